# Session 39, call 3 (H200): the sweep's paged entry (34 workloads) at HEAD, after the block-table check moved out of
# fa_decode's key loop: auto (check on, as a user calls it), the named default (check off) and the peers (JAX's Pallas
# paged op, FA3's kvcache), one process, 4 rounds. One tar comes back.
# bash .run/s39_run3.sh <full git sha>   (from the repository root; carry [".run", ".whl"])
set -u
ls /tmp/site > /dev/null 2>&1 || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1 PALLAS_ATTN_GIT_SHA=$1 PYTHONPATH=$(pwd):/tmp/site
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee /tmp/env.txt
W=/tmp/c3; rm -rf $W; mkdir -p $W; cp /tmp/env.txt $W/
t0=$(date +%s)
timeout 430 python3 -m compare run --config sweep --only 'sweep_paged_*' --impl pallas:auto --impl pallas:fa_decode:default \
  --impl 'jax-pallas:*' --impl 'fa3:*' --rounds 4 --compile-workers 12 --max-run-s 420 --out /tmp/p3 > $W/paged.log 2>&1
echo "paged rc $? in $(( $(date +%s) - t0 )) s"; cp /tmp/p3/records.jsonl $W/paged.records.jsonl
python3 - <<'PY' | tee $W/summary.txt
import json, math
by = {}
for l in open('/tmp/p3/records.jsonl'):
    r = json.loads(l)
    if r.get('type') != 'result' or r['status'] != 'ok': continue
    by.setdefault(r['workload']['name'], {})[r['impl']['name'].replace('pallas:fa_decode:', '')] = r['metrics']['time_us_p50']
g, h = [], []
for w, d in sorted(by.items()):
    a, df = d.get('pallas:auto'), d.get('default')
    peers = {k: v for k, v in d.items() if not k.startswith('pallas') and k != 'default'}
    bp = min(peers.values()) if peers else None
    if a and bp: g.append(a / bp)
    if a and df: h.append(a / df)
    print(w.replace('sweep_paged_', '')[:32].ljust(32), f"auto={a:.1f}" if a else "", f"default={df:.1f}" if df else "",
          f"best peer {min(peers, key=peers.get)}={bp:.1f} auto/peer {a / bp:.3f}" if a and bp else "",
          f"auto/default {a / df:.3f}" if a and df else "")
gm = lambda x: math.exp(sum(map(math.log, x)) / len(x))
print(f"auto/best peer: {len(g)} workloads geomean {gm(g):.3f} worst {max(g):.3f}")
print(f"auto/default: {len(h)} workloads geomean {gm(h):.3f} range {min(h):.3f}-{max(h):.3f}")
PY
cd /tmp && tar czf $OUT/call3.tgz c3

# Session 27, H100 call 2: the whole sweep, pallas:auto + peers, over 6 lanes (session 26's lanes with the lock's
# host-only stretches, the agreement compiled ahead, the memory estimate sending too-large workloads to the pass alone),
# at the short-prefill route (dropin.CUDNN_FORWARD) and the D 96 forward route (dropin.APART).
# bash .run/s27_run2.sh <full git sha>   (archive HEAD to .run/src.tar.xz first; carry [".run", ".whl"]; kind nvidia-h100-x1)
set -u
REPO=$(pwd)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
mkdir -p /tmp/new && (cd /tmp/new && tar xJf $REPO/.run/src.tar.xz) || exit 1
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1 PALLAS_ATTN_GIT_SHA=$1 PYTHONPATH=/tmp/new:/tmp/site OUT
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
cd /tmp/new
t0=$(date +%s)
timeout 555 python3 -m compare run --config sweep --impl pallas:auto --impl 'jax:*' --impl 'jax-pallas:*' --impl 'torch:cudnn' \
  --impl 'torch:flash' --impl 'fa3:*' --impl 'flashinfer:*' --jobs 6 --compile-workers 12 --max-run-s 515 --out /tmp/sweep > $OUT/sweep.log 2>&1
echo "sweep rc $? in $(( $(date +%s) - t0 )) s"
gzip -c /tmp/sweep/records.jsonl > $OUT/records.jsonl.gz
tar czf $OUT/lanes.tgz -C /tmp/sweep lanes
python3 - <<'PY' | tee $OUT/summary.txt
import json, collections
st, fam, waits, fb = collections.Counter(), collections.defaultdict(dict), collections.Counter(), collections.Counter()
for line in open('/tmp/sweep/records.jsonl'):
    r = json.loads(line)
    if r.get('type') == 'header': print('lanes:', json.dumps(r.get('lanes'))[:400])
    if r.get('type') != 'result': continue
    w = r['workload']['name']; st[r['status']] += 1; m = r.get('metrics') or {}
    if m.get('clock_fallback'): fb[m['clock_fallback'][:80]] += 1
    if m.get('workload_wall_s') is not None: fam[w.split('_')[1]][w] = m['workload_wall_s']
    ln = m.get('lane') or {}
    if ln: waits[(w, 'sh')] = ln.get('lock_wait_shared_s', 0); waits[(w, 'ex')] = ln.get('lock_wait_exclusive_s', 0)
print(dict(st)); print('clock fallbacks:', dict(fb))
for f, d in fam.items(): print(f"  {f:8s} {len(d):3d} workloads, mean {sum(d.values()) / len(d):5.2f} s, lane-seconds {sum(d.values()):7.1f}")
print(f"lock waits: shared {sum(v for (w,k),v in waits.items() if k=='sh'):.1f} s, exclusive {sum(v for (w,k),v in waits.items() if k=='ex'):.1f} s")
PY
tail -4 $OUT/sweep.log

# Session 37, call 1 (H200): the whole sweep (auto + every peer) in ONE invocation over 6 lanes with the second
# stage, at the shorter timing windows (--reps 10 --e2e-budget-s 0.25; today's defaults 20 / 0.5): issue 27's bound.
# bash .run/s37_run1.sh <full git sha>   (from the repository root; carry [".run", ".whl"])
set -u
REPO=$(pwd)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1 PALLAS_ATTN_GIT_SHA=$1 PYTHONPATH=$REPO:/tmp/site OUT
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
t0=$(date +%s)
timeout 550 python3 -m compare run --config sweep --impl pallas:auto --impl 'jax:*' --impl 'jax-pallas:*' --impl 'torch:cudnn' \
  --impl 'torch:flash' --impl 'fa3:*' --impl 'flashinfer:*' --jobs 6 --compile-workers 12 --rounds 4 --reps 10 \
  --e2e-budget-s 0.25 --max-run-s 540 --out /tmp/sweep > $OUT/sweep.log 2>&1
echo "sweep rc $? in $(( $(date +%s) - t0 )) s"
gzip -c /tmp/sweep/records.jsonl > $OUT/records.jsonl.gz
python3 - <<'PY' | tee $OUT/summary.txt
import json, collections, math, statistics
st, fam, sp, passes, skipped = collections.Counter(), collections.defaultdict(dict), collections.defaultdict(list), collections.Counter(), collections.Counter()
by = collections.defaultdict(dict)
for line in open('/tmp/sweep/records.jsonl'):
    r = json.loads(line)
    if r.get('type') == 'header': print('lanes:', json.dumps(r.get('lanes'))[:200])
    if r.get('type') != 'result': continue
    w = r['workload']['name']; st[r['status']] += 1; m = r.get('metrics') or {}; e = w.split('_')[1]
    if r['status'] == 'skipped': skipped[e] += 1
    if m.get('workload_wall_s') is not None: fam[e][w] = m['workload_wall_s']
    passes[(m.get('lane') or {}).get('pass')] += 1
    if r['status'] == 'ok':
        by[w][r['impl']['name']] = m['time_us_p50']
        if m.get('time_us_p10'): sp[e].append(m['time_us_p90'] / m['time_us_p10'])
print(dict(st), 'passes', dict(passes), 'skipped by entry', dict(skipped))
for f, d in sorted(fam.items()): print(f"  {f:8s} {len(d):3d} workloads, lane-seconds {sum(d.values()):7.1f}, median p90/p10 {statistics.median(sp[f]) if sp[f] else 0:.3f}")
ent = collections.defaultdict(list)
for w, d in by.items():
    peers = [v for k, v in d.items() if not k.startswith('pallas')]
    if 'pallas:auto' in d and peers: ent[w.split('_')[1]].append((d['pallas:auto'] / min(peers), w))
for e, rs in sorted(ent.items()):
    g = math.exp(sum(math.log(x) for x, _ in rs) / len(rs))
    print(f"  {e:8s} auto/best peer geomean {g:.3f} over {len(rs)}, worst {max(rs)[0]:.3f} {max(rs)[1]}")
PY
tail -3 $OUT/sweep.log

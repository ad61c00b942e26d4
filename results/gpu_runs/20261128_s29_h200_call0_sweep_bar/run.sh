# Prepared in session 28 for the next session (not yet run): the sweep bar (auto within 3% of the best named config)
# judged for the two entries whose routes moved (prefill, train): auto + the named configs + cuDNN + FA3, 6 lanes,
# 4 rounds. Prediction in .run/pred_s29_call0.md.
# bash .run/s29_run0.sh <full git sha>   (archive HEAD to .run/src.tar.xz first; carry [".run", ".whl"]; kind nvidia-h100-x1)
set -u
REPO=$(pwd)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
mkdir -p /tmp/new && (cd /tmp/new && tar xJf $REPO/.run/src.tar.xz) || exit 1
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1 PALLAS_ATTN_GIT_SHA=$1 PYTHONPATH=/tmp/new:/tmp/site OUT
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
cd /tmp/new
t0=$(date +%s)
timeout 565 python3 -m compare run --config sweep --impl pallas:auto --impl 'pallas:fa_prefill:*' --impl 'pallas:dropin:wide' --impl 'pallas:dropin:fused' \
  --impl jax:cudnn --impl 'fa3:*' --only 'sweep_prefill_*' --only 'sweep_train_*' --jobs 6 --compile-workers 12 --rounds 4 --max-run-s 545 \
  --out /tmp/sweep > $OUT/sweep.log 2>&1
echo "sweep rc $? in $(( $(date +%s) - t0 )) s"
gzip -c /tmp/sweep/records.jsonl > $OUT/records.jsonl.gz
tar czf $OUT/lanes.tgz -C /tmp/sweep lanes
python3 - <<'PY' | tee $OUT/summary.txt
import json, collections
st, fam, sp, ph, passes = collections.Counter(), collections.defaultdict(dict), collections.defaultdict(list), collections.Counter(), collections.Counter()
for line in open('/tmp/sweep/records.jsonl'):
    r = json.loads(line)
    if r.get('type') == 'header': print('lanes:', json.dumps(r.get('lanes'))[:300])
    if r.get('type') != 'result': continue
    w = r['workload']['name']; st[r['status']] += 1; m = r.get('metrics') or {}; e = w.split('_')[1]
    if m.get('workload_wall_s') is not None: fam[e][w] = m['workload_wall_s']
    passes[(m.get('lane') or {}).get('pass')] += 1
    if r['status'] == 'ok' and m.get('time_us_p50', 0) > 50: sp[e].append(m['time_us_p90'] / m['time_us_p10'])
    for k in ('oracle', 'oracle_host', 'oracle_fetch'):
        ph[k] += (m.get('phase_s') or {}).get(k, 0)
print(dict(st), 'passes', dict(passes))
for f, d in fam.items(): print(f"  {f:8s} {len(d):3d} workloads, mean {sum(d.values()) / len(d):5.2f} s, lane-seconds {sum(d.values()):7.1f}")
for e, v in sp.items(): print(f"  noise {e:8s} {len(v):4d} ok records > 50 us, p90/p10 > 1.05 in {sum(x > 1.05 for x in v)}")
print('oracle phase seconds (all records):', {k: round(v, 1) for k, v in ph.items()})
PY
tail -3 $OUT/sweep.log
timeout 60 python3 -m compare report /tmp/sweep/records.jsonl --out $OUT/sweep_report.md --no-plots > /dev/null 2>&1; echo "report rc $?"
grep -E '^\| (prefill|train) \|' $OUT/sweep_report.md | cut -c1-400

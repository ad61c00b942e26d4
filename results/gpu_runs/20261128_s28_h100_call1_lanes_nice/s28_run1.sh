# Prepared in session 27 for the next session's first H100 call (not yet run): is the lanes' timing noise CPU
# contention from the other lanes' compiles? The prefill entry over 6 lanes twice, compile workers at nice +10
# (session 27's default in a lane) and at nice 0 (PALLAS_ATTN_LANE_COMPILE_NICE=0), then the spread of each.
# bash .run/s28_run1.sh <full git sha>   (archive HEAD to .run/src.tar.xz first; carry [".run", ".whl"]; kind nvidia-h100-x1)
set -u
REPO=$(pwd)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
mkdir -p /tmp/new && (cd /tmp/new && tar xJf $REPO/.run/src.tar.xz) || exit 1
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1 PALLAS_ATTN_GIT_SHA=$1 PYTHONPATH=/tmp/new:/tmp/site OUT
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
cd /tmp/new
SEL="--config sweep --only sweep_prefill_* --impl pallas:auto --impl jax:cudnn --impl torch:cudnn --impl fa3:*"
for nice in 10 0; do
  t0=$(date +%s)
  PALLAS_ATTN_LANE_COMPILE_NICE=$nice timeout 250 python3 -m compare run $SEL --jobs 6 --compile-workers 12 --max-run-s 230 \
    --out /tmp/nice$nice > $OUT/nice$nice.log 2>&1
  echo "nice $nice rc $? in $(( $(date +%s) - t0 )) s"
  gzip -c /tmp/nice$nice/records.jsonl > $OUT/nice$nice.records.jsonl.gz
done
python3 - <<'PY' | tee $OUT/summary.txt
import json
for nice in (10, 0):
    sp, mis = [], {}
    for line in open(f'/tmp/nice{nice}/records.jsonl'):
        r = json.loads(line)
        if r.get('type') != 'result' or r['status'] != 'ok': continue
        m = r['metrics']
        if m['time_us_p50'] > 50: sp.append(m['time_us_p90'] / m['time_us_p10'])
        if 'mistral-7b-v0.1_n8192' in r['workload']['name']: mis[r['impl']['name']] = round(m['time_us_p50'], 1)
    print(f"nice {nice}: {len(sp)} records, p90/p10 > 1.05 in {sum(x > 1.05 for x in sp)}, Mistral N8192 {mis}")
PY

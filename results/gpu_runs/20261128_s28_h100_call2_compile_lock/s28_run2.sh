# Session 28, call 2 (H100): (1) the long D 128 route's GPU test; (2) the lanes' timing noise with and without
# PALLAS_ATTN_LANE_COMPILE_LOCK=1 (every compile holds the GPU lock shared), the prefill entry over 6 lanes each;
# (3) the D 128 training steps at N 4096 (the route's new start) in one process, 4 rounds.
# bash .run/s28_run2.sh <full git sha>   (archive HEAD to .run/src.tar.xz first; carry [".run", ".whl"]; kind nvidia-h100-x1)
set -u
REPO=$(pwd)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
mkdir -p /tmp/new && (cd /tmp/new && tar xJf $REPO/.run/src.tar.xz) || exit 1
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1 PALLAS_ATTN_GIT_SHA=$1 PYTHONPATH=/tmp/new:/tmp/site OUT
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
cd /tmp/new
timeout 100 python3 -m pytest -q -rA tests/gpu/test_dropin_gpu.py -k "long_d128" > $OUT/gpu_tests.log 2>&1; echo "tests rc $?"; tail -1 $OUT/gpu_tests.log
SEL="--config sweep --only sweep_prefill_* --impl pallas:auto --impl jax:cudnn --impl torch:cudnn --impl fa3:*"
for lk in 0 1; do
  t0=$(date +%s)
  PALLAS_ATTN_LANE_COMPILE_LOCK=$lk timeout 200 python3 -m compare run $SEL --jobs 6 --compile-workers 12 --max-run-s 185 \
    --out /tmp/lock$lk > $OUT/lock$lk.log 2>&1
  echo "compile lock $lk rc $? in $(( $(date +%s) - t0 )) s"
  gzip -c /tmp/lock$lk/records.jsonl > $OUT/lock$lk.records.jsonl.gz
done
t0=$(date +%s)
timeout 150 python3 -m compare run --config sweep --only 'sweep_train_*-7b*_n4096' --only 'sweep_train_llama-3.1-*_n4096' \
  --impl pallas:auto --impl 'pallas:dropin:wide' --impl jax:cudnn --impl 'fa3:mha' --rounds 4 --max-run-s 140 \
  --out /tmp/train > $OUT/train.log 2>&1
echo "train rc $? in $(( $(date +%s) - t0 )) s"
gzip -c /tmp/train/records.jsonl > $OUT/train_records.jsonl.gz
python3 - <<'PY' | tee $OUT/summary.txt
import json, collections
for lk in (0, 1):
    sp, mis, walls, cw = [], {}, [], 0.0
    for line in open(f'/tmp/lock{lk}/records.jsonl'):
        r = json.loads(line)
        if r.get('type') != 'result' or r['status'] != 'ok': continue
        m = r['metrics']
        if m['time_us_p50'] > 50: sp.append(m['time_us_p90'] / m['time_us_p10'])
        if 'mistral-7b-v0.1_n8192' in r['workload']['name']: mis[r['impl']['name']] = round(m['time_us_p50'], 1)
        if r['impl']['name'] == 'pallas:auto':
            walls.append(m.get('workload_wall_s', 0)); cw += (m.get('lane') or {}).get('lock_wait_compile_s', 0)
    print(f"compile lock {lk}: {len(sp)} records, p90/p10 > 1.05 in {sum(x > 1.05 for x in sp)}, > 1.02 in "
          f"{sum(x > 1.02 for x in sp)}, workload wall sum {sum(walls):.0f} s, compile waits {cw:.0f} s, Mistral N8192 {mis}")
d, ch = collections.defaultdict(dict), {}
for line in open('/tmp/train/records.jsonl'):
    r = json.loads(line)
    if r.get('type') != 'result': continue
    w, i = r['workload']['name'], r['impl']['name']
    d[w][i] = round(r['metrics']['time_us_p50'], 1) if r['status'] == 'ok' else r['status']
    if i == 'pallas:auto': ch[w] = (r['impl'].get('plan') or {}).get('chose')
for w, v in d.items():
    a, c, f = v.get('pallas:auto'), v.get('jax:cudnn'), v.get('fa3:mha')
    ok = all(isinstance(x, float) for x in (a, c, f))
    print(f"{w:36s} chose {ch.get(w)!s:28s} auto/cudnn {a / c if ok else float('nan'):.3f} auto/fa3 {a / f if ok else float('nan'):.3f} {v}")
PY

# Prepared in session 27 for the next session's first H100 call (not yet run): the long D 128 training route
# (dropin.TRAIN_ON_CUDNN_MIN_Q_LEN) GPU-tested and timed: its GPU test, then the D 128 training steps at N 4096-16384
# (Llama-3.1-8B / 70B, Qwen2.5-7B) in one process, auto beside jax:cudnn, FA3 and the named pair `pallas:dropin:wide`
# (what auto ran before), 4 rounds; then the prefill at the same shapes (auto keeps fa_prefill's forward).
# bash .run/s28_run0.sh <full git sha>   (archive HEAD to .run/src.tar.xz first; carry [".run", ".whl"]; kind nvidia-h100-x1)
set -u
REPO=$(pwd)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
mkdir -p /tmp/new && (cd /tmp/new && tar xJf $REPO/.run/src.tar.xz) || exit 1
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1 PALLAS_ATTN_GIT_SHA=$1 PYTHONPATH=/tmp/new:/tmp/site OUT
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
cd /tmp/new
timeout 150 python3 -m pytest -q -rA tests/gpu/test_dropin_gpu.py -k "long_d128 or d96_default" > $OUT/gpu_tests.log 2>&1; echo "tests rc $?"; tail -2 $OUT/gpu_tests.log
t0=$(date +%s)
timeout 330 python3 -m compare run --config sweep --only 'sweep_train_llama-3.1-8b_n*' --only 'sweep_train_llama-3.1-70b_n*' \
  --only 'sweep_train_qwen2.5-7b_n*' --impl pallas:auto --impl 'pallas:dropin:wide' --impl jax:cudnn --impl 'fa3:mha' --rounds 4 \
  --max-run-s 320 --out /tmp/train > $OUT/train.log 2>&1
echo "train rc $? in $(( $(date +%s) - t0 )) s"
gzip -c /tmp/train/records.jsonl > $OUT/train_records.jsonl.gz
python3 - <<'PY' | tee $OUT/summary.txt
import json, collections
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

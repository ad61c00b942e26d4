# Session 28, call 4 (H100): Mistral's windowed training steps on cuDNN's pair (dropin.TRAIN_ON_CUDNN_MIN_WINDOW):
# the two route GPU tests, then Mistral-7B N 8192 / 16384 training steps in one process, 4 rounds, auto beside our
# pair (pallas:dropin:wide, what auto ran before), jax.nn cuDNN and FA3.
# bash .run/s28_run4.sh <full git sha>   (archive HEAD to .run/src.tar.xz first; carry [".run", ".whl"]; kind nvidia-h100-x1)
set -u
REPO=$(pwd)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
mkdir -p /tmp/new && (cd /tmp/new && tar xJf $REPO/.run/src.tar.xz) || exit 1
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1 PALLAS_ATTN_GIT_SHA=$1 PYTHONPATH=/tmp/new:/tmp/site OUT
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
cd /tmp/new
timeout 80 python3 -m pytest -q -rA tests/gpu/test_dropin_gpu.py -k "long_d128 or mistral_window" > $OUT/gpu_tests.log 2>&1; echo "tests rc $?"; tail -1 $OUT/gpu_tests.log
t0=$(date +%s)
timeout 95 python3 -m compare run --config sweep --only 'sweep_train_mistral-7b-v0.1_n8192' --only 'sweep_train_mistral-7b-v0.1_n16384' \
  --impl pallas:auto --impl 'pallas:dropin:wide' --impl jax:cudnn --impl 'fa3:mha' --rounds 4 --max-run-s 88 \
  --out /tmp/train > $OUT/train.log 2>&1
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
    a, c, f, o = v.get('pallas:auto'), v.get('jax:cudnn'), v.get('fa3:mha'), v.get('pallas:dropin:wide')
    ok = all(isinstance(x, float) for x in (a, c, f, o))
    nan = float('nan')
    print(f"{w:36s} chose {ch.get(w)!s:8s} auto/cudnn {a / c if ok else nan:.3f} auto/ours {a / o if ok else nan:.3f} "
          f"auto/fa3 {a / f if ok else nan:.3f} {v}")
PY

# Session 27, H100 call 1: GPU tests of the D 96 route and the short-prefill cuDNN-forward route; the boundary of that
# route (configs/route_short_prefill.toml, one process, 4 rounds); the training step where the route differentiates.
# bash .run/s27_run1.sh <full git sha>   (archive HEAD to .run/src.tar.xz first; carry [".run", ".whl"]; kind nvidia-h100-x1)
set -u
REPO=$(pwd)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
mkdir -p /tmp/new && (cd /tmp/new && tar xJf $REPO/.run/src.tar.xz) || exit 1
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1 PALLAS_ATTN_GIT_SHA=$1 PYTHONPATH=/tmp/new:/tmp/site OUT
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
cd /tmp/new
t0=$(date +%s)
timeout 200 python3 -m pytest -q -x tests/gpu/test_dropin_gpu.py -k "d96 or short_causal or vmap" > $OUT/gpu_tests.log 2>&1; echo "tests rc $? in $(( $(date +%s) - t0 )) s"; tail -3 $OUT/gpu_tests.log
t0=$(date +%s)
timeout 300 python3 -m compare run --config configs/route_short_prefill.toml --impl 'pallas:auto' --impl 'pallas:fa_prefill:default' \
  --impl 'pallas:fa_prefill:tiles4' --impl 'pallas:fa_prefill:c3' --impl 'jax:cudnn' --impl 'fa3:mha' --rounds 4 --max-run-s 270 \
  --out /tmp/route > $OUT/route.log 2>&1
echo "route rc $? in $(( $(date +%s) - t0 )) s"
t0=$(date +%s)
timeout 120 python3 -m compare run --config sweep --only 'sweep_train_gpt-2_n512' --only 'sweep_train_gpt-2_n4096' \
  --only 'sweep_train_llama-3.1-8b_n512' --only 'sweep_prefill_gpt-2_n512' --impl 'pallas:auto' --impl 'jax:cudnn' --impl 'pallas:dropin:fused' \
  --rounds 4 --max-run-s 100 --out /tmp/train > $OUT/train.log 2>&1
echo "train rc $? in $(( $(date +%s) - t0 )) s"
gzip -c /tmp/route/records.jsonl > $OUT/route_records.jsonl.gz
gzip -c /tmp/train/records.jsonl > $OUT/train_records.jsonl.gz
python3 - <<'PY' | tee $OUT/summary.txt
import json, collections
for f in ('/tmp/route/records.jsonl', '/tmp/train/records.jsonl'):
    d = collections.defaultdict(dict); ch = {}
    for line in open(f):
        r = json.loads(line)
        if r.get('type') != 'result': continue
        w = r['workload']['name']; i = r['impl']['name']
        d[w][i] = round(r['metrics']['time_us_p50'], 1) if r['status'] == 'ok' else r['status']
        if i == 'pallas:auto': ch[w] = (r['impl'].get('plan') or {}).get('chose')
    for w, v in d.items():
        a, c = v.get('pallas:auto'), v.get('jax:cudnn')
        rat = f"{a / c:.3f}" if isinstance(a, float) and isinstance(c, float) else '-'
        print(f"{w:34s} auto/cudnn {rat}  chose {ch.get(w)}  {v}")
PY

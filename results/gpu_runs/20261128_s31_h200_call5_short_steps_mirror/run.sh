# Session 31 call 5 (H200): the short training steps (dropin.CUDNN_FORWARD: GPT-2 N 512-4096, D 128 N 512) with cuDNN's
# training forward + fa_prefill_bwd's backward (dropin.CUDNN_FORWARD_STEP, new) against our own pair
# (pallas:dropin:wide / fused), cuDNN's pair and FA3; one process, 4 rounds; then the GPU tests of the route.
# Prediction: docs/dropin.md, "cuDNN's forward before our backward" (PREDICTION.md).
# bash .run/s31_run5.sh <full git sha>   (archive HEAD to .run/src.tar.xz first; carry [".run", ".whl"]; kind nvidia-h200)
set -u
REPO=$(pwd)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
mkdir -p /tmp/new && (cd /tmp/new && tar xJf $REPO/.run/src.tar.xz) || exit 1
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1 PALLAS_ATTN_GIT_SHA=$1 PYTHONPATH=/tmp/new:/tmp/site OUT
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
cd /tmp/new
python3 -c "from pallas_attn import dropin; print('cudnn fwd api:', dropin._cudnn_fwd_api()[1] == '')"
t0=$(date +%s)
only=()
for w in sweep_train_gpt-2_n512 sweep_train_gpt-2_n1024 sweep_train_gpt-2_n2048 sweep_train_gpt-2_n4096 \
  sweep_train_llama-3.1-8b_n512 sweep_train_llama-3.1-70b_n512 sweep_train_qwen2.5-7b_n512; do only+=(--only "$w"); done
timeout 270 python3 -m compare run --config sweep --impl pallas:auto --impl pallas:dropin:wide --impl pallas:dropin:fused \
  --impl jax:cudnn --impl 'fa3:*' "${only[@]}" --jobs 1 --rounds 4 --max-run-s 255 --out /tmp/short > $OUT/short.log 2>&1
echo "short rc $? in $(( $(date +%s) - t0 )) s"; t0=$(date +%s)
gzip -c /tmp/short/records.jsonl > $OUT/records.jsonl.gz
tail -1 $OUT/short.log
python3 - <<'PY' | tee $OUT/summary.txt
import json, collections
by = collections.defaultdict(dict); plan = {}
for line in open('/tmp/short/records.jsonl'):
    r = json.loads(line)
    if r.get('type') != 'result': continue
    w, i = r['workload']['name'], r['impl']['name']
    if r['status'] != 'ok': print('  ', w, i, r['status'], (r.get('error') or r.get('reason') or '')[:160]); continue
    m = r['metrics']; by[w][i] = m['time_us_p50']
    if i == 'pallas:auto': plan[w] = ((r['impl'].get('plan') or {}).get('chose'), round(m['time_us_p90'] / m['time_us_p10'], 2))
print(f"{'workload':34s} {'auto':>8s} {'wide':>8s} {'fused':>8s} {'cudnn':>8s} {'fa3':>8s}  auto/ours auto/cudnn chose")
for w, d in sorted(by.items()):
    a = d.get('pallas:auto', 0); ours = min(x for x in (d.get('pallas:dropin:wide', 1e12), d.get('pallas:dropin:fused', 1e12)))
    c = d.get('jax:cudnn', 0)
    print(f"{w:34s} {a:8.1f} {d.get('pallas:dropin:wide', 0):8.1f} {d.get('pallas:dropin:fused', 0):8.1f} {c:8.1f} {d.get('fa3:mha', 0):8.1f}  {a / ours:.3f}   {a / c if c else 0:.3f}   {plan.get(w)}")
PY
timeout 170 python3 -m pytest -q -rfE -p no:cacheprovider tests/gpu/test_dropin_gpu.py -k "short_causal" > $OUT/tests.log 2>&1
echo "tests rc $? in $(( $(date +%s) - t0 )) s"; tail -4 $OUT/tests.log

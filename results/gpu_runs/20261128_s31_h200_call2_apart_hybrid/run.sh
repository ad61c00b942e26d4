# Session 31 call 2 (H200): the routed training steps (dropin.APART: causal D 128 from N 4096, Mistral's window, D 96
# from N 1024) with fa_prefill's forward + jax.nn cuDNN's backward (dropin.APART_STEP, new) against cuDNN's pair and
# FA3, one process, 4 rounds; then the drop-in's APART GPU tests. Prediction: docs/fa_prefill.md, "Our forward, cuDNN's
# backward" (copied to PREDICTION.md).
# bash .run/s31_run2.sh <full git sha>   (archive HEAD to .run/src.tar.xz first; carry [".run", ".whl"]; kind nvidia-h200)
set -u
REPO=$(pwd)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
mkdir -p /tmp/new && (cd /tmp/new && tar xJf $REPO/.run/src.tar.xz) || exit 1
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1 PALLAS_ATTN_GIT_SHA=$1 PYTHONPATH=/tmp/new:/tmp/site OUT
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
cd /tmp/new
python3 -c "import jax; from pallas_attn import dropin; print('jax', jax.__version__, 'cudnn bwd api:', dropin._cudnn_bwd_api())"
t0=$(date +%s)
only=()
for m in llama-3.1-8b llama-3.1-70b qwen2.5-7b mistral-7b-v0.1; do for n in 4096 8192 16384; do only+=(--only "sweep_train_${m}_n${n}"); done; done
only+=(--only 'sweep_train_phi-3-mini_n*')
timeout 330 python3 -m compare run --config sweep --impl pallas:auto --impl jax:cudnn --impl 'fa3:*' "${only[@]}" \
  --jobs 1 --rounds 4 --max-run-s 315 --out /tmp/train > $OUT/train.log 2>&1
echo "train rc $? in $(( $(date +%s) - t0 )) s"; t0=$(date +%s)
gzip -c /tmp/train/records.jsonl > $OUT/records.jsonl.gz
tail -2 $OUT/train.log
python3 - <<'PY' | tee $OUT/summary.txt
import json, collections, math
by = collections.defaultdict(dict); plan = {}
for line in open('/tmp/train/records.jsonl'):
    r = json.loads(line)
    if r.get('type') != 'result': continue
    w, i = r['workload']['name'], r['impl']['name']
    if r['status'] != 'ok': print('  ', w, i, r['status'], (r.get('error') or r.get('reason') or '')[:200]); continue
    m = r['metrics']; by[w][i] = (m['time_us_p50'], m['time_us_p90'] / m['time_us_p10'])
    if i == 'pallas:auto': plan[w] = (r['impl'].get('plan') or {}).get('chose')
rc, rf = [], []
print(f"{'workload':42s} {'auto':>9s} {'cudnn':>9s} {'fa3':>9s} auto/cudnn auto/fa3  chose")
for w, d in sorted(by.items()):
    a, c, f = d.get('pallas:auto', (0, 0)), d.get('jax:cudnn', (0, 0)), d.get('fa3:mha', (0, 0))
    x = a[0] / c[0] if a[0] and c[0] else 0; y = a[0] / f[0] if a[0] and f[0] else 0
    if x: rc.append(x)
    if y: rf.append(y)
    print(f"{w:42s} {a[0]:9.1f} {c[0]:9.1f} {f[0]:9.1f} {x:9.3f} {y:8.3f}  {plan.get(w)} sp {a[1]:.2f}/{c[1]:.2f}")
g = lambda v: math.exp(sum(map(math.log, v)) / len(v)) if v else 0
print(f"geomean auto/cudnn {g(rc):.3f} over {len(rc)}, auto/fa3 {g(rf):.3f} over {len(rf)}")
PY
timeout 200 python3 -m pytest -q -rfE -p no:cacheprovider tests/gpu/test_dropin_gpu.py -k "apart or long_d128 or mistral_window or d96" > $OUT/tests.log 2>&1
echo "tests rc $? in $(( $(date +%s) - t0 )) s"; tail -4 $OUT/tests.log

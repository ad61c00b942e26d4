# Session 35, call 4 (H200): the MLA direct epilogue's GPU tests (direct, and the one-split B 64 S 8k timing tests of
# every config), the serving tests (the varlen test at three T), DeepSeek-V3's 21 MLA sweep workloads.
# bash .run/s35_run4.sh <full git sha>   (archive HEAD to .run/src.tar.xz first; carry [".run"])
set -u
REPO=$(pwd)
mkdir -p /tmp/new && (cd /tmp/new && tar xJf $REPO/.run/src.tar.xz) || exit 1
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1 PALLAS_ATTN_GIT_SHA=$1 PYTHONPATH=/tmp/new OUT
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
cd /tmp/new
t0=$(date +%s)
timeout 170 python3 -m pytest -v -s -m gpu tests/gpu/test_mla_pallas_gpu.py -k "direct or timing_b64" -p no:randomly \
  > $OUT/tests_mla.log 2>&1
echo "mla tests rc $? in $(( $(date +%s) - t0 )) s: $(tail -1 $OUT/tests_mla.log)"
t0=$(date +%s)
timeout 120 python3 -m pytest -v -m gpu tests/gpu/test_serving_gpu.py -k "packed or mixed" -p no:randomly \
  > $OUT/tests_serving.log 2>&1
echo "serving tests rc $? in $(( $(date +%s) - t0 )) s: $(tail -1 $OUT/tests_serving.log)"
grep -hE "FAILED|Error:" $OUT/tests_mla.log $OUT/tests_serving.log | head -10
grep -h "^TIMING" $OUT/tests_mla.log
t0=$(date +%s)
timeout 230 python3 -m compare run --config sweep --only 'sweep_mla_deepseek-v3_*' --impl pallas:auto \
  --impl pallas:fa_mla:kv64_mc --impl pallas:fa_mla:kv64_mc_wl --impl jax:xla_mla --rounds 4 --max-run-s 220 \
  --out /tmp/mla > $OUT/mla.log 2>&1
echo "mla rc $? in $(( $(date +%s) - t0 )) s"
gzip -c /tmp/mla/records.jsonl > $OUT/mla.records.jsonl.gz
python3 - <<'PY' | tee $OUT/summary.txt
import json, collections, math
by, fr = collections.defaultdict(dict), collections.defaultdict(dict)
for line in open('/tmp/mla/records.jsonl'):
    r = json.loads(line)
    if r.get('type') != 'result' or r['status'] != 'ok': continue
    w, i = r['workload']['name'], r['impl']['name']
    by[w][i] = r['metrics']['time_us_p50']
    fr[w][i] = r['metrics'].get('roofline_fraction') or 0
print(f"{'workload':34s} {'auto':>8s} {'kv64_mc':>8s} {'mc_wl':>8s} auto/mc auto/wl floor(auto) auto/xla")
lx = []
for w, d in sorted(by.items()):
    a, m, p, x = (d.get(k, 0) for k in ('pallas:auto', 'pallas:fa_mla:kv64_mc', 'pallas:fa_mla:kv64_mc_wl', 'jax:xla_mla'))
    if a and x: lx.append(math.log(a / x))
    print(f"{w[10:]:34s} {a:8.1f} {m:8.1f} {p:8.1f} {a / m if m else 0:7.3f} {a / p if p else 0:7.3f} "
          f"{fr[w].get('pallas:auto', 0):.3f} {a / x if x else 0:.3f}")
print(f"auto / xla geomean over {len(lx)}: {math.exp(sum(lx) / len(lx)) if lx else 0:.3f}")
PY

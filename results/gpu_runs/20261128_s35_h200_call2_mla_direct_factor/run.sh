# Session 35, call 2 (H200): the MLA direct epilogue again (the flag as a factor): GPU tests, the breakdown with direct on and
# off, DeepSeek-V3's 21 MLA sweep workloads with auto and the XLA peer.
# bash .run/s35_run2.sh <full git sha>   (archive HEAD to .run/src.tar.xz first; carry [".run"])
set -u
REPO=$(pwd)
mkdir -p /tmp/new && (cd /tmp/new && tar xJf $REPO/.run/src.tar.xz) || exit 1
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1 PALLAS_ATTN_GIT_SHA=$1 PYTHONPATH=/tmp/new OUT
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
cd /tmp/new
t0=$(date +%s)
timeout 200 python3 -m pytest -v -m gpu tests/gpu/test_mla_pallas_gpu.py -p no:randomly \
  -k "direct or finish_pallas or nan_in_nan_out or (deepseek_shape and kv64_mc)" > $OUT/tests.log 2>&1
echo "tests rc $? in $(( $(date +%s) - t0 )) s: $(tail -1 $OUT/tests.log)"
grep -E "FAIL|Error" $OUT/tests.log | head -10
t0=$(date +%s)
timeout 150 python3 scripts/mla_breakdown.py --configs kv64_mc,kv64_mc:direct=0 \
  --shapes b64_s2048,b128_s2048,b256_s1024,b64_s8192,b8_s8192 --out $OUT/breakdown.json > $OUT/breakdown.log 2>&1
echo "breakdown rc $? in $(( $(date +%s) - t0 )) s"
t0=$(date +%s)
timeout 200 python3 -m compare run --config sweep --only 'sweep_mla_deepseek-v3_b*_s2048' --only 'sweep_mla_deepseek-v3_b64_s8192' --only 'sweep_mla_deepseek-v3_b8_s8192' --impl pallas:auto \
  --impl jax:xla_mla --rounds 4 --max-run-s 190 --out /tmp/mla > $OUT/mla.log 2>&1
echo "mla rc $? in $(( $(date +%s) - t0 )) s"
gzip -c /tmp/mla/records.jsonl > $OUT/mla.records.jsonl.gz
python3 - <<'PY' | tee $OUT/summary.txt
import json, collections
by, fr = collections.defaultdict(dict), collections.defaultdict(dict)
for line in open('/tmp/mla/records.jsonl'):
    r = json.loads(line)
    if r.get('type') != 'result' or r['status'] != 'ok': continue
    w, i = r['workload']['name'], r['impl']['name']
    by[w][i] = r['metrics']['time_us_p50']
    fr[w][i] = r['metrics'].get('roofline_fraction') or 0
print(f"{'workload':34s} {'auto':>8s} {'xla':>8s} floor(auto) auto/xla")
for w, d in sorted(by.items()):
    a, x = d.get('pallas:auto', 0), d.get('jax:xla_mla', 0)
    print(f"{w[10:]:34s} {a:8.1f} {x:8.1f} {fr[w].get('pallas:auto', 0):.3f} {a / x if x else 0:.3f}")
PY
echo "--- breakdown"; cut -c1-200 $OUT/breakdown.log | grep -E " us |FAILED"

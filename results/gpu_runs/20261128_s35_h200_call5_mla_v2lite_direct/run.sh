# Session 35, call 5 (H200): the direct epilogue at 16 heads (GPU test) and DeepSeek-V2-Lite's 15 MLA sweep workloads.
# bash .run/s35_run5.sh <full git sha>   (archive HEAD to .run/src.tar.xz first; carry [".run"])
set -u
REPO=$(pwd)
mkdir -p /tmp/new && (cd /tmp/new && tar xJf $REPO/.run/src.tar.xz) || exit 1
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1 PALLAS_ATTN_GIT_SHA=$1 PYTHONPATH=/tmp/new OUT
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
cd /tmp/new
t0=$(date +%s)
timeout 100 python3 -m pytest -v -m gpu tests/gpu/test_mla_pallas_gpu.py -k "direct_epilogue_equals and 16" \
  -p no:randomly > $OUT/tests_mla.log 2>&1
echo "mla tests rc $? in $(( $(date +%s) - t0 )) s: $(tail -1 $OUT/tests_mla.log)"
grep -hE "FAILED|Error:" $OUT/tests_mla.log | head -5
t0=$(date +%s)
timeout 200 python3 -m compare run --config sweep --only 'sweep_mla_deepseek-v2-lite_*' --impl pallas:auto \
  --impl pallas:fa_mla:kv64_mc --impl jax:xla_mla --rounds 4 --max-run-s 190 --out /tmp/mla > $OUT/mla.log 2>&1
echo "mla rc $? in $(( $(date +%s) - t0 )) s"
gzip -c /tmp/mla/records.jsonl > $OUT/mla.records.jsonl.gz
python3 - <<'PY' | tee $OUT/summary.txt
import json, collections, math
by, fr, agree = collections.defaultdict(dict), collections.defaultdict(dict), []
for line in open('/tmp/mla/records.jsonl'):
    r = json.loads(line)
    if r.get('type') != 'result': continue
    if r['status'] != 'ok':
        print("NOT OK", r['workload']['name'], r['impl']['name'], r['status'], str(r.get('error'))[:150]); continue
    w, i = r['workload']['name'], r['impl']['name']
    by[w][i] = r['metrics']['time_us_p50']
    fr[w][i] = r['metrics'].get('roofline_fraction') or 0
print(f"{'workload':36s} {'auto':>8s} {'kv64_mc':>8s} {'xla':>8s} auto/mc floor(auto) auto/xla")
lx = []
for w, d in sorted(by.items()):
    a, m, x = (d.get(k, 0) for k in ('pallas:auto', 'pallas:fa_mla:kv64_mc', 'jax:xla_mla'))
    if a and x: lx.append(math.log(a / x))
    print(f"{w[10:]:36s} {a:8.1f} {m:8.1f} {x:8.1f} {a / m if m else 0:7.3f} {fr[w].get('pallas:auto', 0):.3f} "
          f"{a / x if x else 0:.3f}")
print(f"auto / xla geomean over {len(lx)}: {math.exp(sum(lx) / len(lx)) if lx else 0:.3f}")
PY

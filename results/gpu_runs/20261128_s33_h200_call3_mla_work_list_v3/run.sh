# Session 33, calls 1-2 (H200): the MLA work list (issue 30): GPU tests of kv64_wl / kv64_mc_wl (oracle, the split rule,
# NaN, the poisoned table under jit), then the 36 MLA sweep workloads with auto (kv64_mc on the H200), kv64_mc_wl and
# kv64_wl (one process, 4 rounds), then the plan's cost (scripts/mla_breakdown.py if present).
# bash .run/s33_run1.sh <full git sha>   (archive HEAD to .run/src.tar.xz first; carry [".run", ".whl"])
set -u
REPO=$(pwd)
mkdir -p /tmp/new && (cd /tmp/new && tar xJf $REPO/.run/src.tar.xz) || exit 1
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1 PALLAS_ATTN_GIT_SHA=$1 PYTHONPATH=/tmp/new OUT
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
cd /tmp/new
t0=$(date +%s)
timeout 240 python3 -m pytest -v -x -m gpu tests/gpu/test_mla_pallas_gpu.py -k "work_list" > $OUT/tests.log 2>&1
echo "tests rc $? in $(( $(date +%s) - t0 )) s: $(tail -1 $OUT/tests.log)"
grep -E "rel RMS" $OUT/tests.log | head -20
t0=$(date +%s)
timeout 300 python3 -m compare run --config sweep --only 'sweep_mla_deepseek-v3_*' --impl pallas:auto --impl pallas:fa_mla:kv64_mc_wl \
  --rounds 4 --max-run-s 290 --out /tmp/mla > $OUT/mla.log 2>&1
echo "mla rc $? in $(( $(date +%s) - t0 )) s"
gzip -c /tmp/mla/records.jsonl > $OUT/mla.records.jsonl.gz
python3 - <<'PY' | tee $OUT/summary.txt
import json, collections
by, fr, l2 = collections.defaultdict(dict), collections.defaultdict(dict), collections.defaultdict(dict)
for line in open('/tmp/mla/records.jsonl'):
    r = json.loads(line)
    if r.get('type') != 'result' or r['status'] != 'ok': continue
    w, i = r['workload']['name'], r['impl']['name']
    by[w][i] = r['metrics']['time_us_p50']
    fr[w][i] = r['metrics'].get('roofline_fraction') or 0
    l2[w][i] = (r.get('prediction') or {}).get('layer2_us') or 0
print(f"{'workload':40s} {'auto':>8s} {'mc_wl':>8s} {'wl':>8s} {'mc_wl/auto':>10s} frac auto -> mc_wl")
for w, d in sorted(by.items()):
    a, m, p = d.get('pallas:auto', 0), d.get('pallas:fa_mla:kv64_mc_wl', 0), d.get('pallas:fa_mla:kv64_wl', 0)
    print(f"{w[10:]:40s} {a:8.1f} {m:8.1f} {p:8.1f} {m / a if a else 0:10.3f} {fr[w].get('pallas:auto', 0):.3f} -> "
          f"{fr[w].get('pallas:fa_mla:kv64_mc_wl', 0):.3f}")
PY
t0=$(date +%s)
timeout 120 python3 scripts/mla_breakdown.py --configs kv64_mc,kv64_mc_wl --shapes b8_s8192,b32_s2048,b64_s8192,b128_s2048 \
  --out $OUT/breakdown.json > $OUT/breakdown.log 2>&1
echo "breakdown rc $? in $(( $(date +%s) - t0 )) s"; cut -c1-220 $OUT/breakdown.log | grep " us "

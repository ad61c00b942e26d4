# Session 31 call 7 (H200): the quant entry's fp8 / nvfp4 workloads (16) with auto (the H200 table's new B32 S32k rows,
# which the nearest-bucket lookup also extends to B1 and S8k) beside fa_decode's default and the spec_* / waves / tuned
# configs; 2 lanes, 4 rounds. Prediction: .run/pred_s31_call7.md (PREDICTION.md).
set -u
REPO=$(pwd)
mkdir -p /tmp/new && (cd /tmp/new && tar xJf $REPO/.run/src.tar.xz) || exit 1
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1 PALLAS_ATTN_GIT_SHA=$1 PYTHONPATH=/tmp/new OUT
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
cd /tmp/new
t0=$(date +%s)
timeout 230 python3 -m compare run --config sweep --impl pallas:auto --impl pallas:fa_decode:default --impl pallas:fa_decode:spec_occ3 \
  --impl pallas:fa_decode:spec_split4 --impl pallas:fa_decode:spec_split8 --impl pallas:fa_decode:spec_st4 \
  --impl pallas:fa_decode:waves --impl pallas:fa_decode:tuned --only 'sweep_quant_*_fp8_e4m3_*' --only 'sweep_quant_*_nvfp4_*' \
  --jobs 2 --compile-workers 12 --rounds 4 --max-run-s 215 --out /tmp/q > $OUT/q.log 2>&1
echo "quant rc $? in $(( $(date +%s) - t0 )) s"
gzip -c /tmp/q/records.jsonl > $OUT/records.jsonl.gz
tail -1 $OUT/q.log
python3 - <<'PY' | tee $OUT/summary.txt
import json, collections
by = collections.defaultdict(dict); ch = {}
for line in open('/tmp/q/records.jsonl'):
    r = json.loads(line)
    if r.get('type') != 'result' or r['status'] != 'ok': continue
    w, i = r['workload']['name'], r['impl']['name']; by[w][i] = r['metrics']['time_us_p50']
    if i == 'pallas:auto': ch[w] = (r['impl'].get('plan') or {}).get('chose')
for w, d in sorted(by.items()):
    named = {k: v for k, v in d.items() if k != 'pallas:auto'}
    bn = min(named, key=named.get) if named else None
    a = d.get('pallas:auto', 0)
    print(f"{w[12:]:34s} auto {a:8.1f} {str(ch.get(w)):24s} default {d.get('pallas:fa_decode:default', 0):8.1f} best {str(bn).split(':')[-1]:12s} {named.get(bn, 0):8.1f} auto/best {a / named[bn] if bn else 0:.3f}")
PY

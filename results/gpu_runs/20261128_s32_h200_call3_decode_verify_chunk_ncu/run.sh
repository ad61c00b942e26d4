# Session 32, call 3 (H200): (1) the new GPT-2 decode rows through auto, one process; (2) Nsight Compute on the
# chunked prefill kernel at page 16 and 64 and its dense twin (c512 over 8k, Llama-3.1-8B heads, B 4: issue 32's
# page-16 gap, never profiled).
# bash .run/s32_run3.sh <full git sha>   (archive HEAD to .run/src.tar.xz first; carry [".run", ".whl"])
set -u
REPO=$(pwd)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
mkdir -p /tmp/new && (cd /tmp/new && tar xJf $REPO/.run/src.tar.xz) || exit 1
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1 PALLAS_ATTN_GIT_SHA=$1 PYTHONPATH=/tmp/new:/tmp/site OUT
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
cd /tmp/new
t0=$(date +%s)
timeout 150 python3 -m compare run --config sweep --only 'sweep_decode_gpt-2_*' --impl pallas:auto \
  --impl pallas:fa_decode:default --impl pallas:fa_decode:spec_occ3 --impl pallas:fa_decode:spec_bk128 \
  --impl jax:cudnn --impl torch:cudnn --rounds 4 --out /tmp/dec > $OUT/dec.log 2>&1
echo "dec rc $? in $(( $(date +%s) - t0 )) s"
gzip -c /tmp/dec/records.jsonl > $OUT/dec.records.jsonl.gz
python3 - <<'PY' | tee $OUT/summary.txt
import json, collections
by = collections.defaultdict(dict); plan = {}
for line in open('/tmp/dec/records.jsonl'):
    r = json.loads(line)
    if r.get('type') != 'result' or r['status'] != 'ok': continue
    by[r['workload']['name']][r['impl']['name'].split(':')[-1]] = r['metrics']['time_us_p50']
    if r['impl']['name'] == 'pallas:auto': plan[r['workload']['name']] = (r['impl'].get('plan') or {}).get('chose')
for w, d in sorted(by.items()):
    print(f"{w[13:]:22s} auto {plan.get(w)}: " + ", ".join(f"{k} {v:.1f}" for k, v in d.items()))
PY
export NCU_LIMIT=150
for pg in 16 64 0; do
  bash scripts/ncu_profiles.sh chunk_p$pg "chunked --page $pg --dtype bfloat16" 2>&1 | tail -12
done
for pg in 16 64 0; do
  echo "== page $pg"; grep -E "^  [a-zA-Z_].*\(|Duration  |DRAM Throughput|Memory Throughput|L2 Cache Throughput|Compute \(SM\) Throughput|Registers Per" $OUT/chunk_p$pg.details.txt | head -30
done

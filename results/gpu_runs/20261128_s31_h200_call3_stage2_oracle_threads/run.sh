# Session 31 call 3 (H200): the sweep's second-stage workloads alone (the 27 that session 28's whole sweep left to its
# second stage: decode / paged / MLA / quant at 32k-131k tokens a sequence), their configured implementations, 2 lanes
# (the second stage's count: the oracle's host products on 16 // (2 x 2) = 4 threads, compare.runner.oracle_threads),
# 4 rounds. Prediction in PREDICTION.md (.run/pred_s31_call3.md).
# bash .run/s31_run3.sh <full git sha>   (archive HEAD to .run/src.tar.xz first; carry [".run", ".whl"]; kind nvidia-h200)
set -u
REPO=$(pwd)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
mkdir -p /tmp/new && (cd /tmp/new && tar xJf $REPO/.run/src.tar.xz) || exit 1
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1 PALLAS_ATTN_GIT_SHA=$1 PYTHONPATH=/tmp/new:/tmp/site OUT
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc
cd /tmp/new
only=()
for w in sweep_decode_llama-3.1-8b_b8_s131072 sweep_decode_llama-3.1-8b_b32_s32768 sweep_decode_llama-3.1-8b_b128_s8192 \
  sweep_decode_llama-3.1-70b_b8_s131072 sweep_decode_llama-3.1-70b_b32_s32768 sweep_decode_llama-3.1-70b_b128_s8192 \
  sweep_decode_mistral-7b-v0.1_b32_s32768 sweep_decode_gemma-2-9b_b32_s32768 \
  'sweep_paged_llama-3.1-8b_p*_b8_s131072' 'sweep_paged_llama-3.1-8b_p*_b32_s32768' 'sweep_paged_llama-3.1-8b_p*_b128_s8192' \
  sweep_paged_llama-3.1-70b_p64_b64_s8192 sweep_paged_llama-3.1-70b_p64_b64_s16384 sweep_paged_qwen2.5-7b_p64_b64_s16384 \
  'sweep_mla_deepseek-v3_b*_s32768' 'sweep_mla_deepseek-v2-lite_b*_s32768' 'sweep_quant_llama-3.1-*_b32_s32768'; do
  only+=(--only "$w"); done
t0=$(date +%s)
timeout 420 python3 -m compare run --config sweep "${only[@]}" --jobs 2 --compile-workers 12 --rounds 4 --max-run-s 400 \
  --out /tmp/s2 > $OUT/s2.log 2>&1
echo "stage2-alone rc $? in $(( $(date +%s) - t0 )) s"
gzip -c /tmp/s2/records.jsonl > $OUT/records.jsonl.gz
tail -2 $OUT/s2.log
python3 - <<'PY' | tee $OUT/summary.txt
import json, collections
st, wall, ph, per = collections.Counter(), {}, collections.Counter(), collections.defaultdict(collections.Counter)
for line in open('/tmp/s2/records.jsonl'):
    r = json.loads(line)
    if r.get('type') != 'result': continue
    w = r['workload']['name']; st[r['status']] += 1; m = r.get('metrics') or {}
    if m.get('workload_wall_s') is not None: wall[w] = m['workload_wall_s']
    for k, v in (m.get('phase_s') or {}).items():
        ph[k] += v; per[w][k] += v
print(dict(st), len(wall), 'workloads, lane-seconds', round(sum(wall.values()), 1))
print('phase seconds:', {k: round(v, 1) for k, v in sorted(ph.items(), key=lambda x: -x[1])[:12]})
for w in sorted(wall, key=lambda x: -wall[x])[:12]:
    p = per[w]; print(f"  {w:48s} wall {wall[w]:6.1f} oracle {p['oracle']:5.1f} host {p['oracle_host']:5.1f} fetch {p['oracle_fetch']:5.1f}")
PY

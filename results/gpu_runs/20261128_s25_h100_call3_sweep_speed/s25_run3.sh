set -u
REPO=$(pwd)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
mkdir -p /tmp/new && (cd /tmp/new && tar xJf $REPO/.run/src.tar.xz) || exit 1
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1 PALLAS_ATTN_GIT_SHA=$1 PYTHONPATH=/tmp/new:/tmp/site OUT
nvidia-smi --query-gpu=name --format=csv,noheader
t0=$(date +%s)
cd /tmp/new
timeout 400 python3 -m compare run --config sweep --only 'sweep_prefill_*_n1024' --only 'sweep_prefill_*_n8192' --only 'sweep_train_*_n2048' --only 'sweep_train_*_n16384' --only 'sweep_decode_*_b8_s8192' --only 'sweep_decode_*_b128_s1024' --only 'sweep_paged_*_b32_s8192' --only 'sweep_mla_*_b8_s8192' --only 'sweep_mla_*_b128_s32768' --only 'sweep_quant_*_b32_s8192' --only 'sweep_spec_*_tq4' --only 'sweep_chunked_*_c2048_s8192' --impl pallas:auto --impl jax:cudnn --impl torch:cudnn --impl torch:flash --impl 'fa3:*' --out $OUT/sample > $OUT/sample.log 2>&1; echo "sample rc $? at $(( $(date +%s) - t0 )) s"
ONLY=(--only sweep_prefill_llama-3.1-8b_n1024 --only sweep_prefill_llama-3.1-8b_n8192 --only 'sweep_train_llama-3.1-8b_n2048:pallas:auto' --only 'sweep_train_llama-3.1-8b_n2048:pallas:dropin:wide' --only 'sweep_train_llama-3.1-8b_n2048:jax:cudnn' --only 'sweep_train_llama-3.1-8b_n2048:fa3:mha' --only sweep_decode_llama-3.1-8b_b32_s8192 --only sweep_mla_deepseek-v3_b64_s8192 --impl 'pallas:*' --impl jax:cudnn --impl 'fa3:*' --impl torch:cudnn)
timeout $(( 540 - ($(date +%s) - t0) )) python3 -m compare run --config sweep "${ONLY[@]}" --out $OUT/same > $OUT/same.log 2>&1; echo "same-subset rc $? at $(( $(date +%s) - t0 )) s"
python3 $REPO/.run/s25_summary.py same sample 2>&1 | head -3
python3 - <<'PY'
import json, os, collections
fam = collections.defaultdict(dict); st = collections.Counter(); bad = []
for line in open(os.environ['OUT'] + '/sample/records.jsonl'):
    r = json.loads(line)
    if r.get('type') != 'result': continue
    w = r['workload']['name']; f = w.split('_')[1]
    st[r['status']] += 1
    if r['status'] not in ('ok', 'unsupported', 'n/a'): bad.append((w, r['impl']['name'], r['status'], (r.get('reason') or '')[:100]))
    ws = (r.get('metrics') or {}).get('workload_wall_s')
    if ws is not None: fam[f][w] = ws
print(dict(st)); [print('  ', *b) for b in bad[:12]]
full = {'prefill': 64, 'train': 63, 'decode': 59, 'mla': 36, 'paged': 34, 'quant': 24, 'spec': 9, 'chunked': 8}
tot = 0
for f, d in fam.items():
    mean = sum(d.values()) / len(d); tot += mean * full.get(f, 0)
    print(f"{f:8s} {len(d):3d} workloads, mean {mean:5.1f} s, max {max(d.values()):5.1f} s -> x{full.get(f)} = {mean * full.get(f, 0):6.0f} s")
print(f"extrapolated auto+peers sweep: {tot:.0f} s over {sum(full.values())} workloads")
PY

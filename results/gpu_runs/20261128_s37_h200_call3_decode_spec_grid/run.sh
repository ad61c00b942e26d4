# Session 37, call 3 (H200): fa_decode's named configs beside auto and the peers at the decode / spec sweep workloads
# where call 1 left auto behind the best peer (Phi-3 D 96 MHA, GPT-2 D 64, Llama-3.1-70B Tq 4, Llama-3.1-8B Tq 8), one
# process, 4 rounds; then call 2's auto-vs-default gap at spec_extra Tq 2 B 64 again with the default timed first.
# bash .run/s37_run3.sh <full git sha>   (from the repository root; carry [".run", ".whl"])
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1 PALLAS_ATTN_GIT_SHA=$1 PYTHONPATH=$(pwd):/tmp/site OUT
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
C=""
for c in default waves tuned spec_w8 spec_w4 spec_st4 spec_bk128 spec_bk32_w8 spec_split1 spec_split4 spec_split8 spec_occ3 spec_m32; do
  C="$C --impl pallas:fa_decode:$c"; done
t0=$(date +%s)
timeout 330 python3 -m compare run --config sweep --only 'sweep_decode_phi-3-mini_b32_s32768' --only 'sweep_decode_phi-3-mini_b32_s8192' \
  --only 'sweep_decode_phi-3-mini_b1_s8192' --only 'sweep_decode_gpt-2_b8_s1024' --only 'sweep_spec_llama-3.1-70b_tq4' \
  --only 'sweep_spec_llama-3.1-8b_tq8' --impl pallas:auto $C --impl 'torch:cudnn' --impl 'jax:cudnn' --impl 'fa3:*' \
  --rounds 4 --compile-workers 12 --max-run-s 320 --out /tmp/grid > /tmp/grid.log 2>&1
echo "grid rc $? in $(( $(date +%s) - t0 )) s"
gzip -c /tmp/grid/records.jsonl > $OUT/grid.records.jsonl.gz; gzip -c /tmp/grid.log > $OUT/grid.log.gz
timeout 80 python3 -m compare run --config spec_extrapolation --only 'spec_extra_hq32_tq2_b64_s8192' \
  --impl 'pallas:fa_decode:default' --impl pallas:auto --rounds 4 --compile-workers 12 --out /tmp/order > /tmp/order.log 2>&1
echo "order rc $?"
gzip -c /tmp/order/records.jsonl > $OUT/order.records.jsonl.gz
python3 - <<'PY' | tee $OUT/summary.txt
import json
for f in ('/tmp/grid/records.jsonl', '/tmp/order/records.jsonl'):
    by = {}
    try: lines = open(f).read().splitlines()
    except OSError: print(f, 'missing'); continue
    for l in lines:
        r = json.loads(l)
        if r.get('type') != 'result' or r['status'] != 'ok': continue
        by.setdefault(r['workload']['name'], {})[r['impl']['name'].replace('pallas:fa_decode:', '')] = r['metrics']['time_us_p50']
    for w, d in sorted(by.items()):
        peers = {k: v for k, v in d.items() if ':' in k and not k.startswith('pallas')}
        named = {k: v for k, v in d.items() if ':' not in k}
        a = d.get('pallas:auto')
        bp = min(peers.values()) if peers else None
        bn = min(named, key=named.get) if named else None
        print(w[:36].ljust(36), f"auto {a:.1f}" if a else "", f"/peer {a / bp:.3f}" if a and bp else "",
              f"best named {bn} {named[bn]:.1f} (auto/it {a / named[bn]:.3f}, default/it {named.get('default', 0) / named[bn]:.3f})" if bn and a else "")
        print('   ', ' '.join(f"{k}={v:.1f}" for k, v in sorted(d.items(), key=lambda x: x[1])))
PY

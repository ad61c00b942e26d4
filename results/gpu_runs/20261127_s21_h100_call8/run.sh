set -u
mkdir -p /tmp/src && cd /tmp/src && tar xJf $OLDPWD/.run/src.tar.xz || exit 1
export PALLAS_ATTN_GIT_SHA=$1 XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=/tmp/src
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 200 python3 -m compare run --config sweep --only sweep_mla_deepseek-v3_b1_s2048 --only sweep_mla_deepseek-v3_b1_s32768 --only sweep_mla_deepseek-v3_b8_s8192 --only sweep_mla_deepseek-v3_b64_s8192 --only sweep_mla_deepseek-v3_b128_s8192 --only sweep_mla_deepseek-v3_ragged_b64_s8192 --impl pallas:auto --impl jax:xla_mla --e2e-reps 3 --max-run-s 190 --out $OUT/mla > $OUT/compare.log 2>&1; echo "compare rc $?"
python3 - <<'PY'
import json, os
for line in open(os.environ['OUT'] + '/mla/records.jsonl'):
    r = json.loads(line)
    if r.get('type') != 'result': continue
    m = r.get('metrics') or {}
    print(f"{r['workload']['name']:40s} {r['impl']['name']:14s} {r['status']:6s} {m.get('time_us_p50') or 0:9.1f} rf={m.get('roofline_fraction')} {(r.get('plan') or {}).get('config', '') if isinstance(r.get('plan'), dict) else ''}")
PY

set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit 1
mkdir -p /tmp/src && cd /tmp/src && tar xJf $OLDPWD/.run/src.tar.xz || exit 1
export PALLAS_ATTN_GIT_SHA=$1 XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=/tmp/src:/tmp/site
timeout 120 python3 -m pytest -v tests/gpu/test_fa_prefill_bwd_gpu.py -k "deterministic_false" > $OUT/tests.log 2>&1; echo "tests rc $?"; grep -E 'PASS|FAIL|passed|failed' $OUT/tests.log | tail -3
timeout 330 python3 -m compare run --config sweep --only 'sweep_train_gpt-2_n*' --only sweep_train_gpt-oss-20b_n4096 --impl pallas:auto --impl pallas:dropin:wide --impl pallas:dropin:fused --impl jax:cudnn --e2e-reps 3 --max-run-s 320 --out $OUT/train > $OUT/compare.log 2>&1; echo "compare rc $?"
python3 - <<'PY'
import json, os
for line in open(os.environ['OUT'] + '/train/records.jsonl'):
    r = json.loads(line)
    if r.get('type') != 'result': continue
    m = r.get('metrics') or {}
    w = r['workload']['name'] if isinstance(r['workload'], dict) else r['workload']
    i = r['impl'] if isinstance(r['impl'], str) else r['impl'].get('name')
    print(f"{w:36s} {i:22s} {r['status']:6s} {m.get('time_us_p50') or 0:9.1f} {(r.get('notes') or r.get('reason') or '')[:60]}")
PY

# Session 37, call 4 (H200): the spec entry's 9 workloads, auto beside the default, waves, spec_st4, spec_bk128 and the
# peers, 8 rounds, in TWO separate compare runs back to back: does `waves` (two splits where B x Hkv = 128 programs
# fill 0.97 of the SMs) beat the one-split default in both, by more than the 2-4% two identical programs measured
# apart in call 2?
# bash .run/s37_run4.sh <full git sha>   (from the repository root; carry [".run", ".whl"])
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1 PALLAS_ATTN_GIT_SHA=$1 PYTHONPATH=$(pwd):/tmp/site OUT
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for run in a b; do
  timeout 200 python3 -m compare run --config sweep --only 'sweep_spec_*' --impl pallas:auto --impl 'pallas:fa_decode:default' \
    --impl 'pallas:fa_decode:waves' --impl 'pallas:fa_decode:spec_st4' --impl 'pallas:fa_decode:spec_bk128' \
    --impl 'fa3:*' --impl 'jax:cudnn' --rounds 8 --compile-workers 12 --max-run-s 190 --out /tmp/spec_$run > /tmp/spec_$run.log 2>&1
  echo "run $run rc $?"
  gzip -c /tmp/spec_$run/records.jsonl > $OUT/spec_$run.records.jsonl.gz; gzip -c /tmp/spec_$run.log > $OUT/spec_$run.log.gz
done
python3 - <<'PY' | tee $OUT/summary.txt
import json
res = {}
for run in 'ab':
    for l in open(f'/tmp/spec_{run}/records.jsonl'):
        r = json.loads(l)
        if r.get('type') != 'result' or r['status'] != 'ok': continue
        res.setdefault(r['workload']['name'], {}).setdefault(run, {})[r['impl']['name'].replace('pallas:fa_decode:', '')] = r['metrics']['time_us_p50']
print('workload'.ljust(30), 'run', 'waves/default st4/default bk128/default auto/default auto/fa3:mha')
for w, d in sorted(res.items()):
    for run, t in sorted(d.items()):
        de = t.get('default')
        f = lambda k: f"{t[k] / de:.3f}" if k in t and de else '  -  '
        print(w.replace('sweep_spec_', '')[:30].ljust(30), run, '  ', f('waves'), '     ', f('spec_st4'), '     ', f('spec_bk128'), '      ', f('pallas:auto'),
              '    ', f"{t['pallas:auto'] / t['fa3:mha']:.3f}" if 'fa3:mha' in t and 'pallas:auto' in t else '-')
PY

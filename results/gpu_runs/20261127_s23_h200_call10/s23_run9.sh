set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit 1
mkdir -p /tmp/src && cd /tmp/src && tar xJf $OLDPWD/.run/src.tar.xz || exit 1
export PALLAS_ATTN_GIT_SHA=$1 XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=/tmp/src:/tmp/site
nvidia-smi --query-gpu=name --format=csv,noheader
t0=$(date +%s)
timeout 400 python3 -m compare run --config sweep --only 'sweep_chunked_*' --impl pallas:auto --impl pallas:chunked:dense --impl fa3:kvcache --e2e-reps 3 --max-run-s 390 --out $OUT/chunked > $OUT/chunked.log 2>&1; echo "chunked rc $? at $(( $(date +%s) - t0 )) s"
python3 - <<'PY'
import json, os, collections
p = os.environ['OUT'] + '/chunked/records.jsonl'
t = collections.defaultdict(dict)
for line in open(p):
    r = json.loads(line)
    if r.get('type') != 'result': continue
    t[r['workload']['name'].replace('sweep_chunked_llama-3.1-8b_', '')][r['impl']['name']] = (
        r['metrics']['time_us_p50'] if r['status'] == 'ok' else r['status'] + ' ' + (r.get('reason') or '')[:50])
print('workload           auto        dense twin   fa3:kvcache   speed/dense   auto/fa3')
for w, v in t.items():
    a, d, f = (v.get(k) for k in ('pallas:auto', 'pallas:chunked:dense', 'fa3:kvcache'))
    num = all(isinstance(x, float) for x in (a, d, f))
    print(f"{w:16s} {a!s:>10.10} {d!s:>12.12} {f!s:>12.12}  " + (f"{d / a:10.3f} {a / f:10.3f}" if num else ''))
PY

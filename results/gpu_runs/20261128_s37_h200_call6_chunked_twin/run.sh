# Session 37, call 6 (H200): the chunked entry with its dense twin in the same run (call 1's lanes ran auto and the
# peers only, so the report's chunked bar, auto's speed over the dense fa_prefill twin's, had no run at HEAD).
# bash .run/s37_run6.sh <full git sha>   (from the repository root; carry [".run", ".whl"])
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1 PALLAS_ATTN_GIT_SHA=$1 PYTHONPATH=$(pwd):/tmp/site OUT
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 240 python3 -m compare run --config sweep --only 'sweep_chunked_*' --impl pallas:auto --impl 'pallas:chunked:dense' \
  --impl 'fa3:kvcache' --rounds 4 --compile-workers 12 --max-run-s 230 --out /tmp/ch > /tmp/ch.log 2>&1
echo "rc $?"
gzip -c /tmp/ch/records.jsonl > $OUT/chunked.records.jsonl.gz; gzip -c /tmp/ch.log > $OUT/chunked.log.gz
python3 - <<'PY' | tee $OUT/summary.txt
import json
by = {}
for l in open('/tmp/ch/records.jsonl'):
    r = json.loads(l)
    if r.get('type') == 'result' and r['status'] == 'ok':
        by.setdefault(r['workload']['name'], {})[r['impl']['name']] = r['metrics']['time_us_p50']
for w, d in sorted(by.items()):
    a, t, f = d.get('pallas:auto'), d.get('pallas:chunked:dense'), d.get('fa3:kvcache')
    print(w.replace('sweep_chunked_', '')[:34].ljust(34), f"auto {a:.1f}  dense twin {t:.1f}  fa3 {f:.1f}  speed/twin {t / a:.3f}  auto/fa3 {a / f:.3f}")
PY

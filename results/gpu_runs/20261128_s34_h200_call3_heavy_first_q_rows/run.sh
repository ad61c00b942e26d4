# Session 34, call 3 (H200): fa_prefill q_lens and serving GPU tests; the mixed-batch probe, two mixes, on
# call 2's source (old, 6c0b849) and this commit's (new), two processes, per-kernel breakdown; the chunked entry.
# bash .run/s34_run3.sh <full git sha>   (archive HEAD to .run/src.tar.xz, 6c0b849 to .run/src_old.tar.xz; carry [".run", ".whl"])
set -u
REPO=$(pwd)
mkdir -p /tmp/new /tmp/old && (cd /tmp/new && tar xJf $REPO/.run/src.tar.xz) && (cd /tmp/old && tar xJf $REPO/.run/src_old.tar.xz) || exit 1
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1 OUT
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
cd /tmp/new
t0=$(date +%s)
PYTHONPATH=/tmp/new PALLAS_ATTN_GIT_SHA=$1 timeout 240 python3 -m pytest -q -m gpu tests/gpu/test_fa_prefill_gpu.py -k "idle or q_lens or mixed or in_kernel" tests/gpu/test_serving_gpu.py \
  > $OUT/tests.log 2>&1
echo "tests rc $? in $(( $(date +%s) - t0 )) s"; tail -2 $OUT/tests.log
for v in old new; do
  t0=$(date +%s)
  (cd /tmp/$v && PYTHONPATH=/tmp/$v PALLAS_ATTN_GIT_SHA=$( [ $v = old ] && echo 6c0b8493bf879c3c1ca049d1e59c2bb2ac55527c || echo $1 ) \
    timeout 150 python3 scripts/serving_probe.py --parts mixed --kernels --out /tmp/probe_$v > $OUT/probe_$v.log 2>&1)
  echo "probe $v rc $? in $(( $(date +%s) - t0 )) s"
  gzip -c /tmp/probe_$v/records.jsonl > $OUT/probe_$v.records.jsonl.gz
done
for v in old new; do echo "== probe $v"; grep -v "^ " $OUT/probe_$v.log | tail -7; done
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site $REPO/.whl/*.whl || exit 1
t0=$(date +%s)
PYTHONPATH=/tmp/new:/tmp/site PALLAS_ATTN_GIT_SHA=$1 timeout 150 python3 -m compare run --config sweep --only 'sweep_chunked_*' --impl pallas:auto \
  --impl pallas:chunked:dense --impl 'fa3:kvcache' --rounds 4 --out /tmp/ch > $OUT/chunked.log 2>&1
echo "chunked rc $? in $(( $(date +%s) - t0 )) s"
gzip -c /tmp/ch/records.jsonl > $OUT/chunked.records.jsonl.gz
python3 - <<'PY' | tee $OUT/summary.txt
import json, collections
by = collections.defaultdict(dict)
for line in open('/tmp/ch/records.jsonl'):
    r = json.loads(line)
    if r.get('type') != 'result' or r['status'] != 'ok': continue
    by[r['workload']['name']][r['impl']['name']] = r['metrics']['time_us_p50']
for w, d in sorted(by.items()):
    a, t, f = d.get('pallas:auto'), d.get('pallas:chunked:dense'), d.get('fa3:kvcache')
    print(f"{w[14:]:30s} auto {a:8.1f} twin {t:8.1f} speed/twin {t / a:.3f} auto/fa3 {a / f if f else 0:.3f}")
PY

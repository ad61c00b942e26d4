# Session 29 call 5 (H200): the packed bound again after PACKED_TILES ((4096, 4), (8192, 2)); the window grid with its
# points now running the window.
# bash .run/s29_run5.sh <full git sha>   (archive HEAD to .run/src.tar.xz first; carry [".run", ".whl"]; kind nvidia-h200)
set -u
REPO=$(pwd)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
mkdir -p /tmp/new && (cd /tmp/new && tar xJf $REPO/.run/src.tar.xz) || exit 1
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1 PALLAS_ATTN_GIT_SHA=$1 PYTHONPATH=/tmp/new:/tmp/site OUT
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
cd /tmp/new
t0=$(date +%s)
timeout 130 python3 -m compare run --config packed_bound --impl pallas:auto --impl 'pallas:fa_prefill:*' --impl 'fa3:*' \
  --jobs 4 --compile-workers 8 --rounds 4 --max-run-s 120 --out /tmp/packed > $OUT/packed.log 2>&1
echo "packed rc $? in $(( $(date +%s) - t0 )) s"; t0=$(date +%s)
timeout 150 python3 -m compare tune --config tune_fa_prefill_window --rounds 4 --max-run-s 140 --out /tmp/win > $OUT/window.log 2>&1
echo "window rc $? in $(( $(date +%s) - t0 )) s"
for d in win packed; do gzip -c /tmp/$d/records.jsonl > $OUT/$d.records.jsonl.gz; done
python3 - <<'PY' | tee $OUT/summary.txt
import json, collections
for d in ('packed', 'win'):
    t = collections.defaultdict(dict)
    for line in open(f'/tmp/{d}/records.jsonl'):
        r = json.loads(line)
        if r.get('type') != 'result': continue
        m = r.get('metrics') or {}
        v = f"{m['time_us_p50']:.1f}" if r['status'] == 'ok' and m.get('time_us_p50') else r['status']
        t[r['workload']['name']][r['impl']['name'].replace('pallas:fa_prefill:', '').replace('pallas:', '')] = v
    for w, v in t.items(): print(d, w, json.dumps(v))
PY

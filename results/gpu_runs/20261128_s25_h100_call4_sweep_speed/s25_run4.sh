set -u
REPO=$(pwd)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
mkdir -p /tmp/new && (cd /tmp/new && tar xJf $REPO/.run/src.tar.xz) || exit 1
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1 PALLAS_ATTN_GIT_SHA=$1 PYTHONPATH=/tmp/new:/tmp/site OUT
nvidia-smi --query-gpu=name --format=csv,noheader
t0=$(date +%s)
cd /tmp/new
timeout 195 python3 -m compare run --config sweep --only 'sweep_prefill_*_n1024' --only 'sweep_prefill_*_n8192' --only 'sweep_train_*_n2048' --only 'sweep_train_*_n16384' --only 'sweep_decode_*_b8_s8192' --only 'sweep_paged_*_b32_s8192' --impl pallas:auto --impl jax:cudnn --impl torch:cudnn --impl torch:flash --impl 'fa3:*' --out $OUT/sample > $OUT/sample.log 2>&1; echo "sample rc $? at $(( $(date +%s) - t0 )) s"
python3 - <<'PY'
import json, os, collections
fam = collections.defaultdict(dict); st = collections.Counter(); bad = []; ph = collections.Counter()
for line in open(os.environ['OUT'] + '/sample/records.jsonl'):
    r = json.loads(line)
    if r.get('type') != 'result': continue
    w = r['workload']['name']; f = w.split('_')[1]
    st[r['status']] += 1
    if r['status'] not in ('ok', 'unsupported', 'n/a'): bad.append((w, r['impl']['name'], r['status'], (r.get('reason') or '')[:120]))
    m = r.get('metrics') or {}
    for k, v in (m.get('phase_s') or {}).items():
        if isinstance(v, (int, float)): ph[k] += v
    if m.get('workload_wall_s') is not None: fam[f][w] = m['workload_wall_s']
print(dict(st)); [print('  BAD', *b) for b in bad[:12]]
print('phase sums:', ', '.join(f"{k} {v:.1f}" for k, v in ph.most_common(12)))
for f, d in fam.items():
    print(f"{f:8s} {len(d):3d} workloads, mean {sum(d.values()) / len(d):5.1f} s, max {max(d.values()):5.1f} s")
PY

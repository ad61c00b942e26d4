# Session 32, call 2 (H200): fa_decode's named configs at the decode shapes no table row covers (GPT-2 D 64 MHA,
# Phi-3 D 96 MHA, Gemma-2 D 256, gpt-oss D 64 GQA 8:1 with sinks) beside auto and the peers, one compare run, for
# `compare tune --table` (issue 27: the default is the best path).
# bash .run/s32_run2.sh <full git sha>   (archive HEAD to .run/src.tar.xz first; carry [".run", ".whl"])
set -u
REPO=$(pwd)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
mkdir -p /tmp/new && (cd /tmp/new && tar xJf $REPO/.run/src.tar.xz) || exit 1
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1 PALLAS_ATTN_GIT_SHA=$1 PYTHONPATH=/tmp/new:/tmp/site OUT
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
cd /tmp/new
impls=""
for c in default waves tuned spec_w8 spec_w4 spec_st4 spec_bk128 spec_bk32_w8 spec_split1 spec_split4 spec_split8 spec_occ3 spec_m32; do
  impls="$impls --impl pallas:fa_decode:$c"; done
t0=$(date +%s)
timeout 420 python3 -m compare run --config sweep --only 'sweep_decode_gpt-2_*' --only 'sweep_decode_phi-3-mini_*' \
  --only 'sweep_decode_gemma-2-9b_*' --only 'sweep_decode_gpt-oss-20b_*' --impl pallas:auto $impls --impl 'jax:cudnn' \
  --impl 'torch:cudnn' --impl 'fa3:*' --jobs 4 --compile-workers 8 --rounds 4 --max-run-s 400 --out /tmp/dec > $OUT/dec.log 2>&1
echo "dec rc $? in $(( $(date +%s) - t0 )) s"
gzip -c /tmp/dec/records.jsonl > $OUT/dec.records.jsonl.gz
python3 - <<'PY' | tee $OUT/summary.txt
import json, collections
by = collections.defaultdict(dict); st = collections.Counter()
for line in open('/tmp/dec/records.jsonl'):
    r = json.loads(line)
    if r.get('type') != 'result': continue
    st[r['status']] += 1
    if r['status'] == 'ok': by[r['workload']['name']][r['impl']['name']] = r['metrics']['time_us_p50']
print(dict(st))
print(f"{'workload':40s} {'auto':>8s} {'default':>8s} {'best named':>24s} {'best peer':>22s}")
for w, d in sorted(by.items()):
    named = {k.split(':')[-1]: v for k, v in d.items() if k.startswith('pallas:fa_decode:')}
    peers = {k: v for k, v in d.items() if not k.startswith('pallas')}
    bn = min(named, key=named.get) if named else None; bp = min(peers, key=peers.get) if peers else None
    print(f"{w[13:]:40s} {d.get('pallas:auto', 0):8.1f} {named.get('default', 0):8.1f} {bn or '-':>14s} {named.get(bn, 0):9.1f} {bp or '-':>12s} {peers.get(bp, 0):9.1f}")
PY
tail -2 $OUT/dec.log

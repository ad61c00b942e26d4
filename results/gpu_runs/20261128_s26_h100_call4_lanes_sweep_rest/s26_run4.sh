# Session 26 call 4: the entries call 3 did not reach (decode, paged, spec, mla, quant, chunked): the whole sweep, pallas:auto and the peers, over 6 lanes (--jobs 6), bounded by --max-run-s.
# bash .run/s26_run2.sh <full git sha>   (carry [".run", ".whl"]; kind nvidia-h100-x1; <= 8 files back)
set -u
REPO=$(pwd)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
mkdir -p /tmp/new && (cd /tmp/new && tar xJf $REPO/.run/src.tar.xz) || exit 1
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1 PALLAS_ATTN_GIT_SHA=$1 PYTHONPATH=/tmp/new:/tmp/site OUT
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
t0=$(date +%s)
cd /tmp/new
timeout 320 python3 -m compare run --config sweep --only 'sweep_decode_*' --only 'sweep_paged_*' --only 'sweep_spec_*' --only 'sweep_mla_*' --only 'sweep_quant_*' --only 'sweep_chunked_*' --impl pallas:auto --impl 'jax:*' --impl 'jax-pallas:*' --impl 'torch:cudnn' \
  --impl 'torch:flash' --impl 'fa3:*' --impl 'flashinfer:*' --jobs 6 --compile-workers 12 --max-run-s 285 --out /tmp/sweep > $OUT/sweep.log 2>&1
echo "sweep rc $? in $(( $(date +%s) - t0 )) s"
gzip -c /tmp/sweep/records.jsonl > $OUT/records.jsonl.gz
tar czf $OUT/lanes.tgz -C /tmp/sweep lanes
python3 - <<'PY' | tee $OUT/summary.txt
import json, collections
st, fam, bad, skipped, waits = collections.Counter(), collections.defaultdict(dict), [], collections.Counter(), collections.Counter()
hdr = None
for line in open('/tmp/sweep/records.jsonl'):
    r = json.loads(line)
    if r.get('type') == 'header': hdr = r
    if r.get('type') != 'result': continue
    w = r['workload']['name']; st[r['status']] += 1
    m = r.get('metrics') or {}
    if r['status'] == 'skipped': skipped[(r.get('reason') or '')[:40]] += 1
    elif r['status'] not in ('ok', 'unsupported', 'n/a'): bad.append((w, r['impl']['name'], r['status'], (r.get('reason') or '')[:150]))
    if m.get('workload_wall_s') is not None: fam[w.split('_')[1]][w] = m['workload_wall_s']
    ln = m.get('lane') or {}
    if ln: waits[(w, 'sh')] = ln.get('lock_wait_shared_s', 0); waits[(w, 'ex')] = ln.get('lock_wait_exclusive_s', 0)
print(dict(st)); print('skipped:', dict(skipped)); [print('  BAD', *b) for b in bad[:15]]
print('lanes:', json.dumps((hdr or {}).get('lanes'))[:600])
for f, d in fam.items(): print(f"  {f:8s} {len(d):3d} workloads, mean {sum(d.values()) / len(d):5.2f} s, max {max(d.values()):5.2f} s, lane-seconds {sum(d.values()):7.1f}")
print(f"lock waits: shared {sum(v for (w,k),v in waits.items() if k=='sh'):.1f} s, exclusive {sum(v for (w,k),v in waits.items() if k=='ex'):.1f} s")
PY
tail -5 $OUT/sweep.log
python3 - <<'PY' | tee -a $OUT/summary.txt
import json, collections
fb = collections.Counter()
for line in open('/tmp/sweep/records.jsonl'):
    r = json.loads(line)
    if r.get('type') == 'result' and (r.get('metrics') or {}).get('clock_fallback'): fb[r['metrics']['clock_fallback'][:90]] += 1
print('clock fallbacks:', dict(fb))
PY
grep -c "ran out of memory" $OUT/sweep.log

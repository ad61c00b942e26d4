# Session 26 call 1: a sweep sample (auto + peers) in one process, then the same over 4 lanes (--jobs 4); p50s compared.
# bash .run/s26_run1.sh <full git sha>   (carry [".run", ".whl"]; kind nvidia-h100-x1; <= 8 files back)
set -u
REPO=$(pwd)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
mkdir -p /tmp/new && (cd /tmp/new && tar xJf $REPO/.run/src.tar.xz) || exit 1
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1 PALLAS_ATTN_GIT_SHA=$1 PYTHONPATH=/tmp/new:/tmp/site OUT
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc
t0=$(date +%s)
cd /tmp/new
SAMPLE=(--only 'sweep_prefill_llama-3.1-8b_n1024' --only 'sweep_prefill_llama-3.1-8b_n8192' --only 'sweep_prefill_gpt-2_n1024'
        --only 'sweep_prefill_gpt-2_n8192' --only 'sweep_prefill_gemma-2-9b_n1024' --only 'sweep_prefill_gemma-2-9b_n8192'
        --only 'sweep_train_llama-3.1-8b_n2048' --only 'sweep_train_gpt-2_n2048' --only 'sweep_train_qwen2.5-7b_n2048'
        --only 'sweep_train_llama-3.1-8b_n8192'
        --only 'sweep_decode_*_b8_s8192' --only 'sweep_paged_*_b32_s8192' --only 'sweep_mla_*_b8_s8192' --only 'sweep_quant_*_b32_s8192'
        --impl pallas:auto --impl jax:cudnn --impl jax:xla --impl 'jax-pallas:*' --impl torch:cudnn --impl torch:flash --impl 'fa3:*')
timeout 240 python3 -m compare run --config sweep "${SAMPLE[@]}" --quiet --out $OUT/plain > $OUT/plain.log 2>&1; echo "plain rc $? at $(( $(date +%s) - t0 )) s"
t1=$(date +%s)
timeout 220 python3 -m compare run --config sweep "${SAMPLE[@]}" --jobs 4 --out /tmp/lanes4 > $OUT/lanes.log 2>&1; echo "lanes rc $? in $(( $(date +%s) - t1 )) s"
tar czf $OUT/lanes4.tgz -C /tmp lanes4
python3 - <<'PY' | tee $OUT/summary.txt
import json, os, collections, math
def load(p):
    recs, fam, st, bad, e2e, waits = {}, collections.defaultdict(dict), collections.Counter(), [], {}, collections.defaultdict(float)
    for line in open(p):
        r = json.loads(line)
        if r.get('type') != 'result': continue
        w = r['workload']['name']; st[r['status']] += 1
        if r['status'] not in ('ok', 'unsupported', 'n/a', 'skipped'): bad.append((w, r['impl']['name'], r['status'], (r.get('reason') or '')[:150]))
        m = r.get('metrics') or {}
        if m.get('workload_wall_s') is not None: fam[w.split('_')[1]][w] = m['workload_wall_s']
        if r['status'] == 'ok' and m.get('time_us_p50'):
            recs[(w, r['impl']['name'])] = m['time_us_p50']; e2e[(w, r['impl']['name'])] = m.get('e2e_synced_us')
        ln = m.get('lane')
        if ln: waits[(w, 'sh')] = ln.get('lock_wait_shared_s', 0); waits[(w, 'ex')] = ln.get('lock_wait_exclusive_s', 0)
    return recs, fam, st, bad, e2e, waits
P, L = load(os.environ['OUT'] + '/plain/records.jsonl'), load('/tmp/lanes4/records.jsonl')
for tag, (recs, fam, st, bad, e2e, waits) in (('plain', P), ('lanes4', L)):
    print(tag, dict(st)); [print('   BAD', *b) for b in bad[:12]]
    for f, d in fam.items(): print(f"   {f:8s} {len(d):3d} workloads, mean {sum(d.values()) / len(d):5.2f} s, max {max(d.values()):5.2f} s, sum {sum(d.values()):6.1f} s")
    if waits: print(f"   lock waits: shared {sum(v for (w,k),v in waits.items() if k=='sh'):.1f} s, exclusive {sum(v for (w,k),v in waits.items() if k=='ex'):.1f} s")
def gm(r): return math.exp(sum(map(math.log, r)) / len(r))
common = [k for k in P[0] if k in L[0]]
if common:
    r = sorted((L[0][k] / P[0][k], k) for k in common)
    print(f"p50 lanes/plain over {len(r)} pairs: geomean {gm([x for x,_ in r]):.4f}, {r[0][0]:.3f} {r[0][1]} .. {r[-1][0]:.3f} {r[-1][1]}")
    for x, k in r[:4] + r[-4:]: print(f"   {x:.3f} {k[0]} {k[1]} plain {P[0][k]:.1f} lanes {L[0][k]:.1f}")
    e = [L[4][k] / P[4][k] for k in common if L[4].get(k) and P[4].get(k)]
    if e: print(f"e2e_synced lanes/plain over {len(e)}: geomean {gm(e):.3f}, {min(e):.3f}-{max(e):.3f}")
PY

set -u
REPO=$(pwd)
mkdir -p /tmp/src && cd /tmp/src && tar xJf $REPO/.run/src.tar.xz || exit 1
export PALLAS_ATTN_GIT_SHA=$1 XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=/tmp/src PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
t0=$(date +%s)
for c in poly4 default; do MOSAIC_GPU_DUMP_PTXAS=1 timeout 90 python3 $REPO/.run/ptxas_prefill.py 64 $c > $OUT/ptxas_$c.log 2>&1; echo "ptxas $c: $(grep -i -E 'registers|spill' $OUT/ptxas_$c.log | sort | uniq -c | head -4)"; done
echo "ptxas done at $(( $(date +%s) - t0 )) s"
timeout 170 python3 -m pytest -q -m gpu tests/gpu/test_fa_prefill_gpu.py -k "poly4 or nan" > $OUT/tests.log 2>&1; echo "tests rc $? at $(( $(date +%s) - t0 )) s"; tail -3 $OUT/tests.log
timeout 330 python3 -m compare run --config sweep --only sweep_prefill_gpt-2_n512 --only sweep_prefill_gpt-2_n1024 --only sweep_prefill_gpt-2_n2048 --only sweep_prefill_gpt-2_n4096 --only sweep_prefill_gpt-2_n16384 --only sweep_prefill_llama-3.1-8b_n1024 --only sweep_prefill_llama-3.1-8b_n4096 --impl pallas:auto --impl pallas:fa_prefill:default --impl pallas:fa_prefill:poly4 --impl pallas:fa_prefill:tiles4 --impl pallas:fa_prefill:tiles4_poly4 --impl pallas:fa_prefill:c3 --impl pallas:fa_prefill:c3_poly4 --impl jax:cudnn --e2e-reps 3 --max-run-s 320 --out $OUT/pf > $OUT/pf.log 2>&1; echo "pf rc $? at $(( $(date +%s) - t0 )) s"
python3 - <<'PY'
import json, os, collections
p = os.environ['OUT'] + '/pf/records.jsonl'
t = collections.defaultdict(dict)
for line in open(p):
    r = json.loads(line)
    if r.get('type') != 'result' or r['status'] != 'ok': continue
    w = r['workload']['name'].replace('sweep_prefill_', ''); i = r['impl']['name'].replace('pallas:fa_prefill:', '')
    t[w][i] = r['metrics']['time_us_p50']
cols = ['pallas:auto', 'default', 'poly4', 'tiles4', 'tiles4_poly4', 'c3', 'c3_poly4', 'jax:cudnn']
print('workload           ' + ' '.join(f"{c[-11:]:>11s}" for c in cols) + '  p4/def t4p4/t4 c3p4/c3')
for w, v in t.items():
    r = lambda a, b: v[a] / v[b] if a in v and b in v else 0
    print(f"{w:18s} " + ' '.join(f"{v.get(c, 0):11.1f}" for c in cols) + f"  {r('poly4','default'):.3f} {r('tiles4_poly4','tiles4'):.3f} {r('c3_poly4','c3'):.3f}")
PY

set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit 1
mkdir -p /tmp/src && cd /tmp/src && tar xJf $OLDPWD/.run/src.tar.xz || exit 1
cp $OLDPWD/.run/ptxas_prefill.py /tmp/ptxas_prefill.py
export PALLAS_ATTN_GIT_SHA=$1 XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=/tmp/src:/tmp/site
nvidia-smi --query-gpu=name --format=csv,noheader
t0=$(date +%s)
for dc in "64 c3" "64 default" "64 tiles4" "128 c3" "128 default"; do
  set -- $dc
  MOSAIC_GPU_DUMP_PTXAS=1 timeout 60 python3 /tmp/ptxas_prefill.py $1 $2 > $OUT/ptxas_d$1_$2.log 2>&1
  echo "d$1 $2: $(grep -a -E 'spill|Used [0-9]+ registers' $OUT/ptxas_d$1_$2.log | sort | uniq -c | tr '\n' ';' | head -c 400)"
done
echo "ptxas done at $(( $(date +%s) - t0 )) s"
I=""; for c in default tuned spec_w8 spec_w4 spec_st4 spec_bk128 spec_bk32_w8 spec_split1 spec_split4 spec_split8 spec_occ3 spec_m32; do I="$I --impl pallas:fa_decode:$c"; done
timeout 480 python3 -m compare run --config sweep --only 'sweep_spec_*' --impl pallas:auto $I --impl fa3:mha --e2e-reps 3 --max-run-s 470 --out $OUT/spec > $OUT/spec.log 2>&1; echo "spec rc $? at $(( $(date +%s) - t0 )) s"
python3 - <<'PY'
import json, os, collections
p = os.environ['OUT'] + '/spec/records.jsonl'
t = collections.defaultdict(dict)
for line in open(p):
    r = json.loads(line)
    if r.get('type') != 'result' or r['status'] != 'ok': continue
    t[r['workload']['name'].replace('sweep_spec_', '')][r['impl']['name'].replace('pallas:fa_decode:', '')] = r['metrics']['time_us_p50']
cols = sorted({c for v in t.values() for c in v})
print('workload ' + ' '.join(c[:10] for c in cols))
for w, v in t.items():
    print(f"{w:16s} " + ' '.join(f"{v.get(c, 0):10.1f}" for c in cols))
PY

# Session 38, call 2 (H200, the machine of call 1 still warm): what call 1 could not bring back or finish. The quant
# GPU tests again with a longer limit (call 1's 150 s cut them at ~75%); NVFP4 B1 (both models, S 8k / 32k) default
# against quant_qk16 again, 6 rounds (call 1: 1.015 / 1.033 at S 8k, the only rows above the default); call 1's
# fourth SASS export and the summary, from the reports call 1 left in /tmp. One tar comes back ($OUT file count).
# bash .run/s38_run2.sh <full git sha>   (from the repository root; carry [".run", ".whl"])
set -u
ls /tmp/site > /dev/null 2>&1 || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1 PALLAS_ATTN_GIT_SHA=$1 PYTHONPATH=$(pwd):/tmp/site
W=/tmp/c2; mkdir -p $W
t0=$(date +%s)
timeout 330 python3 -m pytest -q -m gpu tests/gpu/test_fa_decode_quant_gpu.py -p no:cacheprovider > $W/tests.log 2>&1
echo "tests rc $? in $(( $(date +%s) - t0 )) s"; tail -3 $W/tests.log
t0=$(date +%s)
timeout 120 python3 -m compare run --config sweep --only 'sweep_quant_*_nvfp4_b1_*' --impl pallas:fa_decode:default \
  --impl pallas:fa_decode:quant_qk16 --rounds 6 --compile-workers 12 --max-run-s 110 --out /tmp/b1 > $W/b1.log 2>&1
echo "b1 rc $? in $(( $(date +%s) - t0 )) s"
cp /tmp/b1/records.jsonl $W/b1.records.jsonl
ncu -i /tmp/nvfp4_quant_qk16.ncu-rep --page source --csv --print-source sass 2>&1 | gzip > $W/nvfp4_quant_qk16.sass.csv.gz
cp /root/out/*.sass.csv.gz $W/ 2>/dev/null; ls /tmp/*.ncu-rep
for f in fp8_default fp8_quant_qk16 nvfp4_default; do
  [ -f $W/$f.sass.csv.gz ] || ncu -i /tmp/$f.ncu-rep --page source --csv --print-source sass 2>&1 | gzip > $W/$f.sass.csv.gz; done
python3 scripts/ncu_sass_summary.py $W/*.sass.csv.gz > $W/sass_summary.txt 2>&1; grep "^==" $W/sass_summary.txt
python3 - <<'PY' | tee $W/summary.txt
import json
by = {}
for l in open('/tmp/b1/records.jsonl'):
    r = json.loads(l)
    if r.get('type') != 'result' or r['status'] != 'ok': continue
    m = r['metrics']
    by.setdefault(r['workload']['name'], {})[r['impl']['name'].replace('pallas:fa_decode:', '')] = (m['time_us_p50'], m['time_us_p10'], m['time_us_p90'])
for w, d in sorted(by.items()):
    q, df = d.get('quant_qk16'), d.get('default')
    print(w.replace('sweep_quant_', '')[:34].ljust(34), ' '.join(f"{k}={v[0]:.2f} [{v[1]:.2f}-{v[2]:.2f}]" for k, v in sorted(d.items())),
          f"qk16/default {q[0] / df[0]:.3f}" if q and df else "")
PY
cd /tmp && tar czf $OUT/call2.tgz c2

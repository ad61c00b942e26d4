# Session 38, call 1 (H200): quant_qk16 (a bf16 q's scores in fp16 on the K tile as it decodes) beside fa_decode's
# default (qk16 off) and auto at the quant sweep's 24 workloads, one process; the quant GPU tests; ncu instruction
# counts (SourceCounters) of NVFP4 and fp8 B32 S8k with and without it.
# bash .run/s38_run1.sh <full git sha>   (from the repository root; carry [".run", ".whl"])
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1 PALLAS_ATTN_GIT_SHA=$1 PYTHONPATH=$(pwd):/tmp/site OUT
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
t0=$(date +%s)
timeout 150 python3 -m pytest -q -m gpu tests/gpu/test_fa_decode_quant_gpu.py -p no:cacheprovider > $OUT/tests.log 2>&1
echo "tests rc $? in $(( $(date +%s) - t0 )) s"; tail -3 $OUT/tests.log
t0=$(date +%s)
timeout 240 python3 -m compare run --config sweep --only 'sweep_quant_*' --impl pallas:auto --impl pallas:fa_decode:default \
  --impl pallas:fa_decode:quant_qk16 --impl jax:cudnn --rounds 4 --compile-workers 12 --max-run-s 230 \
  --out /tmp/quant > /tmp/quant.log 2>&1
echo "quant rc $? in $(( $(date +%s) - t0 )) s"
gzip -c /tmp/quant/records.jsonl > $OUT/quant.records.jsonl.gz; gzip -c /tmp/quant.log > $OUT/quant.log.gz
t0=$(date +%s)
for kv in nvfp4 fp8; do for cfg in default quant_qk16; do
  timeout 60 ncu --clock-control none --profile-from-start off --section SourceCounters --section InstructionStats \
    --section LaunchStats --section SpeedOfLight -f -o /tmp/${kv}_$cfg python3 scripts/ncu_case.py decode --kv $kv \
    --dtype bfloat16 --config $cfg >> $OUT/ncu_run.log 2>&1
  echo "ncu $kv $cfg rc $?"
  ncu -i /tmp/${kv}_$cfg.ncu-rep --page source --csv --print-source sass 2>&1 | gzip > $OUT/${kv}_$cfg.sass.csv.gz
  ncu -i /tmp/${kv}_$cfg.ncu-rep --page details > $OUT/${kv}_$cfg.details.txt 2>&1
done; done
echo "ncu in $(( $(date +%s) - t0 )) s"
python3 scripts/ncu_sass_summary.py $OUT/*.sass.csv.gz > $OUT/sass_summary.txt 2>&1; grep "^==" $OUT/sass_summary.txt
python3 - <<'PY' | tee $OUT/summary.txt
import json
by = {}
for l in open('/tmp/quant/records.jsonl'):
    r = json.loads(l)
    if r.get('type') != 'result' or r['status'] != 'ok': continue
    by.setdefault(r['workload']['name'], {})[r['impl']['name'].replace('pallas:fa_decode:', '')] = r['metrics']['time_us_p50']
for w, d in sorted(by.items()):
    q, df = d.get('quant_qk16'), d.get('default')
    print(w.replace('sweep_quant_', '')[:34].ljust(34), ' '.join(f"{k}={v:.1f}" for k, v in sorted(d.items())),
          f"qk16/default {q / df:.3f}" if q and df else "")
PY

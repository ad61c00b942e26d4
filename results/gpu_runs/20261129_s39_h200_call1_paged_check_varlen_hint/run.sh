# Session 39, call 1 (H200): (a) GPU tests of the reinstated paged block-table check (fa_decode, quant paged) and of
# paged_attention_varlen's decode_max_q; (b) configs/quant_batches.toml's paged rows: auto (check on) against the
# named default (check off) and quant_pv16_off, 4 rounds; (c) scripts/serving_probe.py mixed with the decode_max_q 1
# variant, every kernel printed; (d) the spec entry twice (session 37 call 4's invocation) with rotating rounds: auto
# against the named config it picks. One tar comes back.
# bash .run/s39_run1.sh <full git sha>   (from the repository root; carry [".run", ".whl"])
set -u
ls /tmp/site > /dev/null 2>&1 || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1 PALLAS_ATTN_GIT_SHA=$1 PYTHONPATH=$(pwd):/tmp/site
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee /tmp/env.txt
W=/tmp/c1; rm -rf $W; mkdir -p $W; cp /tmp/env.txt $W/
t0=$(date +%s)
timeout 240 python3 -m pytest -q -m gpu tests/gpu/test_fa_decode_gpu.py tests/gpu/test_serving_gpu.py \
  "tests/gpu/test_fa_decode_quant_gpu.py::test_paged_ragged" -p no:cacheprovider > $W/tests.log 2>&1
echo "tests rc $? in $(( $(date +%s) - t0 )) s"; tail -3 $W/tests.log
t0=$(date +%s)
timeout 120 python3 -m compare run --config quant_batches --only 'quant_batch_paged_*' --impl pallas:auto \
  --impl pallas:fa_decode:default --impl pallas:fa_decode:quant_pv16_off --rounds 4 \
  --compile-workers 12 --max-run-s 110 --out /tmp/p1 > $W/paged.log 2>&1
echo "paged rc $? in $(( $(date +%s) - t0 )) s"; cp /tmp/p1/records.jsonl $W/paged.records.jsonl
t0=$(date +%s)
timeout 150 python3 scripts/serving_probe.py --parts mixed --kernels --out /tmp/serving > $W/serving.log 2>&1
echo "serving rc $? in $(( $(date +%s) - t0 )) s"; cp /tmp/serving/records.jsonl $W/serving.records.jsonl
for run in a b; do
  t0=$(date +%s)
  timeout 100 python3 -m compare run --config sweep --only 'sweep_spec_*' --impl pallas:auto --impl 'pallas:fa_decode:default' \
    --impl 'pallas:fa_decode:waves' --impl 'pallas:fa_decode:spec_st4' --impl 'pallas:fa_decode:spec_bk128' \
    --impl 'fa3:*' --impl 'jax:cudnn' --rounds 8 --compile-workers 12 --max-run-s 90 --out /tmp/spec_$run > $W/spec_$run.log 2>&1
  echo "spec $run rc $? in $(( $(date +%s) - t0 )) s"; cp /tmp/spec_$run/records.jsonl $W/spec_$run.records.jsonl
done
python3 - <<'PY' | tee $W/summary.txt
import json
by = {}
for l in open('/tmp/p1/records.jsonl'):
    r = json.loads(l)
    if r.get('type') != 'result' or r['status'] != 'ok': continue
    by.setdefault(r['workload']['name'], {})[r['impl']['name'].replace('pallas:fa_decode:', '')] = r['metrics']['time_us_p50']
for w, d in sorted(by.items()):
    a, df = d.get('pallas:auto'), d.get('default')
    print(w.replace('quant_batch_', '')[:34].ljust(34), ' '.join(f"{k}={v:.1f}" for k, v in sorted(d.items())),
          f"auto/default {a / df:.3f}" if a and df else "")
print()
for l in open('/tmp/serving/records.jsonl'):
    r = json.loads(l)
    if r.get('type') == 'result' and r['status'] == 'ok':
        print('serving', r['impl']['name'][:60].ljust(60), f"{r['metrics']['time_us_p50']:.1f}")
print()
res = {}
for run in 'ab':
    for l in open(f'/tmp/spec_{run}/records.jsonl'):
        r = json.loads(l)
        if r.get('type') != 'result' or r['status'] != 'ok': continue
        res.setdefault(r['workload']['name'], {}).setdefault(run, {})[r['impl']['name'].replace('pallas:fa_decode:', '')] = r
for w, runs in sorted(res.items()):
    for run, d in sorted(runs.items()):
        a = d.get('pallas:auto')
        if not a: continue
        ch = a['impl'].get('plan', {}).get('config')
        t = {k: v['metrics']['time_us_p50'] for k, v in d.items()}
        same = t.get(ch)
        print(w.replace('sweep_spec_', '')[:30].ljust(30), run, f"auto={t['pallas:auto']:.1f} chose {ch}={same}",
              f"auto/chosen {t['pallas:auto'] / same:.3f}" if same else "", 'places', a['metrics'].get('round_places'),
              'chosen places', d[ch]['metrics'].get('round_places') if same else None)
PY
cd /tmp && tar czf $OUT/call1.tgz c1

# issue 26's before/after: the same workloads and named configs on three trees, one process each, on one GPU
set -u
REPO=$(pwd)
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
t0=$(date +%s)
W="--only sweep_prefill_llama-3.1-8b_n4096 --only sweep_prefill_gpt-2_n4096 --only sweep_train_llama-3.1-8b_n4096 --only sweep_train_gpt-2_n4096 --only sweep_decode_llama-3.1-8b_b32_s8192 --only sweep_paged_llama-3.1-8b_p64_b32_s8192 --only sweep_mla_deepseek-v3_b64_s8192 --only sweep_mla_deepseek-v3_b1_s32768"
I="--impl pallas:fa_prefill:default --impl pallas:fa_prefill:pingpong --impl pallas:dropin:wide --impl pallas:dropin:default --impl pallas:fa_decode:tuned --impl pallas:fa_mla:kv64_mc --impl pallas:fa_mla:kv64_ws_mc --impl jax:cudnn"
for spec in "A:tree_246c7eb:246c7eb34e5b9e5e9b4f97df2b0c7f9e88d876d5:default" "B:tree_daba66e:daba66ef6bf572bcf6065379b9a10a41202bd6b5:default" "C:tree_final:$1:waves"; do
  IFS=: read name tar sha dec <<< "$spec"
  mkdir -p /tmp/t_$name && tar xJf $REPO/.run/$tar.tar.xz -C /tmp/t_$name || exit 1
  (cd /tmp/t_$name && PALLAS_ATTN_GIT_SHA=$sha PYTHONPATH=/tmp/t_$name timeout 200 python3 -m compare run --config sweep $W $I --impl pallas:fa_decode:$dec --e2e-reps 3 --max-run-s 170 --out $OUT/$name > $OUT/$name.log 2>&1)
  echo "tree $name rc $? at $(( $(date +%s) - t0 )) s"
done
python3 - <<'PY'
import json, os, collections
t = collections.defaultdict(dict)
for name in "ABC":
    p = os.path.join(os.environ['OUT'], name, 'records.jsonl')
    if not os.path.exists(p): continue
    for line in open(p):
        r = json.loads(line)
        if 'workload' not in r or 'impl' not in r or r.get('status') != 'ok': continue
        i = r['impl']['name'].replace('pallas:', '').replace('fa_decode:waves', 'fa_decode:default')
        t[(r['workload']['name'].replace('sweep_', ''), i)][name] = r['metrics']['time_us_p50']
print(f"{'workload':36s} {'impl':22s} {'A 246c7eb':>10s} {'B daba66e':>10s} {'C final':>10s} {'B/A':>6s} {'C/A':>6s}")
for (w, i), v in sorted(t.items()):
    a = v.get('A'); f = lambda x: f"{v[x]:10.1f}" if x in v else f"{'-':>10s}"
    rb = f"{v['B'] / a:6.3f}" if a and 'B' in v else '     -'; rc = f"{v['C'] / a:6.3f}" if a and 'C' in v else '     -'
    print(f"{w:36s} {i:22s} {f('A')} {f('B')} {f('C')} {rb} {rc}")
PY

#!/usr/bin/env bash
# ROLE: tool (tests/test_scripts_roles.py: scripts/ holds probes and tools only)
# Nsight Compute profiles of single kernel calls (scripts/ncu_case.py), exported as text under $OUT.
# Usage (GPU machine, repo root): scripts/ncu_profiles.sh NAME "ARGS" [NAME "ARGS" ...]
#   e.g. scripts/ncu_profiles.sh prefill "prefill --config default" mla "mla --config kv64"
# Per NAME: $OUT/NAME.details.txt (every section of `--set full`) and $OUT/NAME.sass.csv.gz (per-SASS-instruction
# counters and warp-stall samples); the reports themselves stay in /tmp (they are large). Logs: $OUT/ncu_run.log.
set -u
OUT=${OUT:-$PWD/gpu_out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
while [ $# -ge 2 ]; do
  name=$1; args=$2; shift 2; t0=$SECONDS
  timeout ${NCU_LIMIT:-240} ncu --clock-control none --profile-from-start off --set full -f -o /tmp/$name \
    python3 scripts/ncu_case.py $args >> "$OUT/ncu_run.log" 2>&1
  echo "$name ($args): rc=$? $((SECONDS - t0))s" | tee -a "$OUT/ncu_run.log"
  ncu -i /tmp/$name.ncu-rep --page details > "$OUT/$name.details.txt" 2>&1
  ncu -i /tmp/$name.ncu-rep --page source --csv --print-source sass 2>&1 | gzip > "$OUT/$name.sass.csv.gz"
  grep -E '^  [a-zA-Z_].*\(|Duration|Compute \(SM\) Throughput|Issue Slots Busy|Registers Per|Achieved Occupancy' \
    "$OUT/$name.details.txt" | head -n 12
done

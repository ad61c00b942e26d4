"""Within-run ratios (each pair's p50 over the workload's pallas:auto p50) in a one-process run and a lanes run of the
same workloads: a timing window disturbed by another lane would move a pair's ratio; machine-to-machine differences
mostly cancel. Usage: python .run/s26_ratio_check.py ONE.jsonl LANES.jsonl [...more LANES files]"""
import json, math, sys, collections
def load(paths):
    d = collections.defaultdict(dict)
    for p in paths:
        for l in open(p):
            r = json.loads(l)
            if r.get('type') == 'result' and r['status'] == 'ok' and (r.get('metrics') or {}).get('time_us_p50'):
                d[r['workload']['name']][r['impl']['name']] = r['metrics']['time_us_p50']
    return d
one, lanes = load([sys.argv[1]]), load(sys.argv[2:])
rows = []
for w in one:
    if w not in lanes or 'pallas:auto' not in one[w] or 'pallas:auto' not in lanes[w]:
        continue
    for i in one[w]:
        if i != 'pallas:auto' and i in lanes[w]:
            a = one[w][i] / one[w]['pallas:auto']; b = lanes[w][i] / lanes[w]['pallas:auto']
            rows.append((b / a, w, i))
rows.sort()
g = math.exp(sum(math.log(x) for x, _, _ in rows) / len(rows))
print(f"{len(rows)} (workload, peer) pairs: (peer/auto in lanes) / (peer/auto in one process): geomean {g:.4f}, "
      f"min {rows[0][0]:.3f} ({rows[0][1]} {rows[0][2]}), max {rows[-1][0]:.3f} ({rows[-1][1]} {rows[-1][2]})")
within = sum(1 for x, _, _ in rows if abs(x - 1) <= 0.03)
print(f"within 3%: {within} of {len(rows)}")
for x, w, i in rows[:3] + rows[-3:]:
    print(f"  {x:.3f} {w} {i}")

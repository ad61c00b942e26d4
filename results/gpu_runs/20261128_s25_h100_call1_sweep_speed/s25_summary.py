import json, os, sys, collections, re
out = os.environ['OUT']
def load(tag):
    recs = {}
    for line in open(f"{out}/{tag}/records.jsonl"):
        r = json.loads(line)
        if r.get('type') != 'result': continue
        recs[(r['workload']['name'].replace('sweep_', ''), r['impl']['name'])] = r
    return recs
def wall(tag):
    m = re.search(r"(\d+) records in (\d+) s", open(f"{out}/{tag}.log").read())
    return m.group(0) if m else "?"
tags = [t for t in sys.argv[1:] if os.path.exists(f"{out}/{t}/records.jsonl")]
R = {t: load(t) for t in tags}
for t in tags:
    ph = collections.Counter(); n = collections.Counter()
    for r in R[t].values():
        m = r.get('metrics') or {}
        n[r['status']] += 1
        for k, v in (m.get('phase_s') or {}).items():
            if isinstance(v, (int, float)): ph[k] += v
        ph['first_call'] += m.get('first_call_s') or 0
    print(f"{t}: {wall(t)}; statuses {dict(n)}; phase sums (s): " + ", ".join(f"{k} {v:.1f}" for k, v in ph.most_common()))
if len(tags) >= 2:
    a, b = tags[0], tags[1]
    print(f"\np50 {a} / {b} on pairs ok in both:")
    rat = []
    for key in sorted(R[a]):
        ra, rb = R[a][key], R[b].get(key)
        if not rb or ra['status'] != 'ok' or rb['status'] != 'ok': continue
        pa, pb = ra['metrics'].get('time_us_p50'), rb['metrics'].get('time_us_p50')
        if not pa or not pb: continue
        rat.append(pa / pb)
        print(f"  {key[0]:32s} {key[1]:30s} {pa:10.1f} {pb:10.1f} {pa / pb:6.3f}")
    if rat:
        import math
        print(f"  geomean {math.exp(sum(map(math.log, rat)) / len(rat)):.3f} over {len(rat)}, min {min(rat):.3f} max {max(rat):.3f}")
    for key in sorted(set(R[a]) | set(R[b])):
        sa = R[a].get(key, {}).get('status'); sb = R[b].get(key, {}).get('status')
        if sa != sb: print(f"  status differs {key}: {sa} vs {sb}")

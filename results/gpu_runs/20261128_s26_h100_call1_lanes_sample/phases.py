import json, sys, collections
def load(p):
    out = collections.OrderedDict()
    for l in open(p):
        r = json.loads(l)
        if r.get('type') != 'result': continue
        w = r['workload']['name']; m = r.get('metrics') or {}
        d = out.setdefault(w, collections.Counter())
        for k, v in (m.get('phase_s') or {}).items():
            if isinstance(v, (int, float)): d[k] += v
        if m.get('first_call_s'): d['first_call'] += m['first_call_s']
        d['wall'] = m.get('workload_wall_s') or d['wall']
        ln = m.get('lane') or {}
        d['w_sh'] = ln.get('lock_wait_shared_s', 0); d['w_ex'] = ln.get('lock_wait_exclusive_s', 0)
    return out
a, b = load(sys.argv[1]), load(sys.argv[2])
keys = ['wall', 'inputs', 'oracle', 'compile_bg', 'compile_wait', 'first_call', 'agreement', 'warmup', 'kernel_clock', 'e2e', 'w_sh', 'w_ex']
print(f"{'workload':44s}" + ''.join(f"{k[:9]:>10s}" for k in keys))
for w in a:
    for tag, d in (('P', a[w]), ('L', b.get(w, {}))):
        print(f"{(w[6:] if tag=='P' else '')[:42]:42s} {tag}" + ''.join(f"{d.get(k, 0):10.2f}" for k in keys))

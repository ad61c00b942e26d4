import json,gzip,collections,sys,math
for f in sys.argv[1:]:
  by=collections.defaultdict(dict)
  for l in gzip.open(f):
    r=json.loads(l)
    if r.get('type')!='result' or r['status']!='ok': continue
    by[r['workload']['name']][r['impl']['name']]=r['metrics']['time_us_p50']
  for e in ('prefill','train'):
    rs=[]
    for w,d in by.items():
      if not w.startswith('sweep_'+e) or 'pallas:auto' not in d: continue
      peers=[v for k,v in d.items() if not k.startswith('pallas:')]
      if peers: rs.append((d['pallas:auto']/min(peers),w))
    if rs:
      g=math.exp(sum(math.log(x) for x,_ in rs)/len(rs)); print(f"{f.split('/')[-1]:28s} {e:8s} n={len(rs)} geomean {g:.3f} worst {max(rs)[0]:.3f} {max(rs)[1]} >1.05: {sum(x>1.05 for x,_ in rs)}")

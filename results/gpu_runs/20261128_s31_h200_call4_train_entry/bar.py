import json,gzip,collections,sys
by=collections.defaultdict(dict); sp={}
for f in sys.argv[1:]:
  for l in gzip.open(f):
    r=json.loads(l)
    if r.get('type')!='result' or r['status']!='ok': continue
    m=r['metrics']; by[r['workload']['name']][r['impl']['name']]=m['time_us_p50']; sp[(r['workload']['name'],r['impl']['name'])]=m['time_us_p90']/m['time_us_p10']
for w,d in sorted(by.items()):
    a=d.get('pallas:auto')
    if a is None: continue
    named={k:v for k,v in d.items() if k.startswith('pallas:') and k!='pallas:auto'}
    peers={k:v for k,v in d.items() if not k.startswith('pallas:')}
    bn=min(named.items(),key=lambda x:x[1]) if named else (None,0)
    bp=min(peers.items(),key=lambda x:x[1]) if peers else (None,0)
    flag = (bn[0] and a>1.03*bn[1]) or (bp[0] and a>1.05*bp[1])
    if flag: print(f"{w:50s} auto {a:9.1f} sp{sp[(w,'pallas:auto')]:.2f} | named {bn[0]} {bn[1]:9.1f} ({a/bn[1] if bn[0] else 0:.3f}) | peer {bp[0]} {bp[1]:.1f} ({a/bp[1] if bp[0] else 0:.3f})")

import json,sys,math
for p in sys.argv[1:]:
    d=json.load(open(p)); c=d.get('cost'); cc=d.get('cell_costs')
    if c is None or cc is None: print(p,'cost',c is not None,'cell_costs',cc is not None, 'runs' in d and [ (r.get('cost') if isinstance(r,dict) else None) for r in d['runs']][:3]); continue
    ids=[x['cell_id'] for x in cc]
    bad=[]
    for k in ('measuring_gpu_s','pairs_gpu_s','reruns_gpu_s','triage_gpu_s'):
        s=sum(x[k] for x in cc)
        if not math.isclose(s,c[k],rel_tol=1e-9,abs_tol=1e-6): bad.append((k,s,c[k]))
        if any((not isinstance(x[k],(int,float))) or x[k]<0 for x in cc): bad.append((k,'neg/nonnum'))
    print(p,'n=%d uniq=%d'%(len(ids),len(set(ids))),'cost',{k:round(v,3) for k,v in c.items()},'MISMATCH' if bad else 'sums ok',bad)

import json, copy, sys, os
n=int(sys.argv[1]); out=sys.argv[2]; pad=int(sys.argv[3]) if len(sys.argv)>3 else 0
A=json.load(open('base/sh1/R/results.json')); B=json.load(open('base/sh2/R/results.json'))
PA=json.load(open('base/sh1/R/shard.json')); PB=json.load(open('base/sh2/R/shard.json'))
tc=A['cells'][0]; tp=PA['cells'][0]
if pad:
    for r in tc['repeats']:
        r['steps']=[dict(r['steps'][-1], step=i) for i in range(pad)]
cellsA=[];cellsB=[];plan=[]
for i in range(2*n):
    s=1+(i%2); cid=f"gpt2-tiny.fp32.1gpu.single.base{i}"
    p=copy.deepcopy(tp); p['shard']=s; p['cell']['id']=cid; plan.append(p)
    c=copy.deepcopy(tc); c['id']=cid; c['logs']=[]
    (cellsA if s==1 else cellsB).append(c)
for d,cells,P,idx in ((A,cellsA,PA,1),(B,cellsB,PB,2)):
    d['cells']=cells; d['dropped']=[]
    P['cells']=plan; P['expected_gpu_s']=[sum(p['expected_gpu_s'] for p in plan if p['shard']==1), sum(p['expected_gpu_s'] for p in plan if p['shard']==2)]
    dd=f'{out}/{"ab"[idx-1]}'; os.makedirs(dd+'/logs',exist_ok=True)
    json.dump(d,open(dd+'/results.json','w')); json.dump(P,open(dd+'/shard.json','w'))

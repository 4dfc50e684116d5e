#!/bin/bash
# hforge.sh NAME 'python code on H (s1 history.json) T (s1 triage.json)'
source /tmp/h42/env; D=/tmp/h42/v5; n=$1; d=$D/$n; rm -rf $d; mkdir -p $d; cp -r $D/s1/cc2 $d/s1; cp -r $D/s2/cc2 $d/s2; cd $d
python3 - <<PY
import json
H=json.load(open('s1/history.json')); T=json.load(open('s1/triage.json'))
$2
open('s1/history.json','w').write(H if isinstance(H,str) else json.dumps(H,indent=1)); json.dump(T,open('s1/triage.json','w'),indent=1)
PY
$B report merge s1 s2 -o m --baselines /tmp/h42/t/esc/baselines > mout 2> merr; rc=$?
echo "== $n rc=$rc $(grep -v '^shard' merr | grep -v '^ ' | head -2 | cut -c1-400)"
[ -f m/report.json ] && python3 /tmp/h42/cc.py m/report.json
true

#!/bin/bash
# forge.sh NAME 'python code using A,B (results dicts) PA,PB (shard plans)' -> t/NAME/{a,b}
n=$1; code=$2; d=/tmp/h42/t/$n; rm -rf $d; mkdir -p $d; cp -r /tmp/h42/base/sh1/R $d/a; cp -r /tmp/h42/base/sh2/R $d/b
cd $d; python3 - <<PY
import json
A=json.load(open('a/results.json')); B=json.load(open('b/results.json'))
PA=json.load(open('a/shard.json')); PB=json.load(open('b/shard.json'))
$code
json.dump(A,open('a/results.json','w'),indent=1); json.dump(B,open('b/results.json','w'),indent=1)
json.dump(PA,open('a/shard.json','w'),indent=1); json.dump(PB,open('b/shard.json','w'),indent=1)
PY

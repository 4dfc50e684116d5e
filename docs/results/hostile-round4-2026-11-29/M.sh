#!/bin/bash
source /tmp/h42/env
n=$1; shift; HEADN=${HEADN:-900} ./run.sh $n.merge ${TO:-120} $B report merge t/$n/a t/$n/b -o t/$n/out "$@"
if [ -d t/$n/out ]; then f=t/$n/out; [ -f $f/summary.txt ] || f=$(ls -d t/$n/out/*/ | head -1); echo "-- outputs: $(grep -ho 'result: .*' $f/summary.txt 2>/dev/null | head -1|cut -c1-150) | report.json exit_code=$(python3 -c "import json;print(json.load(open('$f/report.json')).get('exit_code'))" 2>/dev/null) | junit $(grep -o 'failures="[0-9]*"' $f/junit.xml 2>/dev/null| head -1)"; ls t/$n/out | tr '\n' ' '; echo; fi

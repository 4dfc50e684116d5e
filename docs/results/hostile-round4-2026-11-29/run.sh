#!/bin/bash
# run.sh NAME TIMEOUT cmd...
name=$1; to=$2; shift 2
d=/tmp/h42/t/$name; mkdir -p $d
/usr/bin/time -v -o $d/time timeout $to "$@" > $d/out 2> $d/err; rc=$?
echo $rc > $d/rc
rss=$(grep "Maximum resident" $d/time | awk '{print $NF}'); el=$(grep "Elapsed" $d/time | awk '{print $NF}')
echo "== $name rc=$rc rss=${rss}KB t=$el"
echo "-- stdout:"; head -c ${HEADN:-1500} $d/out | cat -v; echo; echo "-- stderr:"; head -c ${HEADN:-1500} $d/err | cat -v; echo
grep -l "panicked" $d/err >/dev/null && echo "!!! PANIC"
grep -q $'[\x1b\x07]' $d/out $d/err && echo "!!! RAW ESC/BEL in terminal output"
true

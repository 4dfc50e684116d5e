#!/bin/bash
# replay.sh BENCH
#
# Re-runs issue 42's whole hostile corpus against the bench binary BENCH: every row of
# results.md (round A), verify.md (round B) and final.md (round C), one row per case (a
# verify.md or final.md row that re-checks a results.md case is folded into that case and
# named "R:x / V:n"). Each row's verdict comes from the behaviour those files document:
# exit 2 naming the file/flag/key for bad input, no raw ESC/BEL on the terminal or in text
# outputs, no panic (exit 101), no exit 3, nothing outside the output folder deleted, one
# exit code in every output, bounded time and memory.
#
# Every command's stdout/stderr/rc is checked for a panic, exit 3, a timeout and raw
# ESC/BEL on top of the row's own expectation. The fixtures under t/, base/, v/, v2/, v5/
# are read, never written: everything a command writes goes under $W (/tmp/h42/RP), and
# the fixtures a script made (forged shards, the 50 MB stores' sites, the large shards,
# the zero-spread nights, the cost forgeries) are made again there.
#
# Output: the table `case | observed | verdict` and a count line, on stdout and in
# /tmp/h42/replay-<shortsha>.md (SHA=... overrides the sha, which is otherwise read from
# the git tree the binary was built in, with -dirty when it has uncommitted changes).
set -u
BENCH=$(readlink -f "${1:?usage: replay.sh BENCH}")
H=/tmp/h42
W=$H/RP
T0=$(date +%s)
export BENCH_VENV=${BENCH_VENV:-/work/main/.venv}
# The binary links libtorch from the venv; env.sh exports its paths (and cd's, so cd back).
if ! ldd "$BENCH" 2>/dev/null | grep -q 'libtorch.*=> /'; then
  # shellcheck disable=SC1091
  source /work/main/scripts/env.sh >/dev/null
fi
set +e +u +o pipefail
cd $H || exit 1
# Nothing from a CI job may change what bench does here (step summary, branch, PR).
unset CI GITHUB_ACTIONS GITHUB_BASE_REF GITHUB_HEAD_REF GITHUB_REF_NAME GITHUB_STEP_SUMMARY \
  GITHUB_EVENT_PATH GITHUB_SHA GITLAB_CI CI_API_V4_URL BENCH_HISTORY BENCH_GPU_HOUR_PRICE
export CUDA_VISIBLE_DEVICES=

if [ -z "${SHA:-}" ]; then
  root=$(git -C "$(dirname "$BENCH")" rev-parse --show-toplevel 2>/dev/null)
  if [ -n "$root" ]; then
    SHA=$(git -C "$root" rev-parse --short HEAD)
    [ -n "$(git -C "$root" status --porcelain --untracked-files=no)" ] && SHA=$SHA-dirty
  else
    SHA=unknown
  fi
fi
OUTMD=$H/replay-$SHA.md

rm -rf $W
mkdir -p $W/o $W/ok
ROWS=$W/rows.md
: > $ROWS
NOBL=$W/no-baselines   # a baselines folder that does not exist: every cell is new
cp -r base/sh1/R $W/ok/a
cp -r base/sh2/R $W/ok/b
OKA=$W/ok/a
OKB=$W/ok/b
SECRET="TOP SECRET"    # the content of /tmp/h42/secret.txt, which no output may hold

# ---------------------------------------------------------------- helpers
# x ID TIMEOUT CMD...: runs CMD (stdin closed) with stdout in $O, stderr in $E, exit code
# in $RC, seconds in $SECS; $G collects what no command may do (panic, exit 3, time out,
# raw ESC/BEL on the terminal).
x() {
  local id=$1 to=$2
  shift 2
  O=$W/o/$id.out
  E=$W/o/$id.err
  local t=$(date +%s.%N)
  if [ "$(type -t "$1")" = function ]; then
    # A function of this script (exported below) runs in a bash under the same timeout.
    timeout -k 5 "$to" bash -c '"$@"' bash "$@" > "$O" 2> "$E" < /dev/null
  else
    timeout -k 5 "$to" "$@" > "$O" 2> "$E" < /dev/null
  fi
  RC=$?
  SECS=$(echo "$(date +%s.%N) - $t" | bc)
  G=""
  [ "$RC" = 101 ] && G+=" PANIC(exit 101)"
  [ "$RC" = 3 ] && G+=" exit-3"
  { [ "$RC" = 124 ] || [ "$RC" = 137 ]; } && G+=" TIMEOUT(${to}s)"
  grep -q 'panicked' "$E" && G+=" panicked"
  grep -q $'[\x1b\x07]' "$O" && G+=" raw-ESC/BEL-on-stdout"
  grep -q $'[\x1b\x07]' "$E" && G+=" raw-ESC/BEL-on-stderr"
  ALLG+="$G"
}
# The first line of stderr that says something (an error or a warning), shown as text.
fe() { grep -m1 -E '^(error|warning|missing)' "$E" || grep -m1 -v '^\s*$' "$E"; }
# show TEXT: one table cell (no newline, no |, control characters written out).
show() {
  printf '%s' "$1" | tr '\n\t' '  ' | sed 's/|/\\|/g; s/\x1b/\\x1b/g; s/\x07/\\x07/g' | LC_ALL=C tr -c '[:print:]' '?' | cut -c1-330
}
PASSN=0
FAILN=0
FAILS=""
# rec CASE OBSERVED PROBLEMS: one table row; PASS when PROBLEMS is empty.
rec() {
  local v=PASS
  if [ -n "$3" ]; then
    v=FAIL
    FAILN=$((FAILN + 1))
    FAILS+="$1: $3"$'\n'
  else
    PASSN=$((PASSN + 1))
  fi
  local obs
  obs=$(show "$2")
  [ -n "$3" ] && obs="$obs; PROBLEM:$(show "$3")"
  printf '| %s | %s | %s |\n' "$1" "$obs" "$v" >> $ROWS
  printf '[%s] %s (%ss)\n' "$v" "$1" "$(($(date +%s) - T0))" >&2
}
# ok CASE WANT [STRING...]: the row of the last `x`: its exit code is one of WANT ("2",
# "0 2"), stderr or stdout holds each STRING (fixed strings), $X holds the row's other
# problems; the observation is the exit code and the first line of stderr (or $N).
ok() {
  local c=$1 want=$2 p bad="$G$X"
  shift 2
  case " $want " in *" $RC "*) ;; *) bad+=" exit $RC, documented: ${want// / or }" ;; esac
  for p in "$@"; do
    grep -qF -- "$p" "$E" "$O" || bad+=" no '$p' in the output"
  done
  rec "$c" "rc=$RC: ${N:-$(fe)}" "$bad"
  X=""
  N=""
}
X=""
N=""
ALLG=""
# sub: a part of a row made of several commands (flags, spellings): appends to $SUBOBS and
# $SUBBAD; `ok`'s checks for one of them. Then `rec CASE "$SUBOBS" "$SUBBAD"`.
sub() {
  local label=$1 want=$2 p bad="$G"
  shift 2
  case " $want " in *" $RC "*) ;; *) bad+=" exit $RC (documented ${want// / or })" ;; esac
  for p in "$@"; do
    grep -qF -- "$p" "$E" "$O" || bad+=" no '$p'"
  done
  SUBOBS+="$label rc=$RC; "
  [ -n "$bad" ] && SUBBAD+="[$label]$bad "
}
subreset() {
  SUBOBS=""
  SUBBAD=""
}
# noesc FILE...: the files hold no raw ESC or BEL.
noesc() {
  local f
  for f in "$@"; do
    [ -f "$f" ] || {
      X+=" $f missing"
      continue
    }
    grep -q $'[\x1b\x07]' "$f" && X+=" raw ESC/BEL in ${f#$W/}"
  done
}
nosecret() { grep -rqsF "$SECRET" "$@" && X+=" '$SECRET' (secret.txt) copied into ${1#$W/}"; }
keep() {
  local f
  for f in "$@"; do
    [ -e "$f" ] || [ -L "$f" ] || X+=" ${f#$W/} deleted"
  done
}
gone() {
  local f
  for f in "$@"; do
    { [ -e "$f" ] || [ -L "$f" ]; } && X+=" ${f#$W/} still there"
  done
}
# jget FILE EXPR: a Python expression over the JSON document d.
jget() { python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print($2)" "$1" 2> /dev/null; }
# costs REPORT_JSON: "sums ok" when each of the run's cost parts is the sum of its cells'.
costs() {
  python3 - "$1" << 'PY'
import json, math, sys
try:
    d = json.load(open(sys.argv[1]))
except Exception as e:
    print("unreadable", e); sys.exit()
c, cc = d.get("cost"), d.get("cell_costs")
if c is None or cc is None:
    print("no cost/cell_costs"); sys.exit()
bad = []
for k in ("measuring_gpu_s", "pairs_gpu_s", "reruns_gpu_s", "triage_gpu_s"):
    s = sum(x[k] for x in cc)
    if not math.isclose(s, c[k], rel_tol=1e-9, abs_tol=1e-6):
        bad.append("%s: cells add up to %g, run says %g" % (k, s, c[k]))
    if any(not isinstance(x[k], (int, float)) or x[k] < 0 for x in cc):
        bad.append(k + " negative")
ids = [x["cell_id"] for x in cc]
if len(ids) != len(set(ids)):
    bad.append("a cell listed twice")
print("MISMATCH " + "; ".join(bad) if bad else "sums ok")
PY
}
# One merge of two shards into OUT: merge A B OUT [flags].
merge2() {
  local a=$1 b=$2 o=$3
  shift 3
  "$BENCH" report merge "$a" "$b" -o "$o" "$@"
}
export BENCH H W
export -f merge2
# The script that starts a command in its own process group, signals the group when a line
# appears on its stderr (as a terminal's Ctrl-C does), and records the exit code, how long
# the command took after the signal, and any process of the group left running.
cat > $W/sigrun.py << 'PY'
import os, signal, subprocess, sys, time
out, sig, pat, delay = sys.argv[1], getattr(signal, sys.argv[2]), sys.argv[3], float(sys.argv[4])
cmd = sys.argv[sys.argv.index('--') + 1:]
os.makedirs(out, exist_ok=True)
def pre():
    os.setpgrp()
    for s in (signal.SIGINT, signal.SIGQUIT, signal.SIGTERM, signal.SIGPIPE):
        signal.signal(s, signal.SIG_DFL)
p = subprocess.Popen(cmd, stdout=open(out + '/out', 'wb'), stderr=open(out + '/err', 'wb'),
                     stdin=subprocess.DEVNULL, preexec_fn=pre)
t0 = time.time()
seen = False
while time.time() - t0 < 120:
    if pat.encode() in open(out + '/err', 'rb').read():
        seen = True
        break
    if p.poll() is not None:
        break
    time.sleep(0.05)
time.sleep(delay)
ts = time.time()
try:
    os.killpg(p.pid, sig)
except Exception:
    pass
try:
    rc = p.wait(timeout=90)
except subprocess.TimeoutExpired:
    os.killpg(p.pid, signal.SIGKILL)
    rc = 'still running 90 s after the signal'
after = time.time() - ts
time.sleep(0.5)
try:
    os.killpg(p.pid, 0)
    left = 'yes'
    os.killpg(p.pid, signal.SIGKILL)
except ProcessLookupError:
    left = 'no'
print('rc=%s seen=%s after=%.1f left=%s' % (rc, seen, after, left))
PY
# closedpipe CMD...: runs CMD with stdout a pipe whose reader is gone; prints its exit code
# and stderr.
cat > $W/closedpipe.py << 'PY'
import os, subprocess, sys
r, w = os.pipe(); os.close(r)
p = subprocess.run(sys.argv[1:], stdout=w, stderr=subprocess.PIPE, timeout=120)
os.close(w)
print('rc', p.returncode, '| stderr:', p.stderr[:300])
PY

# ---------------------------------------------------------------- forged shards
# Each forgery of round A (forge.sh NAME CODE) made again from the two clean shards, with
# the edit results.md names (A, B: the shards' results.json; PA, PB: their shard.json).
python3 - "$W/f" << 'PY'
import copy, json, os, shutil, sys
root = sys.argv[1]
F = {
 'm01_plans_disagree': "PB['cells'][0]['shard']=2; PB['cells'][1]['shard']=1",
 'm01b_plan_params': "PB['cells'][0]['cell']['params']['steps']=999",
 'm01c_plan_extra_cell': "g=copy.deepcopy(PB['cells'][1]); g['shard']=2; g['cell']['id']='ghost.x'; PB['cells'].append(g)",
 'm01d_plan_expected': "PB['cells'][0]['expected_gpu_s']=123.0",
 'm01e_plan_count': "PB['shard']['count']=3",
 'm02_dup_in_shard': "A['cells'].append(copy.deepcopy(A['cells'][0]))",
 'm03_cell_two_shards': "B['cells'].append(copy.deepcopy(A['cells'][0]))",
 'm04_cell_no_plan': "g=copy.deepcopy(A['cells'][0]); g['id']='ghost.fp32.1gpu.single.base'; B['cells'].append(g)",
 'm05_matrix_sha': "B['matrix_sha256']='0'*64",
 'm06_commit': "A['environment']['git_commit']='a'*40; B['environment']['git_commit']='b'*40",
 'm07_libtorch': "B['environment']['libtorch']='2.10.0+cu128'",
 'm08_driver': "B['environment']['driver']='580.95.05'",
 'm09_1e308': "m=A['cells'][0]['metrics']['tokens_per_s']; m['value']=1e308; m['samples']=[1e308,1e308]",
 'm10_neg': "m=A['cells'][0]['metrics']['tokens_per_s']; m['value']=-5.0; m['samples']=[-5.0,-5.0]",
 'm15_dur1e20': "A['cells'][0]['duration_s']=1e20",
 'm15b_attempt_dur1e20': "A['cells'][0]['attempts'][0]['duration_s']=1e20",
 'm15c_dur_neg': "A['cells'][0]['duration_s']=-3.0",
 'm19_interrupted': "A['interrupted']=True",
 'v1_sample_1e308': "m=A['cells'][0]['metrics']['tokens_per_s']; m['samples']=[1e308,36000.0]",
 'v2_relspread_neg': "A['cells'][0]['metrics']['tokens_per_s']['rel_spread']=-1.0",
 'v3_tflops_1e308': "A['cells'][0]['metrics']['tflops_per_gpu']['value']=1e308",
 'v4_steptime_neg': "A['cells'][0]['metrics']['step_time_s']['value']=-0.01",
 'v5_status_bogus': "A['cells'][0]['status']='bogus'",
 'v6_step_in_repeat_1e308': "A['cells'][0]['repeats'][0]['steps'][3]['step_time_s']=1e308",
 'v7_hwkey_esc': "A['environment']['hardware_key']='a\\x1b]0;t\\x07'; PA['hardware_key']='a\\x1b]0;t\\x07'",
 'v8_cellid_esc': "A['cells'][0]['id']='gpt2\\x1b]0;t\\x07'",
 'v9_runid_esc': "[d.__setitem__('run_id','R\\x1b[2J') for d in (A,B,PA,PB)]",
 'v10_matrixname_esc': "A['matrix_name']=B['matrix_name']='smoke\\x1b]0;t\\x07'",
 'v11_env_cpu_esc_bidi': "[(d['environment'].__setitem__('cpu','AMD \\x1b[31mEPYC'), d['environment'].__setitem__('host','vm\\u202egpj.exe')) for d in (A,B)]",
 'v12_unknown_metric_esc': "A['cells'][0]['metrics']['evil\\x1b]0;x\\x07']={'value':1.0,'samples':[1.0],'rel_spread':0.0}",
 'v13_rel_spread_1e308': "A['cells'][0]['metrics']['tokens_per_s']['rel_spread']=1e308",
 'v14_loss_nan': "A['cells'][0]['repeats'][0]['steps'][3]['loss']=float('nan')",
 'v15_tokens_neg': "A['cells'][0]['repeats'][0]['steps'][3]['tokens']=-512",
 'x01_logs_abs_paths': "A['cells'][0]['logs']=['/tmp/h42/secret.txt','../../../../../tmp/h42/secret.txt']",
 'x12_no_shardjson': "",
 'x13_shard_index0': "PB['shard']['index']=0",
 'x14_both_index1': "PB['shard']['index']=1",
 'x15_runid_differs': "B['run_id']=PB['run_id']='R2'",
 'x21_hwkey_other': "A['environment'].update(hardware_key='h100-sxm-80gb', gpu_count=1, gpu_model='NVIDIA H100 80GB HBM3')",
 'R2': "[d.__setitem__('run_id','R2') for d in (A,B,PA,PB)]",
 'N-m_runid_newline': "[d.__setitem__('run_id','R2\\nnotes.txt') for d in (A,B,PA,PB)]",
 'm13_symlink_log': "",
 'm13b_symlink_dir': "",
 'm13c_logs_is_link': "",
 'm13d_fifo_log': "",
}
for n, code in F.items():
    d = os.path.join(root, n)
    shutil.copytree('/tmp/h42/base/sh1/R', d + '/a', symlinks=True)
    shutil.copytree('/tmp/h42/base/sh2/R', d + '/b', symlinks=True)
    A = json.load(open(d + '/a/results.json')); B = json.load(open(d + '/b/results.json'))
    PA = json.load(open(d + '/a/shard.json')); PB = json.load(open(d + '/b/shard.json'))
    exec(code)
    json.dump(A, open(d + '/a/results.json', 'w'), indent=1); json.dump(B, open(d + '/b/results.json', 'w'), indent=1)
    json.dump(PA, open(d + '/a/shard.json', 'w'), indent=1); json.dump(PB, open(d + '/b/shard.json', 'w'), indent=1)
os.remove(root + '/x12_no_shardjson/b/shard.json')
os.symlink('/tmp/h42/secret.txt', root + '/m13_symlink_log/a/logs/evil.log')
os.symlink('/etc', root + '/m13b_symlink_dir/a/logs/etc')
shutil.rmtree(root + '/m13c_logs_is_link/a/logs'); os.symlink('/etc', root + '/m13c_logs_is_link/a/logs')
os.mkfifo(root + '/m13d_fifo_log/a/logs/fifo.log')
PY
FD=$W/f

# ================================================================ the night with a hostile commit (E1-E8, C-1)
E_=$W/esc
mkdir -p $E_/tmp
cp t/esc/history.pre6.sqlite $E_/h.sqlite
night() { # night HISTORY RESULTS RUN_ID [flags]: a night of the toy repository as its CI runs it
  env -C $H/t/esc/repo GITHUB_REF_NAME=main TMPDIR=$E_/tmp "$BENCH" matrix matrix.yaml --no-progress \
    --run-id "$3" --results-dir "$2" --baselines $H/t/esc/baselines --history "$1" "${@:4}"
}
export E_
export -f night
x n6 300 night $E_/h.sqlite $E_/results night6
N6O=$O
N6E=$E
N6G=$G
N6RC=$RC
R6=$E_/results/night6
n6() { O=$N6O E=$N6E RC=$N6RC G=$N6G; }
ok "R:E1 escapes: stdout of a triaged night (subject/author/kernel)" 1 'evil\x1b]0;k\x07_'
n6
N="$(grep -m1 'bisect: measuring' $N6E | cut -c1-160)"
ok "R:E2 escapes: stderr 'bisect: measuring (subject)'" 1 'bisect: measuring'
n6
noesc $R6/summary.txt
N="summary.txt: $(grep -m1 '^result' $R6/summary.txt)"
ok "R:E3 escapes: summary.txt" 1
n6
noesc $R6/summary.md
grep -qF '](javascript' $R6/summary.md && X+=" a live javascript: link in summary.md"
grep -qF '\[c\]\(javascript' $R6/summary.md || X+=" the subject's link is not written out"
N="summary.md: $(grep -c $'\x1b' $R6/summary.md) ESC, $(grep -c '](javascript' $R6/summary.md) live links"
ok "R:E4 escapes+links: summary.md" 1
x e5 60 "$BENCH" report post $R6 --dry-run --baselines $H/t/esc/baselines
grep -qF '](javascript' $O && X+=" a live javascript: link in the comment"
N="$(grep -c '](javascript' $O) live links, $(wc -c < $O) bytes"
ok "R:E5 escapes+links: report post --dry-run" 1 'javascript'
cp -r t/esc/n6nl $W/n6nl
rm -f $W/n6nl/summary.* $W/n6nl/report.* $W/n6nl/junit.xml
x e6 60 "$BENCH" report $W/n6nl --baselines $H/t/esc/baselines
grep -q '^result: ok' $O && X+=" a line of stdout starts 'result: ok'"
grep -q '^result: ok' $W/n6nl/summary.txt $W/n6nl/summary.md && X+=" a line of a summary starts 'result: ok'"
N="$(grep -c '^result' $O) result line: $(grep '^result' $O | cut -c1-60)"
ok "R:E6 triage.json subject with \\n + 'result: ok (exit 0)' via bench report" 1 'fix\nresult: ok (exit 0)'
n6
noesc $R6/report.html $R6/junit.xml $R6/report.json
grep -qi 'href="javascript' $R6/report.html && X+=" href=javascript in report.html"
N="report.html/junit.xml/report.json of night6"
ok "R:E8_html_json_junit_escape" 1
n6
N="$(costs $R6/report.json)"
[ "$N" = "sums ok" ] || X+=" $N"
ok "V:C-1 cell_costs of a plain --history night with side by side + bisect" 1

# Ctrl-C or SIGTERM while a triage or confirmation setup runs: exit 130, and every output
# says 130; nothing of the group left running.
ctrlc() { # ctrlc CASE NAME SIGNAL PATTERN
  local d=$W/sig/$2
  mkdir -p $d
  cp t/esc/history.pre6.sqlite $d/h.sqlite
  local s
  s=$(python3 $W/sigrun.py $d "$3" "$4" 1 -- env -C $H/t/esc/repo GITHUB_REF_NAME=main TMPDIR=$E_/tmp \
    "$BENCH" matrix matrix.yaml --no-progress --run-id "$2" --results-dir $d/results \
    --baselines $H/t/esc/baselines --history $d/h.sqlite --triage-setup 'sleep 8.042')
  O=$d/out E=$d/err RC=$(echo "$s" | sed -n 's/^rc=\([^ ]*\).*/\1/p') G=""
  grep -q panicked $E && G+=" panicked"
  grep -q $'[\x1b\x07]' $O $E && G+=" raw ESC/BEL on the terminal"
  echo "$s" | grep -q 'seen=True' || X+=" '$4' never appeared"
  echo "$s" | grep -q 'left=no' || X+=" a process of the group outlived bench"
  sleep 0.5
  # The setup's own command line (sleep 8.042, used nowhere else) finds what was left.
  local left
  left=$(pgrep -f 'sleep 8\.042')
  if [ -n "$left" ]; then
    X+=" the setup 'sleep 8.042' still runs"
    kill $left
  fi

  local after
  after=$(echo "$s" | sed -n 's/.*after=\([0-9.]*\).*/\1/p')
  [ "$(echo "${after:-99} < 10" | bc)" = 1 ] || X+=" exited ${after}s after the signal"
  local sum=$d/results/$2/summary.txt
  grep -q 'INTERRUPTED (exit 130)' $sum 2> /dev/null || X+=" summary.txt: $(grep -m1 '^result' $sum 2> /dev/null)"
  [ "$(jget $d/results/$2/report.json "d['exit_code']")" = 130 ] || X+=" report.json exit_code $(jget $d/results/$2/report.json "d['exit_code']")"
  N="$s; $(grep -m1 '^result' $sum 2> /dev/null | cut -c1-90)"
  ok "$1" 130
}
ctrlc "R:E7 Ctrl-C during triage setup" e7 SIGINT 'setup at c85650e'
ctrlc "R:N1 Ctrl-C during side-by-side confirmation's setup / V:1" n1 SIGINT 'setup at f9d9c11f88'
ctrlc "R:N1b_sigterm_side_by_side_setup / V:2" n1b SIGTERM 'setup at f9d9c11f88'

# ================================================================ merged shards (round A's forgeries)
mf() { # mf CASE NAME WANT STRINGS...: merge the forged shards of NAME
  local c=$1 n=$2 w=$3
  shift 3
  x "$n.merge" 120 merge2 $FD/$n/a $FD/$n/b $FD/$n/out
  ok "$c" "$w" "$@"
}
mf R:m01_plans_disagree m01_plans_disagree 2 'b/shard.json' 'plans'
mf "R:m01b_plan_params / V:9" m01b_plan_params 2 'b/shard.json' 'planned with other parameters'
mf R:m01c_plan_extra_cell m01c_plan_extra_cell 2 'b/shard.json' 'ghost.x'
mf R:m01d_plan_expected m01d_plan_expected "0 2"
mf R:m01e_plan_count m01e_plan_count 2 'b/shard.json'
mf R:m02_dup_in_shard m02_dup_in_shard 2 'a/results.json' 'listed twice'
mf R:m03_cell_two_shards m03_cell_two_shards 2 'b/results.json' 'is a cell of shard 1/2'
mf R:m04_cell_no_plan m04_cell_no_plan 2 'b/results.json' "in no shard's plan"
mf R:m05_matrix_sha m05_matrix_sha 2 'b/results.json' 'matrix_sha256'
mf R:m06_commit m06_commit 2 'environment.git_commit'
mf R:m07_libtorch m07_libtorch 2 'environment.libtorch'
mf R:m08_driver m08_driver 2 'environment.driver'
mf R:m09_1e308 m09_1e308 2 'a/results.json' 'tokens_per_s is 1e308'
mf R:m10_neg m10_neg 2 'a/results.json' 'tokens_per_s is -5'
mf R:m15_dur1e20_merge m15_dur1e20 2 'a/results.json' 'duration_s is 1e20'
mf R:m15b_attempt_dur1e20_merge m15b_attempt_dur1e20 2 'attempts[0].duration_s is 1e20'
mf R:m15c_dur_neg_merge m15c_dur_neg 2 'duration_s is -3'
mf R:v1_sample_1e308 v1_sample_1e308 2 'samples[0]' '1e308'
mf R:v2_relspread_neg v2_relspread_neg 2 'rel_spread'
mf R:v3_tflops_1e308 v3_tflops_1e308 2 'tflops_per_gpu is 1e308'
mf R:v4_steptime_neg v4_steptime_neg 2 'step_time_s is -1e-2'
x v5.merge 120 merge2 $FD/v5_status_bogus/a $FD/v5_status_bogus/b $FD/v5_status_bogus/out
grep -qE 'results\.json:[0-9]+:[0-9]+' $E || X+=" no results.json:LINE:COL"
ok R:v5_status_bogus 2 'unknown variant `bogus`'
mf R:v6_step_in_repeat_1e308 v6_step_in_repeat_1e308 2 'repeats[0].steps[3].step_time_s'
mf R:v13_rel_spread_1e308 v13_rel_spread_1e308 2 'rel_spread: 1e308'
x v14.merge 120 merge2 $FD/v14_loss_nan/a $FD/v14_loss_nan/b $FD/v14_loss_nan/out
grep -qE 'results\.json:[0-9]+:[0-9]+' $E || X+=" no results.json:LINE:COL"
ok R:v14_loss_nan 2 'malformed results'
x v15.merge 120 merge2 $FD/v15_tokens_neg/a $FD/v15_tokens_neg/b $FD/v15_tokens_neg/out
grep -qE 'results\.json:[0-9]+:[0-9]+' $E || X+=" no results.json:LINE:COL"
ok R:v15_tokens_neg 2 '-512'
mf R:v8_cellid_esc v8_cellid_esc 2 'gpt2\x1b]0;t\x07'
mf R:v9_runid_esc v9_runid_esc 2 'R\x1b[2J'
mf R:x12_no_shardjson x12_no_shardjson 2 'shard 1/1'
mf R:x13_shard_index0 x13_shard_index0 2 'shard.index 0'
mf R:x14_both_index1 x14_both_index1 2 'both hold shard 1/2'

# One hardware key with an escape, at every door that reads it.
subreset
V7=$FD/v7_hwkey_esc
x v7m 60 merge2 $V7/a $V7/b $V7/out
sub merge 2 'a\x1b]0;t\x07'
cp -r $V7/a $W/v7a
x v7r 60 "$BENCH" report $W/v7a --baselines $NOBL
sub report 2 'a\x1b]0;t\x07'
x v7i 60 "$BENCH" history import $V7/a --history $W/v7.sqlite
sub 'history import' 2 'a\x1b]0;t\x07'
x v7h 60 "$BENCH" report html $V7/a -o $W/v7.html
sub 'report html' 2 'a\x1b]0;t\x07'
x v7b 60 "$BENCH" baseline update $V7/a --baselines $W/v7bl
sub 'baseline update' 2 'a\x1b]0;t\x07'
rec R:v7_hwkey_esc "$SUBOBS" "$SUBBAD"

# Text a shard carries (matrix name, cpu, host, metric names) is text in every output.
for n in v10_matrixname_esc v11_env_cpu_esc_bidi v12_unknown_metric_esc; do
  x $n.merge 120 merge2 $FD/$n/a $FD/$n/b $FD/$n/out
  for f in $(find $FD/$n/out -type f); do noesc $f; done
  N="$(grep -m1 '^result' $O); $(find $FD/$n/out -type f | xargs grep -l $'[\x1b\x07]' 2> /dev/null | wc -l) output files with raw ESC/BEL"
  ok "R:$n" 0
done

# An interrupted shard: the merge's exit code is the one every output states.
x m19 120 merge2 $FD/m19_interrupted/a $FD/m19_interrupted/b $FD/m19_interrupted/out
M19=$FD/m19_interrupted/out
M19RC=$RC
grep -q "(exit $RC)" $M19/summary.txt 2> /dev/null || X+=" summary.txt: $(grep -m1 '^result' $M19/summary.txt 2> /dev/null)"
[ "$(jget $M19/report.json "d['exit_code']")" = "$RC" ] || X+=" report.json exit_code $(jget $M19/report.json "d['exit_code']")"
jf=$(grep -o 'failures="[0-9]*"' $M19/junit.xml 2> /dev/null | head -1)
{ [ "$RC" != 0 ] && [ "$jf" = 'failures="0"' ]; } && X+=" junit has no failure"
N="$(grep -m1 '^result' $M19/summary.txt 2> /dev/null); report.json $(jget $M19/report.json "d['exit_code']"); junit $jf"
ok R:m19_interrupted_shard "1 130"
x m19r 60 "$BENCH" report $M19 --baselines $NOBL
grep -q "^result: .*(exit $RC)" $O || X+=" stdout's result line does not say exit $RC"
N="$(grep -m1 '^result' $O)"
ok R:m19_report_later "$M19RC"

cp -r $FD/m15_dur1e20/a $W/m15a
x m15r 60 "$BENCH" report $W/m15a --baselines $NOBL
ok R:m15_dur1e20_report 2 'duration_s is 1e20'
cp -r $FD/m15b_attempt_dur1e20/a $W/m15ba
x m15br 60 "$BENCH" report $W/m15ba --baselines $NOBL
ok R:m15b_attempt_dur1e20_report 2 'attempts[0].duration_s is 1e20'
x m15i 60 "$BENCH" history import $FD/m15_dur1e20/a --history $W/m15.sqlite
ok R:m15_dur1e20_import 2 'duration_s is 1e20'

# Links and FIFOs in a shard's logs/, and log paths outside the shard.
x m13 120 merge2 $FD/m13_symlink_log/a $FD/m13_symlink_log/b $FD/m13_symlink_log/out
gone $FD/m13_symlink_log/out/logs/evil.log
nosecret $FD/m13_symlink_log/out
ok R:m13_symlink_log 0
x m13b 120 merge2 $FD/m13b_symlink_dir/a $FD/m13b_symlink_dir/b $FD/m13b_symlink_dir/out
gone $FD/m13b_symlink_dir/out/logs/etc
grep -rqs 'root:x:0' $FD/m13b_symlink_dir/out && X+=" /etc/passwd copied"
ok R:m13b_symlink_dir 0
x m13c 120 merge2 $FD/m13c_logs_is_link/a $FD/m13c_logs_is_link/b $FD/m13c_logs_is_link/out
[ -e $FD/m13c_logs_is_link/out/logs/passwd ] && X+=" /etc copied into logs/"
grep -rqs 'root:x:0' $FD/m13c_logs_is_link/out && X+=" /etc/passwd copied"
ok R:m13c_logs_is_link 0
x m13d 30 merge2 $FD/m13d_fifo_log/a $FD/m13d_fifo_log/b $FD/m13d_fifo_log/out
N="${SECS}s"
ok R:m13d_fifo_log 0
x x01 120 merge2 $FD/x01_logs_abs_paths/a $FD/x01_logs_abs_paths/b $FD/x01_logs_abs_paths/out
nosecret $FD/x01_logs_abs_paths/out
ok R:x01_logs_abs_paths 0
cp -r t/x02/res/F $W/x02
rm -f $W/x02/summary.* $W/x02/report.* $W/x02/junit.xml
x x02 60 "$BENCH" report $W/x02 --baselines $NOBL
nosecret $W/x02 $O $E
ok R:x02_failed_cell_log_outside 1

# The baselines a merge judges against: refused (file:line:col, key path) before anything
# is written.
x m24 60 merge2 $OKA $OKB $W/m24out --baselines t/m24/bl
gone $W/m24out
ok R:m24_bad_baseline 2 'cpu-x86_64.yaml:2:37'
for v in v-5:value_-5 v.inf:value_.inf v.nan:value_.nan v0:value_0 v1e308:value_1e308 tol-1:tol_-1 tol.nan:tol_nan; do
  d=${v%%:*}
  at=':19:16:'
  case $d in tol*) at=':21:20:' ;; esac
  x bl_$d 60 merge2 $OKA $OKB $W/bl_$d --baselines t/bl/$d
  ok "R:bl_${v#*:}" 2 "cpu-x86_64.yaml$at"
done
x bl_tol1e308 60 merge2 $OKA $OKB $W/bl_tol1e308 --baselines t/bl/tol1e308
ok R:bl_tol_1e308 "0 2"

# ================================================================ fleets and --expect-kinds
FL=$W/fl
mkdir -p $FL
x f1 120 merge2 $OKA $OKB $FL/o1 --expect-kinds cpu,h100=2
F1O=$O
F1RC=$RC
for f in summary.md junit.xml report.json fleet.json; do
  grep -q h100 $FL/o1/$f 2> /dev/null || X+=" h100 not named in $f"
done
x f1post 60 "$BENCH" report post $FL/o1 --dry-run
grep -q h100 $O || X+=" h100 not named in the comment"
O=$F1O E=$W/o/f1.err RC=$F1RC G=""
N="stderr: $(grep -m1 '^missing' $E)"
ok R:f1_missing_kind 1 'missing: hardware kind h100'
[ "$(tail -1 $F1O)" = "result: FAILED (exit 1)" ] || X+=" the last line of stdout is '$(tail -1 $F1O)'"
N="last stdout line: $(tail -1 $F1O)"
ok "R:N2_fleet_stdout_verdict / V:10" 1
x f1j 120 merge2 $OKA $OKB $FL/o1j --expect-kinds cpu,h100=2 --format json
N=$(python3 -c "
import json,sys
d=json.load(open(sys.argv[1]))
print('one JSON document: exit_code=%s missing=%s' % (d.get('exit_code'), str(d.get('missing'))[:80]))
" $O 2>&1 | tail -1)
[ "$(jget $O "d['exit_code']")" = 1 ] || X+=" stdout is not one JSON document with exit_code 1"
jget $O "d['missing']" | grep -q h100 || X+=" h100 not in 'missing'"
ok "R:N3_fleet_json_verdict / V:11" 1
subreset
x f2a 60 merge2 $OKA $OKB $FL/o_cpu3 --expect-kinds cpu=3
sub cpu=3 1 'run R has 2 shards, 3 expected'
x f2b 60 merge2 $OKA $OKB $FL/o_cpu1 --expect-kinds cpu=1
sub cpu=1 1 '1 expected'
rec R:f2_shardcount_mismatch "$SUBOBS" "$SUBBAD"
subreset
i=0
for k in cpu=0 cpu=-1 cpu=abc =2 '' cpu=2, h100=99999999999999999999 $'h\x1b]0;t\x07'; do
  i=$((i + 1))
  x f3_$i 60 merge2 $OKA $OKB $FL/o_f3_$i --expect-kinds="$k"
  sub "$(show "$k")" 2 '--expect-kinds'
done
gone $FL/o_f3_1
[ -n "$X" ] && SUBBAD+="$X"
X=""
rec R:f3_expect_bad_values "$SUBOBS" "$SUBBAD"
x f3b 60 merge2 $OKA $OKB $FL/o_dup --expect-kinds cpu,cpu
ok R:f3b_expect_dup "0 2"
x f3c 60 merge2 $OKA $OKB $FL/o_CPU --expect-kinds CPU
ok R:f3c_expect_case 1 'CPU'
x x15 120 merge2 $FD/x15_runid_differs/a $FD/x15_runid_differs/b $FD/x15_runid_differs/out
ok R:x15_runid_differs 1 'shard 2/2: missing' 'shard 1/2: missing'
x x16 60 "$BENCH" report merge $FL/o1 -o $W/x16
ok R:x16_merge_fleet_output 2 'not the folder of a `bench matrix` run'
x x17 60 "$BENCH" report $FL/o1 --baselines $NOBL
ok R:x17_report_fleet 2 'the folder of a fleet'
# A fleet merged again over its own output, and a single run over a former fleet folder.
subreset
x 8b1 120 merge2 $OKA $OKB $FL/fl --expect-kinds cpu
sub 'fleet' 0
x 8b2 120 merge2 $OKA $OKB $FL/fl --expect-kinds cpu
sub 'again' 0
x 8b3 120 merge2 $OKA $OKB $FL/o1 --expect-kinds cpu,h100=2
sub 'missing-h100 again' 1
x 8b4 120 "$BENCH" report merge $OKA $OKB $FD/R2/a $FD/R2/b -o $FL/fm
sub '2-run fleet' 0
x 8b5 120 "$BENCH" report merge $OKA $OKB $FD/R2/a $FD/R2/b -o $FL/fm
sub 'again' 0
x 8b6 120 merge2 $OKA $OKB $FL/fm
sub 'one run over it' 0
gone $FL/fm/cpu-x86_64.R2
SUBBAD+="$X"
X=""
rec "V:8b fleet re-merge over own output" "$SUBOBS" "$SUBBAD"

# ================================================================ the merge's output folder
MG=$W/mo
mkdir -p $MG
x m12a 120 merge2 $OKA $OKB $MG/reuse
for f in history.json triage.json fleet.json; do echo '{bogus' > $MG/reuse/$f; done
x m12 120 merge2 $OKA $OKB $MG/reuse
if [ "$RC" = 2 ]; then
  keep $MG/reuse/history.json $MG/reuse/triage.json $MG/reuse/fleet.json
  grep -q 'history.json' $E || X+=" the refusal does not name history.json"
else
  gone $MG/reuse/history.json $MG/reuse/triage.json $MG/reuse/fleet.json
fi
ok R:m12_reuse "0 2"
mkdir -p $MG/foreign
echo precious > $MG/foreign/notes.txt
x m12c 60 merge2 $OKA $OKB $MG/foreign
keep $MG/foreign/notes.txt
ok R:m12c_foreign_out 2 'not an earlier merge'
mkdir -p $MG/fake/src
echo '{}' > $MG/fake/shards.json
echo 'fn main() {}' > $MG/fake/src/main.rs
x m12d 60 merge2 $OKA $OKB $MG/fake
keep $MG/fake/shards.json $MG/fake/src/main.rs
ok R:m12d_fake_marker 2
x m12e0 120 merge2 $OKA $OKB $MG/notes
echo precious > $MG/notes/notes.txt
x m12e 60 merge2 $OKA $OKB $MG/notes
keep $MG/notes/notes.txt
ok "R:m12e_merge_out_plus_user_file / V:7" 2 'notes.txt'
# Inputs inside the output, the output an input.
x n8a 120 merge2 $OKA $OKB $MG/bl
mkdir $MG/bl/bl
cp t/bl/good/cpu-x86_64.yaml $MG/bl/bl/
x n8 60 merge2 $OKA $OKB $MG/bl --baselines $MG/bl/bl
keep $MG/bl/bl/cpu-x86_64.yaml
ok "R:N8_merge_baselines_inside_out / V:6" 2 '--baselines' 'is inside -o'
ln -s /tmp/h42/nonexistent/x $MG/dangling
x md 60 merge2 $OKA $OKB $MG/dangling
ok R:merge_dangling 2 'a symbolic link to /tmp/h42/nonexistent/x, which does not exist'
echo f > $MG/afile
subreset
x mf1 60 merge2 $OKA $OKB $MG/afile
sub 'file' 2 'not a folder but a file'
x mf2 60 merge2 $OKA $OKB /proc/x
sub '/proc/x' 2 '/proc'
rec R:merge_file_proc "$SUBOBS" "$SUBBAD"
a_sum=$(md5sum $OKA/results.json)
x mi 60 merge2 $OKA $OKB $OKA
[ "$(md5sum $OKA/results.json)" = "$a_sum" ] || X+=" the input's results.json changed"
ok R:merge_out_is_input 2 'one folder'
subreset
x x10 60 merge2 $OKA $OKA $W/x10out
sub 'a a' 2 'both hold shard 1/2'
ln -s $OKA $W/alink
x x10b 60 merge2 $OKA $W/alink $W/x10out
sub 'a alink' 2 'both hold shard 1/2'
rec R:x10_merge_same_shard_twice "$SUBOBS" "$SUBBAD"
x x11 60 "$BENCH" report merge $OKA -o $W/x11out
ok R:x11_merge_one_shard_missing 1 'shard 2/2: missing'

# ================================================================ round B: .bench-written, inputs inside -o
NB=$W/n
mkdir -p $NB/victim
echo keep > $NB/victim/k.txt
echo keep > $NB/keep_outside.txt
"$BENCH" history import $OKA --history $NB/s2.sqlite > /dev/null 2>&1
subreset
x 8a1 120 merge2 $OKA $OKB $NB/mg
sub merge 0
x 8a2 120 merge2 $OKA $OKB $NB/mg
sub 'merge again' 0
x 8a3 60 "$BENCH" site --history $NB/s2.sqlite -o $NB/site
sub site 0
x 8a4 60 "$BENCH" site --history $NB/s2.sqlite -o $NB/site
sub 'site again' 0
rec "V:8a re-run over own output" "$SUBOBS" "$SUBBAD"

x na0 120 merge2 $OKA $OKB $NB/o1
echo p > $NB/o1/logs/precious.txt
x na 60 merge2 $OKA $OKB $NB/o1
keep $NB/o1/logs/precious.txt
ok "V:N-a user file inside a listed subfolder (merge)" 2 'logs/precious.txt'
x nb0 60 "$BENCH" site --history $NB/s2.sqlite -o $NB/s1
echo p > $NB/s1/cells/CNAME
echo p > $NB/s1/assets/custom.css
x nb 60 "$BENCH" site --history $NB/s2.sqlite -o $NB/s1
keep $NB/s1/cells/CNAME $NB/s1/assets/custom.css
ok "V:N-b user file inside a listed subfolder (site)" 2 'cells/CNAME' 'assets/custom.css'
subreset
x nc0 120 merge2 $OKA $OKB $NB/g
rm $NB/g/.bench-written
echo p > $NB/g/notes.txt
x nc1 60 merge2 $OKA $OKB $NB/g
sub merge 2 'no readable .bench-written'
x nc2 120 merge2 $OKA $OKB $NB/gf --expect-kinds cpu
rm $NB/gf/.bench-written
echo p > $NB/gf/notes.txt
x nc3 60 merge2 $OKA $OKB $NB/gf --expect-kinds cpu
sub fleet 2 'no readable .bench-written'
x nc4 60 "$BENCH" site --history $NB/s2.sqlite -o $NB/gs
rm $NB/gs/.bench-written
echo p > $NB/gs/CNAME
x nc5 60 "$BENCH" site --history $NB/s2.sqlite -o $NB/gs
sub site 2 'no readable .bench-written'
keep $NB/g/notes.txt $NB/gf/notes.txt $NB/gs/CNAME
SUBBAD+="$X"
X=""
rec "V:N-c output with no .bench-written + a user file (merge, fleet, site)" "$SUBOBS" "$SUBBAD"
subreset
x nd0 120 merge2 $OKA $OKB $NB/gd
rm $NB/gd/.bench-written
mkdir $NB/gd/.bench-written
echo p > $NB/gd/notes.txt
x nd1 30 merge2 $OKA $OKB $NB/gd
sub 'list a folder' 2
x nd2 120 merge2 $OKA $OKB $NB/gp
rm $NB/gp/.bench-written
mkfifo $NB/gp/.bench-written
echo p > $NB/gp/notes.txt
x nd3 30 merge2 $OKA $OKB $NB/gp
sub 'list a FIFO' 2
keep $NB/gd/notes.txt $NB/gp/notes.txt
SUBBAD+="$X"
X=""
rec "V:N-d .bench-written a dir / fifo (+ notes.txt)" "$SUBOBS" "$SUBBAD"
x ne0 120 merge2 $OKA $OKB $NB/hu
python3 -c "
import sys
with open(sys.argv[1], 'a') as f:
    for i in range(500000): f.write('pad%06d\n' % i)" $NB/hu/.bench-written
echo p > $NB/hu/notes.txt
x ne 60 merge2 $OKA $OKB $NB/hu
keep $NB/hu/notes.txt
N="list $(wc -c < $NB/hu/.bench-written) bytes: $(fe)"
ok "V:N-e list over 4 MiB (+notes.txt unlisted)" 2 'notes.txt'
x nf0 120 merge2 $OKA $OKB $NB/nu
printf '\xff\xfe\n' >> $NB/nu/.bench-written
echo p > $NB/nu/notes.txt
x nf 60 merge2 $OKA $OKB $NB/nu
keep $NB/nu/notes.txt
ok "V:N-f list with one non-UTF-8 line (+notes.txt unlisted)" 2
subreset
i=0
for entry in '..' '/' '../victim' "$NB/victim" '' '.' 'logs/../../victim' '../keep_outside.txt'; do
  i=$((i + 1))
  x ng0_$i 120 merge2 $OKA $OKB $NB/f$i
  printf '%s\n' "$entry" >> $NB/f$i/.bench-written
  x ng_$i 60 merge2 $OKA $OKB $NB/f$i
  sub "'$entry'" "0 2"
  rm -rf $NB/f$i
done
keep $NB/victim/k.txt $NB/keep_outside.txt
SUBBAD+="$X"
X=""
rec "V:N-g forged list naming .. / / ../victim / abs path / '' / . / logs/../../victim" "$SUBOBS" "$SUBBAD"
x nh0 120 merge2 $OKA $OKB $NB/fh
rm -r $NB/fh/logs $NB/fh/report.json
ln -s ../victim $NB/fh/logs
ln -s ../keep_outside.txt $NB/fh/report.json
x nh 60 merge2 $OKA $OKB $NB/fh
keep $NB/victim/k.txt $NB/keep_outside.txt
ok "V:N-h listed entries replaced by links outside" "0 2"
subreset
x ni0 120 merge2 $OKA $OKB $NB/real
ln -s real $NB/lnk
x ni1 120 merge2 $OKA $OKB $NB/lnk
sub 'link to a merge' 0
[ -L $NB/lnk ] || SUBBAD+=" the link -o named was replaced by a folder"
mkdir $NB/real2
echo p > $NB/real2/user.txt
ln -s real2 $NB/lnk2
x ni2 60 merge2 $OKA $OKB $NB/lnk2
sub 'link to a user folder' 2
keep $NB/real2/user.txt
ln -s nowhere $NB/dang
x ni3 60 merge2 $OKA $OKB $NB/dang
sub 'dangling' 2 'a symbolic link to nowhere'
SUBBAD+="$X"
X=""
rec "V:N-i -o is a link to an earlier merge / to a user folder / dangling" "$SUBOBS" "$SUBBAD"
# Round C's failure: a .bench-written that is a link to a list naming the user's file.
subreset
x nj0 120 merge2 $OKA $OKB $NB/h
cp $NB/h/.bench-written $NB/list2
echo notes.txt >> $NB/list2
rm $NB/h/.bench-written
ln -s ../list2 $NB/h/.bench-written
echo p > $NB/h/notes.txt
x nj 60 merge2 $OKA $OKB $NB/h
sub merge "0 2"
keep $NB/h/notes.txt
x nj1 60 "$BENCH" site --history $NB/s2.sqlite -o $NB/hs
cp $NB/hs/.bench-written $NB/list3
echo CNAME >> $NB/list3
rm $NB/hs/.bench-written
ln -s ../list3 $NB/hs/.bench-written
echo p > $NB/hs/CNAME
x nj2 60 "$BENCH" site --history $NB/s2.sqlite -o $NB/hs
sub site "0 2"
keep $NB/hs/CNAME
SUBBAD+="$X"
X=""
rec "V:N-j .bench-written is a symlink to a list naming notes.txt (merge; site: CNAME)" "$SUBOBS" "$SUBBAD"
x nk0 120 merge2 $OKA $OKB $NB/es
touch $NB/es/$'evil\e]0;T\a\e[2Jx' $NB/es/$'nl\nresult: ok (exit 0)' $NB/es/$'\xff\xfebin'
x nk 60 merge2 $OKA $OKB $NB/es
keep $NB/es/$'evil\e]0;T\a\e[2Jx' $NB/es/$'nl\nresult: ok (exit 0)' $NB/es/$'\xff\xfebin'
ok "V:N-k ESC/newline/non-UTF-8 names in refusal" 2 'evil\x1b]0;T\x07\x1b[2Jx' 'nl\nresult: ok (exit 0)'
x nl0 120 merge2 $OKA $OKB $NB/nl
touch $NB/nl/$'junit.xml\nlogs'
x nl 60 merge2 $OKA $OKB $NB/nl
keep $NB/nl/$'junit.xml\nlogs'
ok "V:N-l newline name splitting into listed lines" 2 'junit.xml\nlogs'
x nm 60 "$BENCH" report merge $OKA $OKB $FD/N-m_runid_newline/a $FD/N-m_runid_newline/b -o $NB/fe
ok "V:N-m run_id with newline to forge a fleet subfolder/list line" 2 'run_id "R2\nnotes.txt"'
# The store and run folders a site reads, inside the site it replaces, in every spelling.
N3=$W/n3
mkdir -p $N3
"$BENCH" site --history $NB/s2.sqlite -o $N3/site > /dev/null 2>&1
cp $NB/s2.sqlite $N3/site/store.sqlite
echo store.sqlite >> $N3/site/.bench-written
ln -s site $N3/sitelink
ln -s site $N3/sd
ln -s site/store.sqlite $N3/st.sqlite
subreset
nn() { # nn LABEL DIR CMD...: one spelling, run in DIR
  local l=$1 d=$2
  shift 2
  x nn 60 env -C "$d" "$@"
  sub "$l" 2 '--history' 'is inside -o'
}
nn './site/../site/store.sqlite' $N3 "$BENCH" site --history ./site/../site/store.sqlite -o site
nn 'abs --history' $N3 "$BENCH" site --history $N3/site/store.sqlite -o site
nn 'abs -o/' $N3 "$BENCH" site --history site/store.sqlite -o $N3/site/
nn '-o link' $N3 "$BENCH" site --history site/store.sqlite -o sitelink
nn 'file link' $N3 "$BENCH" site --history st.sqlite -o site
nn 'dir link' $N3 "$BENCH" site --history sd/store.sqlite -o site
nn 'BENCH_HISTORY' $N3 env BENCH_HISTORY=site/store.sqlite "$BENCH" site -o site
nn 'cd site; -o ../site' $N3/site "$BENCH" site --history store.sqlite -o ../site
nn 'cd site; -o .' $N3/site "$BENCH" site --history store.sqlite -o .
nn 'plain' $N3 "$BENCH" site --history site/store.sqlite -o site
keep $N3/site/store.sqlite
SUBBAD+="$X"
X=""
rec "V:N-n site --history inside -o, 10 spellings" "$SUBOBS" "$SUBBAD"
# The baselines a merge reads, inside its output, in every spelling.
x no0 120 merge2 $OKA $OKB $N3/mo
mkdir $N3/mo/bl
cp t/bl/good/cpu-x86_64.yaml $N3/mo/bl/
ln -s bl $N3/mo/baselines
printf 'bl\nbl/cpu-x86_64.yaml\nbaselines\n' >> $N3/mo/.bench-written
ln -s mo/bl $N3/bll
ln -s mo $N3/mol
subreset
no() {
  local l=$1 d=$2
  shift 2
  x no 60 env -C "$d" "$@"
  sub "$l" 2 '--baselines'
}
no './mo/../mo/bl' $N3 "$BENCH" report merge $OKA $OKB -o mo --baselines ./mo/../mo/bl
no 'link bll' $N3 "$BENCH" report merge $OKA $OKB -o mo --baselines bll
no '-o mol' $N3 "$BENCH" report merge $OKA $OKB -o mol --baselines mo/bl
no 'cd mo; -o . (default baselines)' $N3/mo "$BENCH" report merge $OKA $OKB -o .
keep $N3/mo/bl/cpu-x86_64.yaml
SUBBAD+="$X"
X=""
rec "V:N-o merge --baselines inside -o, spellings" "$SUBOBS" "$SUBBAD"
subreset
cp -r $OKA $N3/sa
cp -r $OKB $N3/sb
x np1 60 "$BENCH" report merge $N3/sa $N3/sb -o $N3/sa
sub '-o sa' 2 'one folder or one holds the other'
x np0 120 merge2 $OKA $OKB $N3/mo2
cp -r $OKA $N3/mo2/sa
cp -r $OKB $N3/mo2/sb
(cd $N3/mo2 && find sa sb) >> $N3/mo2/.bench-written
x np2 60 "$BENCH" report merge $N3/mo2/sa $N3/mo2/sb -o $N3/mo2
sub 'inputs inside -o' 2 'one folder or one holds the other'
keep $N3/sa/results.json $N3/mo2/sa/results.json
SUBBAD+="$X"
X=""
rec "V:N-p merge -o = an input / inputs inside -o" "$SUBOBS" "$SUBBAD"
subreset
"$BENCH" site --history $NB/s2.sqlite -o $N3/s5 > /dev/null 2>&1
x nq1 60 "$BENCH" site --history $NB/s2.sqlite -o $N3/s5/cells/..
sub 'site -o s5/cells/..' "0 2"
keep $N3/s5/index.html
ls -a $N3 $N3/s5 | grep -q '\.bench-site-' && SUBBAD+=" a staging folder left behind"
x nq2 120 merge2 $OKA $OKB $N3/mo3
x nq3 120 merge2 $OKA $OKB $N3/mo3/logs/..
sub 'merge -o mo3/logs/..' 0
x nq4 60 "$BENCH" site --history $NB/s2.sqlite -o $N3/s5/.
sub 'site -o s5/.' 0
SUBBAD+="$X"
X=""
rec "V:N-q site -o spelled with .." "$SUBOBS" "$SUBBAD"

# ================================================================ the merge's GPU-second costs (round B's C rows)
CC=$W/c
cforge() { # cforge NAME PYTHON: two history shards, with the edit on shard 1's history.json (H) / triage.json (T)
  local d=$CC/$1
  mkdir -p $d
  cp -r $H/v5/s1/cc2 $d/s1
  cp -r $H/v5/s2/cc2 $d/s2
  (cd $d && python3 - << PY
import json
H=json.load(open('s1/history.json')); T=json.load(open('s1/triage.json'))
$2
open('s1/history.json','w').write(H if isinstance(H,str) else json.dumps(H,indent=1)); json.dump(T,open('s1/triage.json','w'),indent=1)
PY
  )
}
cmerge() { x "c_$1" 120 env -C $CC/$1 "$BENCH" report merge s1 s2 -o m --baselines $H/t/esc/baselines; }
cforge clean ""
cmerge clean
N="merge rc=$RC, $(costs $CC/clean/m/report.json); ok0 merge $(costs $NB/mg/report.json); fleet o1 run $(costs $FL/o1/cpu-x86_64/report.json)"
echo "$N" | grep -q MISMATCH && X+=" $N"
echo "$N" | grep -qE 'unreadable|no cost' && X+=" $N"
ok "V:C-2 cell_costs, merged run (2 shards with history.json), shard merge ok0, fleet f1" "0 1"
subreset
cforge h1_1e308 'H["reruns_gpu_s"]=1e308'
cforge h2_neg 'H["reruns_gpu_s"]=-1'
cforge h3_nanstr 'H["reruns_gpu_s"]="NaN"'
cforge h3b_nanlit 'H["reruns_gpu_s"]=0.5; H=json.dumps(H,indent=1).replace("\"reruns_gpu_s\": 0.5","\"reruns_gpu_s\": NaN")'
cforge h3c_inf 'H["reruns_gpu_s"]=0.5; H=json.dumps(H,indent=1).replace("\"reruns_gpu_s\": 0.5","\"reruns_gpu_s\": 1e999")'
for n in h1_1e308 h2_neg h3_nanstr h3b_nanlit h3c_inf; do
  cmerge $n
  sub $n 2 's1/history.json'
done
rec 'V:C-3 shard history.json reruns_gpu_s 1e308 / -1 / "NaN" / NaN literal / 1e999' "$SUBOBS" "$SUBBAD"
subreset
cforge h8_bycell_1e308 'H["reruns_gpu_s"]=5; H["reruns_gpu_s_by_cell"]={"a":1e308}'
cforge h8b_bycell_nanstr 'H["reruns_gpu_s"]=5; H["reruns_gpu_s_by_cell"]={"a":"NaN"}'
for n in h8_bycell_1e308 h8b_bycell_nanstr; do
  cmerge $n
  sub $n 2 'history.json'
done
rec 'V:C-4 reruns_gpu_s_by_cell.a 1e308 / "NaN"' "$SUBOBS" "$SUBBAD"
# Refused (exit 2), or merged with per-cell costs that add up to the run's.
twoor() { # twoor LABEL: after cmerge
  if [ "$RC" = 2 ]; then
    sub "$1" 2
  else
    local s
    s=$(costs $CC/$1/m/report.json)
    sub "$1 ($s)" "0 1"
    [ "$s" = "sums ok" ] || SUBBAD+="[$1] $s "
  fi
}
subreset
cforge h5_incons 'H["reruns_gpu_s"]=5; H["reruns_gpu_s_by_cell"]={"a":100}'
cforge h4_ghost 'H["reruns_gpu_s"]=5; H["reruns_gpu_s_by_cell"]={"ghost":5}'
cforge h5b_ok 'H["reruns_gpu_s"]=5; H["reruns_gpu_s_by_cell"]={"a":5}'
for n in h5_incons h4_ghost h5b_ok; do
  cmerge $n
  twoor $n
done
rec "V:C-5 reruns_gpu_s_by_cell inconsistent with reruns_gpu_s (h5), a ghost cell (h4), consistent (h5b)" "$SUBOBS" "$SUBBAD"
subreset
cforge t1_triage_1e308 'T["findings"][0]["bisected"]["gpu_s"]=1e308'
cforge t2_triage_neg 'T["findings"][0]["bisected"]["gpu_s"]=-1'
for n in t1_triage_1e308 t2_triage_neg; do
  cmerge $n
  sub $n 2 'triage.json' 'bisected.gpu_s'
done
rec "V:C-6 shard triage.json bisected.gpu_s 1e308 / -1" "$SUBOBS" "$SUBBAD"
subreset
cforge t3_triage_ghostcell 'T["findings"][0]["bisected"]["cell"]="ghost"'
cmerge t3_triage_ghostcell
twoor t3_triage_ghostcell
rec "V:C-7 triage bisected.cell names no cell of the run" "$SUBOBS" "$SUBBAD"
subreset
cforge p1_pairs_dupcell 'H["cells"].append(H["cells"][0])'
cmerge p1_pairs_dupcell
twoor p1_pairs_dupcell
rec "V:C-8 shard history.json lists a cell twice" "$SUBOBS" "$SUBBAD"
subreset
for n in h1_1e308 h2_neg h3_nanstr h3b_nanlit h3c_inf h4_ghost h5_incons t1_triage_1e308 p1_pairs_dupcell; do
  before=$(md5sum < $CC/$n/s1/report.json)
  x cr_$n 60 env -C $CC/$n "$BENCH" report s1 --baselines $H/t/esc/baselines
  sub $n 2 's1'
  [ "$(md5sum < $CC/$n/s1/report.json)" = "$before" ] || SUBBAD+="[$n] s1/report.json rewritten "
done
rec "V:C-9 bench report on a folder whose history.json has reruns_gpu_s 1e308 (and 8 other forgeries)" "$SUBOBS" "$SUBBAD"

# ================================================================ stored values out of bounds
ST=$W/st
mkdir -p $ST
for v in clean inf ninf neg txt zero 1e308 same; do cp t/store/e_$v.sqlite $ST/; done
cp t/study/million.sqlite $ST/
CELL=gpt2-tiny.fp32.1gpu.single.base
infnan() { grep -qwiE 'inf|nan|infinity' "$@" && X+=" inf/NaN in $(grep -lwiE 'inf|nan|infinity' "$@" | sed "s|$W/||" | head -3 | tr '\n' ' ')"; }
x study_clean 300 "$BENCH" history study --history $ST/e_clean.sqlite --detect-trials 500 --alarm-trials 1000
CLEAN_S=$SECS
for v in inf ninf neg txt zero 1e308; do
  x hist_$v 60 "$BENCH" history $CELL --history $ST/e_$v.sqlite
  infnan $O
  if [ $v = zero ]; then
    grep -q 'no change points' $O || X+=" $(grep -m1 -A1 'change points' $O | tail -1)"
  else
    grep -q '20.00K -> 18.00K (-10.0%' $O || X+=" the -10% change point is not 20.00K -> 18.00K"
  fi
  N="$(fe | cut -c1-120) .. $(grep -m1 -- '->' $O | sed 's/^ *//' | cut -c1-90)"
  ok R:S_hist_$v 0 'warning:' "metric tokens_per_s"
  x site_$v 120 "$BENCH" site --history $ST/e_$v.sqlite -o $ST/site_$v
  for f in $(find $ST/site_$v -type f ! -name 'site.js' ! -name 'uPlot*'); do infnan $f; done
  ok R:S_site_$v 0 'warning:'
  x study_$v 300 "$BENCH" history study --history $ST/e_$v.sqlite --detect-trials 500 --alarm-trials 1000
  infnan $O
  [ "$(echo "$SECS < 2 * $CLEAN_S + 10" | bc)" = 1 ] || X+=" ${SECS}s, the store without the row ${CLEAN_S}s"
  N="$(fe | cut -c1-100); ${SECS}s (clean ${CLEAN_S}s)"
  ok R:S_study_$v 0 'warning:'
done
x hist_same 60 "$BENCH" history $CELL --history $ST/e_same.sqlite
infnan $O
grep -q 'no change points' $O || X+=" change points on identical values"
N="$(grep -m1 'change points' $O | sed 's/^ *//' | cut -c1-60)"
ok R:S_hist_same 0
x study_million 300 "$BENCH" history study --history $ST/million.sqlite --detect-trials 500 --alarm-trials 1000
[ "$(echo "$SECS < 2 * $CLEAN_S + 10" | bc)" = 1 ] || X+=" ${SECS}s, the store without the row ${CLEAN_S}s"
N="${SECS}s vs ${CLEAN_S}s without the row; $(fe | cut -c1-150)"
ok R:study_million_row 0 'more than'
# The same run given twice to the study, in every spelling.
for s in 'same:t/study/res/seed' 'dot:t/study/res/./seed' 'slash:t/study/res/seed/' 'symlink:t/study/res/link' \
  'abs:/tmp/h42/t/study/res/seed' 'dotdot:t/study/res/../res/seed' 'copy:t/study/res/copy'; do
  x sd_${s%%:*} 120 "$BENCH" history study t/study/res/seed "${s#*:}" --detect-trials 500 --alarm-trials 1000
  ok "R:study_dup_${s%%:*}" 2 'each run counts once'
done
# Arguments with escapes are written out, never echoed raw.
x hae 60 "$BENCH" history $'a\x1b]0;pwned\x07\x1b[2J' --history $ST/e_clean.sqlite
ok R:hist_arg_esc 2 'a\x1b]0;pwned\x07\x1b[2J'
subreset
x hae2 60 "$BENCH" history $CELL --hardware $'h\x1b]0;x\x07' --history $ST/e_clean.sqlite
sub --hardware 2 'h\x1b]0;x\x07'
x hae3 60 "$BENCH" history $CELL --metric $'m\x1b]0;x\x07' --history $ST/e_clean.sqlite
sub --metric 2 'm\x1b]0;x\x07'
x hae4 60 "$BENCH" history $CELL --history $'/tmp/x\x1b]0;x\x07.sqlite'
sub --history 2 'x\x1b]0;x\x07.sqlite'
rec R:hist_arg_esc_variants "$SUBOBS" "$SUBBAD"

# ================================================================ a closed stdout: exit 141
pipe() { # pipe CASE CMD...
  local c=$1
  shift
  local s
  s=$(python3 $W/closedpipe.py "$@" 2>&1)
  G=""
  echo "$s" | grep -q panicked && G=" panicked"
  RC=$(echo "$s" | sed -n 's/^rc \([-0-9]*\).*/\1/p')
  E=/dev/null O=/dev/null
  N="$s"
  ok "$c" 141
}
pipe "R:pipe141_matrix_--dry-run" "$BENCH" matrix smoke.yaml --dry-run
pipe R:pipe141_completions_bash "$BENCH" completions bash
pipe R:pipe141_man "$BENCH" man
pipe R:pipe141_history_CELL "$BENCH" history $CELL --history $ST/e_clean.sqlite
subreset
for c in "schema" "env" "report $NB/mg --baselines $NOBL" \
  "history study --history $ST/e_clean.sqlite --detect-trials 100 --alarm-trials 200" \
  "report merge $OKA $OKB -o $W/p141m" "site --history $NB/s2.sqlite -o $W/p141s" \
  "report post $NB/mg --dry-run --baselines $NOBL" "matrix smoke.yaml --dry-run --format json"; do
  # shellcheck disable=SC2086
  s=$(python3 $W/closedpipe.py "$BENCH" $c 2>&1)
  r=$(echo "$s" | sed -n 's/^rc \([-0-9]*\).*/\1/p')
  SUBOBS+="${c%% /*} rc=$r; "
  [ "$r" = 141 ] || SUBBAD+="[$c] $s "
done
rec "R:pipe141_others (schema, env, report, study, merge, site, post --dry-run, matrix json)" "$SUBOBS" "$SUBBAD"
for c in "R:N4_help_closed_stdout (--help) / V:12a:--help" "R:N4_help_closed_stdout (matrix --help) / V:12b:matrix --help" \
  "V:12c closed pipe --version:--version"; do
  # shellcheck disable=SC2086
  s=$(python3 $W/closedpipe.py "$BENCH" ${c##*:} 2>&1)
  bad=""
  echo "$s" | grep -q '^rc 141 ' || bad=" $s"
  echo "$s" | grep -q "stderr: b''" || bad+=" stderr not empty"
  rec "${c%:*}" "$s" "$bad"
done

# ================================================================ logs from elsewhere (ingest)
IG=$W/ing
mkdir -p $IG
PAX=(--model gpt3-175b --global-batch 256 --seq-len 2048 --gpus 128 --gpu h100 --results-dir $IG/res)
x pax_fifty 60 "$BENCH" ingest t/pax/fifty.log --framework paxml "${PAX[@]}"
ok R:pax_fifty 2 'fifty.log:21' 'Paxml prints only the first 20'
x pax_fifty_auto 60 "$BENCH" ingest t/pax/fifty.log "${PAX[@]}"
ok R:pax_fifty_auto 2 'fifty.log:21'
x pax_t21 60 "$BENCH" ingest t/pax/t21.log --framework paxml "${PAX[@]}"
ok R:pax_t21 2 't21.log:21'
x pax_inter 60 "$BENCH" ingest t/pax/inter.log --framework paxml "${PAX[@]}"
ok R:pax_inter 2 'inter.log:41'
x pax_twoproc 60 "$BENCH" ingest t/pax/twoproc.log --framework paxml "${PAX[@]}"
ok R:pax_twoproc 2 'writer'
x pax_twenty 60 "$BENCH" ingest t/pax/twenty.log --framework paxml "${PAX[@]}"
ok R:pax_twenty 0 '20 step(s) read, 19 measured'
x ing_empty 60 "$BENCH" ingest t/ing/empty.log --framework paxml "${PAX[@]}"
ok R:ing_empty 2 'no paxml step line'
x ing_devzero 30 "$BENCH" ingest /dev/zero --framework paxml "${PAX[@]}"
ok R:ing_devzero 2 'character device'
x ing_dir 30 "$BENCH" ingest t/ing --framework paxml "${PAX[@]}"
ok R:ing_dir 2 'directory'
x ing_fifo 30 "$BENCH" ingest t/ing/fifo.log --framework paxml "${PAX[@]}"
ok R:ing_fifo 2 'FIFO'
python3 -c "open('$IG/hugeline.log','w').write('x'*(2<<20)+'\n')"
x ing_huge 60 "$BENCH" ingest $IG/hugeline.log --framework paxml "${PAX[@]}"
ok R:ing_hugeline 2 'longer than 1048576 bytes'
subreset
x ing_crlf 60 "$BENCH" ingest t/ing/crlf.log --framework paxml "${PAX[@]}"
sub crlf 0
x ing_esc 60 "$BENCH" ingest t/ing/esc.log --framework paxml "${PAX[@]}"
sub esc 0
rec R:ing_crlf_esc "$SUBOBS" "$SUBBAD"
subreset
ib() { # ib LABEL STRING ARGS...: one bad flag of ingest
  local l=$1 s=$2
  shift 2
  x ib 60 "$BENCH" ingest t/pax/twenty.log --framework paxml --results-dir $IG/res "$@"
  sub "$l" 2 "$s"
}
G0=(--model gpt3-175b --gpu h100)
ib --run-id '--run-id "r\x1b[2J"' "${G0[@]}" --global-batch 256 --seq-len 2048 --gpus 128 --run-id $'r\x1b[2J'
ib --cell '--cell c\x1b]0;x\x07' "${G0[@]}" --global-batch 256 --seq-len 2048 --gpus 128 --cell $'c\x1b]0;x\x07'
ib --hardware-key '--hardware-key "h\x1b"' "${G0[@]}" --global-batch 256 --seq-len 2048 --gpus 128 --hardware-key $'h\x1b'
ib --global-batch '--global-batch 0' "${G0[@]}" --global-batch 0 --seq-len 2048 --gpus 128
ib --gpus '--gpus 0' "${G0[@]}" --global-batch 256 --seq-len 2048 --gpus 0
ib --skip-steps '--skip-steps is 99' "${G0[@]}" --global-batch 256 --seq-len 2048 --gpus 128 --skip-steps 99
ib --seq-len 'more tokens per step' "${G0[@]}" --global-batch 256 --seq-len 18446744073709551615 --gpus 128
rec R:ing_bad_flags "$SUBOBS" "$SUBBAD"

# ================================================================ matrix names with escapes
x n25 60 "$BENCH" matrix t/n25/m.yaml --dry-run
ok R:n25_matrix_name_esc_dryrun 2 't/n25/m.yaml:1:1' 'smoke\x1b]0;pwned\x07\x1b[2J'
x n25b 60 "$BENCH" matrix t/n25/m.yaml --gpus 0 --results-dir $W/n25b
ok R:n25b_matrix_name_esc_run 2 't/n25/m.yaml:1:1' 'smoke\x1b]0;pwned\x07\x1b[2J'
x n25c 60 "$BENCH" matrix t/n25/m2.yaml --dry-run
ok R:n25c_matrix_name_bidi_bel 2 'smoke\u{202e}\x07x'
x n25d 60 "$BENCH" matrix t/n25/m3.yaml --dry-run
ok R:n25d_raw_esc_error_snippet 2 '\x1b]0;PWN\x07'
x n25e 60 "$BENCH" matrix t/n25/m4.yaml --dry-run
ok R:n25e_raw_esc_key 2 'bogus\x1b]0;PWN\x07'
x n25f 60 "$BENCH" matrix t/n25/m5.yaml --dry-run
ok R:n25f_raw_esc_plain_name 2 'smoke\x1b]0;PWN\x07'

# ================================================================ bisect
BI=$W/bis
mkdir -p $BI/tmp
cp t/esc/history.sqlite $BI/h2.sqlite
wt_before=$(git -C t/esc/repo worktree list | wc -l)
head_before=$(git -C t/esc/repo rev-parse HEAD)
x bis_rmgit 300 env -C $H/t/esc/repo TMPDIR=$BI/tmp "$BENCH" bisect a --good f9d9c11 --bad HEAD \
  --matrix matrix.yaml --history $BI/h.sqlite --work-dir $BI/wd --setup 'rm -rf .git'
[ "$(git -C t/esc/repo rev-parse HEAD 2> /dev/null)" = "$head_before" ] || X+=" the repository's HEAD changed or its .git is gone"
[ "$(git -C t/esc/repo worktree list | wc -l)" = "$wt_before" ] || X+=" a worktree left registered"
N="$(grep -m1 -E '^error|cannot' $E | cut -c1-200)"
ok R:bisect_setup_rm_git 1 'not a git repository'
subreset
bb() {
  local l=$1 s=$2
  shift 2
  x bb 60 env -C $H/t/esc/repo TMPDIR=$BI/tmp "$BENCH" bisect "$@" --history $BI/h2.sqlite --work-dir $BI/wd2
  sub "$l" 2 "$s"
}
bb '--good ESC' '--good f9d9\x1b]0;x\x07' a --good $'f9d9\x1b]0;x\x07' --bad HEAD --matrix matrix.yaml
bb '--matrix ../..' '--matrix ../../../../etc/passwd' a --good f9d9c11 --bad HEAD --matrix ../../../../etc/passwd
bb '--matrix /etc/passwd' '--matrix /etc/passwd' a --good f9d9c11 --bad HEAD --matrix /etc/passwd
bb 'cell ESC' 'a\x1b[2J' $'a\x1b[2J' --good f9d9c11 --bad HEAD --matrix matrix.yaml
bb '--max-repeats 0' '--max-repeats 0' a --good f9d9c11 --bad HEAD --matrix matrix.yaml --max-repeats 0
x bbw 60 env -C $H/t/esc/repo "$BENCH" bisect a --good f9d9c11 --bad HEAD --matrix matrix.yaml --history $BI/h2.sqlite --work-dir $H/t/bis/dl
sub '--work-dir dangling' 2 'a symbolic link to /nonexistent/x'
bb 'good=bad' 'no range to bisect' a --good HEAD --bad HEAD --matrix matrix.yaml
bb 'bad before good' 'is not an ancestor' a --good HEAD --bad f9d9c11 --matrix matrix.yaml
rm -f /tmp/h42/pwned
bb '--good=--output=...' 'not a commit' a --good=--output=/tmp/h42/pwned --bad HEAD --matrix matrix.yaml
[ -e /tmp/h42/pwned ] && SUBBAD+=" --output= reached git: /tmp/h42/pwned written"
rec R:bisect_bad_args "$SUBOBS" "$SUBBAD"

# ================================================================ a zero spread
ZS=$W/zs
mkdir -p $ZS
zn() { x "zs_$1" 120 env -C $H/t/zero_spread "$BENCH" matrix "$2" --no-progress --run-id "$1" --results-dir $ZS/res --history "$3"; }
for i in 1 2 3 4 5; do zn z$i m$i.yaml $ZS/h.sqlite > /dev/null; done
cp $ZS/h.sqlite $ZS/h6.sqlite
cp $ZS/h.sqlite $ZS/h7.sqlite
zn z6 m6.yaml $ZS/h6.sqlite
grep -qiw 'inf' $O && X+=" inf on stdout"
N="$(grep -m1 -E 'regressed|improved' $O | sed 's/^ *//' | cut -c1-110)"
ok R:zero_spread_regress 1 'regressed -23.1%' 'no spread in the history'
zn z7 m7.yaml $ZS/h7.sqlite
grep -qiw 'inf' $O && X+=" inf on stdout"
N="$(grep -m1 -E 'regressed|improved' $O | sed 's/^ *//' | cut -c1-110)"
ok R:zero_spread_improve 0 'improved +25.0%' 'no spread in the history'

# ================================================================ a stored step time out of bounds, then a sharded night
SH=$W/sh
for v in 1e308 -1 0 abc 9e999:inf 1e-300; do
  f=${v%%:*}
  name=${v#*:}
  d=$SH/$f
  mkdir -p $d
  cp t/shard1e308/h_$f.sqlite $d/h1.sqlite
  cp t/shard1e308/h_$f.sqlite $d/h2.sqlite
  subreset
  warned=""
  for i in 1 2; do
    x sh_${f}_$i 300 "$BENCH" matrix smoke.yaml --no-progress --shard $i/2 --run-id S --results-dir $d/sh$i --history $d/h$i.sqlite
    sub "shard $i" "0 1"
    grep -q '^warning:' $E && warned=1
    fin=$(jget $d/sh$i/S/shard.json "all(isinstance(x,(int,float)) and x==x and abs(x)<1e300 for x in d['expected_gpu_s']+[c['expected_gpu_s'] for c in d['cells']])")
    [ "$fin" = True ] || SUBBAD+="[shard $i] expected_gpu_s not all finite "
  done
  [ -n "$warned" ] || SUBBAD+=" no warning names the stored row "
  x sh_${f}_m 120 merge2 $d/sh1/S $d/sh2/S $d/out
  sub merge "0 1"
  rec "R:shard_night_steptime_$name" "$SUBOBS" "$SUBBAD"
done

# ================================================================ the site's output folder
SI=$W/site
mkdir -p $SI
for s in big small other; do cp t/site/$s.sqlite $SI/; done
subreset
x ss1 120 "$BENCH" site --history $SI/big.sqlite -o $SI/s
sub big 0
x ss2 120 "$BENCH" site --history $SI/small.sqlite -o $SI/s
sub small 0
x ss2f 120 "$BENCH" site --history $SI/small.sqlite -o $SI/fresh_small
[ "$(cd $SI/s && ls cells runs)" = "$(cd $SI/fresh_small && ls cells runs)" ] || SUBBAD+=" pages of cells or runs not in small.sqlite kept "
x ss3 120 "$BENCH" site --history $SI/other.sqlite -o $SI/s
sub other 0
x ss3f 120 "$BENCH" site --history $SI/other.sqlite -o $SI/fresh_other
[ "$(cd $SI/s && ls cells runs)" = "$(cd $SI/fresh_other && ls cells runs)" ] || SUBBAD+=" pages of cells or runs not in other.sqlite kept "
rec R:site_stale_pages "$SUBOBS runs/ after other: $(ls $SI/s/runs | tr '\n' ' ')" "$SUBBAD"
# inputs_inside_out.sh: the store, the run folders and a user's CNAME inside the site.
IO=$W/io
mkdir -p $IO
"$BENCH" history import $OKA --history $IO/store.sqlite > /dev/null 2>&1
"$BENCH" site --history $IO/store.sqlite -o $IO/site > /dev/null 2>&1
mv $IO/store.sqlite $IO/site/store.sqlite
x n6s 60 env -C $IO "$BENCH" site --history site/store.sqlite -o site
keep $IO/site/store.sqlite
ok "R:N6_site_store_inside_out / V:3" 2 '--history site/store.sqlite is inside -o site'
cp -r $OKA $IO/runsR
"$BENCH" history import $IO/runsR --history $IO/s2.sqlite > /dev/null 2>&1
mkdir -p $IO/site/results
mv $IO/runsR $IO/site/results/R
x n7s 60 env -C $IO "$BENCH" site --history s2.sqlite --runs site/results -o site
keep $IO/site/results/R/results.json
ok "R:N7_site_runs_inside_out / V:4" 2 '--runs site/results is inside -o site'
"$BENCH" site --history $IO/s2.sqlite -o $IO/site2 > /dev/null 2>&1
echo precious > $IO/site2/CNAME
x n5s 60 env -C $IO "$BENCH" site --history s2.sqlite -o site2
keep $IO/site2/CNAME
ok "R:N5_site_over_site_plus_user_file / V:5" 2 'CNAME'
mkdir -p $SI/foreign
echo a > $SI/foreign/a.txt
x sf 60 "$BENCH" site --history $SI/small.sqlite -o $SI/foreign
keep $SI/foreign/a.txt
ok R:site_foreign 2 'bench site did not write'
ln -s /tmp/h42/nonexistent/x $SI/dangling
x sdg 60 "$BENCH" site --history $SI/small.sqlite -o $SI/dangling
ok R:site_dangling 2 'a symbolic link to /tmp/h42/nonexistent/x, which does not exist'
echo f > $SI/afile
subreset
x sfile1 60 "$BENCH" site --history $SI/small.sqlite -o $SI/afile
sub file 2 'not a folder but a file'
x sfile2 60 "$BENCH" site --history $SI/small.sqlite -o $SI/afile/sub
sub 'under a file' 2 'not a folder but a file'
x sfile3 60 "$BENCH" site --history $SI/small.sqlite -o /proc/site
sub /proc/site 2 '/proc'
# `-o /` runs in a chroot onto an overlay of / (its writes and deletions go to a tmpfs of a
# private mount namespace), so that a regression here cannot delete anything of this machine.
x sfile4 60 unshare -m sh -c 'mount -t tmpfs tmpfs /mnt && mkdir -p /mnt/up /mnt/work /mnt/root &&
  mount -t overlay overlay -o lowerdir=/,upperdir=/mnt/up,workdir=/mnt/work /mnt/root &&
  mount -t proc proc /mnt/root/proc && mount --rbind /dev /mnt/root/dev && exec chroot /mnt/root "$@"' sh \
  "$BENCH" site --history $SI/small.sqlite -o /
sub / 2 '-o /'
rec R:site_file "$SUBOBS" "$SUBBAD"

# ================================================================ 50 MB stored strings
BG=$W/big
mkdir -p $BG
for k in subject author host branch matrix_name kernel; do
  cp t/big/$k.sqlite $BG/$k.sqlite
  x big_$k 120 /usr/bin/time -f 'TIME %e %M' "$BENCH" site --history $BG/$k.sqlite -o $BG/site_$k
  sz=$(du -sk $BG/site_$k | cut -f1)
  tm=$(grep '^TIME' $E | cut -d' ' -f2)
  kb=$(grep '^TIME' $E | cut -d' ' -f3)
  [ "${sz:-99999}" -lt 1024 ] || X+=" site ${sz} KB"
  [ "${kb:-9999999}" -lt 1500000 ] || X+=" ${kb} KB resident"
  [ "$(echo "${tm:-999} < 30" | bc)" = 1 ] || X+=" ${tm}s"
  N="site ${sz} KB, ${tm}s, ${kb} KB resident"
  ok R:big_site_$k 0
done
subreset
for k in subject author host branch; do
  x bh_$k 60 "$BENCH" history a --history $BG/$k.sqlite
  sub "$k ($(wc -c < $O) B)" 0
  [ "$(wc -c < $O)" -lt 20000 ] || SUBBAD+="[$k] $(wc -c < $O) bytes "
done
rec R:big_hist "$SUBOBS" "$SUBBAD"
rm -f $BG/*.sqlite

# ================================================================ a 50 MB subject in triage.json
TR=$W/tri
mkdir -p $TR
for f in results.json triage.json history.json telemetry.json confirm kernels logs triage; do cp -r t/tri/$f $TR/; done
x tri 120 /usr/bin/time -f 'TIME %e %M' "$BENCH" report $TR --baselines $NOBL
[ "$(wc -c < $O)" -lt 20000 ] || X+=" $(wc -c < $O) bytes on stdout"
grep -q '^result: ok' $O && X+=" a line starts 'result: ok'"
grep -qi '<img[^>]*onerror' $TR/report.html && X+=" <img onerror> in report.html"
TRO=$O
TRE=$E
TRRC=$RC
TRG=$G
x tripost 60 "$BENCH" report post $TR --dry-run --baselines $NOBL
grep -qi '<img' $O && X+=" <img in the comment"
[ "$(wc -c < $O)" -lt 20000 ] || X+=" comment $(wc -c < $O) bytes"
G="$TRG$G"
N="stdout $(wc -c < $TRO) B, $(grep '^TIME' $TRE | cut -d' ' -f2-)s/KB; comment $(wc -c < $O) B; rc post=$RC"
O=$TRO E=$TRE RC=$TRRC
ok R:tri_50mb_subject_report 1 'more characters)'

# ================================================================ history import
IM=$W/imp
mkdir -p $IM/dir
subreset
x x20a 60 "$BENCH" history import $OKA --history $IM/h.sqlite
sub first 0
x x20b 60 "$BENCH" history import $OKA --history $IM/h.sqlite
sub again 0
rec R:x20_import_twice "$SUBOBS" "$SUBBAD"
x x21 60 "$BENCH" history import $FD/x21_hwkey_other/a --history $IM/h.sqlite
ok R:x21_import_runid_other_key 2 'run id R is already in the history for hardware cpu-x86_64'
x x22 60 "$BENCH" history import $FL/o1 --history $IM/h.sqlite
ok R:x22_import_fleet_folder 2 'o1'
subreset
x x25 60 "$BENCH" history import $OKA --branch $'main\x1b]0;x\x07' --history $IM/h3.sqlite
sub import 0
x x25h 60 "$BENCH" history gpt2-tiny.fp32.1gpu.single.base --history $IM/h3.sqlite
sub history 0 'main\x1b'
x x25s 60 "$BENCH" site --history $IM/h3.sqlite -o $IM/site
sub site 0
for f in $(find $IM/site -type f); do grep -q $'[\x1b\x07]' $f && SUBBAD+=" raw ESC in ${f#$W/}"; done
rec R:x25_import_branch_esc "$SUBOBS" "$SUBBAD"
subreset
x x26 60 "$BENCH" history import $OKA --history $IM/dir
sub dir 2 'not a regular file'
head -c 3000 /dev/urandom > $IM/garbage.sqlite
x x27 60 "$BENCH" history import $OKA --history $IM/garbage.sqlite
sub garbage 2 'not a database'
x x28 60 "$BENCH" history import $OKA --history 'postgres://user:s3cretpw@127.0.0.1:9/db'
sub postgres 2 'user:***@'
grep -q s3cretpw $E $O && SUBBAD+=" the password is printed"
rec R:x26_28_import_bad_stores "$SUBOBS" "$SUBBAD"

# ================================================================ a merge of large shards
LG=$W/lg
mkdir -p $LG
python3 bigshard.py 2300 $LG/l2 400
x large2 300 /usr/bin/time -f 'TIME %e %M' "$BENCH" report merge $LG/l2/a $LG/l2/b -o $LG/l2/out
gone $LG/l2/out
N="$(fe | cut -c1-140); $(grep '^TIME' $E | cut -d' ' -f2-)"
ok R:large_merge_280MB 2 'more than the 256 MiB'
rm -rf $LG/l2
python3 bigshard.py 1700 $LG/l1 400
subreset
x large1 300 /usr/bin/time -f 'TIME %e %M' "$BENCH" report merge $LG/l1/a $LG/l1/b -o $LG/l1/out
sub "merge ($(grep '^TIME' $E | cut -d' ' -f2-)s/KB, results.json $(du -m $LG/l1/out/results.json 2> /dev/null | cut -f1) MB)" 0
rm -rf $LG/l1/a $LG/l1/b
x large1r 300 "$BENCH" report $LG/l1/out --baselines $NOBL
sub report 0
rec R:large_merge_217MB "$SUBOBS" "$SUBBAD"
rm -rf $LG

# ================================================================ report.html's title (round C's note) and the rest
# A matrix name with ESC/BEL in a merged run: report.html (its <title> too) holds none raw.
X=""
V10=$FD/v10_matrixname_esc/out
noesc $V10/report.html $V10/summary.txt $V10/summary.md
grep -q '<title>[^<]*\\x1b' $V10/report.html || X+=" the <title> does not show the escape written out"
N="<title>: $(grep -o '<title>[^<]*</title>' $V10/report.html | show "$(cat)")"
O=/dev/null E=/dev/null RC=0 G=""
ok "F:report.html <title> of a matrix name with ESC/BEL (round C note)" 0
cp -r $FD/v10_matrixname_esc/a $W/v10a
x v10r 60 "$BENCH" report $W/v10a --baselines $NOBL
noesc $W/v10a/report.html
ok "F:report.html <title> via bench report of a shard with ESC/BEL in matrix_name" 0

# Nothing outside $W was written: no stray files in /tmp/h42 or the fixtures' repository.
stray=$(cd $H && ls -A | grep -vE '^(RP|replay.*|results\.md|verify\.md|final\.md|[A-Za-z0-9_.-]+\.(sh|py|md|txt|log|yaml)|env|bench|base|t|v[0-9z]*|F|Z|M\.sh)$')
git -C t/esc/repo status --porcelain | grep -q . && stray+=" t/esc/repo has changes"
rec "F:nothing written outside the replay's folder" "${stray:-none}" "${stray:+ $stray}"

# ---------------------------------------------------------------- the table
{
  echo "# Replay of issue 42's hostile corpus against $BENCH ($SHA)"
  echo
  echo "results.md + verify.md + final.md, one row per case; $(date -u +%Y-%m-%dT%H:%MZ); $(($(date +%s) - T0)) s"
  echo
  echo '| case | observed | verdict |'
  echo '|---|---|---|'
  cat $ROWS
  echo
  echo "**$((PASSN + FAILN)) cases: $PASSN PASS, $FAILN FAIL** (binary $BENCH, commit $SHA)"
  if [ -n "$FAILS" ]; then
    echo
    echo '## FAIL'
    printf '%s' "$FAILS" | sed 's/^/- /'
  fi
} > "$OUTMD"
cat "$OUTMD"
echo "written: $OUTMD" >&2
[ "$FAILN" = 0 ]

#!/bin/bash
# rec.sh NAME "cmd" "expected" "observed" PASS|FAIL
[ -f /tmp/h42/results.md ] || printf '| case | command | expected | observed | verdict |\n|---|---|---|---|---|\n' > /tmp/h42/results.md
esc() { printf '%s' "$1" | tr '\n' ' ' | sed 's/|/\\|/g' | cut -c1-400; }
echo "| $1 | \`$(esc "$2")\` | $(esc "$3") | $(esc "$4") | $5 |" >> /tmp/h42/results.md

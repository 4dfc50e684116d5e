#!/usr/bin/env bash
# Draws the imports between the runner's modules (src/run) and checks its layering:
#   entry (run/mod.rs) -> dispatch -> launcher -> executor (executor, launch, slurm)
# with `config`, `error`, `events` and `progress` as shared vocabulary ("S") that the
# layers above the executor use and that itself uses only the executor layer. An import
# from a lower layer into a higher one, or between the dispatcher and a launcher the wrong
# way round ("an arrow back up"), fails the check.
#
# It also checks the CLI seam, and runs scripts/module-graph.py over the whole crate (the
# pipeline's rules; see its docstring). The CLI seam: only src/cli/ and src/main.rs may name `crate::cli`. The
# clap types and their resolution live there; every other module takes its own plain
# settings struct, so the domain never depends on the command line (test modules may).
#
# Usage: scripts/module-graph.sh [--dot]   (--dot prints a Graphviz graph instead)
#
# It reads `use crate::run::X`, `crate::run::X::` paths and `super::X` imports in each file
# under src/run, so it needs nothing but bash, grep and sed (cargo-modules would build the
# crate, which costs minutes of a two-core CI machine).
set -euo pipefail
cd "$(dirname "$0")/.."

# The layer of a module under src/run: higher numbers import lower ones only.
layer() {
  case "$1" in
    entry) echo 4 ;;
    dispatch) echo 3 ;;
    launcher) echo 2 ;;
    executor | launch | slurm) echo 1 ;;
    config | error | events | progress) echo S ;;
    *) echo "?" ;;
  esac
}

# The top-level module of the run wing a file belongs to.
owner() {
  local rel=${1#src/run/}
  case "$rel" in
    mod.rs) echo entry ;;
    */*) echo "${rel%%/*}" ;;
    *) echo "${rel%.rs}" ;;
  esac
}

edges=$(
  for f in $(find src/run -name '*.rs' | sort); do
    from=$(owner "$f")
    # Test modules may reach anywhere; only the code above `#[cfg(test)]` counts.
    # Comments (doc links) name modules without importing them.
    body=$(sed '/^#\[cfg(test)\]/,$d' "$f" | grep -vE '^\s*//' || true)
    {
      grep -oE 'crate::run::[a-z_]+' <<<"$body" | sed 's/crate::run:://' || true
      # `super::x` from a top-level file of src/run names a sibling; from a file in a
      # folder it names a sibling inside that folder, which is the same module.
      if [[ "$f" != src/run/*/* ]]; then
        grep -oE '\bsuper::[a-z_]+' <<<"$body" | sed 's/super:://' || true
      fi
      # `super::{..}` / `super::Item` from a top-level file, and `crate::run::Item`, name
      # items of the entry itself (run/mod.rs).
      if [[ "$f" != src/run/*/* ]] && grep -qE '\bsuper::(\{|[A-Z])' <<<"$body"; then
        echo entry
      fi
      grep -qE 'crate::run::(\{|[A-Z])' <<<"$body" && echo entry
      # The entry names its child modules bare (`dispatch::run`, `use launcher::Local`).
      if [[ "$f" == src/run/mod.rs ]]; then
        grep -oE '(^|[^:a-z_])(self::)?[a-z_]+::' <<<"$body" |
          sed -E 's/^[^a-z_]*//; s/^self:://; s/:://' |
          grep -xE "$(find src/run -mindepth 1 -maxdepth 1 | sed -E 's#src/run/##; s#\.rs$##' | paste -sd'|')" || true
      fi
    } | sort -u | while read -r to; do
      [[ -n "$to" && "$to" != "$from" ]] && echo "$from $to"
    done
  done | sort -u
)

if [[ "${1:-}" == --dot ]]; then
  echo 'digraph run {'
  echo '  rankdir=TB;'
  while read -r a b; do echo "  \"$a\" -> \"$b\";"; done <<<"$edges"
  echo '}'
  exit 0
fi

status=0
echo "src/run imports (module -> what it imports), by layer:"
for m in entry dispatch launcher executor launch slurm config error events progress; do
  outs=$(awk -v m="$m" '$1 == m { print $2 }' <<<"$edges" | tr '\n' ' ')
  echo "  [$(layer "$m")] $m -> ${outs:-(nothing in src/run)}"
done
while read -r a b; do
  [[ -z "$a" ]] && continue
  la=$(layer "$a")
  lb=$(layer "$b")
  if [[ "$la" == "?" || "$lb" == "?" ]]; then
    echo "unknown module in edge $a -> $b: add it to scripts/module-graph.sh" >&2
    status=1
  elif [[ $la == S && $lb == S ]]; then
    :
  elif [[ $la == S ]]; then
    if ((lb >= 2)); then
      echo "arrow back up: shared $a imports $b (layer $lb)" >&2
      status=1
    fi
  elif [[ $lb == S ]]; then
    if ((la == 1)); then
      echo "arrow back up: executor-layer $a imports the run's $b" >&2
      status=1
    fi
  elif ((lb > la)) || ((lb == la && la != 1)); then
    echo "arrow back up: $a (layer $la) imports $b (layer $lb)" >&2
    status=1
  fi
done <<<"$edges"
if ((status == 0)); then
  echo "ok: dispatch -> launcher -> executor, no arrow back up"
fi

# The CLI seam: code outside src/cli/ and src/main.rs (above its `#[cfg(test)]`, comments
# aside) must not name the clap types, neither as `crate::cli::X` nor in a grouped
# `use crate::{.., cli, ..}`.
cli_status=0
for f in $(find src -name '*.rs' ! -path 'src/cli/*' ! -path src/main.rs | sort); do
  body=$(sed '/^#\[cfg(test)\]/,$d' "$f" | grep -vE '^\s*//' || true)
  if grep -qE 'crate::cli\b|crate::\{[^}]*\bcli\b' <<<"$body"; then
    echo "$f imports crate::cli: the domain takes settings structs; resolve the clap arguments in src/cli/resolve.rs instead" >&2
    cli_status=1
  fi
done
if ((cli_status == 0)); then
  echo "ok: only src/cli/ and src/main.rs import crate::cli"
else
  status=1
fi

# The whole crate (docs/architecture.md, "The pipeline"): no cycle between top-level modules,
# no stage importing a later one, no file importing a file that imports it back.
if ! python3 scripts/module-graph.py src; then
  status=1
fi
exit $status

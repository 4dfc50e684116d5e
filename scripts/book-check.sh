#!/usr/bin/env bash
# Builds the book (docs/, mdBook) and checks every link and anchor of it and of README.md
# (scripts/book-check.py). mdBook is not a Debian package, so it is installed from
# crates.io at a pinned version into target/tools/ once (about a minute on 2 cores, without
# its server and file watcher), then reused.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
MDBOOK_VERSION=0.5.4
TOOLS="$ROOT/target/tools"
mdbook="$TOOLS/bin/mdbook"
if ! "$mdbook" --version 2>/dev/null | grep -q "v$MDBOOK_VERSION"; then
  start=$(date +%s)
  cargo install --quiet --locked --no-default-features --version "$MDBOOK_VERSION" --root "$TOOLS" mdbook
  echo "book-check: installed mdbook $MDBOOK_VERSION in $(( $(date +%s) - start )) s" >&2
fi
rm -rf target/book
"$mdbook" build docs
python3 scripts/book-check.py target/book

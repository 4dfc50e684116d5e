#!/usr/bin/env bash
# Re-fetches the chart library that report.html inlines (uPlot, MIT) from the npm registry,
# at the version package.json pins, into src/report/html/vendor/uplot/ (with its licence
# and version), where src/report/html.rs embeds it with include_str!. To move to a newer
# uPlot: change the version in package.json, run `npm install`, then this script, and
# commit package.json, package-lock.json and the vendored files together.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
npm ci --no-audit --no-fund
src=node_modules/uplot
dst=src/report/html/vendor/uplot
mkdir -p "$dst"
cp "$src/dist/uPlot.iife.min.js" "$src/dist/uPlot.min.css" "$src/LICENSE" "$dst/"
node -p 'require("./node_modules/uplot/package.json").version' > "$dst/VERSION"
echo "vendored uPlot $(cat "$dst/VERSION") into $dst"

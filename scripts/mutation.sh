#!/usr/bin/env bash
# Mutation testing of the modules that guard data: scripts/mutation.py, with the project's venv.
# Not in CI; docs/testing.md says when to run it and what it found.
#
#   bash scripts/mutation.sh                   # every module, then the Lua (about an hour on two cores)
#   bash scripts/mutation.sh lua [swap ...]    # the Lua guards' hand-made mutants (scripts/lua_mutants.py)
#   bash scripts/mutation.sh lock redact       # some of them (--list names them)
#   bash scripts/mutation.sh --retest lock     # the last run's survivors, on the tests as they are now
#   bash scripts/mutation.sh --report          # the counts and survivors of the last runs
#
# Mutants are applied to a copy of the tree under $BLOOMCTL_MUTATION_DIR (/tmp/bloomctl-mutation):
# the checkout is never written, Ctrl-C included. Exit status: 0 when nothing survived, 1 when
# something did, 130 when interrupted.
set -euo pipefail
cd "$(dirname "$0")/.."
python="${PYTHON:-.venv/bin/python}"
if ! "$python" -c 'import cosmic_ray' 2>/dev/null; then
    echo "mutation.sh: cosmic-ray is missing: $python -m pip install -e '.[mutation]'" >&2
    exit 2
fi
# The Lua guards, which cosmic-ray does not reach, have hand-made mutants: `lua` runs them alone,
# and a run with no names runs them after the Python modules.
if [ "${1:-}" = "lua" ]; then
    shift
    exec "$python" scripts/lua_mutants.py "$@"
fi
if [ "$#" -gt 0 ]; then
    exec "$python" scripts/mutation.py "$@"
fi
status=0
"$python" scripts/mutation.py || status=$?
if [ "$status" -gt 1 ]; then  # interrupted, or could not run: stop there
    exit "$status"
fi
"$python" scripts/lua_mutants.py || exit $?
exit "$status"

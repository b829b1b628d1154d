#!/usr/bin/env bash
# The quickstart as a new user meets it. .ci/run calls this; it also runs by hand (about a minute).
#
#   bash scripts/check-quickstart.sh
#
# 1. A fresh clone of this repository's HEAD, run with an empty environment and a minimal PATH, so
#    nothing can import bloomctl: the quickstart must create .venv, install the checkout, say so,
#    and finish the tour; run again, it must use that .venv without installing.
#    Piped (as here), its output is plain text: not one escape sequence; and its window demo keeps
#    its bucket within capacity (`window info` warns about one past it).
# 2. Its failures: a missing server binary, a module that does not load and a busy port each exit
#    non-zero, the last two with the server's log on stderr.
# Needs git, python3 (3.11+) and redis-server on /usr/local/bin:/usr/bin:/bin, and pip's access to PyPI.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
tmp="$(mktemp -d)"
busy_pid=
cleanup() {
  if [ -n "$busy_pid" ]; then kill "$busy_pid" 2>/dev/null || true; wait "$busy_pid" 2>/dev/null || true; fi
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() { printf 'check-quickstart: FAIL: %s\n' "$1" >&2; sed -e 's/^/  | /' "$tmp/out" >&2; exit 1; }

git clone -q "$root" "$tmp/clone"
mkdir "$tmp/home"
# An empty environment, but pip keeps its own settings (index, certificates, proxy) if it has any.
clean_env=(env -i HOME="$tmp/home" PATH=/usr/local/bin:/usr/bin:/bin)
for name in $(compgen -e); do
  case "$name" in PIP_* | http_proxy | https_proxy | no_proxy | HTTP_PROXY | HTTPS_PROXY | NO_PROXY)
    clean_env+=("$name=${!name}") ;;
  esac
done
quickstart() { (cd "$tmp/clone" && "${clean_env[@]}" "$@" bash examples/quickstart.sh "${args[@]}") >"$tmp/out" 2>&1; }

args=()
"${clean_env[@]}" python3 -c 'import bloomctl.cli' >/dev/null 2>&1 && fail "bloomctl is importable before the quickstart"
quickstart || fail "the quickstart on a fresh clone exited $?"
grep -q 'installing this checkout into' "$tmp/out" || fail "the quickstart did not say it installed bloomctl"
grep -q 'rollback users --yes' "$tmp/out" || fail "the tour did not reach rollback"
[ -x "$tmp/clone/.venv/bin/bloomctl" ] || fail "no .venv/bin/bloomctl in the clone"
grep -q $'\x1b' "$tmp/out" && fail "escape sequences in the piped output"
grep -q 'above plan' "$tmp/out" && fail "the window demo overfills a bucket"
quickstart || fail "the second run exited $?"
grep -q 'installing this checkout into' "$tmp/out" && fail "the second run installed again"
echo "check-quickstart: fresh clone OK (installed into .venv, then used it)"

quickstart REDIS_SERVER=/nonexistent/redis-server && fail "a missing REDIS_SERVER did not fail"
grep -q 'no redis-server at /nonexistent/redis-server' "$tmp/out" || fail "no message for a missing REDIS_SERVER"

args=(/nonexistent/redisbloom.so)
quickstart && fail "a module that does not load did not fail"
grep -q 'did not start' "$tmp/out" && grep -q 'nonexistent/redisbloom.so' "$tmp/out" ||
  fail "no server log for a module that does not load"

args=()
busy_port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
redis-server --port "$busy_port" --bind 127.0.0.1 --dir "$tmp" --save "" --appendonly no >/dev/null 2>&1 &
busy_pid=$!
printf '#!/bin/sh\nexec redis-server "$@" --port %s\n' "$busy_port" >"$tmp/busy-redis-server"
chmod +x "$tmp/busy-redis-server"
for _ in $(seq 50); do redis-cli -p "$busy_port" ping >/dev/null 2>&1 && break; sleep 0.1; done
quickstart REDIS_SERVER="$tmp/busy-redis-server" && fail "a busy port did not fail"
grep -q 'Address already in use' "$tmp/out" || fail "no server log for a busy port"
echo "check-quickstart: failures OK (missing binary, bad module, busy port)"

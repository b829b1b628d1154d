#!/usr/bin/env bash
# A five-minute tour of bloomctl against a throwaway local redis-server (nothing else is touched).
#
#   bash examples/quickstart.sh [/path/to/redisbloom.so]
#
# The module path may also come from BLOOMCTL_REDISBLOOM_MODULE. The server runs on a free port
# in a temporary directory and is shut down when the script ends.
set -euo pipefail

module="${1:-${BLOOMCTL_REDISBLOOM_MODULE:-}}"
bloomctl=(bloomctl)
command -v bloomctl >/dev/null 2>&1 || bloomctl=(python3 -m bloomctl)

workdir="$(mktemp -d)"
port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
server_args=(--port "$port" --bind 127.0.0.1 --dir "$workdir" --save "" --appendonly no --daemonize yes
             --pidfile "$workdir/redis.pid" --logfile "$workdir/redis.log")
if [ -n "$module" ]; then
  server_args+=(--loadmodule "$module")
fi
redis-server "${server_args[@]}"
cleanup() { redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true; rm -rf "$workdir"; }
trap cleanup EXIT
for _ in $(seq 50); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.1; done
export BLOOMCTL_URL="redis://127.0.0.1:$port/0"

step() { printf '\n\033[1m$ %s\033[0m\n' "$*"; }
run() { step "bloomctl $*"; "${bloomctl[@]}" "$@"; }

run plan --capacity 1M --error-rate 1% --items 3M --format table

if [ -z "$module" ]; then
  printf '\nNo RedisBloom module given: the server has no BF.* commands, and bloomctl says so (exit 4):\n'
  run reserve users --capacity 100k --error-rate 1% || echo "(exit $?)"
  printf '\nRun again with the module path to see reserve, info, fill-ratio and swap:\n'
  printf '  bash examples/quickstart.sh /path/to/redisbloom.so\n'
  exit 0
fi

run reserve users --capacity 100k --error-rate 1% --format table
step "redis-cli BF.MADD users user:1 ... user:90000   (the application's writes)"
python3 - "$port" <<'PY'
import sys, redis
r = redis.Redis(port=int(sys.argv[1]))
for start in range(0, 90_000, 1000):
    r.execute_command("BF.MADD", "users", *[f"user:{i}" for i in range(start, start + 1000)])
PY
run info users --format table
run fill-ratio users --warn 0.8 --max 0.95 || echo "(exit $?: over --max)"

step "a rebuilt filter appears as the standby {users}:standby (bloomctl rebuild will do this)"
"${bloomctl[@]}" reserve '{users}:standby' --capacity 200k --error-rate 1% --format json >/dev/null
python3 - "$port" <<'PY'
import sys, redis
r = redis.Redis(port=int(sys.argv[1]))
for start in range(0, 100_000, 1000):
    r.execute_command("BF.MADD", "{users}:standby", *[f"user:{i}" for i in range(start, start + 1000)])
PY
run swap users --keep-old 600 --yes
run fill-ratio users --format text
run rollback users --yes
run info users --format json

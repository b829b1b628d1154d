#!/usr/bin/env bash
# A five-minute tour of bloomctl against a throwaway local redis-server (nothing else is touched).
#
#   bash examples/quickstart.sh [/path/to/redisbloom.so]
#
# The module path may also come from BLOOMCTL_REDISBLOOM_MODULE. Without one, the tour runs on
# bloomctl's module-free bitmap backend (a plain Redis string hashed by a Redis Functions library).
# The server runs on a free port in a temporary directory and is shut down when the script ends.
set -euo pipefail

module="${1:-${BLOOMCTL_REDISBLOOM_MODULE:-}}"
if command -v bloomctl >/dev/null 2>&1; then
  bloomctl=(bloomctl)
  python="$(head -n 1 "$(command -v bloomctl)" | sed -e 's/^#!//')"   # the interpreter bloomctl runs on
else
  python=python3
  bloomctl=("$python" -m bloomctl)
fi

workdir="$(mktemp -d)"
port="$("$python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
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
add_items() {  # the application's writes, through bloomctl's library: add_items KEY FIRST LAST
  "$python" - "$port" "$@" <<'PY'
import sys
import redis
from bloomctl import backends
port, key, first, last = int(sys.argv[1]), sys.argv[2].encode(), int(sys.argv[3]), int(sys.argv[4])
client = redis.Redis(port=port)
backend = backends.for_key(client, key)
for start in range(first, last, 1000):
    backend.madd(client, key, [f"user:{i}" for i in range(start, min(start + 1000, last))])
PY
}

if [ -n "$module" ]; then
  printf 'redis-server with RedisBloom (%s)\n' "$module"
else
  printf 'No RedisBloom module given: this tour uses the module-free bitmap backend.\n'
  printf 'Run `bash examples/quickstart.sh /path/to/redisbloom.so` for the RedisBloom one.\n'
fi

run plan --capacity 1M --error-rate 1% --items 3M --format table
run reserve users --capacity 100k --error-rate 1% --format table
step "(the application adds user:0 ... user:89999)"
add_items users 0 90000
run info users --format table
run fill-ratio users --warn 0.8 --max 0.95 || true

step "(a rebuilt, bigger filter appears as the standby {users}:standby; bloomctl rebuild will do this)"
"${bloomctl[@]}" reserve '{users}:standby' --capacity 200k --error-rate 1% --format json >/dev/null
add_items '{users}:standby' 0 100000
run swap users --keep-old 600 --yes
run fill-ratio users --format text
run rollback users --yes
run info users --format json

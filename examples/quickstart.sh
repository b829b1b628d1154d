#!/usr/bin/env bash
# A five-minute tour of bloomctl against a throwaway local redis-server (nothing else is touched).
#
#   bash examples/quickstart.sh [/path/to/redisbloom.so]
#   REDIS_SERVER=/opt/redis/bin/redis-server bash examples/quickstart.sh
#
# The module path may also come from BLOOMCTL_REDISBLOOM_MODULE. Without one, the tour runs on
# bloomctl's module-free bitmap backend (a plain Redis string hashed by a Redis Functions library).
# REDIS_SERVER picks the server binary (default: redis-server on PATH). The server runs on a free
# port in a temporary directory and is stopped when the script ends; if it does not start, the
# script exits 1 and prints the server's log to stderr.
# When no Python on hand can import bloomctl, the script installs this checkout into .venv at the
# repository's root (python3 -m venv .venv; pip install -e .) and says so.
# Headings are bold only on a terminal and never with NO_COLOR set (https://no-color.org), as
# bloomctl's own output is: piped or logged, the tour is plain text.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
module="${1:-${BLOOMCTL_REDISBLOOM_MODULE:-}}"
redis_server="${REDIS_SERVER:-redis-server}"

# The Python to run on: bloomctl's own interpreter when the command is on PATH, else the
# checkout's .venv if there is one, else python3.
python=python3
bloomctl=("$python" -m bloomctl)
if command -v bloomctl >/dev/null 2>&1; then
  interpreter="$(head -n 1 "$(command -v bloomctl)" | sed -e 's/^#!//')"
  if [ -x "$interpreter" ] && [[ "$(basename "$interpreter")" == python* ]]; then
    python="$interpreter"
    bloomctl=(bloomctl)
  fi
elif [ -x "$root/.venv/bin/python" ]; then
  python="$root/.venv/bin/python"
  bloomctl=("$python" -m bloomctl)
fi
# bloomctl.cli imports click and redis: a bare checkout on sys.path is not enough.
if ! "$python" -c 'import bloomctl.cli, redis' >/dev/null 2>&1; then
  printf 'bloomctl is not importable by %s: installing this checkout into %s/.venv (pip install -e .)\n' \
    "$python" "$root" >&2
  [ -x "$root/.venv/bin/python" ] || python3 -m venv "$root/.venv"
  PIP_DISABLE_PIP_VERSION_CHECK=1 "$root/.venv/bin/python" -m pip install -q -e "$root"
  python="$root/.venv/bin/python"
  bloomctl=("$python" -m bloomctl)
fi

if ! command -v "$redis_server" >/dev/null 2>&1; then
  printf 'quickstart: no redis-server at %s (set REDIS_SERVER=/path/to/redis-server)\n' "$redis_server" >&2
  exit 1
fi
workdir="$(mktemp -d)"
server_pid=
cleanup() {
  if [ -n "$server_pid" ]; then kill "$server_pid" 2>/dev/null || true; wait "$server_pid" 2>/dev/null || true; fi
  rm -rf "$workdir"
}
trap cleanup EXIT
port="$("$python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
server_args=(--port "$port" --bind 127.0.0.1 --dir "$workdir" --save "" --appendonly no)
if [ -n "$module" ]; then
  server_args+=(--loadmodule "$module")
fi
"$redis_server" "${server_args[@]}" >"$workdir/redis.log" 2>&1 &
server_pid=$!
serving() {  # the server on the port works in our directory (another one that held the port would answer too)
  "$python" - "$port" "$workdir" <<'PY' 2>/dev/null
import os, sys
import redis
port, workdir = int(sys.argv[1]), os.path.realpath(sys.argv[2])
try:
    served = redis.Redis(port=port, socket_timeout=1).config_get("dir")["dir"]
except redis.RedisError:
    sys.exit(1)
sys.exit(0 if os.path.realpath(served) == workdir else 1)
PY
}
started=
for _ in $(seq 50); do
  kill -0 "$server_pid" 2>/dev/null || break
  if serving; then started=1; break; fi
  sleep 0.2
done
if [ -z "$started" ]; then
  printf 'quickstart: %s did not start on port %s. The end of its log:\n' "$redis_server" "$port" >&2
  if [ -s "$workdir/redis.log" ]; then tail -n 20 "$workdir/redis.log" >&2; else echo '(the log is empty)' >&2; fi
  exit 1
fi
export BLOOMCTL_URL="redis://127.0.0.1:$port/0"

if [ -t 1 ] && [ -z "${NO_COLOR:-}" ]; then bold=$'\033[1m' plain=$'\033[0m'; else bold= plain=; fi
step() { printf '\n%s$ %s%s\n' "$bold" "$*" "$plain"; }
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
run reserve users --capacity 100k --error-rate 1% --format table --yes
step "(the application adds user:0 ... user:89999)"
add_items users 0 90000
run info users --format table
run fill-ratio users --warn 0.8 --max 0.95 || true

step "(a rebuilt, bigger filter appears as the standby {users}:standby; bloomctl rebuild will do this)"
"${bloomctl[@]}" reserve '{users}:standby' --capacity 200k --error-rate 1% --format json --yes >/dev/null
add_items '{users}:standby' 0 100000
run swap users --keep-old 600 --yes
run fill-ratio users --format text
run rollback users --yes
run info users --format json

step "(a cuckoo filter: items can be deleted again; the application adds 5,000 sessions and ends 1,000)"
run reserve sessions --type cuckoo --capacity 10k --bucket-size 4 --format table --yes
"$python" - "$port" <<'PY'
import sys
import redis
from bloomctl import Filter
sessions = Filter(redis.Redis(port=int(sys.argv[1])), "sessions")
sessions.madd([f"session:{i}" for i in range(5000)], dual_write=True)
sessions.mdelete([f"session:{i}" for i in range(1000)], dual_write=True)
print("session:1 present:", sessions.exists("session:1"), "- session:4999 present:", sessions.exists("session:4999"))
PY
run info sessions --format table
run fill-ratio sessions || true

step "(a time-windowed filter: one bucket a day, the last 3 looked up together, old ones expiring)"
run window create recent --period 1d --keep 3 --capacity auto --min-capacity 1k --error-rate 1% --yes
"$python" - "$port" <<'PY'
import sys
import redis
from bloomctl import WindowedFilter
recent = WindowedFilter(redis.Redis(port=int(sys.argv[1])), "recent")
recent.madd([f"event:{i}" for i in range(700)])  # 70% of the bucket (past 100%, window info would warn)
print("event:7 seen recently:", recent.exists("event:7"), "- event:9999:", recent.exists("event:9999"))
PY
run window info recent --format table
step "(the cron job's rotation tomorrow, as if the server's clock were a day on: a new bucket, sized from today's)"
"$python" - "$port" <<'PY'
import sys
import redis
from bloomctl import detect, window
client = redis.Redis(port=int(sys.argv[1]))
later = window.server_time(client, b"recent") + window.DAY
report = window.rotate(client, detect(client), "recent", now=later, dry_run=True)
print(f"current bucket {report.as_dict()['current']}; new buckets' capacity {report.capacity:,} ({report.capacity_basis}) [dry run]")
for bucket in report.as_dict()["buckets"]:
    print(f"  {bucket['action']:8} {bucket['key']}" + (f" until {bucket['expire_at']}" if bucket["expire_at"] else ""))
PY
run window rotate recent

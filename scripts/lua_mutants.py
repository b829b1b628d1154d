"""Hand-made mutants of the Lua that guards data, which no mutation tool reaches: the swap and
rollback scripts, the lock's renewal and release, the standby marks, the client build's cutover
and upload scripts, and the dual-write library. Each mutant drops or weakens one guard; the tests
that matter for it run against the mutated code, and a mutant they do not fail survives.

Like scripts/mutation.py, it works in a copy of the working tree (the checkout is never written;
the copy's file is put back after each mutant and checked at the end), and the tests' own
bloomctl processes import the copy through PYTHONPATH. Each pytest run starts its own servers, so
a mutated function library is the one loaded. Not in CI (docs/testing.md).

    python scripts/lua_mutants.py            # every mutant
    python scripts/lua_mutants.py swap lock  # those whose name starts with one of these
    python scripts/lua_mutants.py --without tests/test_swap_script.py swap   # as before that file
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORK = Path(os.environ.get("BLOOMCTL_MUTATION_DIR", "/tmp/bloomctl-mutation")) / "lua"
TIMEOUT = 300  # seconds for one mutant's tests: a mutant that hangs them counts as killed

SWAP_TESTS = ("tests/test_swap_script.py", "tests/test_swap_atomic.py")
LOCK_TESTS = ("tests/test_locks.py",)
REBUILD_TESTS = ("tests/test_rebuild.py", "-k", "not cluster")
CLIENT_TESTS = ("tests/test_client_build.py", "-k", "not cluster")
DUAL_TESTS = ("tests/test_cuckoo_rebuild.py",)


@dataclass(frozen=True)
class Mutant:
    name: str
    path: str
    old: str  # exactly once in the file
    new: str
    tests: tuple[str, ...]


MUTANTS = [
    # the swap script (bloomctl/lifecycle/single.py)
    Mutant(
        "swap-lock",
        "bloomctl/lifecycle/single.py",
        "if ARGV[4] ~= '' then\n  local lock",
        "if false then\n  local lock",
        SWAP_TESTS,
    ),
    Mutant(
        "swap-type",
        "bloomctl/lifecycle/single.py",
        "if redis.call('TYPE', KEYS[2])['ok'] ~= ARGV[2] then",
        "if false then",
        SWAP_TESTS,
    ),
    Mutant(
        "swap-magic",
        "bloomctl/lifecycle/single.py",
        "if ARGV[3] ~= '' and redis.call('GETRANGE', KEYS[2]",
        "if false and redis.call('GETRANGE', KEYS[2]",
        SWAP_TESTS,
    ),
    Mutant("swap-loading", "bloomctl/lifecycle/single.py", "if standby_meta[1] == 'loading' or ", "if ", SWAP_TESTS),
    Mutant("swap-failed", "bloomctl/lifecycle/single.py", "or standby_meta[1] == 'failed' or", "or", SWAP_TESTS),
    Mutant(
        "swap-interrupted",
        "bloomctl/lifecycle/single.py",
        " or standby_meta[1] == 'interrupted' then",
        " then",
        SWAP_TESTS,
    ),
    Mutant(
        "swap-dual-log", "bloomctl/lifecycle/single.py", "if standby_meta[2] == 'log' then", "if false then", SWAP_TESTS
    ),
    Mutant("swap-dual-error", "bloomctl/lifecycle/single.py", "if standby_meta[3] then", "if false then", SWAP_TESTS),
    Mutant(
        "swap-keep-negative", "bloomctl/lifecycle/single.py", "if not keep or keep < 0 or", "if not keep or", SWAP_TESTS
    ),
    Mutant(
        "swap-same-keys",
        "bloomctl/lifecycle/single.py",
        "    if KEYS[i] == KEYS[j] then\n      return redis.error_reply('BLOOMCTL the standby must",
        "    if false then\n      return redis.error_reply('BLOOMCTL the standby must",
        SWAP_TESTS,
    ),
    Mutant(
        "swap-persist",
        "bloomctl/lifecycle/single.py",
        "redis.call('RENAME', KEYS[2], KEYS[1])\nredis.call('PERSIST', KEYS[1])",
        "redis.call('RENAME', KEYS[2], KEYS[1])",
        SWAP_TESTS,
    ),
    Mutant(
        "swap-keep-old",
        "bloomctl/lifecycle/single.py",
        "if keep > 0 then\n  redis.call('PEXPIRE', KEYS[3], keep)",
        "if keep > 0 then\n  redis.call('UNLINK', KEYS[3])",
        SWAP_TESTS,
    ),
    Mutant(
        "rollback-no-old",
        "bloomctl/lifecycle/single.py",
        "if redis.call('EXISTS', KEYS[3]) == 0 then\n  return redis.error_reply('BLOOMCTL no old",
        "if false then\n  return redis.error_reply('BLOOMCTL no old",
        SWAP_TESTS,
    ),
    Mutant(
        "rollback-standby",
        "bloomctl/lifecycle/single.py",
        "if redis.call('EXISTS', KEYS[2]) == 1 then\n  return redis.error_reply('BLOOMCTL a standby",
        "if false then\n  return redis.error_reply('BLOOMCTL a standby",
        SWAP_TESTS,
    ),
    Mutant(
        "rollback-persist",
        "bloomctl/lifecycle/single.py",
        "redis.call('RENAME', KEYS[3], KEYS[1])\nredis.call('PERSIST', KEYS[1])",
        "redis.call('RENAME', KEYS[3], KEYS[1])",
        SWAP_TESTS,
    ),
    # the lock (bloomctl/lifecycle/lock.py)
    Mutant(
        "lock-renew-token",
        "bloomctl/lifecycle/lock.py",
        "if value and cjson.decode(value)['token'] == ARGV[1] then\n  return redis.call('PEXPIRE'",
        "if value then\n  return redis.call('PEXPIRE'",
        LOCK_TESTS,
    ),
    Mutant(
        "lock-release-token",
        "bloomctl/lifecycle/lock.py",
        "if value and cjson.decode(value)['token'] == ARGV[1] then\n  return redis.call('DEL'",
        "if value then\n  return redis.call('DEL'",
        LOCK_TESTS,
    ),
    # standby marks (bloomctl/lifecycle/metadata.py, standby.py)
    Mutant(
        "mark-generation",
        "bloomctl/lifecycle/metadata.py",
        "if redis.call('HGET', KEYS[1], 'generation') ~= ARGV[1] then return 0 end\nredis.call('HSET', KEYS[1], 'state', ARGV[2])",
        "redis.call('HSET', KEYS[1], 'state', ARGV[2])",
        (*LOCK_TESTS, "tests/test_rebuild.py", "-k", "not cluster"),
    ),
    Mutant(
        "discard-generation",
        "bloomctl/lifecycle/standby.py",
        "if redis.call('HGET', KEYS[2], 'generation') ~= ARGV[1] then return 0 end\nlocal build",
        "local build",
        (*CLIENT_TESTS, *LOCK_TESTS, "tests/test_memory.py"),
    ),
    # the client build's scripts (bloomctl/rebuild/build/)
    Mutant(
        "cutover-generation",
        "bloomctl/rebuild/build/redisbloom.py",
        "if redis.call('HGET', KEYS[3], 'generation') ~= ARGV[2] then return -1 end",
        "",
        (*CLIENT_TESTS, "tests/test_locks.py"),
    ),
    Mutant(
        "cutover-card",
        "bloomctl/rebuild/build/redisbloom.py",
        "if tostring(redis.call('BF.CARD', KEYS[1])) ~= ARGV[1] then return 0 end",
        "",
        CLIENT_TESTS,
    ),
    Mutant(
        "or-chunk-generation",
        "bloomctl/rebuild/build/bitmap.py",
        "if redis.call('HGET', KEYS[4], 'generation') ~= ARGV[1] then return -1 end",
        "",
        (*CLIENT_TESTS, "tests/test_locks.py"),
    ),
    Mutant(
        "add-count-generation",
        "bloomctl/rebuild/build/bitmap.py",
        "if redis.call('HGET', KEYS[2], 'generation') ~= ARGV[1] then return -1 end\nlocal raw",
        "local raw",
        (*CLIENT_TESTS, "tests/test_locks.py"),
    ),
    # the dual-write library (bloomctl/backends/dual.lua)
    Mutant(
        "dual-log-needs-lock",
        "bloomctl/backends/dual.lua",
        "if state == 'loading' and redis.call('EXISTS', keys[5]) == 1 then",
        "if state == 'loading' then",
        DUAL_TESTS,
    ),
    Mutant(
        "dual-log-needs-loading",
        "bloomctl/backends/dual.lua",
        "if state == 'loading' and redis.call('EXISTS', keys[5]) == 1 then",
        "if redis.call('EXISTS', keys[5]) == 1 then",
        DUAL_TESTS,
    ),
    Mutant(
        "dual-direct-failed",
        "bloomctl/backends/dual.lua",
        "if state == 'failed' or state == 'interrupted' or",
        "if",
        DUAL_TESTS,
    ),
    Mutant(
        "dual-direct-missing",
        "bloomctl/backends/dual.lua",
        " or redis.call('EXISTS', keys[2]) == 0 then\n    return nil",
        " then\n    return nil",
        DUAL_TESTS,
    ),
    Mutant(
        "dual-first-build-log",
        "bloomctl/backends/dual.lua",
        "    if mode == 'log' then\n      log_entries(keys, op, items)\n    end\n    return redis.error_reply('ERR not found')",
        "    return redis.error_reply('ERR not found')",
        DUAL_TESTS,
    ),
    Mutant(
        "dual-standby-no-room",
        "bloomctl/backends/dual.lua",
        "      if problem[n] ~= 1 then",
        "      if false then",
        DUAL_TESTS,
    ),
    Mutant(
        "dual-error-recorded",
        "bloomctl/backends/dual.lua",
        "    redis.call('HSET', keys[3], 'dual_error', string.sub(message(problem), 1, 200))",
        "",
        DUAL_TESTS,
    ),
    Mutant(
        "replay-lock",
        "bloomctl/backends/dual.lua",
        "if not lock or not string.find(lock, args[2], 1, true) then\n    return redis.error_reply('BLOOMCTL lost the lock (it expired): the replay",
        "if false then\n    return redis.error_reply('BLOOMCTL lost the lock (it expired): the replay",
        DUAL_TESTS,
    ),
    Mutant(
        "replay-generation",
        "bloomctl/backends/dual.lua",
        "if redis.call('HGET', keys[2], 'generation') ~= args[1] then\n    return redis.error_reply('BLOOMCTL the standby was replaced",
        "if false then\n    return redis.error_reply('BLOOMCTL the standby was replaced",
        DUAL_TESTS,
    ),
    Mutant(
        "replay-no-room",
        "bloomctl/backends/dual.lua",
        "if op == 'add' and flags[1] ~= 1 then",
        "if false then",
        DUAL_TESTS,
    ),
    Mutant(
        "replay-direct-when-drained",
        "bloomctl/backends/dual.lua",
        "  if left == 0 then\n    redis.call('HSET', keys[2], 'dual', 'direct')",
        "  if left < 0 then\n    redis.call('HSET', keys[2], 'dual', 'direct')",
        DUAL_TESTS,
    ),
    Mutant(
        "replay-trim",
        "bloomctl/backends/dual.lua",
        "  if read > 0 then\n    redis.call('LTRIM', keys[3], read, -1)",
        "  if read > 1 then\n    redis.call('LTRIM', keys[3], read, -1)",
        DUAL_TESTS,
    ),
]


def copy_tree() -> Path:
    """The working tree (not .git, not the venv) under WORK, the compiled kernel included."""
    if WORK.exists():
        shutil.rmtree(WORK)
    ignore = shutil.ignore_patterns(".git", ".venv", "__pycache__", ".pytest_cache", ".ruff_cache", ".mypy_cache")
    shutil.copytree(ROOT, WORK, ignore=ignore)
    return WORK


def run_tests(copy: Path, tests: tuple[str, ...]) -> tuple[bool, float]:
    """Whether the tests pass in ``copy`` (a timeout counts as a failure), and the seconds taken."""
    env = {**os.environ, "PYTHONPATH": str(copy), "CI": "true"}
    started = time.monotonic()
    command = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests]
    try:
        result = subprocess.run(command, cwd=copy, env=env, capture_output=True, timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        return False, time.monotonic() - started
    return result.returncode == 0, time.monotonic() - started


def main(arguments: list[str]) -> int:
    without = set()
    while arguments[:1] == ["--without"] and len(arguments) > 1:  # a test file left out of every selection
        without.add(arguments[1])
        arguments = arguments[2:]
    prefixes = arguments
    chosen = [
        Mutant(m.name, m.path, m.old, m.new, tuple(t for t in m.tests if t not in without))
        for m in MUTANTS
        if not prefixes or m.name.startswith(tuple(prefixes))
    ]
    copy = copy_tree()
    check = subprocess.run(
        [sys.executable, "-c", "import bloomctl; print(bloomctl.__file__)"],
        cwd="/",
        env={**os.environ, "PYTHONPATH": str(copy)},
        capture_output=True,
        text=True,
        check=True,
    )
    if not check.stdout.startswith(str(copy)):
        print(f"lua_mutants: the copy is not what imports ({check.stdout.strip()})", file=sys.stderr)
        return 2
    for mutant in chosen:  # every mutant's text must be there once, or the list is out of date
        text = (copy / mutant.path).read_text()
        if text.count(mutant.old) != 1:
            print(
                f"lua_mutants: {mutant.name}: its text is in {mutant.path} {text.count(mutant.old)} times",
                file=sys.stderr,
            )
            return 2
    originals = {m.path: (copy / m.path).read_bytes() for m in chosen}
    for tests in dict.fromkeys(m.tests for m in chosen):  # the unmutated code passes them
        passed, seconds = run_tests(copy, tests)
        if not passed:
            print(f"lua_mutants: the tests fail without a mutant: {' '.join(tests)}", file=sys.stderr)
            return 2
    survivors = []
    for mutant in chosen:
        path = copy / mutant.path
        original = path.read_text()
        try:
            path.write_text(original.replace(mutant.old, mutant.new))
            passed, seconds = run_tests(copy, mutant.tests)
        finally:
            path.write_text(original)
        verdict = "SURVIVED" if passed else "killed"
        print(f"{mutant.name:28} {verdict:8} {seconds:6.1f}s  {mutant.path}", flush=True)
        if passed:
            survivors.append(mutant)
    for name, original in originals.items():  # the copy is as it was: no mutant left behind
        if (copy / name).read_bytes() != original:
            print(f"lua_mutants: {name} in the copy was not put back", file=sys.stderr)
            return 2
    print(f"\n{len(chosen)} mutants: {len(chosen) - len(survivors)} killed, {len(survivors)} survived")
    for mutant in survivors:
        print(f"  survived: {mutant.name} ({mutant.path}): {mutant.old!r} -> {mutant.new!r}")
    return 1 if survivors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

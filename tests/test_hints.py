"""(#23 item 7) Every next-step command bloomctl prints is run here, in a shell, exactly as printed.

$BLOOMCTL_URL points at a closed port in every run: a hint that lost the server the command was
given (`copy --to URL` printed `bloomctl swap KEY`, which swapped on the source) fails to connect
instead of acting on whatever server the environment names. The catalogue at the end lists every
`bloomctl ...` written into a message of the package, and which test here follows it.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bloomctl.keys import KeyFamily
from tests.servers import RedisServer

BLOOMCTL = str(Path(sys.executable).parent / "bloomctl")
ROOT = Path(__file__).resolve().parents[1]
HINT = re.compile(r"`((?:[A-Z_]+=\S* )?bloomctl [^`]+)`")
NOWHERE = "redis://127.0.0.1:1"  # nothing listens: a hint without its --url fails here


def environment(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BLOOMCTL_")}
    env.update(BLOOMCTL_URL=NOWHERE, PATH=f"{Path(BLOOMCTL).parent}{os.pathsep}{env.get('PATH', '')}", **extra)
    return env


def run(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [BLOOMCTL, *args], capture_output=True, text=True, env=env or environment(), cwd=cwd, timeout=120
    )


def hints(result: subprocess.CompletedProcess) -> list[str]:
    return HINT.findall(result.stdout + result.stderr)


def follow(hint: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """The printed command, run by a shell as a user pastes it."""
    return subprocess.run(
        ["bash", "-c", hint], capture_output=True, text=True, env=env or environment(), cwd=cwd, timeout=120
    )


@pytest.fixture
def second(workdir) -> RedisServer:
    server = RedisServer(workdir)
    yield server
    server.stop()


@pytest.fixture
def csv(tmp_path) -> Path:
    path = tmp_path / "users.csv"
    path.write_text("id\n" + "".join(f"user:{i}\n" for i in range(500)))
    return path


def test_a_rebuild_without_swap_and_the_swap_print_commands_that_act_on_the_same_server(plain, csv):
    key = "bf:{users}"
    assert run("--url", plain.url, "reserve", key, "-c", "1000", "-e", "0.01").returncode == 0  # a filter to replace
    built = run("--url", plain.url, "rebuild", key, "--from-csv", str(csv), "-c", "1000", "-e", "0.01")
    assert built.returncode == 0, built.stderr
    (swap,) = hints(built)
    assert f"--url {plain.url}" in swap and "'bf:{users}'" in swap, swap
    swapped = follow(swap)
    assert swapped.returncode == 0, swapped.stderr
    assert plain.client().exists(key) and not plain.client().exists(KeyFamily.of(key).standby)
    (rollback,) = [h for h in hints(swapped) if " rollback " in h]
    rolled = follow(rollback)
    assert rolled.returncode == 0, rolled.stderr
    assert plain.client().exists(KeyFamily.of(key).standby)  # the rolled-back filter is the standby again


def test_host_and_port_options_reach_the_hint_too(plain, csv):
    built = run(
        "-h", "127.0.0.1", "-p", str(plain.port), "rebuild", "users", "--from-csv", str(csv), "-c", "1000", "-e", "0.01"
    )
    assert built.returncode == 0, built.stderr
    (swap,) = hints(built)
    assert follow(swap).returncode == 0
    assert plain.client().exists("users")


def test_copy_prints_the_targets_swap_not_the_sources(plain, second, csv):
    source, target = plain.client(), second.client()
    assert (
        run(
            "--url", plain.url, "rebuild", "users", "--from-csv", str(csv), "-c", "1000", "-e", "0.01", "--swap"
        ).returncode
        == 0
    )
    source.set("{users}:marker", "source")
    copied = run("--url", plain.url, "copy", "users", "--to", second.url)
    assert copied.returncode == 0, copied.stderr
    (swap,) = hints(copied)
    assert second.url in swap and plain.url not in swap, swap
    swapped = follow(swap)
    assert swapped.returncode == 0, swapped.stderr
    assert target.exists("users") and not target.exists(KeyFamily.of("users").standby)
    assert not source.exists(KeyFamily.of("users").standby) and source.exists("users")  # the source untouched


def test_a_targets_password_is_never_printed_and_the_hint_says_where_it_goes(plain, workdir, csv, tmp_path):
    locked = RedisServer(workdir, extra=["--requirepass", "s3cret-pw"])
    try:
        assert (
            run(
                "--url", plain.url, "rebuild", "users", "--from-csv", str(csv), "-c", "1000", "-e", "0.01", "--swap"
            ).returncode
            == 0
        )
        in_url = locked.url.replace("redis://", "redis://:s3cret-pw@", 1)
        copied = run("--url", plain.url, "copy", "users", "--to", in_url)
        assert copied.returncode == 0, copied.stderr
        assert "s3cret-pw" not in copied.stdout + copied.stderr
        (swap,) = hints(copied)
        assert "with the URL's password in $BLOOMCTL_PASSWORD" in copied.stdout
        assert follow(swap, environment(BLOOMCTL_PASSWORD="s3cret-pw")).returncode == 0

        password_file = tmp_path / "pw"
        password_file.write_text("s3cret-pw\n")
        copied = run("--url", plain.url, "copy", "users", "--to", locked.url, "--to-password-file", str(password_file))
        assert copied.returncode == 0, copied.stderr
        (swap,) = hints(copied)
        assert f"--password-file {password_file}" in swap
        assert follow(swap).returncode == 0, swap

        copied = run(
            "--url", plain.url, "copy", "users", "--to", locked.url, env=environment(BLOOMCTL_TO_PASSWORD="s3cret-pw")
        )
        assert copied.returncode == 0, copied.stderr
        (swap,) = hints(copied)
        assert swap.startswith('BLOOMCTL_PASSWORD="$BLOOMCTL_TO_PASSWORD" '), swap
        assert follow(swap, environment(BLOOMCTL_TO_PASSWORD="s3cret-pw")).returncode == 0
    finally:
        locked.stop()


def test_restore_prints_its_swap_and_a_sharded_dump_points_to_another_name(plain, tmp_path, csv):
    assert run("--url", plain.url, "reserve", "big", "-c", "2000", "-e", "0.01", "--shards", "2").returncode == 0
    dump = tmp_path / "big.bfdump"
    assert run("--url", plain.url, "dump", "big", "-o", str(dump)).returncode == 0
    assert run("--url", plain.url, "reserve", "single", "-c", "100", "-e", "0.01").returncode == 0
    refused = run("--url", plain.url, "restore", "single", "-i", str(dump))
    assert refused.returncode == 5 and "--to-key)" not in refused.stderr, refused.stderr
    assert "under another name (the KEY of restore" in refused.stderr
    restored = run("--url", plain.url, "restore", "other", "-i", str(dump))  # what the line says to do
    assert restored.returncode == 0, restored.stderr
    (swap,) = hints(restored)
    assert follow(swap).returncode == 0
    assert plain.client().exists("other")


def test_a_bitmap_too_big_for_its_shards_names_the_shards_that_fit(plain):
    refused = run("--url", plain.url, "reserve", "huge", "-c", "3G", "-e", "0.1%", "--shards", "8", "--dry-run")
    assert refused.returncode == 2
    shards = int(re.search(r"give --shards (\d+) or more", refused.stderr).group(1))
    assert shards > 8
    assert (
        run(
            "--url", plain.url, "reserve", "huge", "-c", "3G", "-e", "0.1%", "--shards", str(shards), "--dry-run"
        ).returncode
        == 0
    )
    fewer = run(
        "--url", plain.url, "reserve", "huge", "-c", "3G", "-e", "0.1%", "--shards", str(shards - 1), "--dry-run"
    )
    assert fewer.returncode == 2  # the number named is the smallest that fits
    single = run("--url", plain.url, "reserve", "huge", "-c", "600M", "-e", "1%", "--dry-run")
    assert single.returncode == 2 and "give --shards 2 or more" in single.stderr, single.stderr


def test_library_messages_carry_the_connection_the_command_was_given(plain):
    from bloomctl.backends.library import LIBRARY_VERSION, functions_source

    client = plain.client()
    assert run("--url", plain.url, "reserve", "users", "-c", "100", "-e", "0.01").returncode == 0
    old = functions_source().replace(
        f"local LIB_VERSION = {LIBRARY_VERSION}", f"local LIB_VERSION = {LIBRARY_VERSION - 1}"
    )
    client.execute_command("FUNCTION", "LOAD", "REPLACE", old)
    refused = run("--url", plain.url, "reserve", "more", "-c", "100", "-e", "0.01")
    assert refused.returncode != 0
    (install,) = hints(refused)
    assert install.startswith(f"bloomctl --url {plain.url} functions install"), install
    assert follow(install).returncode == 0
    assert run("--url", plain.url, "reserve", "more", "-c", "100", "-e", "0.01").returncode == 0


def test_a_config_files_hint_names_the_file_it_came_from(plain, tmp_path):
    config = tmp_path / "deploy" / "app.toml"
    config.parent.mkdir()
    config.write_text('[filters.a]\ncapacity = "x"\n[filters.b]\nerror_rate = 7\n')
    failed = run("--url", plain.url, "--config", str(config), "check", cwd=tmp_path)
    assert failed.returncode == 2, failed.stderr
    (validate,) = hints(failed)
    assert f"--config {config}" in validate, validate
    listed = follow(validate, cwd=tmp_path)
    assert "no config file" not in listed.stderr
    assert "filters.a" in listed.stdout + listed.stderr and "filters.b" in listed.stdout + listed.stderr


def test_a_missing_current_bucket_names_the_rotate_that_fixes_it(plain):
    made = run(
        "--url", plain.url, "window", "create", "recent", "--period", "1d", "--keep", "2", "-c", "1000", "-e", "0.01"
    )
    assert made.returncode == 0, made.stderr
    described = run("--url", plain.url, "window", "info", "recent", "--format", "json")
    (current,) = [b["key"] for b in json.loads(described.stdout)["buckets"] if b["role"] == "current"]
    plain.client().delete(current)
    warned = run("--url", plain.url, "window", "info", "recent")
    (rotate,) = hints(warned)
    assert rotate.startswith(f"bloomctl --url {plain.url} window rotate"), rotate
    assert follow(rotate).returncode == 0, rotate
    assert plain.client().exists(current)


# --- the catalogue: every `bloomctl ...` the package writes into a message --------------------

FOLLOWED = {
    "bloomctl/cli/rebuild.py": "test_a_rebuild_without_swap_and_the_swap_print_commands_that_act_on_the_same_server",
    "bloomctl/cli/cutover.py": "test_a_rebuild_without_swap_and_the_swap_print_commands_that_act_on_the_same_server",
    "bloomctl/cli/transfer.py": "test_copy_prints_the_targets_swap_not_the_sources",
    "bloomctl/backends/library.py": "test_library_messages_carry_the_connection_the_command_was_given",
    "bloomctl/declared/config.py": "test_a_config_files_hint_names_the_file_it_came_from",
    "bloomctl/cli/window.py": "test_a_missing_current_bucket_names_the_rotate_that_fixes_it",
}
# Hints that need a fault to appear (a server lost mid-swap), or that name a command without its
# arguments on purpose (the user supplies them): the generic insertion of the connection is what
# test_library_messages_carry_the_connection_the_command_was_given proves for them.
POINTERS = {
    "bloomctl/lifecycle/standby.py": "a standby made by hand: `bloomctl swap KEY` (the same code path as the rebuild's hint)",
    "bloomctl/lifecycle/sharded.py": "a sharded swap cut off by a lost server",
    "bloomctl/lifecycle/single.py": "a swap whose reply was lost",
    "bloomctl/transfer/restore.py": "a declined prompt, and the ACL line's doctor",
    "bloomctl/doctor/report.py": "`bloomctl doctor KEY...`: the user names the keys",
    "bloomctl/doctor/inventory.py": "`bloomctl doctor KEY...`: the user names the keys",
    "bloomctl/doctor/access.py": "names the command a user cannot run, not one to run",
    "bloomctl/cli/doctor.py": "the label of the admin's ACL line (`functions install`), run as that user by test_doctor_acl.py",
    "bloomctl/window/settings.py": "`bloomctl window create`: the user gives the window's settings",
    "bloomctl/cli/filters.py": "`bloomctl reserve`, `rebuild ... --capacity N`: the user plans them",
    "bloomctl/declared/schedule.py": "a declared filter's swap (rebuild.swap = false)",
    "bloomctl/declared/check.py": "the fixes of `check`, run by test_check.py",
}


def _message_strings(tree: ast.AST) -> list[str]:
    """The package's string literals (f-strings' parts too), docstrings left out."""
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docstrings.add(id(first.value))
    return [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
    ]


def test_every_printed_command_is_followed_or_explained():
    found = set()
    for path in (ROOT / "bloomctl").rglob("*.py"):
        strings = _message_strings(ast.parse(path.read_text()))
        if any("`bloomctl " in text for text in strings):
            found.add(str(path.relative_to(ROOT)))
        if "next_step(" in path.read_text() or "hints import command" in path.read_text():
            found.add(str(path.relative_to(ROOT)))  # a command line's own hint, made by bloomctl.cli.hints
    machinery = {"bloomctl/cli/hints.py", "bloomctl/cli/output.py", "bloomctl/cli/context.py"}
    unexplained = found - set(FOLLOWED) - set(POINTERS) - machinery
    assert not unexplained, f"printed commands no test follows: {sorted(unexplained)}"
    assert found >= set(FOLLOWED), "a followed hint is gone: update the catalogue"


def test_a_copys_refusals_and_a_declined_swap_name_the_target(plain, second, csv, tmp_path):
    """After `copy --to`, a library message's command is about the target: pasted, it never acts on the source."""
    import pty

    assert (
        run(
            "--url", plain.url, "rebuild", "users", "--from-csv", str(csv), "-c", "1000", "-e", "0.01", "--swap"
        ).returncode
        == 0
    )
    assert run("--url", second.url, "reserve", "users", "-c", "1000", "-e", "0.01").returncode == 0
    controller, terminal_end = pty.openpty()
    process = subprocess.Popen(
        [BLOOMCTL, "--url", plain.url, "copy", "users", "--to", second.url, "--swap"],
        stdin=terminal_end,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=environment(),
        text=True,
    )
    os.close(terminal_end)
    time.sleep(2)  # the question is out by now
    os.write(controller, b"n\n")
    _out, err = process.communicate(timeout=60)
    os.close(controller)
    assert process.returncode == 5 and "the restored filter waits in the standby" in err, err
    (swap,) = HINT.findall(err)
    assert second.url in swap and plain.url not in swap, swap
    assert follow(swap).returncode == 0
    assert not second.client().exists(KeyFamily.of("users").standby)  # swapped in on the target


def test_a_hint_for_a_server_without_a_password_empties_the_shells(workdir, second, csv):
    """$BLOOMCTL_PASSWORD holds the source's password: the target's swap must not send it there (a
    server without a password refuses AUTH, and the password is another server's)."""
    source = RedisServer(workdir, extra=["--requirepass", "source-pw"])
    try:
        env = environment(BLOOMCTL_PASSWORD="source-pw")
        args = ("--url", source.url, "rebuild", "users", "--from-csv", str(csv), "-c", "1000", "-e", "0.01", "--swap")
        assert run(*args, env=env).returncode == 0
        copied = run("--url", source.url, "copy", "users", "--to", second.url, env=env)
        assert copied.returncode == 0, copied.stderr
        (swap,) = hints(copied)
        assert swap.startswith("BLOOMCTL_PASSWORD= bloomctl --url "), swap
        assert follow(swap, env).returncode == 0
        assert second.client().exists("users")
    finally:
        source.stop()


def test_a_url_whose_query_holds_the_password_keeps_its_port_and_database(plain, csv):
    url = f"{plain.url.rsplit('/', 1)[0]}/0?password=a@b"  # a query password with an '@': no userinfo
    from bloomctl.server.connection import url_without_secrets

    assert url_without_secrets(url) == f"{plain.url.rsplit('/', 1)[0]}/0"
    assert url_without_secrets("redis://h:6380/2?password=a:b@c") == "redis://h:6380/2"


def test_a_config_profiles_server_is_the_hints_server(plain, csv, tmp_path):
    """A rebuild of a declared filter runs on its profile's server: the swap it prints goes there, with
    the profile's password handed on from its variable (swap reads no profiles)."""
    locked = RedisServer(Path(tmp_path), extra=["--requirepass", "profile-pw"])
    try:
        config = tmp_path / "app.toml"
        config.write_text(
            "version = 1\n[profiles.default]\n"
            f'url = "{locked.url}"\npassword_env = "APP_REDIS_PASSWORD"\n'
            f'[filters.users]\ncapacity = 1000\nerror_rate = 0.01\nsource.csv = "{csv}"\nsource.column = "id"\n'
            "rebuild.swap = false\n"
        )
        env = environment(APP_REDIS_PASSWORD="profile-pw", BLOOMCTL_PASSWORD="the-shells-other-pw")
        built = run("--config", str(config), "rebuild", "users", env=env)
        assert built.returncode == 0, built.stderr
        (swap,) = hints(built)
        assert swap.startswith('BLOOMCTL_PASSWORD="$APP_REDIS_PASSWORD" bloomctl --url '), swap
        assert locked.url in swap and "profile-pw" not in built.stdout + built.stderr
        assert follow(swap, env).returncode == 0
    finally:
        locked.stop()

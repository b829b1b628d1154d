"""Operator habits (issue 23): what an SRE who knows redis-cli and kubectl types does what they
expect. `-h` is the host everywhere (help is --help), and global options work after the command."""

from __future__ import annotations

import json


def test_h_after_the_command_is_the_host_never_help(cli, plain):
    """`bloomctl fill-ratio users -h HOST` printed the usage and exited 0: a CI check pointed at
    production passed without looking. Now -h is the host wherever it stands."""
    from bloomctl.server.connection import connect, settings_from

    client = connect(settings_from(plain.url))
    client.delete("users")
    cli("reserve", "users", "-c", "1000", "-e", "1%", url=plain.url)
    nowhere = "redis://127.0.0.1:1/0"
    there = cli("fill-ratio", "users", "-h", "127.0.0.1", "-p", str(plain.port), "--format", "json", url=nowhere)
    assert there.exit_code == 0, there.stderr
    assert json.loads(there.stdout)["filters"][0]["key"] == "users"
    glued = cli("fill-ratio", "users", "-h127.0.0.1", "-p", str(plain.port), url=nowhere)
    assert glued.exit_code == 0, glued.stderr
    unreachable = cli("fill-ratio", "users", "-h", "no-such-host.invalid", "--connect-timeout", "2", url=plain.url)
    assert unreachable.exit_code == 3 and "usage" not in unreachable.stdout.lower(), unreachable.stdout
    left_out = cli("fill-ratio", "users", "-h", url=plain.url)
    assert left_out.exit_code == 2 and "-h is the server's host" in left_out.stderr and left_out.stdout == ""
    assert cli("fill-ratio", "--help").exit_code == 0
    alone = cli("-h")
    assert alone.exit_code == 0 and "--host" in alone.stdout


def test_global_options_work_after_the_command(cli, plain):
    """`bloomctl info users --url URL` said "No such option '--url'", and `fill-ratio ...
    --log-format json` exited 2 while `rebuild` took it: global options now go anywhere, and an
    option a command defines itself stays the command's."""
    from bloomctl.server.connection import connect, settings_from

    client = connect(settings_from(plain.url))
    client.delete("orders")
    cli("reserve", "orders", "-c", "1000", "-e", "1%", url=plain.url)
    wrong = "redis://127.0.0.1:1/0"
    after = cli("info", "orders", "--format", "json", "--url", plain.url, url=wrong)
    assert after.exit_code == 0 and json.loads(after.stdout)["key"] == "orders", after.stderr
    equals = cli("info", "orders", f"--url={plain.url}", "--log-format", "json", "-q", url=wrong)
    assert equals.exit_code == 0, equals.stderr
    missing = cli("info", "nope", "--log-format", "json", url=plain.url)
    assert missing.exit_code == 5 and json.loads(missing.stderr.splitlines()[-1])["exit_code"] == 5
    nested = cli("window", "info", "nope", "--url", plain.url, url=wrong)
    assert nested.exit_code == 5 and "'nope'" in nested.stderr, nested.stderr  # the server given after it
    dashdash = cli("info", "--", "--url", url=plain.url)  # after --, a key named --url
    assert dashdash.exit_code == 5 and "'--url'" in dashdash.stderr, dashdash.stderr


def test_moving_global_options_keeps_the_commands_own_words():
    """The reordering itself: values that look like options stay with their option (rebuild's
    `--column -q` is a column named -q), `--` ends it, and an unknown option before the command
    is left for Click to name."""
    from bloomctl.cli import global_options_first, main

    assert global_options_first(main, ["info", "users", "--url", "U", "-q"]) == ["--url", "U", "-q", "info", "users"]
    assert global_options_first(main, ["rebuild", "k", "--column", "-h", "-h", "H"]) == [
        "-h",
        "H",
        "rebuild",
        "k",
        "--column",
        "-h",
    ]
    assert global_options_first(main, ["rebuild", "k", "-q", "--log-format", "json"]) == [
        "-q",
        "--log-format",
        "json",
        "rebuild",
        "k",
    ]
    assert global_options_first(main, ["rebuild", "k", "--column", "-q"]) == ["rebuild", "k", "--column", "-q"]
    assert global_options_first(main, ["info", "--", "-h", "x"]) == ["info", "--", "-h", "x"]
    assert global_options_first(main, ["--bogus", "info", "-h", "x"]) == ["--bogus", "info", "-h", "x"]
    assert global_options_first(main, ["window", "rotate", "d", "-hH"]) == ["-hH", "window", "rotate", "d"]


def test_o_makes_its_directories_and_refuses_a_format_name(cli, plain, tmp_path, monkeypatch):
    """(item 6) `check -o json` wrote a file named json, and `-o reports/x.xml` exited 2 when
    reports/ did not exist (a fresh CI checkout). Now the directories are made, and a format's
    name is refused with the hint, before anything runs."""
    from bloomctl.server.connection import connect, settings_from

    connect(settings_from(plain.url)).delete("kept")
    cli("reserve", "kept", "-c", "1000", "-e", "1%", url=plain.url)
    monkeypatch.chdir(tmp_path)
    nested = cli("fill-ratio", "kept", "--format", "json", "-o", "reports/nightly/fill.json", url=plain.url)
    assert nested.exit_code == 0, nested.stderr
    assert json.loads((tmp_path / "reports" / "nightly" / "fill.json").read_text())["filters"][0]["key"] == "kept"
    for command in (["fill-ratio", "kept"], ["check"]):
        refused = cli(*command, "-o", "json", url=plain.url)
        assert refused.exit_code == 2, refused.stderr
        assert "did you mean --format json?" in refused.stderr
        assert not (tmp_path / "json").exists()
    explicit = cli("fill-ratio", "kept", "-o", "./json", url=plain.url)
    assert explicit.exit_code == 0 and (tmp_path / "json").is_file()
    (tmp_path / "afile").write_text("x")
    blocked = cli("fill-ratio", "kept", "-o", "afile/out.txt", url=plain.url)
    assert blocked.exit_code == 2 and "afile" in blocked.stderr


def test_quiet_prints_nothing_on_stdout_unless_something_failed(cli, plain, tmp_path):
    """(item 4) `bloomctl -q window rotate dedupe` printed 10 lines every run (cron mails them
    every 10 minutes), `rebuild -q` its 7-line summary. -q now holds stdout back unless the
    command fails; a machine format asked for, and a command whose stdout is its product, print."""
    from bloomctl.server.connection import connect, settings_from

    connect(settings_from(plain.url)).flushdb()
    created = cli(
        "window",
        "create",
        "dedupe",
        "--period",
        "1h",
        "--keep",
        "3",
        "-c",
        "1000",
        "-e",
        "1%",
        "--backend",
        "module-free",
        url=plain.url,
    )
    assert created.exit_code == 0, created.stderr
    rotated = cli("-q", "window", "rotate", "dedupe", url=plain.url)
    assert (rotated.exit_code, rotated.stdout, rotated.stderr) == (0, "", "")
    after = cli("window", "rotate", "dedupe", "-q", url=plain.url)  # -q after the command: the same
    assert (after.exit_code, after.stdout) == (0, "")
    rebuild = rebuild_ids(tmp_path)
    rebuilt = cli("-q", *rebuild, url=plain.url)
    assert (rebuilt.exit_code, rebuilt.stdout, rebuilt.stderr) == (0, "", "")
    missing = cli("-q", "rebuild", "ids", "--from-csv", str(tmp_path / "nope.csv"), "--column", "id", url=plain.url)
    assert missing.exit_code == 8 and missing.stdout == "" and missing.stderr.startswith("bloomctl: error:")
    failing = cli("-q", "fill-ratio", "ids", "--max", "0.01", url=plain.url)  # over its threshold: exit 1
    assert failing.exit_code == 1 and "ids" in failing.stdout  # what failed is printed
    asked = cli("-q", "info", "ids", "--format", "json", url=plain.url)
    assert asked.exit_code == 0 and json.loads(asked.stdout)["key"] == "ids"
    dumped = cli("-q", "dump", "ids", "-o", "-", url=plain.url)
    assert dumped.exit_code == 0 and len(dumped.stdout_bytes) > 100


def test_json_logs_and_the_summary_share_one_stream_as_json_lines(cli, plain, tmp_path):
    """(item 4) With --log-format json the documented `>>shop.log 2>&1` mixed the text summary
    into the JSON log lines: the summary is now JSON too, one line."""
    from bloomctl.server.connection import connect, settings_from

    connect(settings_from(plain.url)).flushdb()
    rebuild = rebuild_ids(tmp_path)
    for args in (
        ["--log-format", "json", *rebuild],
        [*rebuild, "--log-format", "json"],
        ["--log-format", "json", "info", "ids"],
    ):
        result = cli(*args, url=plain.url)
        assert result.exit_code == 0, result.stderr
        lines = (result.stdout + result.stderr).splitlines()
        assert lines and all(isinstance(json.loads(line), dict) for line in lines), lines
    report = json.loads(cli("--log-format", "json", "info", "ids", url=plain.url).stdout)
    assert report["key"] == "ids"


def rebuild_ids(folder) -> list[str]:
    """`rebuild ids` from a CSV of 500 ids written in ``folder``, swapped in."""
    source = folder / "ids.csv"
    source.write_text("id\n" + "".join(f"u{i}\n" for i in range(500)))
    return ["rebuild", "ids", "--from-csv", str(source), "--column", "id", "-c", "1000", "-e", "1%", "--swap"]


def test_bundled_flags_dangling_options_and_help_keep_their_meaning(cli, plain, tmp_path):
    """From a review of the above: `-vv fill-ratio users -h` printed the usage and exited 0 again
    (a bundle of short flags before the command hid the command), `-q --help` printed nothing, a
    `-q` that is --prefix's value held stdout back, `info -- -h` was refused, and `info users -p`
    took the command's name as the port."""
    from bloomctl.server.connection import connect, settings_from

    connect(settings_from(plain.url)).flushdb()
    cli("reserve", "users", "-c", "1000", "-e", "1%", url=plain.url)
    bundled = cli("-vv", "fill-ratio", "users", "--max", "0.0001", "-h", url=plain.url)
    assert bundled.exit_code == 2 and "-h is the server's host" in bundled.stderr and bundled.stdout == ""
    moved = cli("-qv", "fill-ratio", "users", "-h", "127.0.0.1", "-p", str(plain.port), url="redis://127.0.0.1:1/0")
    assert (moved.exit_code, moved.stdout) == (0, ""), moved.stderr  # -q in the bundle: held back
    for args in (["-q", "info", "--help"], ["info", "users", "-q", "--help"]):
        shown = cli(*args, url=plain.url)
        assert shown.exit_code == 0 and "Usage:" in shown.stdout
    source = tmp_path / "ids.csv"
    source.write_text("id\n" + "".join(f"u{i}\n" for i in range(300)))
    valued = cli(
        "rebuild",
        "p",
        "--from-csv",
        str(source),
        "--column",
        "id",
        "--prefix",
        "-q",
        "-c",
        "1000",
        "-e",
        "1%",
        url=plain.url,
    )
    assert valued.exit_code == 0 and "items read" in valued.stdout  # -q is the prefix, not --quiet
    assert cli("info", "--", "-h", url=plain.url).exit_code == 5  # a key named -h
    for flag in ("-p", "-u", "--url"):
        dangling = cli("info", "users", flag, url=plain.url)
        assert dangling.exit_code == 2 and f"{flag} is a global option: give it a value" in dangling.stderr


def test_json_logs_make_check_and_fill_ratio_one_line_and_o_edge_cases(cli, plain, tmp_path, monkeypatch):
    """fill-ratio and check printed indented JSON under --log-format json; `check -o -` wrote a
    file named '-'; `-o newdir/` wrote a file named newdir."""
    from bloomctl.server.connection import connect, settings_from

    connect(settings_from(plain.url)).flushdb()
    cli("reserve", "users", "-c", "1000", "-e", "1%", url=plain.url)
    filled = cli("--log-format", "json", "fill-ratio", "users", url=plain.url)
    assert filled.exit_code == 0 and len(filled.stdout.splitlines()) == 1
    assert json.loads(filled.stdout)["filters"][0]["key"] == "users"
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bloomctl.toml").write_text(
        f'[profiles.default]\nurl = "{plain.url}"\n\n[filters.users]\nkey = "users"\ncapacity = 1000\nerror_rate = 0.01\n'
    )
    checked = cli("--log-format", "json", "check", "--no-server-checks", url=None)
    lines = checked.stdout.splitlines()
    assert len(lines) == 1 and isinstance(json.loads(lines[0]), dict), checked.stdout
    dash = cli("check", "--no-server-checks", "-o", "-", "--format", "json", url=None)
    assert not (tmp_path / "-").exists() and isinstance(json.loads(dash.stdout), dict), dash.stderr
    slash = cli("fill-ratio", "users", "-o", "newdir/", url=plain.url)
    assert slash.exit_code == 2 and "names a directory" in slash.stderr and not (tmp_path / "newdir").exists()

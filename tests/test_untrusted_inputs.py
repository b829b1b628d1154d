"""(#24 item 5) What arrives from a file is not trusted: a bloomctl.toml source path outside the
file's directory is refused unless allowed, and a file that is not the export meant never has its
first line printed (a shadow-style file's password hash was, in the "no column" error)."""

from __future__ import annotations

from pathlib import Path

SECRET = "root:$6$salt$0123456789abcdef:19000:0:99999:7:::"


def _config(directory: Path, csv: str, url: str, allow: bool = False) -> Path:
    config = directory / "app.toml"
    config.write_text(
        f'version = 1\n[profiles.default]\nurl = "{url}"\n[filters.users]\ncapacity = 1000\nerror_rate = 0.01\n'
        f'source.csv = "{csv}"\nsource.column = "id"\n' + ("source.allow_outside = true\n" if allow else "")
    )
    return config


def test_a_source_outside_the_files_directory_is_refused_unless_allowed(cli_plain, plain, tmp_path):
    app, elsewhere = tmp_path / "app", tmp_path / "elsewhere"
    app.mkdir()
    elsewhere.mkdir()
    secret = elsewhere / "shadow"
    secret.write_text(SECRET + "\n")
    for path in (str(secret), "../elsewhere/shadow"):
        config = _config(app, path, plain.url)
        for command in (("rebuild", "users"), ("config", "validate"), ("apply", "--dry-run")):
            refused = cli_plain("--config", str(config), *command)
            assert refused.exit_code == 2, (command, refused.stdout, refused.stderr)
            assert "outside the file's directory" in refused.stdout + refused.stderr
            assert "$6$" not in refused.stdout + refused.stderr
    (app / "link.csv").symlink_to(secret)  # a link inside that points out is outside too
    assert cli_plain("--config", str(_config(app, "link.csv", plain.url)), "config", "validate").exit_code == 2
    allowed = cli_plain("--config", str(_config(app, str(secret), plain.url, allow=True)), "rebuild", "users")
    assert allowed.exit_code == 2 and "do not look like column names" in allowed.stderr, allowed.stderr
    assert "$6$" not in allowed.stdout + allowed.stderr and "root" not in allowed.stderr
    assert not plain.client().exists("users")


def test_a_real_headers_names_are_still_shown(cli_plain, plain, tmp_path):
    """A typo in a column name: the header's names help, and they are shown."""
    (tmp_path / "users.csv").write_text("user_id,email\n1,a@example.com\n")
    refused = cli_plain("--config", str(_config(tmp_path, "users.csv", plain.url)), "rebuild", "users")
    assert refused.exit_code == 2 and "no column 'id'; the header has: user_id, email" in refused.stderr


def test_a_user_denied_the_upload_builds_on_the_server_or_is_told_first(cli_bloom, bloom, tmp_path):
    """`--build auto` with BF.LOADCHUNK denied hashed the whole source, then failed (exit 3): the
    probe now tries the upload on its own key, and auto builds on the server instead."""
    client = bloom.client()
    client.execute_command("ACL", "SETUSER", "noload", "on", ">pw", "~*", "&*", "+@all", "-bf.loadchunk")
    try:
        url = bloom.url.replace("redis://", "redis://noload:pw@", 1)
        csv = tmp_path / "u.csv"
        csv.write_text("id\n" + "".join(f"user:{i}\n" for i in range(2000)))
        args = ("rebuild", "users", "--from-csv", str(csv), "-c", "10000", "-e", "0.01", "--format", "json")
        auto = cli_bloom(*args, "--swap", url=url)
        assert auto.exit_code == 0, auto.stderr
        assert '"build": "server"' in auto.stdout and "may not upload" in auto.stderr, auto.stderr
        forced = cli_bloom(*args, "--build", "client", url=url)
        assert forced.exit_code == 4 and "may not upload" in forced.stderr, forced.stderr
    finally:
        client.execute_command("ACL", "DELUSER", "noload")

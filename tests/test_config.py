"""bloomctl.toml: the file's checks (every problem with its line, unknown keys and secrets refused),
`config validate` and `config schema` (a JSON Schema that accepts the example and refuses what the
checks refuse), paths relative to the file, profiles' passwords, and --config / $BLOOMCTL_CONFIG."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from bloomctl.declared.config import ConfigError, find, load
from bloomctl.declared.declarations import rebuild_values, settings_for, source_values
from bloomctl.declared.locate import locate
from bloomctl.declared.schema import SPEC, json_schema, parse_duration
from bloomctl.errors import UsageError
from tests.helpers.files import write

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "bloomctl.toml"

GOOD = """\
version = 1

[profiles.default]
url = "redis://127.0.0.1:6379/0"

[filters.users]
capacity = "auto"
error_rate = "0.1%"
source.csv = "users.csv"
source.column = "id"
"""


def problems(tmp_path: Path, text: str) -> list[tuple[int | None, str]]:
    with pytest.raises(ConfigError) as caught:
        load(write(tmp_path / "bloomctl.toml", text))
    return caught.value.problems


def test_the_example_file_loads_as_three_filters():
    loaded = load(EXAMPLE)
    assert list(loaded.filters) == ["users", "skus", "dedupe"]
    users, skus, dedupe = loaded.filters.values()
    assert (users.kind, users.key, users.capacity, users.error_rate) == ("bloom", "shop:{users}", None, 0.001)
    assert users.source["sql"].startswith("SELECT id FROM users")
    assert skus.capacity == 10_000 and skus.source["csv"] == str(EXAMPLE.parent / "data" / "skus.csv")
    assert dedupe.kind == "windowed" and dedupe.window == {"period": "1d", "keep": 7}
    assert users.line is not None and EXAMPLE.read_text().splitlines()[users.line - 1] == "[filters.users]"


def test_every_problem_is_reported_with_its_line(tmp_path):
    text = """\
version = 1
[profiles.default]
url = "redis://u:secret@127.0.0.1:6379"
password_file = "/run/pw"
password_env = "PW"

[filters.users]
capacity = "auto"
error_rate = 2
headroom = 0.5
source.csv = "users.csv"
source.sql = "SELECT 1"
rebuild.keep_old = -1
rebuild.evry = "24h"
password = "hunter2"
thresholds.warn = 0.95
thresholds.max = 0.9

[filters.sessions]
type = "cuckoo"
capacity = "auto"
bucket_size = 300
rebuild.every = "1h"

[filters.other]
key = "users"
error_rate = "1%"
capacity = 10
expansion = 2
nonscaling = true
bucket_size = 4
"""
    found = problems(tmp_path, text)
    by_line = {}
    for line, message in found:
        by_line.setdefault(line, []).append(message)
    assert any("holds a password" in m for m in by_line[3])
    assert any("password_file or password_env, not both" in m for m in by_line[2])
    assert any("error_rate" in m for m in by_line[9])
    assert any("headroom: must be at least 1" in m for m in by_line[10])
    assert any("one of source.csv, source.parquet or source.sql" in m for m in by_line[11])
    assert any("source.sql needs source.db_url_env" in m for m in by_line[11])
    assert any("keep_old: must be at least 0" in m for m in by_line[13])
    assert any("unknown key (did you mean 'every'?)" in m for m in by_line[14])
    assert any("secrets never go in the file" in m for m in by_line[15])
    assert any("warn (0.95) must not be above max (0.9)" in m for m in by_line[16])
    assert any("bucket_size: must be at most 255" in m for m in by_line[22])
    assert any("needs a number: auto counts a source" in m for m in by_line[21])
    assert any("a scheduled rebuild needs a source" in m for m in by_line[23])
    assert any("the key 'users' is declared by 'users' too" in m for m in by_line[26])
    assert any("expansion and nonscaling exclude each other" in m for m in by_line[29])
    assert any('is for type = "cuckoo"' in m for m in by_line[31])
    assert [line for line, _m in found] == sorted(line for line, _m in found)  # in the file's order


def test_a_toml_syntax_error_names_its_line(tmp_path):
    found = problems(tmp_path, "version = 1\n[filters.users]\ncapacity = = 3\n")
    assert len(found) == 1 and found[0][0] == 3 and "not valid TOML" in found[0][1]


def test_a_later_version_of_the_file_is_refused(tmp_path):
    found = problems(tmp_path, "version = 2\n")
    assert found == [(1, "version: this bloomctl reads version 1 of the file, not 2")]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ('type = "windowed"\nerror_rate = "1%"\ncapacity = 10\n', "needs window.period"),
        ('type = "windowed"\nerror_rate = "1%"\nwindow.period = "1d"\nwindow.keep = 3\n', "needs min_capacity"),
        ('type = "windowed"\ncapacity = 10\nwindow.period = "1d"\nwindow.keep = 3\n', "needs error_rate"),
        ('capacity = 10\nerror_rate = "1%"\nwindow.keep = 3\n', 'is for type = "windowed"'),
        ('capacity = 10\nerror_rate = "1%"\nfingerprint_bits = 12\n', "must be one of 8, 16, 32"),
        ('capacity = "10Q"\nerror_rate = "1%"\n', "capacity"),
        ('capacity = 10\nerror_rate = "1%"\nsource.csv = "a.csv"\nrebuild.every = "soon"\n', "not a duration"),
        ('capacity = 10\nerror_rate = "1%"\nrebuild.jobs = 0\n', "jobs: must be at least 1"),
        ("capacity = 10\n", "a Bloom filter needs error_rate"),
        ('capacity = 10\nerror_rate = "1%"\nprofile = "prod"\n', "no profile 'prod'"),
    ],
)
def test_rules_of_one_filter(tmp_path, body, message):
    text = '[profiles.default]\nurl = "redis://h"\n[filters.f]\n' + body
    found = problems(tmp_path, text)
    assert any(message in text for _line, text in found), found


def test_the_error_of_a_command_is_one_line_naming_the_file_and_the_count(tmp_path):
    path = write(tmp_path / "bloomctl.toml", "[filters.a]\ncapacity = 1\nbogus = 1\nerror_rate = 7\n")
    with pytest.raises(ConfigError) as caught:
        load(path)
    text = str(caught.value)
    assert text.startswith(f"{path}:3: filters.a.bogus: unknown key") and "(and 1 more" in text
    assert "\n" not in text


def test_paths_are_relative_to_the_file(tmp_path):
    sub = tmp_path / "deploy"
    sub.mkdir()
    path = write(
        sub / "bloomctl.toml",
        GOOD.replace('url = "redis://127.0.0.1:6379/0"', 'url = "redis://h"\npassword_file = "pw"'),
    )
    loaded = load(path)
    assert loaded.filters["users"].source["csv"] == str(sub / "users.csv")
    assert loaded.profiles["default"].password_file == str(sub / "pw")
    stdin = write(sub / "stdin.toml", GOOD.replace('"users.csv"', '"-"'))
    assert load(stdin).filters["users"].source["csv"] == "-"


def test_find_takes_the_flag_then_the_variable_then_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert find(None, {}) is None
    write(tmp_path / "bloomctl.toml", GOOD)
    assert find(None, {}) == "bloomctl.toml"
    assert find(None, {"BLOOMCTL_CONFIG": "/etc/x.toml"}) == "/etc/x.toml"
    assert find("given.toml", {"BLOOMCTL_CONFIG": "/etc/x.toml"}) == "given.toml"


def test_durations():
    assert [parse_duration(t) for t in ("90s", "15m", "24h", "7d", "2w", 60)] == [90, 900, 86400, 604800, 1209600, 60]
    for bad in ("0h", "1y", "h", "-1d", 0, "11000d"):
        with pytest.raises(ValueError):
            parse_duration(bad)


def test_a_profile_password_comes_from_its_variable_and_is_never_shown(tmp_path):
    text = '[profiles.default]\nurl = "redis://app@127.0.0.1:6390/2"\npassword_env = "APP_PW"\n'
    loaded = load(write(tmp_path / "bloomctl.toml", text))
    profile = loaded.profiles["default"]
    settings = settings_for(profile, {"APP_PW": "s3cret"})
    assert settings.password == "s3cret" and "s3cret" not in repr(settings) and "s3cret" not in settings.redacted_url
    with pytest.raises(UsageError, match=r"\$APP_PW, which is not set"):
        settings_for(profile, {})
    assert settings_for(profile, {"APP_PW": "x"}, url="redis://other:1").url == "redis://other:1"


def test_declared_values_in_the_rebuild_commands_terms(tmp_path):
    loaded = load(EXAMPLE)
    users = loaded.filters["users"]
    values = rebuild_values(users)
    assert values["capacity"] == "auto" and values["headroom"] == 2.0 and values["swap"] is True
    assert values["keep_old"] == 3600 and values["error_rate"] == 0.001
    with pytest.raises(UsageError, match=r"\$SHOP_DB_URL, which is not set"):
        source_values(users, {})
    given = source_values(users, {"SHOP_DB_URL": "postgresql://h/db"})
    assert given == {"sql": users.source["sql"], "db_url": "postgresql://h/db", "prefix": "user:"}
    with pytest.raises(UsageError, match="fed by the application"):
        source_values(loaded.filters["dedupe"])


# --- the JSON Schema -----------------------------------------------------------------------------


def test_the_schema_is_valid_and_accepts_the_example():
    jsonschema = pytest.importorskip("jsonschema")
    schema = json_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    validator = jsonschema.Draft202012Validator(schema)
    assert list(validator.iter_errors(tomllib.loads(EXAMPLE.read_text()))) == []


@pytest.mark.parametrize(
    "body",
    [
        '[filters.a]\ncapacity = 1\nerror_rate = "1%"\nbogus = 1\n',
        '[filters.a]\ncapacity = 1\nerror_rate = "1%"\nshards = 0\n',
        "[filters.a]\ncapacity = 1\nerror_rate = 5\n",
        '[filters.a]\ntype = "bitset"\n',
        "[profiles.p]\nurl = 7\n",
        'version = "one"\n',
    ],
)
def test_the_schema_refuses_what_the_checks_refuse(tmp_path, body):
    jsonschema = pytest.importorskip("jsonschema")
    validator = jsonschema.Draft202012Validator(json_schema())
    assert list(validator.iter_errors(tomllib.loads(body))), body
    with pytest.raises(ConfigError):
        load(write(tmp_path / "bloomctl.toml", body))


# --- the commands ----------------------------------------------------------------------------------


def test_config_validate_lists_every_problem_and_exits_2(cli, tmp_path):
    path = write(tmp_path / "bloomctl.toml", "[filters.a]\ncapacity = 1\nbogus = 1\nerror_rate = 7\n")
    result = cli("--config", str(path), "config", "validate")
    assert result.exit_code == 2
    lines = result.stdout.splitlines()
    assert len(lines) == 2 and lines[0] == f"{path}:3: filters.a.bogus: unknown key"
    assert lines[1].startswith(f"{path}:4: filters.a.error_rate: ") and "got 7" in lines[1]
    assert result.stderr.strip() == f"bloomctl: error: {path}: 2 problem(s)"
    as_json = cli("config", "validate", str(path), "--format", "json")
    data, _end = json.JSONDecoder().raw_decode(as_json.stdout)
    assert as_json.exit_code == 2 and data["valid"] is False and [p["line"] for p in data["problems"]] == [3, 4]


def test_config_validate_says_what_a_valid_file_declares(cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "bloomctl.toml", GOOD)
    result = cli("config", "validate")
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [
        "bloomctl.toml: valid: 1 profile(s), 1 filter(s)",
        "  users: bloom, from its csv source, profile default",
    ]
    monkeypatch.chdir(ROOT)
    other = cli("config", "validate", env={"BLOOMCTL_CONFIG": str(EXAMPLE)})
    assert other.exit_code == 0 and "3 filter(s)" in other.stdout


def test_no_file_is_a_usage_error(cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = cli("config", "validate")
    assert result.exit_code == 2 and "no config file" in result.stderr
    missing = cli("--config", str(tmp_path / "nope.toml"), "check")
    assert missing.exit_code == 2 and "cannot read the config file" in missing.stderr


def test_config_schema_prints_the_schema(cli):
    result = cli("config", "schema")
    assert result.exit_code == 0 and json.loads(result.stdout) == json.loads(json.dumps(json_schema()))
    assert json.loads(result.stdout)["properties"]["filters"]["additionalProperties"]["additionalProperties"] is False


def test_the_spec_covers_every_key_of_the_docs():
    """docs/config.md documents every key of the file; and shows the example file as it is."""
    page = (ROOT / "docs" / "config.md").read_text()
    names = set()

    def walk(spec, prefix):
        for name, kind in spec.items():
            if isinstance(kind, dict):
                walk(kind, f"{prefix}{name}.")
            elif isinstance(kind, tuple) and kind[0] == "tables":
                walk(kind[1], "")
            else:
                names.add(f"{prefix}{name}")

    walk(SPEC, "")
    missing = sorted(name for name in names if f"`{name}`" not in page)
    assert missing == []
    shown = page.split("```toml\n", 1)[1].split("```", 1)[0]
    assert shown == EXAMPLE.read_text()


# --- review findings ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "redis://h:6379/0?password=hunter2",
        "unix:///run/redis.sock?password=hunter2",
        "redis://u:hun/ter2@h",
        "redis://h:6379/0?pass%77ord=hunter2",  # redis-py reads the name unquoted
    ],
)
def test_a_password_anywhere_in_the_url_is_refused_and_never_echoed(tmp_path, url):
    found = problems(tmp_path, f'[profiles.default]\nurl = "{url}"\n')
    assert any("the URL holds a password" in text for _line, text in found)
    assert not any("hunter2" in text or "ter2" in text for _line, text in found)


@pytest.mark.parametrize("name", ["password_env", "db_url_env"])
def test_a_secret_put_where_a_variable_name_goes_is_refused_and_never_echoed(tmp_path, name):
    secret = "postgresql://app:Sup3rSecret@db/app" if name == "db_url_env" else "s3cret Passw0rd"
    body = (
        f'[profiles.default]\nurl = "redis://h"\npassword_env = "{secret}"\n'
        if name == "password_env"
        else f'[filters.a]\ncapacity = 1\nerror_rate = "1%"\nsource.sql = "SELECT 1"\nsource.db_url_env = "{secret}"\n'
    )
    found = problems(tmp_path, body)
    assert any("the name of an environment variable" in text for _line, text in found)
    assert not any("Sup3rSecret" in text or "Passw0rd" in text for _line, text in found)


@pytest.mark.parametrize(
    "line",
    ["key = [1]", "key = {a=1}", "profile = [1]", 'window = "x"', "window = 1", "source = 1", "thresholds = 3",
     'rebuild = "x"', 'thresholds.warn = "x"', "capacity = true"],
)  # fmt: skip
def test_values_of_the_wrong_kind_are_problems_not_tracebacks(tmp_path, cli, line):
    path = write(
        tmp_path / "bloomctl.toml",
        f'[profiles.default]\nurl = "redis://[bad"\n[filters.f]\ntype = "windowed"\ncapacity = 1\nerror_rate = "1%"\n{line}\n',
    )
    result = cli("config", "validate", str(path))
    assert result.exit_code == 2 and "problem(s)" in result.stderr and "Traceback" not in result.output


def test_line_numbers_survive_strings_and_comments():
    text = """\
[filters.a]
capacity = 10 # wrap long SQL in \"\"\"
error_rate = "1%"
source.sql = \"\"\"SELECT \\\"\"\" id
  FROM t\"\"\"
source.db_url_env = "X"

[filters.b]
x = '''SELECT \"\"\" '''
bogus = 1

[filters.e.source]
csv = "a#b.csv"
"quoted.key" = 1
[[filters.arr]]
y = 1
"""
    tomllib.loads(text)  # (valid TOML)
    where = locate(text)
    assert where[("filters", "a", "error_rate")] == 3 and where[("filters", "a", "source", "db_url_env")] == 6
    assert where[("filters", "b")] == 8 and where[("filters", "b", "bogus")] == 10
    assert where[("filters", "e")] == 12 and where[("filters", "e", "source", "quoted.key")] == 14
    assert where[("filters", "arr")] == 15


def test_names_and_keys_that_would_be_ambiguous(tmp_path):
    found = problems(
        tmp_path,
        '[profiles.default]\nurl = "redis://h"\n[profiles.other]\nurl = "redis://o"\n'
        '[filters."server default"]\ncapacity = 1\nerror_rate = "1%"\n'
        '[filters.a]\nkey = "b"\ncapacity = 1\nerror_rate = "1%"\n'
        '[filters.b]\nkey = "x"\ncapacity = 1\nerror_rate = "1%"\n'
        '[filters.c]\nkey = "x"\nprofile = "other"\ncapacity = 1\nerror_rate = "1%"\n',
    )
    texts = [text for _line, text in found]
    assert any("a filter's name is letters, digits" in t for t in texts)
    assert any("the key 'b' is the name of another filter" in t for t in texts)
    assert any("the key 'x' is declared by 'b' too" in t for t in texts)  # on another profile too: metrics are by key


def test_a_window_period_is_checked_by_validate(tmp_path):
    found = problems(
        tmp_path,
        '[filters.w]\ntype = "windowed"\ncapacity = 1\nerror_rate = "1%"\nwindow.period = "daily"\nwindow.keep = 2\n',
    )
    assert any("window.period" in text for _line, text in found)


def test_bloomctl_password_is_never_sent_to_a_profile(tmp_path):
    loaded = load(write(tmp_path / "bloomctl.toml", '[profiles.default]\nurl = "redis://h:1/0"\n'))
    settings = settings_for(loaded.profiles["default"], {"BLOOMCTL_PASSWORD": "for-another-server"})
    assert settings.password is None


def test_a_percent_encoded_password_name_is_redacted_too():
    from bloomctl.server.connection import redact_url

    assert "hunter2" not in redact_url("redis://h:6379/0?pass%77ord=hunter2")


def test_names_end_where_they_end(tmp_path):
    found = problems(
        tmp_path,
        '[profiles."p\\n"]\nurl = "redis://h"\npassword_env = "PW\\n"\n'
        '[filters."a\\n"]\nprofile = "p\\n"\ncapacity = 1\nerror_rate = "1%"\n'
        '[filters.s]\nprofile = "p\\n"\ntype = "cuckoo"\ncapacity = 100\nshards = 3\n',
    )
    texts = [text for _line, text in found]
    assert sum("name is letters, digits" in t for t in texts) == 2
    assert any("the name of an environment variable" in t for t in texts)
    assert any("shards: is for Bloom filters" in t for t in texts)


def test_keys_whose_companions_meet_are_refused(tmp_path):
    """`cq` and `{cq}` share {cq}:standby, :meta, :lock (a rebuild of one rewrote the other's
    metadata); `{cp:x}:standby` is x's standby (a rebuild of x deleted it); `{dedupe}:2026-12-02`
    is a window's bucket. Each is one problem at its line; a key that only looks alike is fine."""
    body = '\ncapacity = 10\nerror_rate = "1%"\n'
    found = problems(
        tmp_path,
        '[profiles.default]\nurl = "redis://h"\n'
        f'[filters.x]\nkey = "cp:x"{body}'
        f'[filters.i]\nkey = "{{cp:x}}:standby"{body}'
        f'[filters.plain]\nkey = "cq"{body}'
        f'[filters.tagged]\nkey = "{{cq}}"{body}'
        f'[filters.bucket]\nkey = "{{dedupe}}:2026-12-02"{body}'
        '[filters.dedupe]\ntype = "windowed"\ncapacity = 10\nerror_rate = "1%"\nwindow.period = "1d"\nwindow.keep = 2\n'
        f'[filters.alike]\nkey = "{{cqq}}"{body}'
        f'[filters.alike2]\nkey = "cp:xy"{body}'
        f'[filters.shop]\nkey = "shop:{{users}}"{body}'  # two filters, not companions
        f'[filters.shop2]\nkey = "shop:{{users}}:v2"{body}'
        f'[filters.tenant]\nkey = "{{tenant}}:users"{body}'
        f'[filters.tenant2]\nkey = "{{tenant}}:users:emails"{body}'
        '[profiles.eu]\nurl = "redis://eu"\n'
        f'[filters.eu]\nkey = "{{cp:x}}"\nprofile = "eu"{body}',  # another server: its own companions
    )
    texts = {line: text for line, text in found}
    assert len(found) == 3, found
    assert "'{cp:x}:standby' is among the companion keys of 'x'" in texts[8]
    assert "'cq' (of 'plain') and '{cq}' share their companion keys" in texts[16]
    assert any("'{dedupe}:2026-12-02' is among the companion keys of 'dedupe'" in t for t in texts.values())

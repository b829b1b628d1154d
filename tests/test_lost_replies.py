"""A swap whose reply is lost, that the server holds past --timeout, or that never reached the
server: bloomctl releases the lock, looks, and reports what really happened, shard by shard."""

from __future__ import annotations

import json

import pytest

from bloomctl.keys import KeyFamily
from tests.helpers.matrix import SIGNALS_LOCKS_ERRORS
from tests.helpers.redis import active_and_standby


def pause_writes_before(monkeypatch, target, calls: set[int], millis: int = 1500) -> None:
    """The server holds every write for ``millis`` from the swap script's n-th call (in ``calls``):
    the client's --timeout passes first, then the script runs."""
    from bloomctl.lifecycle import single

    real, seen = single.swap, [0]

    def paused(*args, **kwargs):
        seen[0] += 1
        if seen[0] in calls:
            target.client.execute_command("CLIENT", "PAUSE", millis, "WRITE")
        return real(*args, **kwargs)

    monkeypatch.setattr(single, "swap", paused)


@SIGNALS_LOCKS_ERRORS
def test_a_swap_whose_reply_is_lost_reports_what_happened(target, monkeypatch):
    """(#10 item 4) A timeout while the swap script ran was reported as a failure (exit 3) though the swap
    was applied, and the lock stayed. bloomctl releases the lock (which settles a script still
    waiting in the server: it checks the lock's token), looks, and says what happened."""
    import redis

    from bloomctl.lifecycle import single

    active_and_standby(target, 10, 10)
    real = single.swap

    def applied_then_lost(*args, **kwargs):
        real(*args, **kwargs)
        raise redis.exceptions.TimeoutError("Timeout reading from socket")

    monkeypatch.setattr(single, "swap", applied_then_lost)
    result = target.cli("swap", "users", "--yes", "--format", "json")
    assert result.exit_code == 0, result.stderr
    assert "bloomctl looked: it was applied" in result.stderr and json.loads(result.stdout)["note"]
    family = KeyFamily.of("users")
    assert not target.client.exists(family.standby) and not target.client.exists(family.lock)


@SIGNALS_LOCKS_ERRORS
def test_a_swap_held_by_the_server_past_the_timeout_is_reported_truthfully(target, monkeypatch):
    """The server holds the swap's script (CLIENT PAUSE) past --timeout: whichever way it ends, the
    report matches the keys, and the lock is released."""
    if target.cluster:
        pytest.skip("CLIENT PAUSE holds one node")
    active_and_standby(target, 10, 10)
    pause_writes_before(monkeypatch, target, {1})
    result = target.cli("--timeout", "0.5", "swap", "users", "--yes")
    family = KeyFamily.of("users")
    if result.exit_code == 0:
        assert "it was applied" in result.stderr and not target.client.exists(family.standby)
    else:
        assert result.exit_code == 3 and "it was NOT applied" in result.stderr, result.stderr
        assert target.client.exists(family.standby)
    assert not target.client.exists(family.lock)


@SIGNALS_LOCKS_ERRORS
def test_a_swap_that_never_reached_the_server_says_it_was_not_applied(target, monkeypatch):
    import redis

    from bloomctl.lifecycle import single

    active_and_standby(target, 10, 10)

    def lost(*args, **kwargs):
        raise redis.exceptions.TimeoutError("Timeout reading from socket")

    monkeypatch.setattr(single, "swap", lost)
    result = target.cli("swap", "users", "--yes")
    assert result.exit_code == 3 and "it was NOT applied" in result.stderr, result.stderr
    family = KeyFamily.of("users")
    assert target.client.exists(family.standby) and not target.client.exists(family.lock)
    assert target.card("users") == 10


@SIGNALS_LOCKS_ERRORS
def test_a_sharded_swap_counts_the_shards_really_swapped(target, tmp_path, monkeypatch):
    """(#10 item 4) "1 of 3" was reported with 2 applied: the second member's reply was lost after it ran."""
    import redis

    from bloomctl.lifecycle import single

    csv = tmp_path / "u.csv"
    csv.write_text("id\n" + "".join(f"user:{i}\n" for i in range(3000)))
    args = ["rebuild", "users", "--from-csv", str(csv), "-c", "9000", "-e", "1%", "--shards", "3", "--nonscaling"]
    first = target.cli(*args, "--swap")
    assert first.exit_code == 0, first.stderr
    second = target.cli(*args[:4])
    assert second.exit_code == 0, second.stderr  # standbys built again, not swapped
    real, calls = single.swap, [0]

    def second_reply_lost(*args, **kwargs):
        calls[0] += 1
        done = real(*args, **kwargs)
        if calls[0] == 2:
            raise redis.exceptions.ConnectionError("Connection closed by server.")
        return done

    monkeypatch.setattr(single, "swap", second_reply_lost)
    result = target.cli("swap", "users", "--yes")
    assert result.exit_code == 5 and "stopped after 2 of 3 shards" in result.stderr, result.stderr
    monkeypatch.undo()
    again = target.cli("swap", "users", "--yes")
    assert again.exit_code == 0, again.stderr
    assert not target.client.exists(KeyFamily.of("users").lock)

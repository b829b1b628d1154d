"""What keeps a bad standby from being swapped in, each guard tested where it stands: the shrink
guard at its boundary (swap, rebuild --swap, the library, a sharded filter), the capacity of a
filter that never grows, the recipe its items were built with, and someone else's data at a
companion key, refused and kept."""

from __future__ import annotations

import json

import pytest

from bloomctl.keys import KeyFamily
from bloomctl.lifecycle import front as lifecycle
from bloomctl.lifecycle.manifest import read_manifest
from bloomctl.server.capabilities import detect
from tests.helpers.matrix import GUARDS, SIGNALS_LOCKS_ERRORS
from tests.helpers.redis import active_and_standby, fill_to

# --- the shrink guard -------------------------------------------------------------------------


@GUARDS
@pytest.mark.parametrize(
    "args, below, at",
    [
        pytest.param([], 490, 500, id="default-0.5"),
        pytest.param(["--min-ratio", "0.8"], 790, 800, id="min-ratio-0.8"),
        pytest.param(["--min-ratio", "80%"], 790, 800, id="min-ratio-80%"),
    ],
)
def test_the_shrink_guard_holds_at_its_boundary(target, args, below, at):
    """(#10 item 19) The guard's comparison weakened tenfold (`ratio < min_ratio / 10`) passed every
    test. Exactly at the boundary: 1000 items are not replaced by 490 (0.49 < 0.5, exit 5, nothing
    moved) and are by 500 (0.5 is enough); with --min-ratio 0.8 (or 80%), 790 and 800."""
    family = active_and_standby(target, 1000, below)
    refused = target.cli("swap", "users", "--yes", *args)
    assert refused.exit_code == 5 and "--allow-shrink" in refused.stderr, refused.stderr
    assert f"{below / 1000:.1%} of the active filter's 1,000" in refused.stderr, refused.stderr
    assert target.card("users") == 1000 and target.card(family.standby) == below
    fill_to(target, family.standby, at)
    allowed = target.cli("swap", "users", "--yes", *args)
    assert allowed.exit_code == 0, allowed.stderr
    assert target.card("users") == at and not target.client.exists(family.standby)


@GUARDS
def test_the_shrink_guard_of_a_rebuild_and_of_the_library(target, tmp_path):
    """(#10 item 19) `rebuild --swap` and `lifecycle.swap` apply the same boundary: a rebuild of
    490 items over 1000 is refused (the standby kept, verified), one of 500 swaps; `min_ratio=0`
    lets even an empty standby through (an inclusive comparison would refuse it)."""
    from bloomctl.errors import StateConflict

    family = KeyFamily.of("users")
    target.reserve("users", 10_000)
    fill_to(target, "users", 1000)
    for rows, code in ((490, 5), (500, 0)):
        csv = tmp_path / f"u{rows}.csv"
        csv.write_text("id\n" + "".join(f"user:{i}\n" for i in range(rows)))
        result = target.cli("rebuild", "users", "--from-csv", str(csv), "-c", "100000", "-e", "1%", "--swap")
        assert result.exit_code == code, result.stderr
        assert target.card("users") == (1000 if code else rows)
    server = detect(target.client)
    target.reserve(family.standby, 100)
    with pytest.raises(StateConflict, match="allow_shrink"):
        lifecycle.swap(target.client, server, "users", min_ratio=0.5)
    assert target.card("users") == 500
    lifecycle.swap(target.client, server, "users", min_ratio=0)
    assert target.card("users") == 0 and not target.client.exists(family.standby)
    assert target.card(family.old) == 500  # the library keeps the replaced filter an hour by default
    assert 3500 < target.client.ttl(family.old) <= 3600


@GUARDS
@pytest.mark.parametrize(
    "guards",
    [{"min_ratio": float("nan")}, {"min_ratio": -1}, {"keep_old_seconds": -1}],
    ids=["nan", "negative", "keep"],
)
def test_the_librarys_guards_are_refused_before_anything_is_taken(target, guards):
    """A NaN ratio would let every standby through. `guarded_swap` refuses bad guards before it
    takes the lock (a held lock would answer first), and `restore(swap=True)` before it reads the
    dump (an empty header would be refused first)."""
    from bloomctl.errors import UsageError
    from bloomctl.lifecycle.guards import SwapGuards
    from bloomctl.lifecycle.lock import FilterLock
    from bloomctl.transfer.restore import restore

    family = active_and_standby(target, 100, 100)
    server = detect(target.client)
    with (
        FilterLock(target.client, "users", command="someone else"),
        pytest.raises(UsageError, match=r"min_ratio|keep_old"),
    ):
        lifecycle.guarded_swap(target.client, server, "users", SwapGuards(**guards))
    with pytest.raises(UsageError, match=r"min_ratio|keep_old"):
        restore(target.client, server, "users", {}, iter([]), swap=True, **guards)
    assert target.card("users") == 100 and target.card(family.standby) == 100


@GUARDS
def test_a_sharded_swap_honours_allow_shrink_and_asks_on_a_terminal(target, tmp_path, monkeypatch):
    """(#10 item 19, found by mutation testing) A sharded swap that dropped --allow-shrink (every
    member then refused) or its question on a terminal passed every test."""
    import bloomctl.cli.confirm as confirm

    args = ["-c", "9000", "-e", "1%", "--shards", "3", "--nonscaling"]
    for rows, extra in ((3000, ["--swap"]), (300, [])):
        csv = tmp_path / f"u{rows}.csv"
        csv.write_text("id\n" + "".join(f"user:{i}\n" for i in range(rows)))
        built = target.cli("rebuild", "users", "--from-csv", str(csv), *args, *extra)
        assert built.exit_code == 0, built.stderr
    manifest = read_manifest(target.client, "users")
    before = sum(target.card(member) for member in manifest.members)
    shrink = target.cli("swap", "users", "--yes")
    assert shrink.exit_code == 5 and "--allow-shrink" in shrink.stderr, shrink.stderr
    monkeypatch.setattr(confirm, "stdin_is_tty", lambda: True)
    refused = target.cli("swap", "users", "--allow-shrink", input="n\n")
    assert refused.exit_code == 5 and "Swap the 3 shard standbys of 'users' in?" in refused.stderr, refused.stderr
    assert "not confirmed" in refused.stderr and sum(target.card(m) for m in manifest.members) == before
    allowed = target.cli("swap", "users", "--allow-shrink", input="y\n")
    assert allowed.exit_code == 0, allowed.stderr
    assert sum(target.card(member) for member in manifest.members) <= 300 < before


# --- a filter that never grows ----------------------------------------------------------------


@SIGNALS_LOCKS_ERRORS
@pytest.mark.parametrize("build", ["client", "server"])
def test_a_bitmap_filter_is_never_swapped_in_over_its_capacity(target, tmp_path, build):
    """(#10 item 3) A bitmap filter rebuilt from 200k rows with the capacity of 1000 its metadata records was
    swapped in saturated ("maybe" for every absent item). It never grows: past its capacity the
    rebuild stops, as RedisBloom's NONSCALING filter does; over 80% it warns."""
    if target.backend.name != "bitmap":
        pytest.skip("RedisBloom grows, or refuses a NONSCALING filter's item itself")
    assert target.cli("reserve", "users", "-c", "1000", "-e", "1%", "--backend", "bitmap").exit_code == 0
    target.add("users", ["user:0"])
    big = tmp_path / "big.csv"
    big.write_text("id\n" + "".join(f"user:{i}\n" for i in range(200_000)))
    result = target.cli("rebuild", "users", "--from-csv", str(big), "--swap", "--build", build)
    assert result.exit_code == 5, result.stderr
    assert "over its capacity of 1,000" in result.stderr and "--capacity" in result.stderr
    assert target.card("users") == 1 and not target.client.exists(KeyFamily.of("users").old)
    assert target.cli("swap", "users", "--yes").exit_code == 5  # the standby left behind is never swapped in
    near = tmp_path / "near.csv"
    near.write_text("id\n" + "".join(f"user:{i}\n" for i in range(900)))
    result = target.cli("rebuild", "users", "--from-csv", str(near), "--swap", "--build", build)
    assert result.exit_code == 0, result.stderr
    assert "90% of its capacity of 1,000: it never grows" in result.stderr


@SIGNALS_LOCKS_ERRORS
def test_a_swap_refuses_a_bitmap_standby_filled_past_its_capacity(target):
    """(#10 item 3, review) Dual writes kept filling a bitmap standby after the rebuild's count; `swap` then
    put it in place at 3.3x its capacity (an FPR of 52%). Only the rebuild checked the fill."""
    if target.backend.name != "bitmap":
        pytest.skip("only filters that never grow: RedisBloom's NONSCALING refuses items past capacity itself")
    active_and_standby(target, 1000, 900)
    standby = KeyFamily.of("users").standby
    target.add(standby, [f"late:{i}" for i in range(10_000)])  # the application's dual writes
    refused = target.cli("swap", "users", "--yes")
    assert refused.exit_code == 5 and "over its capacity of 10,000" in refused.stderr, refused.stderr
    assert target.card("users") == 1000


# --- the recipe, and companion keys that are not ours -----------------------------------------


@SIGNALS_LOCKS_ERRORS
def test_items_built_otherwise_are_never_swapped_in_silently(target, tmp_path):
    """(#10 item 7) A rebuild with a different --prefix swapped in cleanly and every lookup then missed.
    The recipe (source kind, column, template, prefix) is recorded; a change is refused (exit 5)
    unless --allow-recipe-change, by the rebuild (before loading) and by the swap."""
    from bloomctl.lifecycle.metadata import read_metadata

    csv = tmp_path / "u.csv"
    csv.write_text("id,email\n" + "".join(f"{i},u{i}@x\n" for i in range(200)))
    base = ["rebuild", "users", "--from-csv", str(csv), "--column", "id", "-c", "1000", "-e", "1%"]
    assert target.cli(*base, "--prefix", "user:", "--swap").exit_code == 0
    recorded = json.loads(read_metadata(target.client, KeyFamily.of("users").meta)["recipe"])
    assert recorded == {"source": "csv", "column": "id", "template": None, "prefix": "user:"}
    changed = target.cli(*base, "--prefix", "u:", "--swap")
    assert changed.exit_code == 5 and "built differently" in changed.stderr, changed.stderr
    assert (
        "prefix 'u:'" in changed.stderr
        and "prefix 'user:'" in changed.stderr
        and "--allow-recipe-change" in changed.stderr
    )
    assert not target.client.exists(KeyFamily.of("users").standby)  # refused before anything was written
    assert target.cli(*base, "--prefix", "u:", "--allow-recipe-change").exit_code == 0  # built, not swapped
    swap = target.cli("swap", "users", "--yes")
    assert swap.exit_code == 5 and "built differently" in swap.stderr
    assert target.cli("swap", "users", "--yes", "--allow-recipe-change").exit_code == 0
    assert all(target.backend.mexists(target.client, b"users", [b"u:0", b"u:199"]))
    same = target.cli(*base, "--prefix", "u:", "--swap")
    assert same.exit_code == 0, same.stderr


@SIGNALS_LOCKS_ERRORS
@pytest.mark.parametrize(
    "where, value",
    [
        ("meta", "string"),
        ("meta", "hash"),
        ("standby:meta", "string"),
        ("old:meta", "hash"),
        ("lock", "hash"),
        ("old", "string"),
    ],
)
def test_someone_elses_data_at_a_companion_key_is_refused_and_kept(target, tmp_path, where, value):
    """(#10 item 5) A foreign value at `{k}:meta` was refused by reserve but overwritten by `rebuild --swap`;
    a lock key holding a hash gave a raw WRONGTYPE (exit 3, the key not named). Every command that
    would write, move or delete a companion key refuses (exit 5, the key named) and leaves it be."""
    target.reserve("users", 10_000)
    target.add("users", ["user:0"])
    key = f"{{users}}:{where}"
    if value == "string":
        target.client.set(key, "someone else's")
    else:
        target.client.hset(key, mapping={"owner": "another app"})
    before = target.client.dump(key)
    csv = tmp_path / "u.csv"
    csv.write_text("id\nuser:0\nuser:1\n")
    commands = [
        ["rebuild", "users", "--from-csv", str(csv), "-e", "1%", "--swap"],
        ["swap", "users", "--yes"],
        ["rollback", "users", "--yes"],
    ]
    if where in ("meta", "lock"):
        commands.append(["reserve", "fresh-" + where, "-c", "100", "-e", "1%"])  # another key: allowed
    for args in commands:
        result = target.cli(*args)
        if args[0] == "reserve":
            assert result.exit_code == 0, result.stderr
            continue
        assert result.exit_code == 5, (args, result.stderr)
        assert repr(key) in result.stderr and "WRONGTYPE" not in result.stderr, result.stderr
    assert target.client.dump(key) == before and target.card("users") == 1


@SIGNALS_LOCKS_ERRORS
def test_a_foreign_hash_with_a_field_named_like_ours_is_not_taken_for_metadata(target, tmp_path):
    """(#10 item 5, review) A hash at `{k}:meta` with a generic field (`state`, `schema`) was taken for
    bloomctl's metadata and overwritten by `rebuild --swap`. Metadata is recognised by created_by."""
    target.reserve("users", 1000)
    meta = KeyFamily.of("users").meta
    target.client.delete(meta)
    target.client.hset(meta, mapping={"state": "active", "owner": "billing-service", "schema": "v2"})
    csv = tmp_path / "u.csv"
    csv.write_text("id\n" + "".join(f"user:{i}\n" for i in range(700)))
    result = target.cli("rebuild", "users", "--from-csv", str(csv), "-c", "2000", "-e", "1%", "--swap")
    assert result.exit_code == 5 and "did not write" in result.stderr, result.stderr
    assert target.client.hgetall(meta) == {b"state": b"active", b"owner": b"billing-service", b"schema": b"v2"}

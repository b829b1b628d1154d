"""``bloomctl swap`` and ``bloomctl rollback``: the atomic cutover between a standby and the active filter."""

from __future__ import annotations

import sys

import click

from bloomctl.cli.context import AppContext
from bloomctl.cli.options import format_option, swap_guard_options, yes_option
from bloomctl.cli.render import emit_json
from bloomctl.errors import StateConflict, UsageError
from bloomctl.keys import to_display


def stdin_is_tty() -> bool:
    return sys.stdin.isatty()


def _confirm(question: str, yes: bool) -> None:
    if yes or not stdin_is_tty():
        return
    if not click.confirm(question, default=False, err=True):
        raise StateConflict("not confirmed: nothing changed")


@click.command("swap")
@click.argument("key")
@click.option(
    "--standby", metavar="NAME", help="The filter to swap in [default: the standby of KEY, e.g. {KEY}:standby]."
)
@swap_guard_options
@yes_option
@format_option("text", "json")
@click.pass_obj
def swap_command(
    app: AppContext,
    key: str,
    standby: str | None,
    keep_old: float,
    min_ratio: float,
    allow_shrink: bool,
    yes: bool,
    output_format: str,
) -> None:
    """Atomically replace the filter KEY with its standby (one Lua call: readers never see KEY missing).

    The replaced filter moves to the "old" key (kept for --keep-old seconds, else unlinked:
    freed in the background), and the metadata moves with each filter. Refuses when the
    standby is missing, not a Bloom filter, or much smaller than KEY.

    \b
    Examples:
      bloomctl swap users --yes
      bloomctl swap users --keep-old 3600        # `bloomctl rollback users` within the hour
      bloomctl swap 'bf:{users}' --standby 'bf:{users}:v2' --allow-shrink
    """
    from bloomctl import lifecycle, sharding
    from bloomctl.lock import FilterLock

    manifest = sharding.read_manifest(app.client, key)
    if manifest is not None:
        if standby is not None:
            raise UsageError("a sharded filter swaps each member with its own standby: leave out --standby")
        with FilterLock(app.client, key, command="bloomctl swap") as lock:
            _confirm(f"Swap the {manifest.shards} shard standbys of {to_display(manifest.key)!r} in?", yes)
            replaced = sharding.swap_sharded(
                app.client,
                app.server,
                manifest,
                keep_old_seconds=keep_old,
                min_ratio=min_ratio,
                allow_shrink=allow_shrink,
                lock=lock,
            )
        if output_format == "json":
            emit_json(
                {
                    "key": to_display(manifest.key),
                    "swapped": True,
                    "shards": manifest.shards,
                    "replaced": replaced,
                    "keep_old_seconds": keep_old,
                }
            )
        else:
            click.echo(f"swapped: {to_display(manifest.key)!r}, {manifest.shards} shards, one atomic swap each")
        return
    # The lock first: while a rebuild writes the standby, say so rather than judge a half-built filter.
    with FilterLock(app.client, key, command="bloomctl swap"):
        prepared = lifecycle.prepare_swap(
            app.client, app.server, key, standby=standby, min_ratio=min_ratio, allow_shrink=allow_shrink
        )
        active_items = prepared.active_state.items if prepared.active_state else None
        _confirm(
            f"Swap {to_display(prepared.standby)!r} ({prepared.standby_state.items:,} items) into "
            f"{to_display(prepared.family.active)!r}"
            + (f" ({active_items:,} items now)" if active_items is not None else " (absent now)")
            + "?",
            yes,
        )
        replaced = lifecycle.swap(app.client, prepared, keep_old_seconds=keep_old)
    name = to_display(prepared.family.active)
    old = to_display(prepared.family.old)
    if output_format == "json":
        emit_json(
            {
                "key": name,
                "standby": to_display(prepared.standby),
                "swapped": True,
                "replaced": replaced,
                "items": prepared.standby_state.items,
                "previous_items": active_items,
                "old": old if replaced and keep_old else None,
                "keep_old_seconds": keep_old if replaced else None,
            }
        )
        return
    message = f"swapped: {name!r} now holds {prepared.standby_state.items:,} items"
    if not replaced:
        message += " (there was no previous filter)"
    elif keep_old:
        message += f"; the previous filter is kept as {old!r} for {keep_old:g}s (bloomctl rollback {name})"
    else:
        message += "; the previous filter was unlinked"
    click.echo(message)


@click.command("rollback")
@click.argument("key")
@yes_option
@format_option("text", "json")
@click.pass_obj
def rollback_command(app: AppContext, key: str, yes: bool, output_format: str) -> None:
    """Atomically restore the filter KEY had before the last swap (kept with swap --keep-old).

    The filter being rolled back from becomes the standby, so `swap` can re-apply it.

    \b
    Example:
      bloomctl rollback users --yes
    """
    from bloomctl import lifecycle, sharding
    from bloomctl.keys import KeyFamily
    from bloomctl.lock import FilterLock

    family = KeyFamily.of(key)
    name = to_display(family.active)
    manifest = sharding.read_manifest(app.client, key)
    with FilterLock(app.client, key, command="bloomctl rollback"):
        if manifest is not None:
            _confirm(f"Roll the {manifest.shards} shards of {name!r} back?", yes)
            sharding.rollback_sharded(app.client, manifest)
        else:
            _confirm(f"Roll {name!r} back to {to_display(family.old)!r}?", yes)
            lifecycle.rollback(app.client, key)
    standby = f"each shard's standby ({manifest.shards})" if manifest else repr(to_display(family.standby))
    if output_format == "json":
        emit_json(
            {
                "key": name,
                "rolled_back": True,
                "shards": manifest.shards if manifest else None,
                "standby": None if manifest else to_display(family.standby),
            }
        )
    else:
        click.echo(f"rolled back: {name!r} holds the previous filter again; the replaced one is now {standby}")

"""``bloomctl swap`` and ``bloomctl rollback``: the atomic cutover between a standby and the active filter."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from bloomctl.cli.confirm import confirmer
from bloomctl.cli.context import AppContext
from bloomctl.cli.options import format_option, lock_wait_option, swap_guard_options, yes_option
from bloomctl.cli.output import current
from bloomctl.cli.render import emit_json
from bloomctl.keys import KeyFamily, to_display

if TYPE_CHECKING:  # pragma: no cover - the library loads when a command runs (start-up time)
    from bloomctl.lifecycle.front import SwapResult


@click.command("swap")
@click.argument("key")
@click.option(
    "--standby", metavar="NAME", help="The filter to swap in [default: the standby of KEY, e.g. {KEY}:standby]."
)
@swap_guard_options
@click.option("--dry-run", is_flag=True, help="Make every check of a real swap (the lock too), swap nothing.")
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
    allow_recipe_change: bool,
    lock_wait: float,
    dry_run: bool,
    yes: bool,
    output_format: str,
) -> None:
    """Atomically replace the filter KEY with its standby (one Lua call: readers never see KEY missing).

    The replaced filter moves to the "old" key, kept for an hour (--keep-old) so `bloomctl
    rollback` can restore it (--keep-old 0 unlinks it: freed in the background), and the metadata
    moves with each filter. Refuses when the standby is missing, not a Bloom filter, or much
    smaller than KEY. Takes the filter's lock: while a rebuild writes the standby, exits 6 rather
    than judge a half-built filter (--lock-wait waits for it).

    \b
    Examples:
      bloomctl swap users --yes                  # `bloomctl rollback users` within the hour
      bloomctl swap users --dry-run              # would it swap? every check, nothing changed
      bloomctl swap users --keep-old 0 --lock-wait 600
      bloomctl swap 'bf:{users}' --standby 'bf:{users}:v2' --allow-shrink
    """
    from bloomctl.lifecycle import front as lifecycle

    result = lifecycle.swap(
        app.client,
        app.server,
        key,
        standby=standby,
        keep_old_seconds=keep_old,
        min_ratio=min_ratio,
        allow_shrink=allow_shrink,
        allow_recipe_change=allow_recipe_change,
        confirm=None if dry_run else confirmer(yes),
        lock_wait=lock_wait,
        dry_run=dry_run,
    )
    if result.note is not None:
        current().warn(result.note)
    if output_format == "json":
        emit_json(swap_data(result))
    else:
        click.echo(swap_message(result, app.next_step("rollback", to_display(result.key))))


def swap_data(result: SwapResult) -> dict[str, object]:
    name = to_display(result.key)
    if result.manifest is not None:
        return {
            "key": name,
            "swapped": not result.dry_run,
            "dry_run": result.dry_run,
            "shards": result.manifest.shards,
            "replaced": result.replaced,
            "keep_old_seconds": result.keep_old_seconds,
            "note": result.note,
        }
    replaced = result.replaced[0]
    return {
        "key": name,
        "standby": to_display(result.standby) if result.standby is not None else None,
        "swapped": not result.dry_run,
        "dry_run": result.dry_run,
        "replaced": replaced,
        "items": result.items,
        "previous_items": result.previous_items,
        "old": to_display(result.old) if replaced and result.keep_old_seconds else None,
        "keep_old_seconds": result.keep_old_seconds if replaced else None,
        "note": result.note,
    }


def swap_message(result: SwapResult, rollback: str) -> str:
    """The swap's outcome; ``rollback`` is the command that undoes it (on this run's server)."""
    name = to_display(result.key)
    if result.dry_run:
        return dry_run_message(result)
    if result.manifest is not None:
        return f"swapped: {name!r}, {result.manifest.shards} shards, one atomic swap each"
    message = f"swapped: {name!r} now holds {result.items:,} items"
    if not result.replaced[0]:
        return message + " (there was no previous filter)"
    if result.keep_old_seconds:
        old = to_display(result.old)
        return message + f"; the previous filter is kept as {old!r} for {result.keep_old_seconds:g}s ({rollback})"
    return message + "; the previous filter was unlinked"


def dry_run_message(result: SwapResult) -> str:
    name = to_display(result.key)
    kept = (
        f"kept as {to_display(result.old)!r} for {result.keep_old_seconds:g}s"
        if result.keep_old_seconds
        else "unlinked (--keep-old 0)"
    )
    if result.manifest is not None:
        return (
            f"dry run: would swap {len(result.replaced)} of {result.manifest.shards} shards of {name!r}; "
            f"the replaced shards would be {kept}; nothing changed"
        )
    standby = to_display(result.standby) if result.standby is not None else "the standby"
    message = f"dry run: would swap {standby!r} ({result.items:,} items) into {name!r}"
    if not result.replaced[0]:
        return message + " (absent now); nothing changed"
    return message + f" ({result.previous_items:,} items now); the previous filter would be {kept}; nothing changed"


@click.command("rollback")
@click.argument("key")
@lock_wait_option
@click.option("--dry-run", is_flag=True, help="Make every check of a real rollback (the lock too), change nothing.")
@yes_option
@format_option("text", "json")
@click.pass_obj
def rollback_command(app: AppContext, key: str, lock_wait: float, dry_run: bool, yes: bool, output_format: str) -> None:
    """Atomically restore the filter KEY had before the last swap (kept by swap for an hour, --keep-old).

    The filter being rolled back from becomes the standby, so `swap` can re-apply it.

    \b
    Examples:
      bloomctl rollback users --yes
      bloomctl rollback users --dry-run
    """
    from bloomctl.lifecycle import front as lifecycle

    confirm = None if dry_run else confirmer(yes)
    result = lifecycle.rollback(app.client, key, confirm=confirm, lock_wait=lock_wait, dry_run=dry_run)
    name = to_display(result.key)
    manifest = result.manifest
    if output_format == "json":
        emit_json(
            {
                "key": name,
                "rolled_back": not dry_run,
                "dry_run": dry_run,
                "shards": manifest.shards if manifest else None,
                "standby": None if manifest else to_display(result.standby),
            }
        )
        return
    standby = f"each shard's standby ({manifest.shards})" if manifest else repr(to_display(result.standby))
    if dry_run:
        old = "each shard's old filter" if manifest else repr(to_display(KeyFamily.of(result.key).old))
        click.echo(
            f"dry run: would roll {name!r} back to {old}; the replaced one would become {standby}; nothing changed"
        )
        return
    click.echo(f"rolled back: {name!r} holds the previous filter again; the replaced one is now {standby}")

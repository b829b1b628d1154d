"""``rebuild --all [--due]``: every declared filter in turn, rebuilt, rotated or skipped as its schedule says.

The filters are run one at a time in the file's order, through ``Fleet``: a filter that fails
records its exit code and the others go on; the run's code is the first failure's. Each filter's
outcome is a ``Run``, recorded as it ends, so that a signal part-way leaves what ran recorded (the
metrics file says so). The rebuild itself is the caller's ``rebuild`` (the command line wires its
progress into it); the options it gets are the declaration's under what the command line gave.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from bloomctl.declared.config import Declared
from bloomctl.declared.declarations import declared_inputs, rebuild_defaults
from bloomctl.declared.fleet import Fleet, Log, no_log
from bloomctl.errors import ExitCode, MadeMeanwhile, first_line
from bloomctl.server.capabilities import ServerInfo
from bloomctl.server.client import RedisClient

# what `rebuild --all` takes from the command line for every filter; the rest is each filter's own
ALL_OPTIONS = {
    "dry_run",
    "force",
    "swap",
    "keep_old",
    "min_ratio",
    "allow_shrink",
    "lock_wait",
    "build",
    "jobs",
    "client_memory",
    "batch_size",
    "max_rate",
    "window",
    "verify_sample",
    "verify_mode",
    "catchup_skew",
    "skip_bad_rows",
}


class Run:
    """One filter's rebuild (or rotation, or skip), for the metrics file and the summary of --all."""

    def __init__(self, key: str, name: str | None = None, *, dry_run: bool = False) -> None:
        self.key, self.name = key, name or key
        self.started = time.monotonic()
        self.seconds = 0.0
        self.code: int | None = None  # None: not run
        self.items = 0
        self.swapped = False
        self.action = "rebuild"
        self.reason = ""  # why --all did what it did
        self.detail = ""  # what came of it
        self.dry_run = dry_run  # a dry run: never in the metrics file

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "key": self.key,
            "action": self.action,
            "reason": self.reason,
            "exit_code": self.code,
            "detail": self.detail,
            "items": self.items,
            "swapped": self.swapped,
            "dry_run": self.dry_run,
            "seconds": round(self.seconds, 3),
        }


# One filter's rebuild: given the client, server, key, source values, rebuild options and its Run, the
# rebuild's report; it records its outcome in the Run.
RebuildOne = Callable[[RedisClient, ServerInfo, str, dict[str, Any], dict[str, Any], Run], Any]


class RebuildAll:
    """Every declared filter of ``fleet`` in turn; ``explicit``: the options the command line gave."""

    def __init__(
        self,
        fleet: Fleet,
        explicit: dict[str, Any],
        *,
        due: bool,
        rebuild: RebuildOne,
        log: Log = no_log,
        describe: Callable[[BaseException], str] = first_line,
    ) -> None:
        self.fleet, self.explicit, self.due = fleet, explicit, due
        self.rebuild, self.log, self.describe = rebuild, log, describe
        self.dry_run = bool(explicit.get("dry_run"))
        self.options = {**rebuild_defaults(), **explicit}
        self.runs = [Run(d.key, d.name, dry_run=self.dry_run) for d in fleet.decls]
        self._by_name = {run.name: run for run in self.runs}

    def run(self) -> int:
        """Every filter, one at a time; the first failure's exit code, after all were tried (0: none)."""
        for outcome in self.fleet.each(self._one):
            if outcome.failure is None:
                continue
            run = self._by_name[outcome.decl.name]
            run.code, run.detail = outcome.failure.exit_code, self.describe(outcome.failure.exception)
            self.log(f"{run.name}: failed: {run.detail}", {"filter": run.name, "exit_code": run.code}, "error")
        failed = [r for r in self.runs if r.code]
        return int(failed[0].code or 0) if failed else int(ExitCode.OK)

    def _one(self, client: RedisClient, server: ServerInfo, decl: Declared) -> None:
        from bloomctl.declared import schedule

        run = self._by_name[decl.name]
        decision = schedule.decide(client, decl, only_due=self.due)
        run.action, run.reason = decision.action, decision.reason
        run.detail = decision.reason if decision.action == schedule.SKIP else ""
        if decision.action == schedule.SKIP:
            self.log(f"{decl.name}: skipped: {decision.reason}", {"filter": decl.name, "action": "skip"}, "info")
            return
        self.log(
            f"{decl.name}: {decision.action}: {decision.reason}",
            {"filter": decl.name, "action": decision.action},
            "info",
        )
        if decision.action == schedule.ROTATE:
            self._rotate(client, server, decl, run)
            return
        source, options = declared_inputs(decl, self.options, self.explicit)
        if decision.reason == schedule.FIRST_BUILD:  # under the lock, nothing built if another run
            options["only_if_missing"] = True  # (an apply, say) made it meanwhile
        try:
            self.rebuild(client, server, decl.key, source, options, run)
        except MadeMeanwhile:
            self._made_meanwhile(client, server, decl, source, options, run)

    def _made_meanwhile(
        self, client: RedisClient, server: ServerInfo, decl: Declared, source: Any, options: Any, run: Run
    ) -> None:
        """A first build that found the filter made while it waited for the lock: done, when a
        rebuild from the declared source made it; else (the application's own reserve) built now,
        as a filter never built from its source is."""
        from bloomctl.declared.apply import built_from_its_source

        if built_from_its_source(client, decl):
            run.code, run.action, run.detail = int(ExitCode.OK), "skip", "made meanwhile by another run"
            self.log(f"{decl.name}: skipped: {run.detail}", {"filter": decl.name, "action": "skip"}, "info")
            return
        run.reason = "made meanwhile, never built from its source"
        self.rebuild(client, server, decl.key, source, {**options, "only_if_missing": False}, run)

    def _rotate(self, client: RedisClient, server: ServerInfo, decl: Declared, run: Run) -> None:
        from bloomctl import window
        from bloomctl.declared import apply
        from bloomctl.errors import KeyMissing

        try:
            report = window.rotate(client, server, decl.key, dry_run=self.dry_run)
            made = "dry run" if self.dry_run else "rotated"
        except KeyMissing:  # a window not made yet: made as declared (what `apply` does)
            if self.dry_run:
                run.code, run.action, run.detail = int(ExitCode.OK), "rotate", "dry run: the window would be created"
                return
            report = apply.make_window(client, server, decl)
            made = "created"
        for warning in report.warnings:
            self.log(f"{decl.name}: {warning}", {}, "warning")
        counts = {name: sum(a.action == name for a in report.actions) for name in ("created", "expired", "foreign")}
        run.code, run.action = int(ExitCode.OK), "rotate"
        run.detail = f"{made}: {counts['created']} bucket(s) made, {counts['expired']} removed"

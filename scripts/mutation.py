"""Mutation testing of the modules that guard data: each mutant of a guard runs only the tests that
matter for it, and whatever survives is listed (file:line and the mutation). Not in CI: a habit,
run before changing a guard and after writing its tests (docs/testing.md).

cosmic-ray finds the mutants (``cosmic-ray init``, a session database per module) and applies them
one at a time; this script runs the tests and writes each result back to the database. Everything
happens in a copy of the working tree: other test runs and edits in this checkout never meet a
mutant, the tests' own subprocesses (``python -m bloomctl``) import the mutant through PYTHONPATH,
and the checkout is never written. The copy's module is put back after each mutant, on Ctrl-C too,
and checked byte for byte at the end.

    bash scripts/mutation.sh                    # every module below
    bash scripts/mutation.sh lock validate      # some of them
    bash scripts/mutation.sh --retest lock      # after new tests: the survivors again, on the tests as they are
    bash scripts/mutation.sh --report [NAME...] # the last run's counts and survivors again
    bash scripts/mutation.sh --list             # the modules and their tests

Of cosmic-ray's operators, the plausible slips are kept (see ``plausible``): an off-by-one
comparison or a negated one, + for -, * for /, a number one off, a dropped ``not``, ``and`` for
``or``, True for False, a loop that never runs; not ``<`` for ``is`` or + for ``<<``, which are
seldom anyone's slip and cost a test run each. ``--all-operators`` keeps every one.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import hashlib
import json
import os
import shlex
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORK = Path(os.environ.get("BLOOMCTL_MUTATION_DIR", "/tmp/bloomctl-mutation"))
COPY_IGNORE = shutil.ignore_patterns(
    ".git", ".venv", "__pycache__", ".pytest_cache", ".ruff_cache", ".mypy_cache", "mutants", "*.egg-info"
)


@dataclass(frozen=True)
class Target:
    name: str
    module: str
    tests: tuple[str, ...]  # pytest arguments: the narrowest tests that reach this code
    only: tuple[str, ...] = ()  # the functions (Class.method, or a module-level name) mutated; empty: all


STANDALONE = "not cluster and not redisbloom"
MUTANTS = "tests/test_guards_mutants.py"  # the tests written for the survivors
MORE = "tests/test_guards_mutants_more.py"  # and for the survivors of the targets added after them


def mutants(*names: str) -> tuple[str, ...]:
    """Tests of tests/test_guards_mutants.py by name."""
    return tuple(f"{MUTANTS}::{name}" for name in names)


def more(*names: str) -> tuple[str, ...]:
    """Tests of tests/test_guards_mutants_more.py by name."""
    return tuple(f"{MORE}::{name}" for name in names)


SWAP_GUARDS = mutants(
    "test_the_keep_old_guard_at_its_bounds_and_in_whole_milliseconds",
    "test_the_default_guards_are_shared_frozen_and_refuse_a_shrink_and_a_changed_recipe",
    "test_the_shrink_ratio_of_an_empty_or_one_item_active_filter",
    "test_a_standby_elsewhere_on_one_server_a_missing_filter_named_and_a_full_bitmap_standby",
)
TARGETS = [
    Target(
        "lock",
        "bloomctl/lifecycle/lock.py",
        (MUTANTS, "tests/test_locks.py", "-k", f"(test_guards_mutants and lock) or (test_locks and {STANDALONE})"),
    ),
    Target(
        "redact",
        "bloomctl/server/connection.py",
        (
            *mutants(
                "test_redaction_hides_every_secret_and_nothing_else",
                "test_an_empty_password_is_no_secret_and_the_longest_secret_is_scrubbed_first",
            ),
            "tests/test_config.py",
            "tests/test_connection.py",
            "tests/test_passwords.py",
        ),
        only=(
            "_secret_spans",
            "redact_url",
            "url_without_secrets",
            "check_userinfo",
            "_url_secrets",
            "url_has_secret",
            "_scrub",
            "ConnectionSettings.__repr__",
            "ConnectionSettings.redacted_url",
        ),
    ),
    Target(
        "db-redact",
        "bloomctl/sources/urls.py",
        (
            *mutants("test_a_database_urls_secrets_every_way_they_may_be_read"),
            "tests/test_sql_without_sqlalchemy.py",
            "-k",
            "test_guards_mutants or password or secret or libpq_message",
        ),
        only=("secrets_of", "redact_db_url"),
    ),
    Target(
        "validate",
        "bloomctl/transfer/validate.py",
        (
            *mutants(
                "test_a_header_field_just_out_of_its_range_is_refused",
                "test_sizes_no_filter_can_have_are_refused_as_inconsistent",
                "test_a_capped_rate_restores_and_a_chain_past_any_rate_is_refused",
                "test_a_grown_filters_size_is_checked_sub_filter_by_sub_filter",
                "test_a_cuckoo_members_size_is_checked_unless_it_grew",
            ),
            "tests/test_restore_trust.py",
            "tests/test_transfer.py",
            "-k",
            "test_guards_mutants or ((bad_file or forged or malformed or mismatch or sharded_filters or onto_a_key"
            " or odd_redisbloom or trust or huge or honest or zeroed or header) and not cluster)",
        ),
    ),
    Target(
        "guards",
        "bloomctl/lifecycle/guards.py",
        (*SWAP_GUARDS, "tests/test_swap_guards.py", "-k", "test_guards_mutants or bitmap-standalone"),
    ),
    Target(
        "swap",
        "bloomctl/lifecycle/single.py",
        (*SWAP_GUARDS, "tests/test_swap_guards.py", "-k", "test_guards_mutants or bitmap"),
        only=("prepare_swap", "SwapPlan.shrink_ratio"),
    ),
    Target(
        "config-secrets",
        "bloomctl/declared/schema.py",
        (
            *mutants("test_every_problem_of_a_table_is_reported_after_a_secret_or_a_misplaced_table"),
            "tests/test_config.py",
        ),
        only=("_walk", "_SIMPLE_CHECKS"),
    ),
    Target("config-url", "bloomctl/declared/rules.py", ("tests/test_config.py",), only=("_profile_rules",)),
    Target(
        "replay",
        "bloomctl/rebuild/replay.py",
        (
            *more(
                "test_the_replay_skips_the_sources_own_add_once_and_counts_every_other_copy",
                "test_the_replay_applies_every_add_of_an_item_the_source_lacks_and_no_delete_before_it",
                "test_the_replay_deletes_the_sources_copy_then_takes_the_next_add_as_it",
                "test_the_replay_keeps_its_view_across_batches",
            ),
            "tests/test_cuckoo_rebuild.py",
            "-k",
            "test_guards_mutants_more or ((replay or adds_and_deletes or first_build or log) and not cluster)",
        ),
        only=("decide", "Copies"),
    ),
    Target(
        "tally",
        "bloomctl/transfer/scratch.py",
        (
            *more(
                "test_the_items_estimated_from_a_sub_filters_set_bits_and_their_spread",
                "test_the_bits_are_counted_without_numpy_2_too",
                "test_the_tally_takes_chunks_in_order_each_inside_one_sub_filter",
                "test_a_string_counted_before_its_layout_and_a_tally_short_of_its_bytes",
                "test_the_count_guard_of_the_tally_at_its_boundary",
                "test_the_count_guard_names_the_sub_filter_of_a_chain",
            ),
            "tests/test_restore_trust.py",
            "tests/test_restore_forged.py",
            "-k",
            "test_guards_mutants_more or not cluster",
        ),
        only=("popcount", "estimated_items", "sparsest_window", "BitTally"),
    ),
    Target(
        "dumpfile",
        "bloomctl/transfer/dumpfile.py",
        (
            *more(
                "test_the_least_chunk_data_a_header_declares",
                "test_a_dump_reads_back_chunk_by_chunk_with_its_members",
                "test_a_regular_file_must_hold_the_chunk_data_its_header_declares",
                "test_bytes_after_the_end_record_are_refused_in_a_file_and_on_a_pipe",
                "test_a_dumps_header_is_checked_field_by_field",
                "test_a_header_of_the_largest_size_is_read_and_one_byte_more_refused",
                "test_a_dumps_records_are_checked_one_by_one",
                "test_a_chunk_for_an_empty_cuckoo_member_is_refused_and_only_for_it",
            ),
            "tests/test_restore_trust.py",
            "tests/test_restore_forged.py",
            "tests/test_transfer.py",
            "-k",
            "test_guards_mutants_more or test_restore_forged or (test_restore_trust and not cluster)"
            " or ((bad_file or written_whole or forged or malformed or cuckoo_header) and not cluster)",
        ),
        only=("_Hashing", "_bytes_left", "_chunk_bytes", "declared_data", "_chunkless", "Reader"),
    ),
    Target(
        "verify",
        "bloomctl/rebuild/verify.py",
        (
            *more("test_verify_checks_at_most_a_thousand_items_a_call_and_waits_for_its_window"),
            "tests/test_rebuild.py",
            "-k",
            "test_guards_mutants_more or ((verif or planted_miss) and not cluster)",
        ),
    ),
    Target(
        "recipe",
        "bloomctl/lifecycle/single.py",
        (
            *more("test_the_recipe_guard_refuses_only_two_recorded_recipes_that_differ"),
            *mutants("test_the_default_guards_are_shared_frozen_and_refuse_a_shrink_and_a_changed_recipe"),
            "tests/test_swap_guards.py",
            "-k",
            "test_guards_mutants or (built_otherwise and not cluster)",
        ),
        only=("check_recipe",),
    ),
    Target(
        "probe",
        "bloomctl/rebuild/build/probe.py",
        (
            *more(
                "test_the_probe_matches_this_server_on_an_expiring_key_it_removes",
                "test_the_probe_names_the_bytes_and_the_count_that_differ",
            ),
            "tests/test_client_build.py",
            "tests/test_untrusted_inputs.py",
            "-k",
            "test_guards_mutants_more or ((probe or auto_builds or denied_the_upload) and not cluster)",
        ),
    ),
    Target(
        "capacity-load",
        "bloomctl/rebuild/loader.py",
        (
            *more(
                "test_the_loader_takes_a_bitmap_filter_to_its_capacity_and_not_one_item_past",
                "test_a_full_redisbloom_filter_stops_the_load_naming_its_capacity",
                "test_a_full_cuckoo_filter_stops_the_rebuild_naming_its_capacity_on_both_backends",
                "test_a_write_error_other_than_a_full_filter_is_not_called_its_capacity",
            ),
            "tests/test_swap_guards.py",
            "-k",
            "test_guards_mutants_more or (over_its_capacity and bitmap-standalone)",
        ),
        only=("over_capacity", "Loader.read", "_reached_capacity"),
    ),
    Target(
        "capacity-build",
        "bloomctl/rebuild/build/client.py",
        (
            *more("test_a_client_build_takes_a_filter_to_its_capacity_and_not_one_item_past"),
            "tests/test_swap_guards.py",
            "tests/test_client_build.py",
            "-k",
            "test_guards_mutants_more or ((over_its_capacity or full_nonscaling or outgrows_one_link) and standalone)",
        ),
        only=("Build.check",),
    ),
    Target(
        "capacity-fill",
        "bloomctl/rebuild/run.py",
        (
            *more(
                "test_a_rebuild_fills_a_bitmap_filter_to_its_capacity_and_warns_past_80_percent",
                "test_a_redisbloom_filter_warns_only_where_it_never_grows_and_grows_past_its_capacity",
            ),
            "tests/test_swap_guards.py",
            "-k",
            "test_guards_mutants_more or (over_its_capacity and bitmap-standalone)",
        ),
        only=("check_fill", "growth_limit"),
    ),
    Target(
        "window-expiry",
        "bloomctl/window/rotation.py",
        (
            *more(
                "test_each_bucket_expires_when_it_leaves_the_window_and_strays_go_within_the_look_back",
                "test_a_bucket_the_server_has_no_memory_for_is_said_so_and_other_refusals_are_not",
            ),
            "tests/test_window.py",
            "-k",
            "test_guards_mutants_more or ((rotat or strays or foreign or missed) and not cluster)",
        ),
        only=("_bucket", "_expired"),
    ),
]

# Plausible slips: an operator keeps only the replacements a person might write by mistake.
_BINARY = {
    "Add": {"Sub"},
    "Sub": {"Add"},
    "Mul": {"Div", "FloorDiv"},
    "Div": {"Mul", "FloorDiv"},
    "FloorDiv": {"Div", "Mul"},
    "Mod": {"FloorDiv"},
    "Pow": {"Mul"},
    "LShift": {"RShift"},
    "RShift": {"LShift"},
    "BitOr": {"BitAnd"},
    "BitAnd": {"BitOr"},
    "BitXor": {"BitOr"},
}
_COMPARE = {  # the boundary moved, and the test negated
    "Lt": {"LtE", "GtE"},
    "LtE": {"Lt", "Gt"},
    "Gt": {"GtE", "LtE"},
    "GtE": {"Gt", "Lt"},
    "Eq": {"NotEq"},
    "NotEq": {"Eq"},
    "Is": {"IsNot"},
    "IsNot": {"Is"},
    "In": {"NotIn"},
    "NotIn": {"In"},
}


def plausible(operator: str) -> bool:
    name = operator.rpartition("/")[2]
    for prefix, table in (("ReplaceBinaryOperator_", _BINARY), ("ReplaceComparisonOperator_", _COMPARE)):
        if name.startswith(prefix):
            was, _, now = name.removeprefix(prefix).partition("_")
            return now in table.get(was, ())
    if name.startswith("ReplaceUnaryOperator_"):
        return name.startswith("ReplaceUnaryOperator_Delete_")
    return True


def spans(source: str, names: tuple[str, ...]) -> list[tuple[int, int]]:
    """The lines of the named functions, methods (Class.name) and module-level assignments."""
    found: dict[str, tuple[int, int]] = {}

    def visit(body: list[ast.stmt], prefix: str) -> None:
        for node in body:
            targets: list[str] = []
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                targets = [node.name]
            elif isinstance(node, ast.Assign):
                targets = [t.id for t in node.targets if isinstance(t, ast.Name)]
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                targets = [node.target.id]
            for name in targets:
                first = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))])
                found[prefix + name] = (first, node.end_lineno or node.lineno)
            if isinstance(node, ast.ClassDef):
                visit(node.body, f"{prefix}{node.name}.")

    visit(ast.parse(source).body, "")
    missing = [name for name in names if name not in found]
    if missing:
        raise SystemExit(f"mutation: no {', '.join(missing)} in the module: update TARGETS in {__file__}")
    return [found[name] for name in names]


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def pytest_command(target: Target, tree: Path) -> list[str]:
    return [
        *("env", f"PYTHONPATH={tree}", "PYTHONDONTWRITEBYTECODE=1", sys.executable, "-m", "pytest"),
        *("-x", "-q", "-p", "no:cacheprovider", f"--basetemp={tree.parent / 'pytest-tmp'}"),
        *target.tests,
    ]


def run_tests(command: list[str], tree: Path, timeout: float) -> tuple[str, str]:
    """("survived" | "killed", output); a run past ``timeout`` is killed with its servers (the
    test run's own process group), and so is one interrupted by Ctrl-C, before the mutant is put back."""
    proc = subprocess.Popen(command, cwd=tree, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _end(proc)
        return "killed", "timeout"
    except BaseException:
        _end(proc)
        raise
    return ("survived" if proc.returncode == 0 else "killed"), output.decode("utf-8", "replace")


GONE = (ProcessLookupError, PermissionError, subprocess.TimeoutExpired)


def _end(proc: subprocess.Popen) -> None:
    """Stop the test run this script started (its process group: pytest and the servers it started)."""
    with contextlib.suppress(*GONE):
        os.killpg(proc.pid, signal.SIGINT)  # pytest stops its servers on an interrupt
        proc.wait(10)
    with contextlib.suppress(*GONE):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(*GONE):
        proc.wait(10)


def prepare(target: Target, all_operators: bool) -> tuple[Path, Path]:
    """A fresh copy of the tree, and the session database of the module's mutants (those outside
    ``only``, and the implausible ones, marked skipped) with the config that made it beside it:
    ``cosmic-ray exec`` and ``cr-report`` work on them too."""
    home = WORK / target.name
    tree = home / "tree"
    if tree.exists():
        shutil.rmtree(tree)
    shutil.copytree(ROOT, tree, ignore=COPY_IGNORE, symlinks=True)
    config, session = home / "cosmic-ray.toml", home / "session.sqlite"
    config.write_text(
        "[cosmic-ray]\n"
        f"module-path = {json.dumps(target.module)}\n"
        "timeout = 600.0\n"
        "excluded-modules = []\n"
        f"test-command = {json.dumps(shlex.join(pytest_command(target, tree)))}\n"
        '\n[cosmic-ray.distributor]\nname = "local"\n'
    )
    session.unlink(missing_ok=True)
    cosmic_ray = Path(sys.executable).with_name("cosmic-ray")
    subprocess.run([str(cosmic_ray), "init", str(config), str(session)], cwd=tree, check=True)
    _skip_unwanted(target, tree, session, all_operators)
    (home / "module.sha256").write_text(digest(tree / target.module))
    return tree, session


def refresh(target: Target) -> tuple[Path, Path]:
    """For ``--retest``: a fresh copy of the tree (the tests as they are now) over the same module,
    and the last run's survivors made pending again (the session kept as session-before.sqlite).
    Adding tests never revives a killed mutant, so the survivors are all there is to re-run."""
    home = WORK / target.name
    session = home / "session.sqlite"
    if not session.exists():
        raise SystemExit(f"mutation: --retest {target.name}: no session yet; run it first")
    tree = home / "tree"
    shutil.rmtree(tree)
    shutil.copytree(ROOT, tree, ignore=COPY_IGNORE, symlinks=True)
    if digest(tree / target.module) != (home / "module.sha256").read_text():
        raise SystemExit(f"mutation: {target.module} changed since its session: run {target.name} again in full")
    shutil.copyfile(session, home / "session-before.sqlite")
    with sqlite3.connect(session) as db:
        db.execute("DELETE FROM work_results WHERE test_outcome = 'SURVIVED'")
    return tree, session


def _skip_unwanted(target: Target, tree: Path, session: Path, all_operators: bool) -> None:
    from cosmic_ray.work_db import WorkDB, use_db
    from cosmic_ray.work_item import WorkerOutcome, WorkResult

    lines = spans((tree / target.module).read_text(encoding="utf-8"), target.only) if target.only else None
    with use_db(str(session), WorkDB.Mode.open) as db:
        skipped = [
            item.job_id
            for item in db.pending_work_items
            if (lines is not None and not any(a <= item.mutations[0].start_pos[0] <= b for a, b in lines))
            or not (all_operators or plausible(item.mutations[0].operator_name))
        ]
        if skipped:
            db.set_multiple_results(skipped, WorkResult(worker_outcome=WorkerOutcome.SKIPPED))


def execute(target: Target, tree: Path, session: Path, timeout: float) -> None:
    """Each pending mutant in turn: applied to the copy, the tests run, the result stored, the
    module put back (cosmic-ray's ``use_mutation`` restores it even when Ctrl-C ends the run)."""
    from cosmic_ray.mutating import _make_diff, use_mutation
    from cosmic_ray.plugins import get_operator
    from cosmic_ray.work_db import WorkDB, use_db
    from cosmic_ray.work_item import TestOutcome, WorkerOutcome, WorkResult

    command = pytest_command(target, tree)
    with use_db(str(session), WorkDB.Mode.open) as db:
        pending = db.pending_work_items
        for number, item in enumerate(pending, 1):
            (mutation,) = item.mutations
            operator = get_operator(mutation.operator_name)(**(mutation.operator_args or {}))
            started = time.monotonic()
            with use_mutation(tree / mutation.module_path, operator, mutation.occurrence) as (before, after):
                if after is None:
                    result = WorkResult(worker_outcome=WorkerOutcome.NO_TEST)
                else:
                    outcome, output = run_tests(command, tree, timeout)
                    diff = "\n".join(_make_diff(before, after, mutation.module_path))
                    result = WorkResult(
                        worker_outcome=WorkerOutcome.NORMAL,
                        test_outcome=TestOutcome(outcome),
                        output=output[-4000:],
                        diff=diff,
                    )
            db.set_result(item.job_id, result)
            line = mutation.start_pos[0]
            print(
                f"  [{number}/{len(pending)}] {target.module}:{line} {mutation.operator_name.rpartition('/')[2]}: "
                f"{result.test_outcome.value if result.test_outcome else result.worker_outcome.value} "
                f"({time.monotonic() - started:.1f} s)",
                flush=True,
            )


def baseline(target: Target, tree: Path) -> float:
    """The selected tests on the unmutated copy: they must pass, and their time sets the timeout."""
    started = time.monotonic()
    outcome, output = run_tests(pytest_command(target, tree), tree, 900)
    elapsed = time.monotonic() - started
    if outcome != "survived":
        print(output[-3000:])
        raise SystemExit(f"mutation: {target.name}: the tests fail before any mutant ({' '.join(target.tests)})")
    return elapsed


def report(target: Target) -> tuple[int, int, int] | None:
    """Print the module's counts and survivors; (mutants, killed, survived), None without a session."""
    from cosmic_ray.work_db import WorkDB, use_db
    from cosmic_ray.work_item import TestOutcome, WorkerOutcome

    session = WORK / target.name / "session.sqlite"
    if not session.exists():
        return None
    with use_db(str(session), WorkDB.Mode.open) as db:
        items = {item.job_id: item for item in db.work_items}
        results = [(items[job], result) for job, result in db.results]
    tested = [(i, r) for i, r in results if r.worker_outcome == WorkerOutcome.NORMAL]
    killed = [r for _i, r in tested if r.test_outcome == TestOutcome.KILLED]
    survived = sorted(
        (i for i, r in tested if r.test_outcome == TestOutcome.SURVIVED), key=lambda i: i.mutations[0].start_pos
    )
    timeouts = sum(1 for r in killed if r.output == "timeout")
    other = len(results) - len(tested) - sum(1 for _i, r in results if r.worker_outcome == WorkerOutcome.SKIPPED)
    pending = len(items) - len(results)
    scope = f" ({', '.join(target.only)})" if target.only else ""
    print(
        f"{target.name}: {target.module}{scope}: {len(tested)} mutants, {len(killed)} killed ({timeouts} by the "
        f"timeout), {len(survived)} survived"
        + (f", {other} not run" if other else "")
        + (f", {pending} pending (interrupted)" if pending else "")
    )
    survivors = {i.job_id: r for i, r in results}
    for item in survived:
        mutation = item.mutations[0]
        print(f"  SURVIVED {mutation.module_path}:{mutation.start_pos[0]} {mutation.operator_name.rpartition('/')[2]}")
        for line in (survivors[item.job_id].diff or "").splitlines():
            if line[:1] in "-+" and not line.startswith(("---", "+++")):
                print(f"      {line.strip()[:1]} {line[1:].strip()}")
    return len(tested), len(killed), len(survived)


def run(target: Target, all_operators: bool, retest: bool) -> None:
    source = ROOT / target.module
    before = digest(source)
    tree, session = refresh(target) if retest else prepare(target, all_operators)
    copied = digest(tree / target.module)
    print(f"== {target.name}: {target.module}: baseline of {' '.join(target.tests)}", flush=True)
    elapsed = baseline(target, tree)
    timeout = max(20.0, 3 * elapsed + 10)
    print(f"   baseline {elapsed:.1f} s, timeout per mutant {timeout:.0f} s", flush=True)
    try:
        execute(target, tree, session, timeout)
    finally:
        if digest(tree / target.module) != copied:  # never expected: use_mutation restores it
            shutil.copyfile(source, tree / target.module)
            print(f"mutation: restored {tree / target.module}", file=sys.stderr)
        if digest(source) != before:
            print(f"mutation: NOTE {target.module} changed in the checkout during the run (someone's edit)")


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help="targets to run (default: all)")
    parser.add_argument("--report", action="store_true", help="print the last run's counts and survivors")
    parser.add_argument("--list", action="store_true", help="list the targets and their tests")
    parser.add_argument("--all-operators", action="store_true", help="keep every cosmic-ray operator")
    parser.add_argument(
        "--retest", action="store_true", help="re-run the last run's survivors on the tests as they are now"
    )
    args = parser.parse_args(argv)
    by_name = {t.name: t for t in TARGETS}
    unknown = [n for n in args.names if n not in by_name]
    if unknown:
        parser.error(f"unknown target {', '.join(unknown)}; known: {', '.join(by_name)}")
    chosen = [by_name[n] for n in args.names] or TARGETS
    if args.list:
        for t in chosen:
            print(f"{t.name}: {t.module} {list(t.only) or ''}\n    pytest {' '.join(t.tests)}")
        return 0
    interrupted = False
    signal.signal(signal.SIGTERM, _interrupt)  # a kill, like Ctrl-C: the mutant is put back first
    if not args.report:
        for target in chosen:
            try:
                run(target, args.all_operators, args.retest)
            except KeyboardInterrupt:
                print(f"\nmutation: interrupted in {target.name}; its module is restored", file=sys.stderr)
                interrupted = True
                break
    print()
    totals = [counts for counts in (report(t) for t in chosen) if counts]
    survived = sum(counts[2] for counts in totals)
    if len(totals) > 1:
        print(f"\ntotal: {sum(c[0] for c in totals)} mutants, {sum(c[1] for c in totals)} killed, {survived} survived")
    return 130 if interrupted else (1 if survived else 0)


if __name__ == "__main__":
    sys.exit(main())

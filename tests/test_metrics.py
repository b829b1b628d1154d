"""Prometheus textfiles and metrics files: series per key, ratios named `_ratio`, a file renamed
into place carrying the exit code and the last success, regular files only, and a write that
fails keeping the run's own exit code."""

from __future__ import annotations

import json
import time

import pytest

from tests.helpers.matrix import SIGNALS_LOCKS_ERRORS


def _families(text: str) -> dict:
    from prometheus_client.parser import text_string_to_metric_families

    return {f.name: f for f in text_string_to_metric_families(text)}


@SIGNALS_LOCKS_ERRORS
def test_prometheus_thresholds_are_per_key_and_ratios_end_in_ratio(target, tmp_path):
    """(#10 item 14) Two textfiles for two keys emitted conflicting `bloomctl_fill_ratio_threshold{level}`
    series (no key label); ratios were not named `_ratio`."""
    for key in ("a", "b"):
        target.reserve(key, 1000)
    first = _families(target.cli("fill-ratio", "a", "--max", "0.9", "--format", "prometheus").stdout)
    second = _families(target.cli("fill-ratio", "b", "--max", "0.5", "--format", "prometheus").stdout)
    series = {
        (tuple(sorted(s.labels.items())), s.value)
        for families in (first, second)
        for s in families["bloomctl_fill_threshold_ratio"].samples
    }
    labels = {labels for labels, _value in series}
    assert len(labels) == len(series) == 4  # no two files write the same series
    assert ((("key", "b"), ("level", "max")), 0.5) in series
    ratios = [name for name in first if "fpr" in name or "fill" in name]
    assert ratios and all(name.endswith("_ratio") for name in ratios), ratios
    assert "bloomctl_estimated_false_positive_ratio" in first


@SIGNALS_LOCKS_ERRORS
def test_fill_ratio_output_is_atomic_with_exit_code_and_last_success(target, tmp_path):
    """(#10 item 14) `--output FILE` renames a complete file into place; it carries the exit code and
    `bloomctl_last_success_timestamp_seconds`, which a failed run keeps from the file it replaces."""
    import os

    target.reserve("a", 1000)
    textfile = tmp_path / "textfile"
    textfile.mkdir()
    out = textfile / "bloomctl.prom"
    before = time.time()
    ok = target.cli("fill-ratio", "a", "--format", "prometheus", "--output", str(out))
    assert ok.exit_code == 0 and ok.stdout == ""
    families = _families(out.read_text())
    (success,) = families["bloomctl_last_success_timestamp_seconds"].samples
    assert success.labels == {"command": "fill-ratio"} and before <= success.value <= time.time()
    assert families["bloomctl_fill_ratio_exit_code"].samples[0].value == 0
    assert oct(os.stat(out).st_mode & 0o777) == "0o644"
    inode = os.stat(out).st_ino
    missing = target.cli("fill-ratio", "a", "nope", "--format", "prometheus", "--output", str(out))
    assert missing.exit_code == 5
    families = _families(out.read_text())
    assert families["bloomctl_fill_ratio_exit_code"].samples[0].value == 5
    assert families["bloomctl_last_success_timestamp_seconds"].samples[0].value == success.value  # kept
    assert os.stat(out).st_ino != inode  # a new file renamed over the old one, not rewritten in place
    assert sorted(os.listdir(textfile)) == ["bloomctl.prom"]  # no temporary file left behind
    down = target.cli("fill-ratio", "a", "--format", "prometheus", "--output", str(out), url="redis://127.0.0.1:1/0")
    assert down.exit_code == 3
    families = _families(out.read_text())
    assert families["bloomctl_fill_ratio_exit_code"].samples[0].value == 3
    assert families["bloomctl_last_success_timestamp_seconds"].samples[0].value == success.value
    made = target.cli("fill-ratio", "a", "--output", str(tmp_path / "no" / "such" / "dir.prom"))
    assert made.exit_code == 0 and (tmp_path / "no" / "such" / "dir.prom").is_file()  # -o makes its directories
    text = target.cli("fill-ratio", "a", "--format", "json", "--output", str(tmp_path / "a.json"))
    assert text.exit_code == 0 and json.loads((tmp_path / "a.json").read_text())["filters"][0]["key"] == "a"


@SIGNALS_LOCKS_ERRORS
def test_rebuild_metrics_file_says_duration_items_and_result(target, tmp_path):
    """(#10 item 14) `rebuild --metrics-file` (cron and Kubernetes had to echo their own exit code into a
    file): duration, items, exit code, swapped and the last success, also when the run fails."""

    csv = tmp_path / "u.csv"
    csv.write_text("id\n" + "".join(f"user:{i}\n" for i in range(700)))
    metrics = tmp_path / "rebuild-users.prom"
    args = ["rebuild", "users", "--from-csv", str(csv), "-c", "1000", "-e", "1%", "--swap"]
    before = time.time()
    ok = target.cli(*args, "--metrics-file", str(metrics))
    assert ok.exit_code == 0, ok.stderr
    families = _families(metrics.read_text())
    value = {name: f.samples[0].value for name, f in families.items()}
    assert all(f.samples[0].labels["key"] == "users" for f in families.values())
    assert value["bloomctl_rebuild_items"] == 700 and value["bloomctl_rebuild_exit_code"] == 0
    assert value["bloomctl_rebuild_success"] == 1 and value["bloomctl_rebuild_swapped"] == 1
    assert 0 < value["bloomctl_rebuild_duration_seconds"] < 60
    assert before <= value["bloomctl_last_success_timestamp_seconds"] <= time.time()
    missing = target.cli(
        *[a if a != str(csv) else str(tmp_path / "gone.csv") for a in args], "--metrics-file", str(metrics)
    )
    assert missing.exit_code == 8
    failed = {name: f.samples[0].value for name, f in _families(metrics.read_text()).items()}
    assert failed["bloomctl_rebuild_exit_code"] == 8 and failed["bloomctl_rebuild_success"] == 0
    assert failed["bloomctl_rebuild_swapped"] == 0
    assert failed["bloomctl_last_success_timestamp_seconds"] == value["bloomctl_last_success_timestamp_seconds"]
    no_db = target.cli(
        "rebuild", "users", "--from-sql", "SELECT 1", "--metrics-file", str(metrics), env={"BLOOMCTL_DB_URL": ""}
    )
    assert no_db.exit_code == 2  # refused while opening the source: the file says so too
    assert _families(metrics.read_text())["bloomctl_rebuild_exit_code"].samples[0].value == 2
    nowhere = target.cli(*args, "--metrics-file", str(tmp_path / "none" / "x.prom"))
    assert nowhere.exit_code == 2 and "does not exist" in nowhere.stderr and target.card("users") == 700


@SIGNALS_LOCKS_ERRORS
def test_output_files_are_regular_files_only(target, tmp_path, monkeypatch):
    """(#10 item 14, review) `--output` renamed its file over a FIFO or a device (as root, over /dev/full),
    replaced a symbolic link by a file, wrote a file named '-', and left its temporary file behind
    when a signal came during the write."""
    import os

    from bloomctl.cli import metrics

    target.reserve("users", 1000)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    refused = target.cli("fill-ratio", "users", "--format", "json", "--output", str(fifo))
    assert refused.exit_code == 2 and "not a regular file" in refused.stderr and fifo.is_fifo()
    real = tmp_path / "real.prom"
    real.write_text("old\n")
    real.chmod(0o640)
    link = tmp_path / "link.prom"
    link.symlink_to(real)
    assert target.cli("fill-ratio", "users", "--format", "prometheus", "--output", str(link)).exit_code == 0
    assert (
        link.is_symlink() and "bloomctl_fill_ratio" in real.read_text() and oct(real.stat().st_mode & 0o777) == "0o640"
    )
    dash = target.cli("fill-ratio", "users", "--format", "json", "--output", "-")
    assert dash.exit_code == 0 and json.loads(dash.stdout)["filters"]
    before = sorted(os.listdir(tmp_path))

    def interrupted(_fd: int) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(metrics.os, "fsync", interrupted)
    with pytest.raises(KeyboardInterrupt):
        metrics.write_atomically(str(tmp_path / "new.prom"), "x\n", "--output")
    assert sorted(os.listdir(tmp_path)) == before  # no temporary file, no target


@SIGNALS_LOCKS_ERRORS
def test_a_failed_metrics_write_keeps_the_runs_own_exit_code(target, tmp_path, monkeypatch):
    """(#10 item 14, review) When the metrics file could not be written after a failed rebuild, its write
    error replaced the run's own (exit 2 instead of 8, or 143 after SIGTERM)."""
    from bloomctl.cli import metrics
    from bloomctl.errors import UsageError as Refused

    def full_disk(*_args: object) -> None:
        raise Refused("--metrics-file x: cannot write: No space left on device")

    monkeypatch.setattr(metrics, "write_atomically", full_disk)
    result = target.cli(
        "rebuild",
        "users",
        "--from-csv",
        str(tmp_path / "gone.csv"),
        "-c",
        "100",
        "-e",
        "1%",
        "--metrics-file",
        str(tmp_path / "m.prom"),
    )
    assert result.exit_code == 8 and "no metrics written" in result.stderr and "cannot read" in result.stderr


@SIGNALS_LOCKS_ERRORS
def test_any_failure_of_fill_ratio_updates_its_textfile(target, tmp_path, monkeypatch):
    """(#10 item 14, review) An error that was not bloomctl's own (a timeout, a command the ACL denies)
    left the previous run's `exit_code 0` in the textfile."""
    import redis

    import bloomctl.lifecycle.fill

    target.reserve("users", 1000)
    out = tmp_path / "f.prom"
    assert target.cli("fill-ratio", "users", "--format", "prometheus", "--output", str(out)).exit_code == 0

    def timed_out(*_args: object, **_kwargs: object) -> None:
        raise redis.exceptions.TimeoutError("Timeout reading from socket")

    monkeypatch.setattr(bloomctl.lifecycle.fill, "fill_ratio", timed_out)
    failed = target.cli("fill-ratio", "users", "--format", "prometheus", "--output", str(out))
    assert failed.exit_code == 3
    assert _families(out.read_text())["bloomctl_fill_ratio_exit_code"].samples[0].value == 3

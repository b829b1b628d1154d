"""The quickstart's output (#23 item 9): plain text when piped or with NO_COLOR, and a window demo
that does not overfill its bucket.

Piped, it printed raw escape sequences (`^[[1m$ bloomctl plan ...^[[0m`), and with NO_COLOR set on
a terminal it still printed them; its window demo put 2,000 items into a bucket of 1,000 (192.8%
fill, a lookup's FPR 13.96%) without a word from `window info`. The tour starts its own
redis-server (module-free: the quickest tour) and runs in about ten seconds.
"""

from __future__ import annotations

import os
import pty
import subprocess
from pathlib import Path

import pytest

from tests.helpers.processes import read_terminal
from tests.servers import REDIS_SERVER

ROOT = Path(__file__).resolve().parent.parent
QUICKSTART = ROOT / "examples" / "quickstart.sh"
TIMEOUT = 240  # seconds: the tour takes about ten on a busy 2-core machine
ESC = b"\x1b"

pytestmark = pytest.mark.skipif(not REDIS_SERVER, reason="the quickstart needs redis-server")


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR", "BLOOMCTL_URL")}
    return {**env, "REDIS_SERVER": str(REDIS_SERVER), "BLOOMCTL_REDISBLOOM_MODULE": "", **extra}


def _on_a_terminal(command: list[str], env: dict[str, str]) -> tuple[int, bytes]:
    """Runs ``command`` with stdout and stderr on a pseudo-terminal; its exit code and output."""
    leader, follower = pty.openpty()
    proc = subprocess.Popen(command, stdout=follower, stderr=follower, stdin=subprocess.DEVNULL, env=env, cwd=ROOT)
    os.close(follower)
    output = read_terminal(leader)
    code = proc.wait(timeout=TIMEOUT)
    os.close(leader)
    return code, output


def test_the_quickstart_piped_is_plain_text_and_its_window_is_not_overfilled():
    proc = subprocess.run(
        ["bash", str(QUICKSTART)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env=_env(),
        cwd=ROOT,
        timeout=TIMEOUT,
    )
    out = proc.stdout
    assert proc.returncode == 0, out.decode(errors="replace")[-3000:]
    assert b"$ bloomctl window info recent" in out and b"rollback users --yes" in out  # the whole tour ran
    assert ESC not in out, [line for line in out.splitlines() if ESC in line][:3]
    # window info warns about a bucket past its capacity: the demo stays within it
    assert b"above plan" not in out and b"OVER" not in out


def test_no_color_on_a_terminal_means_no_escapes():
    """NO_COLOR (https://no-color.org) holds for the script's headings and bloomctl's tables alike."""
    code, out = _on_a_terminal(["bash", str(QUICKSTART)], _env(NO_COLOR="1", COLUMNS="120"))
    assert code == 0, out.decode(errors="replace")[-3000:]
    assert b"$ bloomctl window rotate recent" in out
    assert ESC not in out, [line for line in out.splitlines() if ESC in line][:3]


def test_a_terminal_without_no_color_gets_bold_headings():
    """The check above can fail: on a terminal, and without NO_COLOR, the headings are bold. Only
    the script's lines that choose the style run here (the tour itself is tested above)."""
    text = QUICKSTART.read_text(encoding="utf-8")
    start = text.index("if [ -t 1 ]")
    end = text.index("\n", text.index("step() {"))
    script = text[start:end] + "\nstep bloomctl plan\n"
    code, out = _on_a_terminal(["bash", "-c", script], _env())
    assert code == 0 and b"\x1b[1m$ bloomctl plan" in out, out
    code, out = _on_a_terminal(["bash", "-c", script], _env(NO_COLOR="1"))
    assert code == 0 and ESC not in out and b"$ bloomctl plan" in out, out

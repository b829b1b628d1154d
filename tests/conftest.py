"""The fixtures live in tests/fixtures/ (servers and the CLI, SQL services, report hooks); `server`,
one server of each kind, is here: `check` and `apply` are tested on each (test_check.py,
test_apply.py)."""

import os
import sys

import pytest

pytest_plugins = ["tests.fixtures.redis", "tests.fixtures.sql", "tests.fixtures.report"]


@pytest.fixture(
    params=[
        pytest.param("plain", id="module-free"),
        pytest.param("bloom", id="redisbloom", marks=pytest.mark.redisbloom),
        pytest.param("cluster", id="cluster", marks=pytest.mark.cluster),
    ]
)
def server(request):
    return request.getfixturevalue(request.param)


def pytest_configure(config: pytest.Config) -> None:
    """The processes the tests start read no terminal: bloomctl asks before it replaces or creates
    a live filter when stdin is one (bloomctl.cli.confirm), and a suite run from a developer's
    shell would hang at that question. The test that means to ask gives its own pseudo-terminal."""
    if os.isatty(0) and not (config.getoption("usepdb") or config.getoption("trace")):  # (pdb reads the terminal)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)


# The exit code of the run, kept for pytest_unconfigure below.
_EXIT_STATUS: list[int] = []


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    _EXIT_STATUS.append(int(exitstatus))


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    """End the process as soon as pytest is done with it.

    A test that leaves a pyarrow CSV reader unclosed leaves its read-ahead threads behind, and the
    interpreter's finalization can then wait for them for ever: a CI run once printed its summary
    and hung for 45 minutes. Every report is written by now (JUnit and the matrix report in
    pytest_sessionfinish, the server fixtures stopped with the last test), so nothing is lost.
    """
    if _EXIT_STATUS:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(_EXIT_STATUS[-1])

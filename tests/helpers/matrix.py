"""Rows of docs/compatibility.md that are not named after the module a test is in.

tests/fixtures/report.py puts a test that takes ``target`` in its module's row, unless its
``matrix`` marker names one. The tests marked with these came from two modules named after the
issue that brought them (test_guards.py, test_hardening.py); moved by subject, they keep the rows
they had, which CI checks on every server."""

from __future__ import annotations

import pytest

GUARDS = pytest.mark.matrix("guards")
SIGNALS_LOCKS_ERRORS = pytest.mark.matrix("signals, locks, errors")

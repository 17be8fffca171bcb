"""Tests run on two pytest-xdist workers (pyproject addopts): most of the suite is chains of single-threaded
processes (imports, set-up, tiny epochs), so one test leaves the second core of the 2-core CI machine idle: the
suite took 1259 s in one process and 906-916 s on two workers (2026-12-02, same machine).

A test that measures time or speed is marked `exclusive`: it runs while no other test runs, so its figures are
not shared with a neighbour's. Every other test holds the lock shared. The lock covers a test's whole protocol,
module fixtures included (a module's fixture is set up within its first test's protocol).

Files are handed to the workers in collection order (--no-loadscope-reorder), which this conftest sets: the
minutes-long `e2e` files first, so the two workers share them instead of one running the last alone, and the files
with `exclusive` tests last, so those rarely wait for a long neighbour to finish.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
from pathlib import Path

import pytest


@contextlib.contextmanager
def held(exclusive: bool):
    """A fair readers-writer lock between the xdist workers of this run: two flock(2) files.

    An exclusive holder keeps the turnstile while it waits for the room and while it runs, so shared holders that
    arrive meanwhile queue behind it instead of starving it.
    """
    run_id = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if run_id is None:  # a single process (pytest -n 0): nothing runs beside this test
        yield
        return
    folder = Path(tempfile.gettempdir()) / f"stagedyolo-tests-{run_id}"
    folder.mkdir(exist_ok=True)
    with open(folder / "turnstile", "a") as turnstile, open(folder / "room", "a") as room:
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        fcntl.flock(room, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        if not exclusive:
            fcntl.flock(turnstile, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(room, fcntl.LOCK_UN)
            fcntl.flock(turnstile, fcntl.LOCK_UN)


def pytest_collection_modifyitems(items):
    def files_marked(name: str) -> set:
        return {item.path for item in items if item.get_closest_marker(name)}

    exclusive, long = files_marked("exclusive"), files_marked("e2e")
    items.sort(key=lambda item: 2 if item.path in exclusive else 0 if item.path in long else 1)  # stable


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    with held(exclusive=item.get_closest_marker("exclusive") is not None):
        yield

"""Running a stage as a child process group that always ends, whether the stage exits or is stopped."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import IO, Any

from .parent_watch import orphans_come_back, parent_death_preexec
from .process_tree import ProcessTree

FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
_POLL_S = 0.2
_REFRESH_S = 0.5


@dataclass
class SupervisedResult:
    returncode: int  # the child's exit status, negative for a signal (as in subprocess)
    stop_signal: int | None = None  # the signal that asked the supervisor to stop, if one did
    killed_pids: list[int] = field(default_factory=list)  # processes that had to be SIGKILLed
    timed_out: bool = False  # timeout_s ran out and the child was stopped (as if by SIGTERM)


class _StopRequests:
    """The stop signals the supervisor received, forwarded to the child's process group as they arrive."""

    def __init__(self) -> None:
        self.first_signal: int | None = None
        self.first_at: float | None = None
        self.count = 0
        self.timed_out = False
        self.child_pid: int | None = None
        self.tree: ProcessTree | None = None

    def on_signal(self, signum: int, _frame: Any) -> None:
        self.count += 1
        if self.first_signal is None:
            self.first_signal, self.first_at = signum, time.monotonic()
        if self.tree is not None:
            # Note the newest processes before the signal orphans them: their groups are how we find them later.
            self.tree.refresh()
        self._forward(signum)

    def attach(self, child_pid: int, tree: ProcessTree) -> None:
        self.child_pid, self.tree = child_pid, tree
        if self.first_signal is not None:  # it arrived while the child was starting
            self._forward(self.first_signal)

    def _forward(self, signum: int) -> None:
        if self.child_pid is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.child_pid, signum)  # the child leads its own group (start_new_session)


def supervise(
    argv: Sequence[str],
    env: Mapping[str, str] | None,
    *,
    cwd: str | os.PathLike | None = None,
    stdout: int | IO | None = None,
    stderr: int | IO | None = None,
    grace_s: float = 10.0,
    on_start: Callable[[int], None] | None = None,
    timeout_s: float | None = None,
) -> SupervisedResult:
    """Like run_supervised, but also says whether a signal stopped the stage and what had to be SIGKILLed."""
    # Orphans come back to us while the child runs: a loader whose rank died is then provably ours.
    with orphans_come_back() as adopts_orphans:
        stop = _StopRequests()
        previous_handlers = _install_handlers(stop)
        proc: subprocess.Popen | None = None
        tree: ProcessTree | None = None
        result = SupervisedResult(returncode=-1)
        try:
            proc = start_session(argv, env, cwd=cwd, stdout=stdout, stderr=stderr)
            tree = ProcessTree(proc.pid, adopts_orphans=adopts_orphans)
            stop.attach(proc.pid, tree)
            if on_start is not None:
                on_start(proc.pid)
            timeout_at = None if timeout_s is None else time.monotonic() + timeout_s
            result.returncode, result.killed_pids = _wait_for_child(proc, tree, stop, grace_s, timeout_at)
        finally:
            try:
                result.killed_pids += _end_what_is_left(proc, tree, stop, grace_s)
            finally:
                _restore_handlers(previous_handlers)
        result.stop_signal, result.timed_out = stop.first_signal, stop.timed_out
        return result


def run_supervised(argv: Sequence[str], env: Mapping[str, str] | None, **options) -> int:
    """Run ``argv`` in its own session and return its exit status (negative for a signal).

    From the main thread, SIGTERM, SIGINT and SIGHUP received meanwhile are forwarded to the child's process
    group (a second one kills at once), and the previous handlers are restored afterwards. From another thread
    no handlers are installed: stopping is the caller's business. Either way, once the child has exited, or
    ``grace_s`` after a stop signal, every process it started is ended, by PID and process group: SIGTERM, then
    SIGKILL when ``grace_s`` is up. ``on_start(pid)`` runs once the child exists (e.g. to start telemetry).
    ``timeout_s``: stop the child as if SIGTERM had arrived once it has run this long (a hung probe).
    ``options`` are supervise()'s: cwd, stdout, stderr, grace_s, on_start, timeout_s.
    """
    return supervise(argv, env, **options).returncode


def start_session(argv: Sequence[str], env: Mapping[str, str] | None, **popen_options) -> subprocess.Popen:
    """The one way this project starts an engine process (a stage's worker, torchrun, the probe's child): in a
    session and process group of its own, so signals reach it and its children and never us, and with a
    parent-death signal, so it still hears about it if we are SIGKILLed."""
    return subprocess.Popen(
        list(argv),
        env=None if env is None else dict(env),
        start_new_session=True,
        preexec_fn=parent_death_preexec(signal.SIGTERM),
        **popen_options,
    )


def _end_what_is_left(
    proc: subprocess.Popen | None, tree: ProcessTree | None, stop: _StopRequests, grace_s: float
) -> list[int]:
    """Whatever outlived the child (ranks, dataloader workers) gets SIGTERM, then SIGKILL at the bound; return
    the SIGKILLed PIDs."""
    killed = []
    if proc is not None and tree is not None:
        started = stop.first_at if stop.first_at is not None else time.monotonic()
        try:
            killed = tree.end_all(deadline=max(started + grace_s, time.monotonic() + 0.5))
            tree.reap_adopted()
        finally:
            tree.release()
    if proc is not None and proc.poll() is None:  # only if on_start or the wait itself raised
        proc.kill()
        proc.wait()
    return killed


def _wait_for_child(
    proc: subprocess.Popen, tree: ProcessTree, stop: _StopRequests, grace_s: float, timeout_at: float | None
) -> tuple[int, list[int]]:
    last_refresh = time.monotonic()
    while True:
        try:
            return proc.wait(timeout=_POLL_S), []
        except subprocess.TimeoutExpired:
            pass
        now = time.monotonic()
        if timeout_at is not None and now >= timeout_at and stop.first_at is None:
            stop.timed_out = True
            stop.on_signal(signal.SIGTERM, None)
        if now - last_refresh >= _REFRESH_S:
            tree.refresh()
            last_refresh = now
        out_of_patience = stop.count >= 2 or (stop.first_at is not None and now - stop.first_at >= grace_s)
        if out_of_patience:
            killed = tree.kill_all()
            return proc.wait(), killed


def _install_handlers(stop: _StopRequests) -> dict[int, Any]:
    if threading.current_thread() is not threading.main_thread():
        return {}
    return {sig: signal.signal(sig, stop.on_signal) for sig in FORWARDED_SIGNALS}


def _restore_handlers(previous: dict[int, Any]) -> None:
    for sig, handler in previous.items():
        # None means a handler installed outside Python; the default is the closest we can restore.
        signal.signal(sig, signal.SIG_DFL if handler is None else handler)

"""Ending a stage's processes when the process that started them is gone (e.g. Snakemake killed with kill -9)."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import sys
import threading
import time
from collections.abc import Callable

_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>


def parent_death_preexec(death_signal: int = signal.SIGTERM) -> Callable[[], None] | None:
    """A Popen ``preexec_fn`` that makes the kernel send ``death_signal`` to the child when its parent dies.

    Linux only (None elsewhere). The kernel ties this to the *thread* that started the child, so start the child
    from a thread that outlives it (run_supervised blocks in that thread until the child has ended). libc is
    loaded here, before the fork, so the child runs no import between fork and exec.
    """
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True).prctl
    parent_pid = os.getpid()

    def set_parent_death_signal() -> None:
        prctl(_PR_SET_PDEATHSIG, int(death_signal), 0, 0, 0)
        if os.getppid() != parent_pid:  # the parent died before prctl took effect
            os.kill(os.getpid(), death_signal)

    return set_parent_death_signal


def exit_when_parent_dies(poll_s: float = 1.0, grace_s: float = 5.0) -> threading.Thread:
    """Start a daemon thread that ends this process (and its process group) once its parent has gone.

    For the worker and each DDP rank: call it first thing. When the parent changes (it died and the process was
    re-parented), the thread sends SIGTERM to this process's group if this process leads it (a torchrun rank
    does, and so does a worker started by run_supervised), so its dataloader workers end too; otherwise to its
    own children and itself. Whatever is left after ``grace_s`` gets SIGKILL. Polling rather than
    PR_SET_PDEATHSIG here, because torchrun may start ranks from a thread that ends before they do.
    """
    parent_pid = os.getppid()
    watcher = threading.Thread(
        target=_watch_parent, args=(parent_pid, poll_s, grace_s), name="exit-when-parent-dies", daemon=True
    )
    watcher.start()
    return watcher


def _watch_parent(parent_pid: int, poll_s: float, grace_s: float) -> None:
    # A parent pid of 1 means we were orphaned before the watch started.
    _watch(f"parent process {parent_pid}", lambda: parent_pid != 1 and os.getppid() == parent_pid, poll_s, grace_s)


def _watch(label: str, alive: Callable[[], bool], poll_s: float, grace_s: float) -> None:
    while alive():
        time.sleep(poll_s)
    print(f"stagedyolo: {label} is gone; ending pid {os.getpid()}", file=sys.stderr, flush=True)
    _signal_own_processes(signal.SIGTERM)
    time.sleep(grace_s)
    _signal_own_processes(signal.SIGKILL)


def _signal_own_processes(sig: int) -> None:
    own_pid = os.getpid()
    if os.getpgid(0) == own_pid:
        # We lead our group: it holds our dataloader workers and nothing of the caller's.
        os.killpg(own_pid, sig)
        return
    import psutil  # only needed on this path

    for child in psutil.Process().children(recursive=True):
        try:
            child.send_signal(sig)
        except psutil.NoSuchProcess:
            pass
    os.kill(own_pid, sig)

"""Ending a stage's processes when the process that started them is gone (e.g. Snakemake killed with kill -9)."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator

import psutil

from .process_tree import is_running

# from <linux/prctl.h>
_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
_PR_GET_CHILD_SUBREAPER = 37


def _libc_prctl():
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True).prctl


def parent_death_preexec(death_signal: int = signal.SIGTERM) -> Callable[[], None] | None:
    """A Popen ``preexec_fn`` that makes the kernel send ``death_signal`` to the child when its parent dies.

    Linux only (None elsewhere). The kernel ties this to the *thread* that started the child, so start the child
    from a thread that outlives it (run_supervised blocks in that thread until the child has ended). libc is
    loaded here, before the fork, so the child runs no import between fork and exec.
    """
    if not sys.platform.startswith("linux"):
        return None
    prctl = _libc_prctl()
    parent_pid = os.getpid()

    def set_parent_death_signal() -> None:
        prctl(_PR_SET_PDEATHSIG, int(death_signal), 0, 0, 0)
        if os.getppid() != parent_pid:  # the parent died before prctl took effect
            os.kill(os.getpid(), death_signal)

    return set_parent_death_signal


@contextlib.contextmanager
def orphans_come_back() -> Iterator[bool]:
    """While inside, the kernel hands this process every orphaned descendant (Linux's child subreaper) instead of
    init; yields whether it does. The previous setting is restored on leaving.

    A dataloader worker whose rank dies is re-parented: as our child, it is provably one of ours, whenever it was
    started (ProcessTree). The caller reaps what it adopts; an adopted process that ends meanwhile stays a zombie of
    this process until then, holding nothing but its pid.
    """
    if not sys.platform.startswith("linux"):
        yield False
        return
    prctl = _libc_prctl()
    before = ctypes.c_int(0)
    if prctl(_PR_GET_CHILD_SUBREAPER, ctypes.byref(before), 0, 0, 0) != 0:
        yield False
        return
    took = prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    try:
        yield took
    finally:
        if took:
            prctl(_PR_SET_CHILD_SUBREAPER, before.value, 0, 0, 0)


def exit_when_parent_dies(poll_s: float = 1.0, grace_s: float = 5.0) -> threading.Thread:
    """Start a daemon thread that ends this process (and its process group) once its parent has gone.

    For the worker and each DDP rank: call it first thing. When the parent changes (it died and the process was
    re-parented), the thread sends SIGTERM to this process's group if this process leads it (a torchrun rank
    does, and so does a worker started by run_supervised), so its dataloader workers end too; otherwise to its
    own children and itself. Whatever is left after ``grace_s`` gets SIGKILL. Polling rather than
    PR_SET_PDEATHSIG here, because torchrun may start ranks from a thread that ends before they do.
    """
    parent_pid = os.getppid()

    def alive() -> bool:  # a parent pid of 1 means we were orphaned before the watch started
        return parent_pid != 1 and os.getppid() == parent_pid

    return _start_watch("exit-when-parent-dies", f"parent process {parent_pid}", alive, poll_s, grace_s)


def exit_when_job_starter_dies(poll_s: float = 1.0, grace_s: float = 5.0) -> threading.Thread:
    """For a Snakemake job's script (the stage supervisor): end this process and its children once the process that
    started the job is gone, e.g. Snakemake killed with kill -9.

    Snakemake runs a `script:` job as `bash -c '...; python <script>'`, and that bash outlives a SIGKILLed Snakemake,
    so watching the parent is not enough: every ancestor whose command line runs this script (the job's shells) is
    watched, and the first one that does not (Snakemake, or whatever ran the script). Each is remembered with its
    start time, so a reused pid does not pass for it. The ending is exit_when_parent_dies': SIGTERM to this process
    and its children (a supervisor forwards it to its worker's group), SIGKILL to what is left after ``grace_s``.
    """
    starters = _job_starters(psutil.Process(), os.path.basename(sys.argv[0]))
    label = " and ".join(f"process {starter.pid}" for starter in starters) + " (what started this job)"
    return _start_watch("exit-when-job-starter-dies", label, lambda: all(map(is_running, starters)), poll_s, grace_s)


def _job_starters(process, script: str) -> list:
    """The ancestors that exist to run `script` (its shells), and the one above them."""
    starters = []
    for ancestor in process.parents():
        if ancestor.pid == 1:  # init, or a container's first process: it ends only with the machine
            break
        starters.append(ancestor)
        try:
            runs_script = bool(script) and any(script in part for part in ancestor.cmdline())
        except Exception:  # psutil.AccessDenied, NoSuchProcess: not one of the job's own shells
            runs_script = False
        if not runs_script:
            break
    return starters


def _start_watch(name: str, label: str, alive: Callable[[], bool], poll_s: float, grace_s: float) -> threading.Thread:
    watcher = threading.Thread(target=_watch, args=(label, alive, poll_s, grace_s), name=name, daemon=True)
    watcher.start()
    return watcher


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
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):
            child.send_signal(sig)
    os.kill(own_pid, sig)

"""Remembering every process a stage starts, so that all of them can be ended, by PID and process group."""

from __future__ import annotations

import contextlib
import os
import signal
import time

import psutil

# The roots of this process's trees that adopt orphans; normally one (a stage supervises one worker at a time).
_ADOPTING_ROOTS: set[int] = set()

# After SIGKILL a process is gone at once unless it sits in uninterruptible I/O; don't wait for that forever.
_AFTER_KILL_WAIT_S = 5.0


def is_running(process: psutil.Process | None) -> bool:
    """Whether a remembered process still runs: same PID and start time, and not a zombie (it holds nothing)."""
    try:
        return process is not None and process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


class ProcessTree:
    """The root process, its descendants and their process groups, as seen since the root started.

    A rank's dataloader workers are re-parented to init when the rank dies, so they stop being descendants of
    the root; they stay in the rank's process group, which is how ``sweep`` finds them again. psutil.Process
    remembers each process's start time, so a PID reused by an unrelated process is never signalled. A group id
    can be reused too, once every member of the group is gone: ``sweep`` adopts a process of a known group only if
    it was started while the group was provably ours (see _confirm_groups). That start time is only as exact as the
    kernel's boot time, whole seconds, so a process started within a refresh of its parent's death may be missed;
    with ``adopts_orphans`` (this process is the child subreaper: parent_watch.orphans_come_back) every orphan of
    the tree is handed back as our child, and adopted whenever it started: by the tree whose group it is in or,
    where no tree knows its group (a rank that died before any refresh saw it), by the only adopting tree there is.
    A child we had before the root started is never adopted; ``release`` ends a tree's claim.
    """

    def __init__(self, root_pid: int, adopts_orphans: bool = False) -> None:
        self.root_pid = root_pid
        self.adopts_orphans = adopts_orphans
        if adopts_orphans:
            _ADOPTING_ROOTS.add(root_pid)
        self._known: dict[int, psutil.Process] = {}
        self._groups: dict[int, float] = {}  # group id -> last time (epoch s) a remembered member was seen in it
        # Never signal the supervisor itself or its own group/session, whatever a descendant does.
        self._protected_pid = os.getpid()
        self._protected_groups = {os.getpgid(0), os.getsid(0)}
        # Our children from before the root started are not its orphans (a caller's own helpers, other stages).
        self._children_before = set(psutil.Process(self._protected_pid).children()) if adopts_orphans else set()
        self.refresh()

    def refresh(self) -> None:
        """Remember the root and its current descendants (cheap enough to call every half second)."""
        try:
            root = psutil.Process(self.root_pid)
            processes = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            processes = []
        if self.adopts_orphans:
            processes += self._orphans_handed_back()
        for process in processes:
            self._remember(process)
        self._confirm_groups()

    def release(self) -> None:
        """Stop claiming orphans that no tree knows (call once the root's processes are all ended)."""
        _ADOPTING_ROOTS.discard(self.root_pid)

    def _orphans_handed_back(self) -> list[psutil.Process]:
        """Our children that are this tree's orphans (see the class), and their descendants."""
        only_adopter = _ADOPTING_ROOTS == {self.root_pid}
        orphans = []
        for child in psutil.Process(self._protected_pid).children():
            if child.pid in _ADOPTING_ROOTS or child in self._children_before:  # not an orphan handed back
                continue
            try:
                if only_adopter or os.getpgid(child.pid) in self._groups:
                    orphans += [child, *child.children(recursive=True)]
            except (ProcessLookupError, psutil.NoSuchProcess):
                continue
        return orphans

    def reap_adopted(self) -> None:
        """Collect the exit status of every ended orphan handed back to us, so that none lingers as our zombie.

        Never the root: its Popen collects it."""
        for process in list(self._known.values()):
            if process.pid == self.root_pid or is_running(process):
                continue
            with contextlib.suppress(ChildProcessError, psutil.NoSuchProcess):
                if process.ppid() == self._protected_pid:
                    os.waitpid(process.pid, os.WNOHANG)

    def sweep(self) -> None:
        """Also remember processes that left the tree but are still in one of its process groups."""
        self.refresh()
        for process in psutil.process_iter():
            try:
                confirmed_at = self._groups.get(os.getpgid(process.pid))
                started_in_our_group = confirmed_at is not None and process.create_time() <= confirmed_at
            except (ProcessLookupError, psutil.NoSuchProcess):
                continue
            if started_in_our_group:
                self._remember(process)

    def _confirm_groups(self) -> None:
        """Note, for each group, that it is still ours now if a remembered process still runs in it.

        The kernel never hands out a group id while the group has a member, so a group that holds one of our
        processes (same PID and start time) is our group; a process started no later than that moment and found in
        it is one of ours. One started after the last such moment may belong to an unrelated group that reused the
        id, and is left alone.
        """
        now = time.time()
        for process in self.alive():
            try:
                group = os.getpgid(process.pid)
            except ProcessLookupError:
                continue
            if group in self._groups:
                self._groups[group] = now

    def alive(self) -> list[psutil.Process]:
        """Remembered processes that still run (zombies count as gone: they hold no resources)."""
        known = list(self._known.values())  # a signal handler may add entries meanwhile
        return [process for process in known if is_running(process)]

    def signal_all(self, sig: int) -> list[psutil.Process]:
        """Send ``sig`` to every remembered process still running; return those."""
        running = self.alive()
        for process in running:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.send_signal(sig)
        return running

    def end_all(self, deadline: float, poll_s: float = 0.1) -> list[int]:
        """SIGTERM everything left, SIGKILL what still runs at ``deadline`` (time.monotonic()); return those PIDs."""
        self.sweep()
        self.signal_all(signal.SIGTERM)
        while self.alive() and time.monotonic() < deadline:
            time.sleep(poll_s)
            self.sweep()  # a dying process may still have forked
        return self.kill_all()

    def kill_all(self) -> list[int]:
        """SIGKILL every remembered process still running; return their PIDs."""
        self.sweep()
        survivors = self.signal_all(signal.SIGKILL)
        give_up_at = time.monotonic() + _AFTER_KILL_WAIT_S
        while self.alive() and time.monotonic() < give_up_at:
            time.sleep(0.05)
        return [process.pid for process in survivors]

    def _remember(self, process: psutil.Process) -> None:
        if process.pid == self._protected_pid:
            return
        if self._known.get(process.pid) == process:  # same pid and same start time
            return
        try:
            group = os.getpgid(process.pid)
        except ProcessLookupError:
            return
        if group in self._protected_groups:
            return
        self._known[process.pid] = process
        self._groups[group] = time.time()

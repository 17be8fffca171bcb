"""One supervisor per work folder: an owner file that names the process running the stage in it."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import psutil

OWNER_FILE = "stage.owner"
_held: set[Path] = set()  # folders this process owns: owning() is re-entrant (train_stage holds it around run_stage)


class FolderOwned(RuntimeError):
    """Another live process runs in the folder; the message names it."""


@contextlib.contextmanager
def owning(folder: Path) -> Iterator[None]:
    """Own `folder` while the block runs: refuse (FolderOwned, naming its pid) while another live process owns it,
    take over the file of a dead one.

    The owner file records the pid and start time (psutil's create_time, so a reused pid is not mistaken for the
    owner) and is held with flock, which the kernel releases however the owner dies. The folder is created if need
    be; when the block leaves nothing in it but the owner file, the folder is removed too, still under the lock.
    """
    folder = Path(folder).resolve()
    if folder in _held:
        yield
        return
    fd = _locked_owner_file(folder)
    _held.add(folder)
    try:
        yield
    finally:
        _held.discard(folder)
        _release(folder, fd)


def _locked_owner_file(folder: Path) -> int:
    """The owner file's descriptor, locked and naming this process."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / OWNER_FILE
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise FolderOwned(_refusal(folder, _read_owner(path))) from None
        if _same_file(fd, path):
            break
        os.close(fd)  # the previous owner removed the file between our open and our lock: lock the new one
    recorded = _read_owner(path)
    if recorded and recorded.get("pid") != os.getpid() and _alive(recorded):  # a filesystem that ignores flock
        os.close(fd)
        raise FolderOwned(_refusal(folder, recorded))
    me = psutil.Process()
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps({"pid": me.pid, "started": me.create_time()}).encode(), 0)
    return fd


def _release(folder: Path, fd: int) -> None:
    try:
        if [entry.name for entry in folder.iterdir()] == [OWNER_FILE]:  # a published stage's emptied work folder
            (folder / OWNER_FILE).unlink()
            folder.rmdir()
    except OSError:
        pass  # something else arrived meanwhile: the folder stays, the file names a process that has ended
    finally:
        os.close(fd)


def _same_file(fd: int, path: Path) -> bool:
    try:
        return os.path.samestat(os.fstat(fd), os.stat(path))
    except FileNotFoundError:
        return False


def _read_owner(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text() or "null")
    except (OSError, ValueError):
        return None


def _alive(owner: dict) -> bool:
    try:
        return abs(psutil.Process(int(owner["pid"])).create_time() - float(owner["started"])) < 0.01
    except (psutil.Error, KeyError, TypeError, ValueError):
        return False


def _refusal(folder: Path, owner: dict | None) -> str:
    who = "another process"
    if owner:
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(owner.get("started", 0))))
        who = f"process {owner.get('pid')} (started {started})"
    return (
        f"{folder} is in use by {who}, another run of this stage: let it end, or end it, before starting the "
        "stage again (starting it now would train a second time into the same checkpoint)"
    )

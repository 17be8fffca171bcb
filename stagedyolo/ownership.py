"""Folders the pipeline owns: it writes and deletes only inside a folder it created and marked as its own.

Why: ``cache.dir`` is "fast local scratch" (``/scratch/$USER``) and ``tracking.dir`` may be yolov5's ``runs``; both
hold the user's files too. So the working copy and the TensorBoard logs go into a subfolder of their own that
carries a marker file, and every sweep (orphan ``.npy``, label caches, old image stores, a rerun stage's events)
first checks for that marker. A folder that exists without the marker, is a symlink, or belongs to another user is
never adopted: another user could otherwise plant a folder (and a pickled ``labels.cache``) under a predictable name.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
import stat
from pathlib import Path

MARKER = ".stagedyolo-owned"
TMP_PREFIX = ".stagetmp-"  # hidden, so YOLOv5's glob never lists a half-written file


class NotOwnedError(RuntimeError):
    """A folder the pipeline would write or delete in, but did not create."""


def is_owned(folder: str | os.PathLike) -> bool:
    """Whether ``folder`` is a real folder of this user that carries the marker (a regular file of this user)."""
    try:
        folder_st = os.lstat(folder)
        marker_st = os.lstat(Path(folder) / MARKER)
    except OSError:
        return False
    mine = folder_st.st_uid == marker_st.st_uid == os.getuid()
    return mine and stat.S_ISDIR(folder_st.st_mode) and stat.S_ISREG(marker_st.st_mode)


def owner_facts(folder: str | os.PathLike) -> dict | None:
    """What the marker of an owned folder records (who it is for), or None when the folder is not owned."""
    if not is_owned(folder):
        return None
    try:
        facts = json.loads((Path(folder) / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return facts if isinstance(facts, dict) else {}


def claim(folder: str | os.PathLike, purpose: str, private: bool = False, **facts) -> Path:
    """Create ``folder`` and mark it as the pipeline's, or check that an existing one is. An empty folder may be
    adopted (nothing in it to lose). ``private``: mode 0700, so no other user can write into it (a labels.cache
    there is a pickle yolov5 loads). Raises NotOwnedError for anything else."""
    folder = Path(folder).absolute()
    folder.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        folder.mkdir(mode=0o700 if private else 0o777)
    if not is_owned(folder):
        _refuse_unless_adoptable(folder)
        _write_marker(folder, {"owner": "stagedyolo", "purpose": purpose, **facts})
    if private:
        os.chmod(folder, 0o700)
    return folder


def _refuse_unless_adoptable(folder: Path) -> None:
    st = os.lstat(folder)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or any(os.scandir(folder)):
        raise NotOwnedError(
            f"{folder} exists and was not created by stagedyolo (no {MARKER} of this user in it). The pipeline only "
            "writes and deletes inside its own folders. Fix: move it away, or point the setting elsewhere."
        )


def _write_marker(folder: Path, facts: dict) -> None:
    tmp = temp_path(folder / MARKER)
    tmp.write_text(json.dumps(facts, indent=1, default=str) + "\n", encoding="utf-8")
    os.replace(tmp, folder / MARKER)


def require_owned(folder: str | os.PathLike, what: str) -> Path:
    if not is_owned(folder):
        raise NotOwnedError(
            f"{what}: {folder} is not a folder stagedyolo created (no {MARKER}); nothing is written or deleted there."
        )
    return Path(folder)


@contextlib.contextmanager
def locked(folder: str | os.PathLike):
    """Hold an exclusive lock on an owned folder (flock on its marker) while writing into it: two jobs updating one
    folder (a rerun beside a running one, two snakemake processes) take turns instead of interleaving."""
    fd = os.open(require_owned(folder, "lock") / MARKER, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield Path(folder)
    finally:
        os.close(fd)  # releases the lock


def temp_path(path: str | os.PathLike) -> Path:
    """A temporary name beside ``path``, unique per process and call: concurrent writers never share one."""
    path = Path(path)
    return path.with_name(f"{TMP_PREFIX}{os.getpid()}-{secrets.token_hex(4)}-{path.name}")


def sweep_temps(folder: str | os.PathLike) -> int:
    """Delete what killed writers left under an owned folder. Call it holding ``locked``: every writer holds it."""
    return sum(drop(p) for p in require_owned(folder, "sweep").rglob(TMP_PREFIX + "*") if p.is_file())


def drop(path: Path) -> int:
    """Delete one file if it is there; 1 if it was."""
    try:
        path.unlink()
        return 1
    except FileNotFoundError:
        return 0

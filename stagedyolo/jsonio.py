"""JSON files shared between processes: written atomically, read leniently."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
from pathlib import Path


def write_json(path: str | os.PathLike, data) -> None:
    """Write to a temporary file, then rename: a reader in another process (or after a kill) never sees half a file."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with replaced_atomically(path) as handle:
        handle.write(json.dumps(data, indent=2, default=str))


@contextlib.contextmanager
def replaced_atomically(path: str | os.PathLike, mode: str = "w"):
    """A handle on a new file beside ``path`` that replaces ``path`` when the block succeeds, and is removed when it
    does not. Its name is unique, so two writers of one path (two probes filling one cache entry) never write into,
    or rename away, each other's temporary file; its mode is what open() gives (0666 less the umask), not
    tempfile.mkstemp's 0600, which would hide a published file from the rest of a shared folder's group."""
    path = Path(path)
    fd, tmp = _new_file_beside(path)
    try:
        with os.fdopen(fd, mode) as handle:
            yield handle
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _new_file_beside(path: Path) -> tuple[int, Path]:
    """Create a hidden file with a random name in path's folder (hidden: yolov5's globs never list it)."""
    while True:
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), tmp
        except FileExistsError:  # 48 random bits: practically never
            continue


def read_json(path: str | os.PathLike):
    """The parsed file, or None when it is missing or unreadable (e.g. a stage killed before writing it)."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None

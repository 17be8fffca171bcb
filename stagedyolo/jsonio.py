"""JSON files shared between processes: written atomically, read leniently."""

from __future__ import annotations

import json
import os
from pathlib import Path


def write_json(path: str | os.PathLike, data) -> None:
    """Write to a temporary file, then rename: a reader in another process (or after a kill) never sees half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str))
    os.replace(tmp, path)


def read_json(path: str | os.PathLike):
    """The parsed file, or None when it is missing or unreadable (e.g. a stage killed before writing it)."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None

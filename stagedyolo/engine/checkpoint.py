"""Reading the epoch a yolov5 checkpoint holds, in a process of its own like everything that imports yolov5.

`python -m stagedyolo.engine.checkpoint <last.pt> <out.json>` writes {"epoch": N} or {"error": "..."}.
yolov5's train.py strips last.pt right after its final epoch (optimizer dropped, epoch set to -1), *before* it
validates best.pt and returns. A run killed after that point has finished training, and resuming it fails for good
("training to N epochs is finished, nothing to resume"), so the supervisor must tell the three cases apart.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from stagedyolo.jsonio import read_json, write_json
from stagedyolo.launch import supervise

FINISHED_EPOCH = -1  # what yolov5's strip_optimizer writes into a checkpoint whose training has ended
READ_TIMEOUT_S = 300


def checkpoint_epoch(path: Path, env: dict, log) -> tuple[int | None, str]:
    """The epoch stored in `path` (FINISHED_EPOCH: training ended), or None and why when it does not load."""
    out = path.with_name(path.name + ".epoch.json")
    out.unlink(missing_ok=True)
    result = supervise([sys.executable, "-m", __name__, str(path), str(out)], env, stdout=log,
                       stderr=subprocess.STDOUT, timeout_s=READ_TIMEOUT_S)  # fmt: skip
    answer = read_json(out) or {"error": f"the reading process exited {result.returncode}"}
    out.unlink(missing_ok=True)
    return answer.get("epoch"), answer.get("error", "")


def main(path: str, out: str) -> int:
    import torch

    try:
        # A yolov5 checkpoint is a pickled model: it is this run's own file (weights must come from a trusted source).
        epoch = int(torch.load(path, map_location="cpu", weights_only=False)["epoch"])
    except Exception as error:  # a torn or foreign file: the caller starts the stage again
        write_json(Path(out), {"error": f"{type(error).__name__}: {error}"})
        return 0
    write_json(Path(out), {"epoch": epoch})
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))

"""Reading a yolov5 checkpoint's epoch and checking its weights, in a process of its own like everything that imports
yolov5.

`python -m stagedyolo.engine.checkpoint <last.pt> <out.json>` writes {"epoch": N, "nonfinite": [...]} or
{"error": "..."}. yolov5's train.py strips last.pt right after its final epoch (optimizer dropped, epoch set to -1),
*before* it validates best.pt and returns. A run killed after that point has finished training, and resuming it fails
for good ("training to N epochs is finished, nothing to resume"), so the supervisor must tell the three cases apart.

Only an answer the reader wrote says something about the file. A reader that gave none (it timed out, was signalled,
was killed for memory, or hit an I/O or memory error) says nothing about it: CheckpointUnanswered, and the
checkpoint must be kept.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from stagedyolo.jsonio import read_json, write_json
from stagedyolo.launch import supervise

FINISHED_EPOCH = -1  # what yolov5's strip_optimizer writes into a checkpoint whose training has ended
READ_TIMEOUT_S = 300
WEIGHT_KEYS = ("model", "ema")  # the networks a yolov5 checkpoint holds (strip_optimizer makes model the EMA)


class CheckpointUnanswered(RuntimeError):
    """The reading process gave no answer: nothing is known about the checkpoint, so it must not be wiped."""


def read_checkpoint(path: Path, env: dict, log) -> dict:
    """{"epoch": N (FINISHED_EPOCH: training ended), "nonfinite": [tensor names]} or {"error": why it does not load}.
    Raises CheckpointUnanswered when the reader wrote neither."""
    out = path.with_name(path.name + ".epoch.json")
    out.unlink(missing_ok=True)
    result = supervise(
        [sys.executable, "-m", __name__, str(path), str(out)],
        env,
        stdout=log,
        stderr=subprocess.STDOUT,
        timeout_s=READ_TIMEOUT_S,
    )
    answer = read_json(out)
    out.unlink(missing_ok=True)
    if not answer:
        raise CheckpointUnanswered(f"reading {path} gave no answer ({_how_it_ended(result)})")
    return answer


def _how_it_ended(result) -> str:
    if result.timed_out:
        return f"the reading process ran past {READ_TIMEOUT_S} s and was stopped"
    if result.stop_signal:
        return f"the job was stopped by signal {result.stop_signal} meanwhile"
    if result.returncode < 0:
        return f"the reading process was killed by signal {-result.returncode}, e.g. for memory"
    return f"the reading process exited {result.returncode}"


def nonfinite_weights(checkpoint: dict, torch) -> list[str]:
    """The names of the floating-point weights in `checkpoint` that hold a NaN or an infinity."""
    bad = []
    for key in WEIGHT_KEYS:
        network = checkpoint.get(key)
        state = network.state_dict() if hasattr(network, "state_dict") else (network or {})
        for name, tensor in state.items():
            if torch.is_tensor(tensor) and tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
                bad.append(f"{key}.{name}")
    return bad


def nonfinite_checkpoints(paths: list[Path], torch) -> str | None:
    """Why the first of `paths` (those that exist) must not be published, its weights being non-finite, or None."""
    for path in filter(Path.exists, paths):
        bad = nonfinite_weights(torch.load(path, map_location="cpu", weights_only=False), torch)
        if bad:
            return (
                f"{path.name} holds non-finite weights after training ({', '.join(bad[:3])}...), though the loss "
                "read finite where it was checked: the stage is not published. Usual causes: the learning rate "
                "is too high, or AMP (fp16) overflows; try a tenth of its lr0, or amp: false."
            )
    return None


def main(path: str, out: str) -> int:
    import torch

    try:
        # A yolov5 checkpoint is a pickled model: it is this run's own file (weights must come from a trusted source).
        checkpoint = torch.load(path, map_location="cpu", weights_only=False)
        epoch = int(checkpoint["epoch"])
    except (MemoryError, OSError):
        raise  # the machine, not the file: no answer, so the caller keeps the checkpoint
    except Exception as error:  # a torn or foreign file: the caller starts the stage again
        write_json(Path(out), {"error": f"{type(error).__name__}: {error}"})
        return 0
    write_json(Path(out), {"epoch": epoch, "nonfinite": nonfinite_weights(checkpoint, torch)})
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))

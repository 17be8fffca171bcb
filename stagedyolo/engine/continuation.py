"""One training across stages: what a stage hands to the next, and how the next one takes it up.

yolov5 7.0 knows two ways to start from a checkpoint, and neither continues a training into a stage with other
settings. `--weights prev.pt` is a new training: fresh optimizer (momentum and Adam moments empty), fresh EMA
(`updates = 0`, so its decay restarts near 0), a new warmup and LR schedule from lr0, AutoAnchor again. `--resume`
restores optimizer, EMA and epoch but reloads the old run's settings (no new img, freeze or epochs). And a finished
run's last.pt is stripped (`strip_optimizer`), so the state a continuation needs is gone.

A stage with `start_from: previous` therefore starts as a new yolov5 run from the previous stage's `continue.pt`
(its last.pt as it was before yolov5 stripped it) and, inside train(), right after train.py has built its own
optimizer, scheduler and EMA for this stage's settings (the patch table's `continue_training` row):
- the optimizer's per-parameter state is restored (its param groups, i.e. this stage's LR, momentum and weight
  decay, stay as train.py set them: the same groups, since freezing only clears requires_grad);
- the EMA's weights and update count are restored;
- the AMP GradScaler's scale is restored (the `handover_state` row saves it in every checkpoint);
- the stage starts at the learning rate the previous stage handed over (the LR its scheduler had set for the epoch
  after its last), unless the stage names its own lr0; its schedule then runs from there to lr * hyp.lrf over its
  own epochs: epoch e at lr * lf(e), and lr * hyp.lrf handed over. yolov5's own schedule runs one epoch behind
  (train.py sets `scheduler.last_epoch = start_epoch - 1` after LambdaLR's constructor has already stepped once, so
  its first two epochs share lf(0) and its last runs at lf(E - 2)): a 2-epoch final stage would never lower its LR,
  and its hyp.lrf would change nothing. A continuing stage's scheduler starts one step on (`schedule_shift`), on
  a resume too, so a resumed stage keeps the same line; the first stage of a recipe is yolov5's own run and keeps
  yolov5's schedule. So a stage's LR depends only on its own settings and the checkpoint it is given:
  changing a later stage never changes an earlier one, and a changed earlier stage reruns the later ones through
  their input;
- no warmup (it ran once, in the first stage) and no AutoAnchor (it ran once too; the anchors are in the weights);
- its own random draws: train.py seeds shuffles and augmentations from opt.seed, so the stage runs at the seed plus
  the epochs already trained (worker.take_up_plan) instead of replaying the first stage's epochs.

The model weights train.py loads from continue.pt are the trained model (ckpt['model']), not the EMA: the EMA is
restored beside it, as yolov5's own --resume does.
"""

from __future__ import annotations

import shutil
from pathlib import Path

HANDOVER_NAME = "continue.pt"  # beside last.pt in yolov5's weights folder, and in the published stage folder


def handover_path(last: str | Path) -> Path:
    return Path(last).with_name(HANDOVER_NAME)


def read_handover(path: str | Path, torch) -> dict:
    """What the next stage needs to know before train.py starts: the LR the stage handed over, how many epochs the
    training has run, and the fitness it reached, validated at which image size (a checkpoint from before the
    `val_img` row was validated at its training size). Raises ValueError when the file is not a handover checkpoint."""
    ckpt = torch.load(str(path), map_location="cpu", weights_only=False)  # this run's own file (docs/robustness.md)
    if not ckpt.get("optimizer") or ckpt.get("ema") is None:
        raise ValueError(f"{path} holds no optimizer or EMA state (a stripped checkpoint): it cannot be continued")
    return {
        "lr": float(ckpt["optimizer"]["param_groups"][0]["lr"]),
        "recipe_epochs": int(ckpt.get("recipe_epochs", ckpt["epoch"] + 1)),
        "fitness": float(ckpt.get("best_fitness") or 0.0),
        "val_img": ckpt.get("val_img") or (ckpt.get("opt") or {}).get("imgsz"),
    }


class Continuation:
    """The seams train.py calls (through the patch table's source rows) to take up a handed-over training.

    ``source``: the handover checkpoint a new stage continues, or None (the first stage, or a restart). On
    `--resume` of an interrupted stage train.py restores optimizer and EMA itself; only the scaler is ours then.
    """

    def __init__(self, source: str | None, optimizer_name: str | None):
        self.source, self.optimizer_name = source, optimizer_name
        self.scaler_state = None
        self.report: dict = {}

    @property
    def schedule_shift(self) -> int:
        """Steps added to train.py's `scheduler.last_epoch`: 1 for a continuing stage (its epoch e then trains at
        lf(e), not lf(e - 1); see the module docstring), 0 for a stage that starts a training."""
        return 1 if self.source else 0

    def take_up(self, ckpt: dict, optimizer, ema, resume) -> None:
        """train.py's `del ckpt, csd` point: its optimizer, scheduler and EMA exist, the checkpoint is loaded."""
        self.scaler_state = ckpt.get("scaler")
        if resume or not self.source:
            return
        self.report = {"from": self.source, "optimizer": self._restore_optimizer(ckpt, optimizer)}
        if ema is not None:
            ema.ema.load_state_dict(ckpt["ema"].float().state_dict())
            ema.updates = int(ckpt["updates"])
        self.report["ema_updates"] = int(ckpt["updates"])

    def _restore_optimizer(self, ckpt: dict, optimizer) -> str:
        saved, fresh = ckpt["optimizer"], optimizer.state_dict()
        previous = (ckpt.get("opt") or {}).get("optimizer")
        if previous != self.optimizer_name:
            return f"not restored: the previous stage used {previous}, this one {self.optimizer_name}"
        sizes = [len(group["params"]) for group in saved["param_groups"]]
        if sizes != [len(group["params"]) for group in fresh["param_groups"]]:
            return f"not restored: the parameter groups differ ({sizes} saved) - a different model?"
        optimizer.load_state_dict({"state": saved["state"], "param_groups": fresh["param_groups"]})
        return "restored"

    def scaler(self, scaler):
        """train.py's GradScaler, with the scale the training had reached (AMP only; a no-op scaler otherwise)."""
        if self.scaler_state and scaler.is_enabled():
            scaler.load_state_dict(self.scaler_state)
            self.report["scaler"] = "restored"
        return scaler

    def strip_keeping_handover(self, strip_optimizer):
        """yolov5's strip_optimizer, which first keeps last.pt as it is (optimizer, EMA, scaler) as continue.pt."""

        def strip(f="best.pt", s=""):
            if Path(f).name == "last.pt":
                handover = handover_path(f)
                partial = handover.with_name(handover.name + ".partial")
                shutil.copyfile(f, partial)  # copy, then rename: a kill leaves no torn continue.pt
                partial.replace(handover)
            return strip_optimizer(f, s)

        return strip

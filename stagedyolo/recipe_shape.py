"""The recipe's shape for your data, from the one training you would otherwise run (`stagedyolo recipe`).

config/config.yaml is tuned to the demo's 160-px images. On untuned data the benchmarks measured one shape against
a fair one-stage yolov5 run of E epochs at the target size, yolov5's default hyp on both sides
(benchmarks/README.md, naive_vs_staged): on det at 480 px it reached the run's best mAP50 in 0.503x its time as
written here (0.523x with recipe_minutes set to that run's time) and ended higher (0.81-0.88 against 0.60-0.67).
This module is that shape, in one place: the benchmarks build their untuned configs with it, and `stagedyolo
recipe` writes it as a config override for your data.

- `smoke` 2 epochs, `frozen` about an eighth of E (it hands over once its gain per second stalls), `finetune`, all
  at the smaller size: SMALL_SHARE of the target in steps of 32, raised to what the boxes need (img_from_boxes);
- `highres` the last fifth of E at the target, mosaic off;
- the fine-tune gets what the smaller size saves: the stages train as many pixels as E epochs at the target
  (pixel_matched_finetune): 1.18x the single run's wall on det at 320 px, unless recipe_minutes fits them;
- one LR line from lr0 to lr0/100 across the stages (linear_lrf), each stage continuing the one before.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

from stagedyolo.recipe import stage_img
from stagedyolo.yolov5_facts import MIN_WARMUP_ITERS, NOMINAL_BATCH

# The smaller size as a share of the target: near half (docs/recipe.md, det: at a 480-px target phases at 256 reached
# the control's best at 0.52x, at 224 at 0.57x; at a 320-px target, phases at 224 (half, raised to the boxes' need)
# at 0.83x, at 256 (0.8 of it) at 0.93x).
SMALL_SHARE = 0.5
SMOKE_EPOCHS = 2
FINAL_LR_FACTOR = 0.01  # the line ends at lr0/100, yolov5's default lrf
# What the recipe sets in stage_defaults: yolov5's own optimizer and LR (its hyp.scratch-low.yaml for the rest).
UNTUNED_DEFAULTS = {"optimizer": "SGD", "lr0": 0.01}
COMMENT_WIDTH = 116  # the written file's comment lines, "# " included, stay within 120 columns


def linear_lrf(epochs: list[int], final: float = FINAL_LR_FACTOR) -> list[float]:
    """Each stage's hyp.lrf so that the chained stages fall along one straight line from lr0 to lr0 * final over
    all their epochs (how config/config.yaml's values were set: 2, 3, 4, 2 epochs give 0.82, 0.67, 0.35, 0.05)."""
    total, done, lrfs = sum(epochs), 0, []
    for n in epochs:
        start, end = 1 - (1 - final) * done / total, 1 - (1 - final) * (done + n) / total
        lrfs.append(round(end / start, 2))
        done += n
    return lrfs


def pixel_matched_finetune(total: int, img: int, small: int, early: int, final: int) -> int:
    """The fine-tune epochs at ``small`` px that make the recipe train no more pixels than ``total`` epochs at
    ``img``: ``early`` epochs at ``small`` before it and ``final`` at ``img`` after it. An epoch's cost grows with
    its image area, so what the smaller phases save buys (img/small)^2 times their epochs, less the ones already
    spent (det at 320 px: 6 early, 6 final of 30 give 31 fine-tune epochs at 256 px, 43 in all)."""
    budget = (total - final) * img * img  # what is left for the phases at the smaller size, in pixel-epochs
    return max(1, budget // (small * small) - early)


def smaller_img(img: int, share: float = SMALL_SHARE) -> int:
    """The early phases' configured size: ``share`` of the target in yolov5's steps of 32, at least 64."""
    return max(64, round(share * img / 32) * 32)


def trained_img(configured: int, target: int, boxes_need: int | None) -> int:
    """The size a phase configured at ``configured`` trains at: the override leaves img_from_boxes at the schema's
    default (on), so stage_img raises it to what the boxes need, capped at the target."""
    return stage_img({"img": configured, "target_img": target, "img_from_boxes": True}, boxes_need)[0]


def frozen_epochs(total: int) -> int:
    """The frozen phase's epochs for a single run of ``total``: about an eighth (4 of 30, as measured)."""
    return max(1, round(total / 8))


def recipe_epochs(
    total: int, img: int, small: int, frozen: int, boxes_need: int | None = None, spend_savings: bool = True
) -> list[int]:
    """Epochs of smoke, frozen, finetune and highres for a single run of ``total`` epochs at ``img``, the early
    phases configured at ``small`` and ``frozen`` of them frozen (0 leaves the phase out). ``boxes_need``: the
    dataset report's min_img_for_95pct_at_stride, so that the savings are counted at the size the phases will train
    at (img_from_boxes). Without ``spend_savings`` the phases share the ``total`` epochs."""
    final = max(1, round(total / 5))
    if not spend_savings:
        return [SMOKE_EPOCHS, frozen, total - SMOKE_EPOCHS - frozen - final, final]
    trained = trained_img(small, img, boxes_need)
    return [SMOKE_EPOCHS, frozen, pixel_matched_finetune(total, img, trained, SMOKE_EPOCHS + frozen, final), final]


def recipe_stages(epochs: list[int], small: int) -> dict:
    """The four stages for ``epochs`` (recipe_epochs), in order, on one LR line; a frozen phase of 0 epochs is left
    out (it takes no share of the line, so the others' lrf already fit)."""
    lrf = linear_lrf(epochs)
    stages = {
        "smoke": {
            "epochs": epochs[0],
            "img": small,
            "start_from": "model",
            "val_period": 2,  # its last epoch only
            "nosave": True,
            "hyp": {"lrf": lrf[0]},
        },
        "frozen": {
            "epochs": epochs[1],
            "img": small,
            "freeze": 10,
            "val_period": 1,
            "handover_on_stall": 0.25,
            "hyp": {"lrf": lrf[1]},
        },
        "finetune": {"epochs": epochs[2], "img": small, "val_period": 3, "hyp": {"lrf": lrf[2]}},
        "highres": {"epochs": epochs[3], "val_period": 1, "hyp": {"lrf": lrf[3], "mosaic": 0.0}},
    }
    if not epochs[1]:
        del stages["frozen"]
    return stages


def recipe_override(
    data_yaml: Path,
    img: int,
    total: int,
    *,
    weights: str | None,
    shipped: dict,
    yolov5_hyp: dict,
    boxes_need: int | None = None,
    small_share: float = SMALL_SHARE,
    minutes: float | None = None,
    run: str | None = None,
) -> dict:
    """A --configfile override of ``shipped`` (config/config.yaml) that runs the recipe on ``data_yaml``: yolov5's
    default hyp (``yolov5_hyp``, its hyp.scratch-low.yaml), the target ``img``, the stages for a single run of
    ``total`` epochs. A --configfile merges into config.yaml key by key, so every hyp key config.yaml sets for the
    demo is set back to yolov5's value, and every stage key it sets is set here."""
    small = smaller_img(img, small_share)
    stages = recipe_stages(recipe_epochs(total, img, small, frozen_epochs(total), boxes_need), small)
    demo_hyp = shipped["stage_defaults"].get("hyp") or {}
    override = {
        "run": run or Path(data_yaml).resolve().parent.name or "mydata",
        "dataset": str(Path(data_yaml).resolve()),
        "model": {"weights": weights and str(Path(weights).resolve())},
        "stage_defaults": {**UNTUNED_DEFAULTS, "img": img, "hyp": {key: yolov5_hyp[key] for key in demo_hyp}},
        "stage_order": list(stages),
        "stages": stages,
    }
    if minutes:
        override["recipe_minutes"] = minutes
    return override


def recipe_comment(override: dict, total: int, boxes_need: int | None, shipped: dict) -> str:
    """The YAML comment above a written override: what it is, each stage's epochs and size, what it keeps from
    ``shipped`` (the base config it merges into), and how to run it."""
    defaults, kept = override["stage_defaults"], shipped["stage_defaults"]
    target = defaults["img"]
    lines = [
        "The staged recipe for",
        f"  {override['dataset']}",
        f"written by `stagedyolo recipe` in place of one yolov5 run of {total} epochs at {target} px (docs/recipe.md).",
        "Each stage continues the one before it, on one LR line:",
    ]
    for name, stage in override["stages"].items():
        configured = stage.get("img", target)
        trained = trained_img(configured, target, boxes_need)
        size = f"{trained} px" + (
            f" (raised from {configured}: the boxes need {boxes_need})" if trained > configured else ""
        )
        lines.append(f"  {name}: {stage['epochs']} epoch{'s' if stage['epochs'] != 1 else ''} at {size}")
    nominal, warmup = kept.get("nominal_batch", NOMINAL_BATCH), kept.get("min_warmup_iters", MIN_WARMUP_ITERS)
    lines += textwrap.wrap(
        f"yolov5's own optimizer and hyp ({defaults['optimizer']}, lr0 {defaults['lr0']:g}, hyp.scratch-low); edit "
        f"anything below. nominal_batch and min_warmup_iters stay as the base config sets them: {nominal} and "
        f"{warmup} (yolov5's {NOMINAL_BATCH} and {MIN_WARMUP_ITERS} suit a dataset of thousands; less leaves a small "
        "one more steps: README, 'Train on your own data').",
        width=COMMENT_WIDTH,
    )
    if not override["model"]["weights"]:
        lines.append(
            "model.weights is null: it trains from model.cfg; set a local .pt to start from pretrained weights."
        )
    if override.get("recipe_minutes"):
        lines.append(f"recipe_minutes: the stages fit {override['recipe_minutes']:g} minutes, their shape kept.")
    lines.append("Run: snakemake --cores 8 --resources gpu=1 --configfile <this file>")
    return "".join(f"# {line}\n" for line in lines)

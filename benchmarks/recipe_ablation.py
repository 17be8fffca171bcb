"""What each part of the staged recipe contributes: the shipped recipe against itself with one part taken out.

Design (fixed before any of its figures were taken; see benchmarks/README.md, "recipe_ablation"):

Dataset (`--dataset`): `demo` (the built-in target set and the demo's pretrained.pt, built once and not timed,
shared with naive_vs_staged.py), judged at its 160-px target size: a row counts only when it was validated at 160 px.
`mixed` (added 2026-12-03, this paragraph and its targets written before its first figures): naive_vs_staged.py's
untuned set (benchmarks/make_mixed.py, 96 train / 24 val images), judged at 320 px, the recipe being naive_vs_staged's
untuned_config for it (yolov5's default hyp, SGD lr0 0.01; smoke 2, frozen 2, finetune 12 at 256 px, highres 4 at
320 px with mosaic off; one LR line), from the demo's pretrained.pt. There the staged recipe ended at mAP50 0.108
where the fair 20-epoch control reached 0.159 in the same wall time: this asks which part costs the accuracy.

`det` (added 2026-12-04, this paragraph and its targets written before any det figure of this script and before
the seeded det run of naive_vs_staged.py): naive_vs_staged.py's first untuned set (benchmarks/make_det640.py, 160
train / 40 val images as naive_vs_staged_det.md's `--det-train 160 --det-val 40`), judged at 160 px, the recipe
naive_vs_staged's untuned_config for it (smoke 2, frozen 4, finetune 18 at 128 px, highres 6 at 160 px with mosaic
off; one LR line). There the stages ended at mAP50 0.228 where the fair 30-epoch control reached 0.316 (Intel Xeon,
seed 0). Targets 0.1, 0.2 and 0.316. It is run only where naive_vs_staged's seeded det run on the same machine shows
the fair control reaching 0.2 at two seeds of three: below that the set does not learn at this budget there, and
the ablation would describe noise, as mixed did on the AMD EPYC machine (every side at mAP50 0.006-0.043).

Sides, in every repeat, each `snakemake --cores 2 --resources gpu=1` on its config in a fresh folder
(naive_vs_staged.run_staged: the clock runs from the snakemake call to the results.csv row):
- `staged`: the recipe as is (demo: config/config.yaml as shipped, smoke, frozen, finetune at 128 px, highres at 160;
  every stage continues the one before it).
- `no_continuity`: the same stages, each after the first a new yolov5 run from the previous stage's last.pt
  (`start_from: previous_weights`): warmup, optimizer, EMA, LR schedule and AutoAnchor start afresh in every stage.
- `no_resolution`: the same stages, every one at the target size (no smaller early phases).
- `no_freezing`: the same stages, the frozen stage with `freeze: 0` (its stall handover kept).

Targets, fixed in advance and all reported: mAP50 0.5, 0.7, 0.9 on the demo; 0.05, 0.1 and 0.159 (the fair
20-epoch control's best in naive_vs_staged.md) on mixed; 0.1, 0.2 and 0.316 on det; and `staged_best` = the best
mAP50 the recipe reached at the target size in that repeat. Per side and target: time to the target, and the ratio
side / staged (above 1: the part taken out saves that much time; a side that never reaches a target gives a bound
`> its wall / staged`). Also each side's best mAP50 at 160 px and its whole wall clock. Repeats: `--repeats` (>= 3),
the side order rotating by one each repeat, os.getloadavg() recorded before and after every run; medians with
min-max over repeats.
No goal: an ablation describes; the recipe's goals are naive_vs_staged's.

Seeds (added 2026-12-04, this paragraph written before the first seeded figures): repeat i trains every side at
yolov5 seed `--seeds`[i] (default 0, 1, 2; naive_vs_staged.seeded sets stage_defaults.seed), so the four sides of a
repeat share one seed and each ratio is paired within its seed, while the spread over repeats holds the training's
own variance, not only timing noise. A CPU training is deterministic per seed and machine: the earlier files, every
repeat at seed 0, each describe one trajectory. The targets and sides are unchanged; each repeat's row in the
markdown names its seed and every side's best mAP50.

det at a 320-px target and the `no_close_mosaic` side (added 2026-12-05, this paragraph and its targets written after
naive_vs_staged_det320.md and before any figure of this script at 320 px): `--dataset det320` is
naive_vs_staged_det320's set and recipe (make_det640, 160 train / 40 val images; smoke 2, frozen 4, finetune 18 at
256 px, highres 6 at 320 px with mosaic off), judged at 320 px. There the stages ended at mAP50 0.40-0.43 in about
200 s where the fair 30-epoch control reached 0.43-0.66 (median 0.583) in 224-231 s, and the stages were level with
that control or ahead of it at the end of the fine-tune in two seeds of three, falling behind in the last phase: this
asks which part costs the accuracy. Targets 0.2, 0.4 and 0.583, with `staged_best` as before. A fifth side, in every
data set from this date: `no_close_mosaic`, the same stages with each stage's own `mosaic` setting removed, so the
final phase trains with the mosaic the earlier phases use (yolov5's 1.0 on the untuned sets). On the demo, whose
stage_defaults keep mosaic off in every stage, that side trains what `staged` trains: an A/A pair there.

The cut itself: `split_only` and `one_run` (added 2026-12-05 afternoon, this paragraph and its reading written
before any figure of either side). On det320 the recipe ends below the fair control even with every phase at 320 px
(no_resolution 0.473 against naive_vs_staged_det320's 30-epoch control at 0.43-0.66). This pair asks whether cutting
one training into continuing stages costs accuracy by itself, apart from what the phases change. `one_run`: one stage
(`train`), the recipe's epochs in all (30 on det320) at the target size, freeze 0, stage_defaults' mosaic (yolov5's
1.0 on the untuned sets), validated every epoch, from the model: the fair control's training, through the same
pipeline and its start-up. `split_only`: the recipe's stages with their epochs and LR line, every one at the target
size, freeze 0, no stall handover, no stage's own mosaic, validated every epoch: one_run cut at the recipe's
boundaries. What still differs is what the cut brings: three stage boundaries, the warmup capped at the first stage's
2 epochs (one_run's is yolov5's 3), the stages' straight LR line against yolov5's own schedule (one epoch behind),
each stage's own random stream, and the trained weights handed over as the fp16 copy yolov5 writes into a checkpoint.
Run with `--sides split_only,one_run` (`staged` always runs: the ratios divide by it), targets the data set's and
`staged_best`. Reading, fixed in advance: per seed, split_only's best mAP50 minus one_run's; below -0.03 at every
seed, the cut itself loses accuracy (a defect to find in the continuation); otherwise the recipe's deficit is its
phases', which the other sides apportion. split_only's wall minus one_run's is what the boundaries cost here.

The smaller phase's savings spent on epochs: `equal_time` (added 2026-12-06, this paragraph and its reading written
after recipe_ablation_det320_cut.md and before any figure of this side). There the recipe trained the same 30 epochs
as one_run in less time (249 s against 317 s, medians) and ended lower (0.402 against 0.532): its 256-px phases
bought the early targets and lost the end. Progressive-resizing recipes in the literature spend what a smaller size
saves on more epochs in the same time. `equal_time` is the recipe (`staged`) with its fine-tune, the phase at the
smaller size, lengthened until the recipe's wall matches one_run's: the 68 s between the medians, at the fine-tune's
6.2 s per 256-px epoch (its job's 115-119 s over 18 epochs, validated every third), buy 11 epochs, so 29 fine-tune
epochs (41 in all; EQUAL_TIME_FINETUNE), every stage's hyp.lrf recomputed so that the stages still fall along one
line from lr0 to lr0/100 (naive_vs_staged.linear_lrf); nothing else changes. Only det320 has the figures this rests
on. Run with `--sides one_run,equal_time`; a further target, `one_run_best` (one_run's best mAP50 in that repeat),
is added wherever one_run runs. Reading, fixed in advance: per seed, equal_time's best mAP50 minus one_run's and its
wall minus one_run's. At least 0 at two seeds of three, with equal_time's median wall at most 1.05x one_run's: the
smaller phase pays for itself on this CPU when its savings buy epochs. Otherwise it does not pay here either way,
and the recipe's phases cannot make it beat one run at this budget on this machine.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import WORK, machine_info, save  # noqa: E402
from naive_vs_staged import (  # noqa: E402
    DEMO_EVAL_IMG,
    FIXED_TARGETS,
    UNTUNED,
    add_seeds_argument,
    base_config,
    best_map,
    demo_inputs,
    first_reaching,
    run_staged,
    seed_of,
    seeded,
    spread,
    untuned_config,
)

from stagedyolo.recipe_shape import linear_lrf  # noqa: E402

SIDES = ("staged", "no_continuity", "no_resolution", "no_freezing", "no_close_mosaic")  # what a bare run runs
CUT_SIDES = ("split_only", "one_run")  # the cut itself, against the same training in one stage: --sides
SPEND_SIDES = ("equal_time",)  # the smaller phase's savings spent on epochs: --sides
# equal_time's fine-tune epochs, from the figures the design names (only det320 has them).
EQUAL_TIME_FINETUNE = {"det320": 29}
BEST = "staged_best"
ONE_RUN_BEST = "one_run_best"  # a target wherever one_run ran
KNOWN = (*SIDES, *CUT_SIDES, *SPEND_SIDES)
# Per data set: the target size every side is judged at, and the fixed targets (the design's).
JUDGED = {
    "demo": (DEMO_EVAL_IMG, FIXED_TARGETS),
    "mixed": (UNTUNED["mixed"].img, (0.05, 0.1, 0.159)),
    "det": (UNTUNED["det"].img, (0.1, 0.2, 0.316)),
    "det320": (320, (0.2, 0.4, 0.583)),
}
# The UNTUNED set a data set trains on where its name is not one (det320: det's set at another target size).
SOURCE = {"det320": "det"}
# Train / val images where the ablation uses other than UNTUNED's: det as naive_vs_staged_det.md ran it.
SIZES = {"det": (160, 40), "det320": (160, 40)}


def recipe(dataset: str) -> dict:
    """The staged recipe as naive_vs_staged runs it on ``dataset``, its inputs built once and not timed."""
    inputs = demo_inputs()
    if dataset == "demo":
        return base_config(inputs["demo"], inputs["weights"], "demo")
    source = SOURCE.get(dataset, dataset)
    spec = UNTUNED[source]
    train, val = SIZES.get(dataset, (spec.train, spec.val))
    data = WORK / "recipe_ablation_inputs" / f"{source}_data_{train}_{val}" / "data.yaml"
    if not data.exists():
        spec.make(str(data.parent), train, val)
    img = JUDGED[dataset][0]
    # the shape every side here was designed and measured on: the phases share the fair control's epochs
    return untuned_config(dataset, data.resolve(), inputs["weights"], img, spec.frozen, spec.finetune, False)


def ablated(config: dict, side: str, dataset: str | None = None) -> dict:
    """The shipped recipe with one part taken out, (CUT_SIDES) with every phase taken out, or (equal_time) with its
    fine-tune lengthened to one_run's wall on ``dataset``."""
    out = copy.deepcopy(config)
    out["run"] = f"{config['run']}_{side}"
    if side in CUT_SIDES:
        return _uncut(out) if side == "one_run" else _cut_only(out)
    if side == "equal_time":
        return _lengthened(out, EQUAL_TIME_FINETUNE[dataset])
    stages = out["stages"]
    first = next(iter(stages))
    for name, stage in stages.items():
        if side == "no_continuity" and name != first:
            stage["start_from"] = "previous_weights"
        if side == "no_resolution":
            stage["img"] = config["stage_defaults"]["img"]
        if side == "no_freezing" and stage.get("freeze"):
            stage["freeze"] = 0
        if side == "no_close_mosaic" and "mosaic" in stage.get("hyp", {}):
            stage["hyp"] = {k: v for k, v in stage["hyp"].items() if k != "mosaic"}
    return out


def _cut_only(config: dict) -> dict:
    """The recipe's stages, epochs and LR line with no phase left: each at the target size, trainable, without a
    stall handover or its own mosaic, validated every epoch."""
    for stage in config["stages"].values():
        for key in ("img", "freeze", "handover_on_stall"):
            stage.pop(key, None)
        stage["hyp"] = {k: v for k, v in stage.get("hyp", {}).items() if k != "mosaic"}
        stage["val_period"] = 1
    return config


def _lengthened(config: dict, finetune_epochs: int) -> dict:
    """The recipe with ``finetune_epochs`` in its fine-tune, every stage's lrf re-fitted to the one LR line."""
    stages = config["stages"]
    stages["finetune"]["epochs"] = finetune_epochs
    lrfs = linear_lrf([stage["epochs"] for stage in stages.values()])
    for stage, lrf in zip(stages.values(), lrfs):
        stage["hyp"] = {**stage.get("hyp", {}), "lrf": lrf}
    return config


def _uncut(config: dict) -> dict:
    """The same training in one stage: the recipe's epochs in all, at stage_defaults (the fair control's settings)."""
    epochs = sum(stage["epochs"] for stage in config["stages"].values())
    config["stages"] = {"train": {"epochs": epochs, "start_from": "model", "val_period": 1}}
    config["stage_order"] = ["train"]
    return config


def analyse_repeat(runs: dict, img: int, fixed: tuple) -> dict:
    targets = {**{str(t): t for t in fixed}, BEST: best_map(runs["staged"]["rows"], img)}
    if "one_run" in runs:
        targets[ONE_RUN_BEST] = best_map(runs["one_run"]["rows"], img)
    out = {"targets": targets, "best_map50": {}, "wall_s": {}, "time_s": {}, "ratio_vs_staged": {}}
    for side, run in runs.items():
        out["best_map50"][side] = best_map(run["rows"], img)
        out["wall_s"][side] = run["wall_s"]
        out["time_s"][side] = {
            name: first_reaching(run["rows"], t, img) if t is not None else None for name, t in targets.items()
        }
    for side in runs:
        if side != "staged":
            out["ratio_vs_staged"][side] = {name: _ratio(out, side, name) for name in targets}
    return out


def _ratio(repeat: dict, side: str, target: str) -> dict:
    staged, other = repeat["time_s"]["staged"][target], repeat["time_s"][side][target]
    if staged is None:
        return {"ratio": None, "kind": "staged never reached it"}
    if other is None:
        return {"ratio": repeat["wall_s"][side] / staged, "kind": "lower bound: the side never reached it"}
    return {"ratio": other / staged, "kind": "measured"}


def summarise(repeats: list[dict]) -> dict:
    summary = {"best_map50": {}, "wall_s": {}, "ratio_vs_staged": {}}
    for side in _sides(repeats[0]):
        summary["best_map50"][side] = spread([r["best_map50"][side] for r in repeats])
        summary["wall_s"][side] = spread([r["wall_s"][side] for r in repeats])
    for side in repeats[0]["ratio_vs_staged"]:
        summary["ratio_vs_staged"][side] = {
            name: _ratio_cells([r["ratio_vs_staged"][side][name] for r in repeats]) for name in repeats[0]["targets"]
        }
    return summary


def _sides(repeat: dict) -> list[str]:
    """The sides a repeat ran, in the design's order (staged first)."""
    return [side for side in KNOWN if side in repeat["best_map50"]]


def _ratio_cells(cells: list[dict]) -> dict:
    return {
        "ratio": spread([c["ratio"] for c in cells if c["kind"] == "measured"]),
        "kinds": [c["kind"] for c in cells],
        "all_ratios": [_rounded(c["ratio"]) for c in cells],
    }


def _rounded(value):
    return None if value is None else round(value, 3)


def markdown(result: dict) -> list[str]:
    s, img = result["summary"], JUDGED[result["dataset"]][0]
    names = list(result["per_repeat"][0]["targets"])
    lines = [
        "# recipe_ablation",
        "",
        f"{result['dataset']} at {img} px, {result['repeats']} repeats; medians (min-max). Ratio = side / staged time "
        "to the target (above 1: the part taken out saves time).",
        "",
        "| side | best mAP50 | whole wall s | " + " | ".join(f"ratio to {n}" for n in names) + " |",
        "|---|---|---|" + "---|" * len(names),
    ]
    for side in s["best_map50"]:
        ratios = s["ratio_vs_staged"].get(side)
        cells = [_cell(ratios[n]["ratio"]) + _bounds(ratios[n]) for n in ratios] if ratios else ["1"] * len(names)
        lines.append(f"| {side} | {_cell(s['best_map50'][side])} | {_cell(s['wall_s'][side])} | {' | '.join(cells)} |")
    return lines + ["", *_repeat_rows(result["per_repeat"], names)]


def _repeat_rows(repeats: list[dict], names: list[str]) -> list[str]:
    """Every side of every repeat: its seed, best mAP50, wall and seconds to each target (— = never reached)."""
    lines = [
        "| repeat | seed | side | best mAP50 | wall s | " + " | ".join(f"s to {n}" for n in names) + " |",
        "|---:|---:|---|---:|---:|" + "---:|" * len(names),
    ]
    for index, repeat in enumerate(repeats):
        for side in _sides(repeat):
            times = [repeat["time_s"][side][n] for n in names]
            cells = " | ".join("—" if t is None else f"{t:.0f}" for t in times)
            best = repeat["best_map50"][side]
            lines.append(
                f"| {index + 1} | {repeat.get('seed', 0)} | {side} | {'—' if best is None else f'{best:.3f}'} | "
                f"{repeat['wall_s'][side]:.0f} | {cells} |"
            )
    return lines


def _cell(stat: dict | None) -> str:
    if not stat:
        return "n/a"
    return f"{stat['median']:.3g} ({stat['min']:.3g}-{stat['max']:.3g})"


def _bounds(cell: dict) -> str:
    other = [k for k in cell["kinds"] if k != "measured"]
    return f" [{len(other)} of {len(cell['kinds'])}: {other[0]}]" if other else ""


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dataset", choices=sorted(JUDGED), default="demo")
    ap.add_argument("--name", default=None, help="results file (default recipe_ablation, or recipe_ablation_<dataset>)")
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument(
        "--sides",
        type=lambda text: tuple(dict.fromkeys(("staged", *text.split(",")))),
        default=SIDES,
        help=f"comma-separated sides to run beside staged, of {', '.join(KNOWN[1:])} (default: the ablation's four)",
    )
    add_seeds_argument(ap)
    ap.add_argument("--smoke", action="store_true", help="1 repeat, every stage one epoch: checks the script runs")
    a = ap.parse_args(argv)
    if a.repeats < 3 and not a.smoke:
        raise SystemExit("--repeats: the design needs at least 3")
    unknown = set(a.sides) - set(KNOWN)
    if unknown:
        raise SystemExit(f"--sides: unknown {sorted(unknown)}; known: {', '.join(KNOWN[1:])}")
    if "equal_time" in a.sides and a.dataset not in EQUAL_TIME_FINETUNE:
        raise SystemExit(f"--sides equal_time: measured for {', '.join(EQUAL_TIME_FINETUNE)} only, not {a.dataset}")
    suffix = "" if a.dataset == "demo" else f"_{a.dataset}"
    a.name = a.name or f"recipe_ablation{suffix}"
    a.workdir = a.workdir or WORK / f"recipe_ablation{suffix}"
    img, fixed = JUDGED[a.dataset]
    started = time.time()
    config = recipe(a.dataset)
    if a.smoke:
        a.repeats, a.name = 1, f"{a.name}_smoke"
        config["stages"] = {k: {**v, "epochs": 1} for k, v in config["stages"].items()}
    repeats, runs = [], []
    for index in range(a.repeats):
        order = a.sides[index % len(a.sides) :] + a.sides[: index % len(a.sides)]
        seed = seed_of(a.seeds, index)
        done = {
            side: run_staged(seeded(ablated(config, side, a.dataset), seed), a.workdir / f"r{index}" / side, side)
            for side in order
        }
        for side in order:
            print(
                json.dumps({"repeat": index, "seed": seed, "side": side, "wall_s": round(done[side]["wall_s"], 1)}),
                flush=True,
            )
        runs.append(done)
        repeats.append({**analyse_repeat(done, img, fixed), "seed": seed})
        result = {
            "design": __doc__.split("\n\n", 1)[1],
            "dataset": a.dataset,
            "repeats": len(repeats),
            "machine": machine_info(),
            "benchmark_wall_s": time.time() - started,
            "configs": {side: ablated(config, side, a.dataset)["stages"] for side in a.sides},
            "per_repeat": repeats,
            "summary": summarise(repeats),
            "runs": runs,
        }
        save(a.name, result, markdown(result))


if __name__ == "__main__":
    main()

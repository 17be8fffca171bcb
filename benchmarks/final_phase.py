"""How the recipe's last phase should switch to the target size: one fine-tune handover, the final phase's ways side
by side.

Design (fixed before any of its figures were taken; see benchmarks/README.md, "final_phase"):

Why. On det at a 480-px target with every phase before the last at 256 px (naive_vs_staged_det480_equal.md), the
switch to the target size with mosaic off dropped mAP50 by 0.11-0.18 for one to three of the final phase's 5-6
validations (0.675 -> 0.497, 0.580 -> 0.468, 0.779 -> 0.626), and at one seed of three the final phase ended below the
fine-tune's best. Two things change at that boundary: the size (256 -> 480 px) and the augmentation (mosaic 1.0 ->
0). This asks which of them costs the drop, and whether a gentler switch keeps it.

Data and recipe: naive_vs_staged's det set (benchmarks/make_det640.py, 160 train / 40 val images, the same folder),
judged at 480 px, yolov5's default hyp (SGD, lr0 0.01), from the demo's pretrained.pt, through the real pipeline
(`snakemake --cores 2`). The recipe is naive_vs_staged.untuned_config's at `--small-share 0.5` (smoke 2, frozen 4
with its stall handover, fine-tune at 256 px validated every third epoch) with the fine-tune at `--finetune` epochs
(default 52: what det480_equal's budget trained, 52-56) and a final phase of `--final` epochs (default 6) at 480,
every stage on one LR line from lr0 to lr0/100 (naive_vs_staged.linear_lrf). Each seed's pipeline runs once with
today's final phase, then each other side reruns only the final phase from the same fine-tune handover (Snakemake
reruns what changed: the script stops if any earlier stage would rerun).

Sides (the final phase only; same epochs in all, validated every epoch at 480 px, the same LR line):
- `mosaic_off`: today's: `--final` epochs at 480 with mosaic off.
- `mosaic_on`: the same epochs with mosaic on (yolov5's 1.0): the size switch alone.
- `close_last2`: mosaic on for all but the last 2 epochs, then 2 with it off (a second stage, `polish`): Ultralytics'
  close_mosaic and YOLOX's last epochs without mosaic, inside the final phase.
- `step_352`: half the epochs at 352 px (between 256 and 480), then the rest at 480, mosaic off in both: a smaller size
  jump. Its 352-px stage does not use the run's image store (`cache: none`; the store holds the sizes the pipeline
  was first run with), so it decodes its JPEGs every epoch: its wall is not comparable, its accuracy is.
- `mosaic_off_again`: today's final phase run again, last: on this CPU a training is deterministic per seed, so it
  should repeat mosaic_off's figures; if it does not, their difference is the comparison's noise floor.

Seeds: `--seeds` (default 0, 1, 2), one pipeline per seed, every side at that seed.

Figures per side and seed: the final phase's mAP50 at 480 px after each epoch, its first validation (the drop: it
minus the fine-tune's last validated figure), its best and its last, and its wall (the final stages' timing.json
wall_s). Per side, the differences to mosaic_off at each seed.

Reading, fixed in advance: a side pays if its best minus mosaic_off's is at least +0.03 at two seeds of three, with a
median difference above 0 and a median final-phase wall at most 1.05x mosaic_off's (step_352 excepted, see above),
and beyond the A/A difference where that is larger. The side that pays with the highest median difference becomes
the untuned recipe's final phase (naive_vs_staged.untuned_config) and docs/recipe.md's advice; none paying, the final
phase stays as it is and the drop is what the switch to the target size costs here. No goal: the recipe's goals are
naive_vs_staged's. The demo's shipped config keeps mosaic off in every stage, so nothing here changes it.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import re
import statistics
import sys
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import WORK, CsvPoller, machine_info, run_snakemake, save  # noqa: E402
from naive_vs_staged import (  # noqa: E402
    PIPELINE_CORES,
    UNTUNED,
    add_seeds_argument,
    boxes_need_for,
    demo_inputs,
    run_staged,
    seeded,
    untuned_config,
)

from stagedyolo.recipe_shape import linear_lrf  # noqa: E402

SIDES = ("mosaic_off", "mosaic_on", "close_last2", "step_352", "mosaic_off_again")
PAYS_BY = 0.03  # best mAP50 above mosaic_off's, at two seeds of three
WALL_CAP = 1.05  # median final-phase wall over mosaic_off's


def final_stages(side: str, epochs: int, small: int, img: int) -> list[tuple[str, dict]]:
    """The final phase of ``side``: (stage, settings) pairs, each stage at ``img`` unless it names its own size."""
    off = {"mosaic": 0.0}
    if side in ("mosaic_off", "mosaic_off_again"):
        return [("highres", {"epochs": epochs, "hyp": off})]
    if side == "mosaic_on":
        return [("highres", {"epochs": epochs, "hyp": {}})]
    if side == "close_last2":
        return [("highres", {"epochs": epochs - 2, "hyp": {}}), ("polish", {"epochs": 2, "hyp": off})]
    if side == "step_352":
        mid = round(math.sqrt(small * img) / 32) * 32
        first = epochs // 2
        return [
            ("highres", {"epochs": first, "img": mid, "cache": "none", "hyp": off}),
            ("polish", {"epochs": epochs - first, "hyp": off}),
        ]
    raise ValueError(side)


def side_config(base: dict, side: str, finetune: int, final: int, img: int) -> dict:
    """``base`` (untuned_config) with the fine-tune at ``finetune`` epochs and ``side``'s final phase, every stage's
    hyp.lrf on one line over all the epochs (the stages before the final phase get the same lrf in every side)."""
    config = copy.deepcopy(base)
    stages = config["stages"]
    small = stages["finetune"]["img"]
    stages["finetune"]["epochs"] = finetune
    del stages["highres"]
    for name, settings in final_stages(side, final, small, img):
        stages[name] = {**settings, "val_period": 1}
    order = list(stages)
    lrfs = linear_lrf([stages[name]["epochs"] for name in order])
    for name, lrf in zip(order, lrfs):
        stages[name]["hyp"] = {**stages[name].get("hyp", {}), "lrf": lrf}
    config["stage_order"] = order
    return config


def final_names(config: dict) -> list[str]:
    return config["stage_order"][3:]


def planned_stages(dry_run: str) -> set[str]:
    """The stages a Snakemake dry run would train."""
    return set(re.findall(r"rule train_stage:.*?wildcards: stage=(\w+)", dry_run, re.S))


def rerun_final(config: dict, workdir: Path, side: str) -> dict:
    """Rerun ``config`` in the finished pipeline folder: only its final stages may train (run_snakemake raises on a
    failed run, with its log)."""
    (workdir / "config" / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    finals = final_names(config)
    log = workdir / f"snakemake_{side}.log"
    run_snakemake(workdir, "-n", cores=PIPELINE_CORES, log=log)
    trained = planned_stages(log.read_text())
    if not trained <= set(finals):
        raise SystemExit(f"{side}: the dry run would train {sorted(trained)}, not only {finals}: see {log}")
    poller = CsvPoller(workdir, [f"results/*/work/{name}/results.csv" for name in finals]).start()
    try:
        run = run_snakemake(workdir, cores=PIPELINE_CORES, log=log)
    finally:
        poller.stop()
    return {"side": side, "wall_s": run["wall_s"], "events": poller.events}


def phase_figures(config: dict, workdir: Path, events: list[dict]) -> dict:
    """The final phase's validated mAP50 per epoch (in stage order), its wall, from the published stages."""
    stage_dir = workdir / "results" / config["run"] / "stages"
    rows, wall = [], 0.0
    for name in final_names(config):
        ours = sorted((e for e in events if Path(e["path"]).parent.name == name), key=lambda e: e["row"])
        rows += [{"stage": name, "epoch": e["epoch"], "map50": round(e["map50"], 4)} for e in ours]
        wall += json.loads((stage_dir / name / "timing.json").read_text())["wall_s"]
    maps = [row["map50"] for row in rows]
    return {"rows": rows, "first": maps[0], "best": max(maps), "last": maps[-1], "wall_s": round(wall, 1)}


def run_seed(base: dict, seed: int, args, workdir: Path) -> dict:
    """One pipeline with today's final phase, then every other side's final phase from its fine-tune handover."""
    configs = {side: seeded(side_config(base, side, args.finetune, args.final, args.img), seed) for side in SIDES}
    first = run_staged(configs["mosaic_off"], workdir, side="mosaic_off")
    finetune = [r for r in first["rows"] if r["stage"] == "finetune" and r["map50"] is not None]
    events = [
        {"path": f"work/{r['stage']}/results.csv", "row": i, "epoch": r["epoch"], "map50": r["map50"]}
        for i, r in enumerate(first["rows"])
    ]
    sides = {"mosaic_off": phase_figures(configs["mosaic_off"], workdir, events)}
    for side in SIDES[1:]:
        print(f"seed {seed}: {side}", flush=True)
        rerun = rerun_final(configs[side], workdir, side)
        sides[side] = phase_figures(configs[side], workdir, rerun["events"])
    return {
        "seed": seed,
        "pipeline_wall_s": first["wall_s"],
        "finetune_last": finetune[-1]["map50"],
        "finetune_best": max(r["map50"] for r in finetune),
        "sides": sides,
    }


def judge(seeds: list[dict]) -> dict:
    """Per side: the differences to mosaic_off per seed and the reading fixed in the design."""
    aa = max(abs(s["sides"]["mosaic_off_again"]["best"] - s["sides"]["mosaic_off"]["best"]) for s in seeds)
    floor = max(PAYS_BY, aa)
    out = {"aa_best_difference": round(aa, 4), "pays_by": floor}
    for side in SIDES[1:]:
        diffs = [round(s["sides"][side]["best"] - s["sides"]["mosaic_off"]["best"], 4) for s in seeds]
        walls = [s["sides"][side]["wall_s"] / s["sides"]["mosaic_off"]["wall_s"] for s in seeds]
        drops = [round(s["sides"][side]["first"] - s["finetune_last"], 4) for s in seeds]
        wall_ok = side == "step_352" or statistics.median(walls) <= WALL_CAP
        pays = sum(d >= floor for d in diffs) >= 2 and statistics.median(diffs) > 0 and wall_ok
        out[side] = {
            "best_minus_mosaic_off": diffs,
            "median_difference": statistics.median(diffs),
            "wall_over_mosaic_off": [round(w, 3) for w in walls],
            "first_minus_finetune_last": drops,
            "pays": side != "mosaic_off_again" and pays,
        }
    out["mosaic_off_first_minus_finetune_last"] = [
        round(s["sides"]["mosaic_off"]["first"] - s["finetune_last"], 4) for s in seeds
    ]
    paying = [side for side in SIDES[1:-1] if out[side]["pays"]]
    out["winner"] = max(paying, key=lambda side: out[side]["median_difference"]) if paying else None
    return out


def markdown(result: dict) -> list[str]:
    j, seeds = result["judged"], result["seeds"]
    lines = [
        "# The final phase: how to switch to the target size",
        "",
        f"Machine: {result['machine'].get('cpu_model')}, {result['machine'].get('cores')} cores, no GPU. det at "
        f"{result['args']['img']} px, fine-tune {result['args']['finetune']} epochs at 256 px, final phase "
        f"{result['args']['final']} epochs; seeds {[s['seed'] for s in seeds]}; benchmark wall "
        f"{result['benchmark_wall_s'] / 60:.0f} min. Each side's final phase starts from the same fine-tune handover.",
        "",
        "| seed | fine-tune last / best | side | mAP50 per final-phase epoch | first | best | last | wall s |",
        "|---:|---|---|---|---:|---:|---:|---:|",
    ]
    for s in seeds:
        for side, f in s["sides"].items():
            per_epoch = ", ".join(f"{r['map50']:.3f}" + ("*" if r["stage"] == "polish" else "") for r in f["rows"])
            lines.append(
                f"| {s['seed']} | {s['finetune_last']:.3f} / {s['finetune_best']:.3f} | {side} | {per_epoch} | "
                f"{f['first']:.3f} | {f['best']:.3f} | {f['last']:.3f} | {f['wall_s']} |"
            )
    lines += [
        "",
        "`*`: an epoch of the second stage (`polish`).",
        "",
        "| side | best − mosaic_off's, per seed | median | wall / mosaic_off's | first − fine-tune's last | pays? |",
        "|---|---|---:|---|---|---|",
    ]
    for side in SIDES[1:]:
        r = j[side]
        lines.append(
            f"| {side} | {r['best_minus_mosaic_off']} | {r['median_difference']:+.3f} | {r['wall_over_mosaic_off']} "
            f"| {r['first_minus_finetune_last']} | {'yes' if r['pays'] else 'no'} |"
        )
    lines += [
        "",
        f"mosaic_off's first validation − the fine-tune's last: {j['mosaic_off_first_minus_finetune_last']}. A/A "
        f"(mosaic_off_again − mosaic_off, best): {j['aa_best_difference']}; a side pays by {j['pays_by']}. "
        f"Winner: {j['winner'] or 'none'}.",
    ]
    return lines


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_seeds_argument(ap)
    ap.add_argument("--img", type=int, default=480)
    ap.add_argument("--small-share", type=float, default=0.5)
    ap.add_argument("--finetune", type=int, default=52)
    ap.add_argument("--final", type=int, default=6)
    ap.add_argument("--det-train", type=int, default=160)
    ap.add_argument("--det-val", type=int, default=40)
    ap.add_argument("--name", default="final_phase")
    ap.add_argument("--workdir", type=Path, default=WORK / "final_phase")
    ap.add_argument("--smoke", action="store_true", help="one seed, fine-tune 2 epochs, final 4: checks the script")
    args = ap.parse_args(argv)
    if args.smoke:
        args.seeds, args.finetune, args.final, args.name = args.seeds[:1], 2, 4, args.name + "_smoke"
    started = time.time()
    inputs = demo_inputs()
    data = WORK / "naive_vs_staged" / f"det_data_{args.det_train}_{args.det_val}" / "data.yaml"
    if not data.exists():
        UNTUNED["det"].make(str(data.parent), args.det_train, args.det_val)
    base = untuned_config(
        "det", data.resolve(), inputs["weights"], args.img, 14, 14, boxes_need=boxes_need_for(data),
        small_share=args.small_share,
    )  # fmt: skip
    seeds = [run_seed(base, seed, args, args.workdir / f"seed{seed}") for seed in args.seeds]
    result = {
        "design": __doc__,
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "machine": machine_info(),
        "benchmark_wall_s": round(time.time() - started, 1),
        "seeds": seeds,
        "judged": judge(seeds),
    }
    save(args.name, result, markdown(result))


if __name__ == "__main__":
    main()

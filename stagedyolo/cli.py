"""``stagedyolo`` console entry point. Subcommands are argparse subparsers; add one by writing a
``_add_<name>(subparsers)`` function that sets ``func`` and listing it in SUBCOMMANDS."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def _load_timing(stage_dir: Path) -> dict:
    """timing.json, or (when the stage never got that far) a timing built from timing_raw.json + telemetry.csv."""
    tj = stage_dir / "timing.json"
    if tj.exists():
        return json.loads(tj.read_text())
    raw = stage_dir / "timing_raw.json"
    if raw.exists():
        from stagedyolo.telemetry import build_timing

        tel = stage_dir / "telemetry.csv"
        return build_timing(
            json.loads(raw.read_text()), tel if tel.exists() else None, wall_s=None, meta={"stage": stage_dir.name}
        )
    raise FileNotFoundError(f"{stage_dir}: neither timing.json nor timing_raw.json")


def cmd_diagnose(args) -> int:
    from stagedyolo.diagnosis import diagnose, diagnosis_markdown, verdict_line, write_diagnosis
    from stagedyolo.jsonio import read_json

    d = Path(args.stage_dir)
    try:
        timing = _load_timing(d)
    except (FileNotFoundError, ValueError) as exc:
        print(f"stagedyolo diagnose: {exc}", file=sys.stderr)
        return 2
    stage = args.stage or timing.get("stage") or d.name
    plan = read_json(d / "stage.json")  # which settings define the stage (never advised); None without one
    findings = diagnose(timing, stage=stage, plan=plan)
    if args.write:
        write_diagnosis(d, findings)
    if args.json:
        print(json.dumps(findings.to_dict(), indent=2))
    elif args.quiet:
        print(verdict_line(stage, findings))
    else:
        print(diagnosis_markdown(findings))
    return 0


def _add_diagnose(sub) -> None:
    p = sub.add_parser(
        "diagnose",
        help="name a stage's bottleneck and the config change to make",
        description="Read <stage dir>/timing.json (or timing_raw.json + telemetry.csv) and print the "
        "diagnosis: the bottleneck class, its evidence and the exact config change.",
    )
    p.add_argument("stage_dir", help="a stage's output directory")
    p.add_argument("--stage", help="stage name used in config keys (default: from timing.json)")
    p.add_argument("--json", action="store_true", help="print diagnosis.json content instead of Markdown")
    p.add_argument("-q", "--quiet", action="store_true", help="print only the one-line verdict")
    p.add_argument("--write", action="store_true", help="also (re)write diagnosis.md and diagnosis.json there")
    p.set_defaults(func=cmd_diagnose)


def cmd_report(args) -> int:
    from stagedyolo.report import build_report

    dirs = {}
    for item in args.stages:
        name, sep, path = item.partition("=")
        if not sep:
            name, path = Path(item).name, item
        dirs[name] = Path(path)
    for k, p in build_report(dirs, args.out).items():
        print(f"{k}\t{p}")
    return 0


def _add_report(sub) -> None:
    p = sub.add_parser("report", help="cross-stage report (table, plots, diagnoses, TensorBoard scalars)")
    p.add_argument("out", help="output directory")
    p.add_argument("stages", nargs="+", help="stage dirs, in order, as NAME=DIR or DIR (name = folder name)")
    p.set_defaults(func=cmd_report)


DEFAULT_CONFIG = Path("config/config.yaml")  # what the Snakefile reads unless told otherwise


def cmd_status(args) -> int:
    from stagedyolo.status import latest_run, run_status

    try:
        results_dir = configured_results_dir(args.config)
    except (OSError, ValueError) as error:
        print(f"stagedyolo status: cannot read the config {args.config}: {error}", file=sys.stderr)
        return 2
    run = run_folder(args.run, results_dir) if args.run else latest_run(results_dir)
    if run is None or not run.is_dir():
        print(
            f"stagedyolo status: no run folder at {args.run or f'{results_dir}/<run>'} (give {results_dir}/<run>, "
            "a run name, or --config with the run's results_dir)",
            file=sys.stderr,
        )
        return 2
    print(run_status(run))
    return 0


def configured_results_dir(config: str | None) -> Path:
    """results_dir of the given config file; without one, of config/config.yaml when there is one, else results."""
    import yaml

    path = Path(config) if config else DEFAULT_CONFIG
    if config is None and not path.is_file():
        return Path("results")
    try:
        values = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as error:
        raise ValueError(f"not valid YAML ({error})") from error
    if not isinstance(values, dict):
        raise ValueError("not a YAML mapping of settings")
    return Path(values.get("results_dir") or "results")


def run_folder(run: str, results_dir: Path) -> Path:
    """A run folder as given, or a run name under results_dir."""
    return Path(run) if Path(run).is_dir() or len(Path(run).parts) > 1 else results_dir / run


def _add_status(sub) -> None:
    p = sub.add_parser(
        "status",
        help="which stage of a run is training, its epoch, images/s and ETA",
        description="Read a run's folders (work/<stage>/progress.json, stages/<stage>/timing.json) "
        "and print every stage: done, running (epoch, images/s, ETAs), failed or waiting.",
    )
    p.add_argument(
        "run",
        nargs="?",
        help="the run folder, <results_dir>/<run>, or a run name (default: the newest run under results_dir)",
    )
    p.add_argument(
        "--config",
        help="the config file whose results_dir holds the runs (default: config/config.yaml "
        "when it exists, else results_dir is results)",
    )
    p.set_defaults(func=cmd_status)


MIN_RECIPE_EPOCHS = 5  # smoke's 2, a frozen and a final epoch, and one to fine-tune


def cmd_recipe(args) -> int:
    import yaml

    from stagedyolo.dataset.validate import DatasetError, validate_dataset
    from stagedyolo.engine.options import base_hyp
    from stagedyolo.recipe import boxes_need_in
    from stagedyolo.recipe_shape import recipe_comment, recipe_override

    base = Path(args.base) if args.base else shipped_config()
    refusal = _recipe_refusal(args, base)
    if refusal:
        print(f"stagedyolo recipe: {refusal}", file=sys.stderr)
        return 2
    shipped = yaml.safe_load(base.read_text())
    try:
        report = validate_dataset(args.data)  # read-only: what prepare_dataset will find, for the boxes' size
    except DatasetError as error:
        print(f"stagedyolo recipe: {error}", file=sys.stderr)
        return 2
    boxes_need = boxes_need_in(report)
    override = recipe_override(
        Path(args.data),
        args.img,
        args.epochs,
        weights=args.weights,
        shipped=shipped,
        yolov5_hyp=base_hyp(),
        boxes_need=boxes_need,
        small_share=args.small_share,
        minutes=args.minutes,
        run=args.run,
    )
    text = recipe_comment(override, args.epochs, boxes_need, shipped) + yaml.safe_dump(override, sort_keys=False)
    if args.output:
        Path(args.output).write_text(text)
        print(f"stagedyolo recipe: wrote {args.output}", file=sys.stderr)
    else:
        print(text, end="")
    return 0


def _recipe_refusal(args, base: Path) -> str | None:
    """Why `stagedyolo recipe` cannot write what was asked, or None."""
    if args.epochs < MIN_RECIPE_EPOCHS or args.img < 64:
        return (
            f"--epochs {args.epochs} --img {args.img}: the recipe replaces a run of at least {MIN_RECIPE_EPOCHS} "
            "epochs (smoke, frozen, fine-tune, final) at 64 px or more"
        )
    if args.output and Path(args.output).exists():
        return f"{args.output} exists; it is left as it is (give another --output)"
    if not base.is_file():
        return f"no {base}: give --base, the config.yaml your Snakefile reads (the override undoes its demo hyp)"
    return None


def shipped_config() -> Path:
    """config/config.yaml here (the Snakefile's), else the one beside the installed package."""
    return DEFAULT_CONFIG if DEFAULT_CONFIG.is_file() else Path(__file__).resolve().parents[1] / DEFAULT_CONFIG


def _add_recipe(sub) -> None:
    from stagedyolo.recipe_shape import SMALL_SHARE

    p = sub.add_parser(
        "recipe",
        help="write the staged recipe for your data as a --configfile override",
        description="Read your data.yaml (only read) and write the staged recipe that replaces one yolov5 run of "
        "--epochs epochs at --img px: smoke, a short frozen phase and the fine-tune at about half the size, the "
        "last fifth at the target with mosaic off, as many pixels as that run, one LR line, yolov5's default hyp "
        "(docs/recipe.md).",
    )
    p.add_argument("data", help="your YOLOv5 data.yaml")
    p.add_argument("--img", type=int, required=True, help="the target image size (the single run's --img)")
    p.add_argument("--epochs", type=int, required=True, help="the epochs the single run would train")
    p.add_argument("--weights", help="pretrained weights, a local .pt file (default: none, train from model.cfg)")
    p.add_argument(
        "--small-share",
        type=float,
        default=SMALL_SHARE,
        help=f"the early phases' size as a share of --img (default {SMALL_SHARE}; raised to what the boxes need)",
    )
    p.add_argument("--minutes", type=float, help="fit the stages to this many minutes (recipe_minutes)")
    p.add_argument("--run", help="the run's name (default: the data.yaml's folder name)")
    p.add_argument("-o", "--output", help="the file to write (default: standard output); an existing one is kept")
    p.add_argument("--base", help="the config the override applies to (default: config/config.yaml)")
    p.set_defaults(func=cmd_recipe)


SUBCOMMANDS = [_add_diagnose, _add_recipe, _add_report, _add_status]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="stagedyolo", description="Staged, measured YOLOv5 training.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for add in SUBCOMMANDS:
        add(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())

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


SUBCOMMANDS = [_add_diagnose, _add_report, _add_status]


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

"""Config checks the JSON schema cannot express: files that must exist, and settings that must agree.

They run when the Snakefile is parsed, so a bad config fails before any job starts. Each message names the
key, what is wrong, and how to fix it.
"""

from __future__ import annotations

from pathlib import Path

from stagedyolo.engine.plan import stage_hyp, stage_names, stage_spec, yolov5_dir


class ConfigError(ValueError):
    pass


def check_config(config: dict, workdir: str | Path = ".") -> None:
    workdir = Path(workdir)
    problems = [*_check_dataset(config, workdir), *_check_model(config, workdir)]
    for stage in stage_names(config):
        problems += _check_stage(config, stage)
    if problems:
        raise ConfigError("invalid config:\n" + "\n".join(f"  - {p}" for p in problems))


def _check_dataset(config: dict, workdir: Path) -> list[str]:
    dataset = config["dataset"]
    if dataset == "demo":
        return []
    path = workdir / dataset
    if not path.is_file():
        return [f"dataset: {dataset!r} does not exist (looked at {path.resolve()}). "
                "Set dataset to the path of your YOLOv5 data.yaml, or to demo."]  # fmt: skip
    return []


def _check_model(config: dict, workdir: Path) -> list[str]:
    model, problems = config["model"], []
    weights = model["weights"]
    if weights == "demo" and config["dataset"] != "demo":
        problems.append("model.weights: demo makes weights for the demo dataset only. "
                        "Set model.weights to your pretrained .pt (e.g. yolov5s.pt), or null to train from model.cfg.")  # fmt: skip
    elif weights not in (None, "demo"):
        if not str(weights).endswith(".pt"):
            problems.append(f"model.weights: {weights!r} is not a .pt checkpoint.")
        elif not (workdir / weights).is_file():
            problems.append(f"model.weights: {weights!r} does not exist. Nothing is downloaded: put the .pt file "
                            "there (e.g. an official yolov5s.pt), or set model.weights: null to train from model.cfg.")  # fmt: skip
    cfg = model["cfg"]
    if not ((workdir / cfg).is_file() or (yolov5_dir() / "models" / cfg).is_file()):
        problems.append(f"model.cfg: {cfg!r} is neither a file nor a model yaml shipped with yolov5 "
                        "(yolov5n.yaml, yolov5s.yaml, yolov5m.yaml, ...).")  # fmt: skip
    return problems


def _check_stage(config: dict, stage: str) -> list[str]:
    spec, problems = stage_spec(config, stage), []
    key = f"stages.{stage}"
    if isinstance(spec["batch"], int) and spec["batch"] % spec["gpus"]:
        lower = spec["batch"] - spec["batch"] % spec["gpus"]
        problems.append(f"{key}.batch: {spec['batch']} is the total batch over {spec['gpus']} GPUs and must be a "
                        f"multiple of {spec['gpus']}: use {lower or spec['gpus']} or {lower + spec['gpus']}.")  # fmt: skip
    try:
        stage_hyp(spec["lr0"], spec["hyp"])
    except ValueError as error:
        problems.append(f"{key}.hyp: {error}")
    return problems

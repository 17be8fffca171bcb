"""Config checks the JSON schema cannot express: files that must exist, and settings that must agree.

They run when the Snakefile is parsed, so a bad config fails before any job starts. Each message names the
key, what is wrong, and how to fix it.
"""

from __future__ import annotations

from pathlib import Path

from stagedyolo.engine.options import stage_hyp, yolov5_dir
from stagedyolo.recipe import previous_stage, stage_names, stage_spec


class ConfigError(ValueError):
    pass


# Keys that existed once: a config that still sets one gets told what happened instead of "unexpected key".
REMOVED_KEYS = {
    ("engine", "warm_start"): "the warm-start server was removed (it trusted any local process holding its socket "
    "name, and saved about 6 s per stage on a 2-core CPU, under 0.2 % of an hour-long stage); every engine "
    "process now starts afresh. Delete the key.",
    ("engine", "warm_idle_s"): "the warm-start server was removed; delete the key.",
}


def check_before_schema(config: dict) -> None:
    """Checks whose message must come before the schema's generic one: keys that were removed, and a run folder
    that would leave results_dir (`run: ..` would write into, and clean up under, results_dir's parent)."""
    problems = [f"{'.'.join(path)}: {why}" for path, why in REMOVED_KEYS.items() if _has_key(config, path)]
    problems += _check_run_location(config)
    _fail_on(problems)


def _fail_on(problems: list[str]) -> None:
    if problems:
        raise ConfigError("invalid config:\n" + "\n".join(f"  - {p}" for p in problems))


def _has_key(config: dict, path: tuple[str, ...]) -> bool:
    node = config
    for key in path:
        if not isinstance(node, dict) or key not in node:
            return False
        node = node[key]
    return True


def _check_run_location(config: dict) -> list[str]:
    problems = []
    run = str(config.get("run", ""))
    if run in ("", ".", "..") or Path(run).is_absolute() or len(Path(run).parts) != 1:
        problems.append(
            f"run: {run!r} must be a plain folder name (letters, digits, '_', '-', '.'), not a path: "
            "each run's outputs land in <results_dir>/<run>/. Use e.g. run: demo."
        )
    results_dir = str(config.get("results_dir", "results"))
    if not results_dir.strip():
        problems.append(
            f"results_dir: {results_dir!r} is empty: every output path would start at the filesystem "
            "root (/<run>/...). Use e.g. results_dir: results, or an absolute path."
        )
    elif ".." in Path(results_dir).parts:
        problems.append(
            f"results_dir: {results_dir!r} contains '..'. Use a folder below the working directory "
            "(e.g. results) or an absolute path."
        )
    return problems


def coerce_cli_strings(config: dict, schema: dict) -> dict:
    """Give values from `snakemake --config` the type the schema asks for.

    Snakemake parses a nested --config value (`stages={finetune: {epochs: 3}}`) with YAML's BaseLoader, so
    every leaf arrives as a string ("3"). A string the schema does not take as it is is read as YAML; a string
    where the schema allows strings, or one of its string constants, is left alone (a run named "001" stays "001",
    workers "auto" stays "auto", workers "0" becomes 0).
    """
    return _coerce(config, schema, schema)


def _coerce(value, node: dict, root: dict):
    node = _resolve(node, root)
    if isinstance(value, dict):
        properties = node.get("properties", {})
        extra = node.get("additionalProperties")
        return {
            k: _coerce(v, properties.get(k, extra if isinstance(extra, dict) else {}), root) for k, v in value.items()
        }
    if isinstance(value, list):
        return [_coerce(v, node.get("items", {}), root) for v in value]
    if isinstance(value, str) and node and not _string_fits(value, node, root):
        import yaml

        try:
            return yaml.safe_load(value)
        except yaml.YAMLError:
            return value
    return value


def _resolve(node: dict, root: dict) -> dict:
    """Follow $ref and merge allOf, enough for this project's schema."""
    if "$ref" in node:
        target = root
        for part in node["$ref"].lstrip("#/").split("/"):
            target = target[part]
        node = {**_resolve(target, root), **{k: v for k, v in node.items() if k != "$ref"}}
    for sub in node.get("allOf", []):
        resolved = _resolve(sub, root)
        node = {**resolved, **node, "properties": {**resolved.get("properties", {}), **node.get("properties", {})}}
    return node


def _string_fits(value: str, node: dict, root: dict) -> bool:
    """Whether the schema node takes ``value`` as the string it is: any string where the type allows strings, else
    only its own constants ("auto" for workers, whose other values are integers: "0" is then read as YAML)."""
    kinds = node.get("type")
    if kinds is not None:
        return "string" in (kinds if isinstance(kinds, list) else [kinds])
    if "enum" in node:
        return value in node["enum"]
    if "const" in node:
        return value == node["const"]
    if "oneOf" in node:
        return any(_string_fits(value, _resolve(sub, root), root) for sub in node["oneOf"])
    return True


def check_config(config: dict, workdir: str | Path = ".") -> None:
    workdir = Path(workdir)
    problems = [*_check_dataset(config, workdir), *_check_model(config, workdir), *_check_tracking(config)]
    problems += _check_stage_order(config)
    _fail_on(problems)  # a stage_order naming no defined stage leaves nothing to check stage by stage
    for stage in stage_names(config):
        problems += _check_stage(config, stage)
    _fail_on(problems)


def _check_stage_order(config: dict) -> list[str]:
    unknown = [stage for stage in config.get("stage_order") or () if stage not in config["stages"]]
    if not unknown:
        return []
    return [
        f"stage_order: {unknown} not defined under stages (defined: {list(config['stages'])}). Add "
        f"stages.{unknown[0]} with its settings, or take it out of stage_order."
    ]


def _check_dataset(config: dict, workdir: Path) -> list[str]:
    dataset = config["dataset"]
    path = workdir / dataset
    if dataset == "demo" or path.is_file():
        return []
    return [
        f"dataset: {dataset!r} does not exist (looked at {path.resolve()}). "
        "Set dataset to the path of your YOLOv5 data.yaml, or to demo."
    ]


def _check_model(config: dict, workdir: Path) -> list[str]:
    model, problems = config["model"], []
    weights = model["weights"]
    if weights == "demo" and config["dataset"] != "demo":
        problems.append(
            "model.weights: demo makes weights for the demo dataset only. "
            "Set model.weights to your pretrained .pt (e.g. yolov5s.pt), or null to train from model.cfg."
        )
    elif weights not in (None, "demo"):
        if not str(weights).endswith(".pt"):
            problems.append(f"model.weights: {weights!r} is not a .pt checkpoint.")
        elif not (workdir / weights).is_file():
            problems.append(
                f"model.weights: {weights!r} does not exist. Nothing is downloaded: put the .pt file "
                "there (e.g. an official yolov5s.pt), or set model.weights: null to train from model.cfg."
            )
    cfg = model["cfg"]
    if not ((workdir / cfg).is_file() or (yolov5_dir() / "models" / cfg).is_file()):
        problems.append(
            f"model.cfg: {cfg!r} is neither a file nor a model yaml shipped with yolov5 "
            "(yolov5n.yaml, yolov5s.yaml, yolov5m.yaml, ...)."
        )
    return problems


def _check_tracking(config: dict) -> list[str]:
    import importlib.util

    if (config.get("tracking") or {}).get("backend") == "mlflow" and importlib.util.find_spec("mlflow") is None:
        return [
            "tracking.backend: mlflow needs the mlflow package, which is not installed. Fix: pip install "
            "'stagedyolo[tracking]' (mlflow-skinny), or set tracking.backend to none or tensorboard."
        ]
    return []


def _check_stage(config: dict, stage: str) -> list[str]:
    spec, problems = stage_spec(config, stage), []
    key = f"stages.{stage}"
    nodes = spec.get("nodes") or 1
    ranks = spec["gpus"] * nodes
    if isinstance(spec["batch"], int) and spec["batch"] % ranks:
        lower = spec["batch"] - spec["batch"] % ranks
        over = f"{ranks} GPUs" + (f" ({nodes} nodes x {spec['gpus']})" if nodes > 1 else "")
        problems.append(
            f"{key}.batch: {spec['batch']} is the total batch over {over} and must be a "
            f"multiple of {ranks}: use {lower or ranks} or {lower + ranks}."
        )
    if nodes > 1 and str(spec["device"]) == "cpu":
        problems.append(f"{key}.nodes: {nodes} needs GPUs (device is cpu): set nodes: 1 or a GPU device.")
    try:
        stage_hyp(spec["lr0"], spec["hyp"])
    except ValueError as error:
        problems.append(f"{key}.hyp: {error}")
    # A tune trial runs the stage in one process: on a multi-GPU stage it would wait for ranks that never start,
    # each trial until the 30-minute DDP timeout.
    if spec.get("tune") and ranks > 1:
        problems.append(
            f"{key}.tune: true cannot be combined with {key}.gpus: {spec['gpus']} (nodes: {nodes}): "
            "each tune trial would hang until the 30-minute DDP timeout. Set tune: false for this stage, or gpus: 1 "
            "(tune a copy of the stage on one GPU, then train on several with the settings it kept)."
        )
    # handover_on_stall ends a stage at an epoch yolov5 only saves when nosave is off (the decision comes after the
    # epoch's validation, too late for yolov5 to treat it as final): the next stage would have nothing to continue.
    if spec.get("handover_on_stall") and spec.get("nosave"):
        problems.append(
            f"{key}: handover_on_stall needs every epoch saved, and nosave: true saves only the last. "
            "Set nosave: false or handover_on_stall: null."
        )
    return problems + _check_yolov5_options(config, stage, spec)


def _check_yolov5_options(config: dict, stage: str, spec: dict) -> list[str]:
    """The combinations yolov5 would refuse (or silently mishandle) only once the stage runs."""
    key, problems = f"stages.{stage}", []
    if spec.get("image_weights") and spec["gpus"] > 1:
        problems.append(
            f"{key}.image_weights: yolov5 refuses image_weights with more than one GPU (gpus: "
            f"{spec['gpus']}). Set image_weights: false or gpus: 1."
        )
    previous = previous_stage(config, stage)
    if previous and spec["start_from"] in ("previous", "previous_weights"):
        before = bool(stage_spec(config, previous).get("single_cls"))
        if bool(spec.get("single_cls")) != before:
            problems.append(
                f"{key}.single_cls: {bool(spec.get('single_cls'))} differs from stage {previous} "
                f"({before}), which it starts from: the detection head would be thrown away. Set "
                "single_cls in stage_defaults, or start_from: model."
            )
    return problems

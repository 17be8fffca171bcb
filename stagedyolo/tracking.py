"""Experiment tracking (config `tracking:`): MLflow (a local file store) or TensorBoard (one folder per stage).

Everything is logged from a stage's *published* files (stage.json, results.csv, timing.json, diagnosis), by a job of
its own that runs after the stage, never from inside yolov5's training loop: a tracker that fails or hangs cannot
kill or slow a stage, and what is logged is exactly what the stage published. A tracking job never fails either: it
logs the error and writes a record saying so, since a failed job would stop the stages still to come (no
keep-going). Layout in MLflow: one parent run per pipeline run (named after config `run`, found again by its results
folder) and one nested run per stage; `track_run` adds the test-split score and the export check to the parent and
closes it. TensorBoard: ``<tracking dir>/<run>/`` (the run's own marked folder; tracking.dir may be yolov5's `runs`,
or shared by several runs) with one folder per stage and ``run/``.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import time
import traceback
from pathlib import Path

from stagedyolo.jsonio import read_json, write_json
from stagedyolo.ownership import NotOwnedError, claim, owner_facts, require_owned
from stagedyolo.telemetry.summary import finite

# MLflow 3 raises on a file store unless told it is wanted; a local folder is the point here (no server, no DB).
MLFLOW_ENV = {"MLFLOW_ALLOW_FILE_STORE": "true", "MLFLOW_DISABLE_TELEMETRY": "true", "DO_NOT_TRACK": "true"}
RUN_DIR_TAG = "stagedyolo_run_dir"
STAGE_TAG = "stagedyolo_stage"
STAGE_FILES = (
    "stage.json",
    "timing.json",
    "timing.md",
    "diagnosis.json",
    "diagnosis.md",
    "results.csv",
    "telemetry.csv",
    "opt.yaml",
    "hyp.yaml",
)
PLAN_SKIPPED = ("attempts", "work_dir", "data", "weights")  # paths of this machine and history: artifacts, not params


def tracking_dir(settings: dict, run_dir: str | os.PathLike) -> Path:
    return Path(settings["dir"] or Path(run_dir) / "tracking" / settings["backend"]).absolute()


# ---------------------------------------------------------------------------------------------------------------------
# What is logged, read from the published files


def stage_params(stage_dir: Path) -> dict:
    """The stage's resolved settings (stage.json), flat: hyp keys become hyp.<key>."""
    plan = read_json(stage_dir / "stage.json") or {}
    params = {}
    for key, value in plan.items():
        if key in PLAN_SKIPPED:
            continue
        if isinstance(value, dict):
            params.update({f"{key}.{k}": v for k, v in value.items()})
        else:
            params[key] = value
    return params


def stage_epoch_metrics(stage_dir: Path) -> list[tuple[str, float, int]]:
    """(name, value, epoch): every results.csv column (losses, precision, recall, mAP, LRs) and the timing of each
    epoch (epoch/<field> from timing.json). Epochs that were not validated carry no metric rather than a zero."""
    import pandas as pd

    out = []
    results = stage_dir / "results.csv"
    if results.is_file():
        frame = pd.read_csv(results, skipinitialspace=True)
        frame.columns = [c.strip() for c in frame.columns]
        for _, row in frame.iterrows():
            out += [(column, row[column], int(row["epoch"])) for column in frame.columns if column != "epoch"]
    for epoch in (read_json(stage_dir / "timing.json") or {}).get("epochs") or []:
        out += [(f"epoch/{k}", v, int(epoch["epoch"])) for k, v in epoch.items() if k != "epoch"]
    return [(name, float(value), step) for name, value, step in out if finite(value) is not None]


def stage_summary_metrics(stage_dir: Path) -> dict:
    """The stage's timing report in one number each: wall time, seconds per phase, steady throughput, data wait."""
    timing = read_json(stage_dir / "timing.json") or {}
    summary = {"stage/wall_s": timing.get("wall_s"), "stage/epochs_completed": timing.get("epochs_completed")}
    summary.update({f"stage/phase_{k}_s": (v or {}).get("s") for k, v in (timing.get("phases") or {}).items()})
    summary.update({f"stage/{k}": v for k, v in (timing.get("throughput") or {}).items() if k.startswith("steady_")})
    summary["stage/data_wait_share"] = (timing.get("data_wait") or {}).get("share")
    return {k: float(v) for k, v in summary.items() if finite(v) is not None}


def run_summary_metrics(test: dict | None, export: dict | None) -> dict:
    """The test-split score (overall and per class) and the export check's largest differences."""
    out = {}
    if test and test.get("test_split"):
        out.update({f"test/{k}": v for k, v in test["all"].items()})
        for row in test["classes"]:
            out.update({f"test/{row['class']}/{k}": row[k] for k in ("ap50", "ap50_95", "precision", "recall")})
    for fmt, check in ((export or {}).get("formats") or {}).items():
        out.update({f"export/{fmt}/{k}": check.get(k) for k in ("raw_max_box_diff_px", "raw_max_score_diff")})
        out[f"export/{fmt}/passed"] = 1.0 if check.get("passed") else 0.0
    return {k: float(v) for k, v in out.items() if finite(v) is not None}


# ---------------------------------------------------------------------------------------------------------------------
# Backends


class MLflowTracker:
    """MLflow through its client API on a file:// store: no server, no active-run globals, no network."""

    def __init__(self, settings: dict, run_dir: str | os.PathLike):
        os.environ.update(MLFLOW_ENV)
        from mlflow.tracking import MlflowClient

        self.store = tracking_dir(settings, run_dir)
        self.client = MlflowClient(tracking_uri=self.store.as_uri())
        experiment = self.client.get_experiment_by_name(settings["experiment"])
        self.experiment_id = (
            experiment.experiment_id if experiment else self.client.create_experiment(settings["experiment"])
        )
        self.run_dir = str(Path(run_dir).resolve())
        self.log_weights = settings["log_weights"]

    def parent_run(self, name: str) -> str:
        """The pipeline run's MLflow run: the one tagged with this results folder, else a new one."""
        found = self.client.search_runs(
            [self.experiment_id], filter_string=f"tags.{RUN_DIR_TAG} = '{self.run_dir}'", max_results=1
        )
        if found:
            return found[0].info.run_id
        return self.client.create_run(self.experiment_id, run_name=name, tags={RUN_DIR_TAG: self.run_dir}).info.run_id

    def log_stage(self, stage: str, stage_dir: Path, run_name: str) -> dict:
        """A nested run for the stage. A rerun stage replaces its earlier record (marked deleted, not erased)."""
        from mlflow.entities import Metric, Param

        parent = self.parent_run(run_name)
        for old in self.client.search_runs(
            [self.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{parent}' and tags.{STAGE_TAG} = '{stage}'"
        ):
            self.client.delete_run(old.info.run_id)
        run_id = self.client.create_run(
            self.experiment_id, run_name=stage, tags={"mlflow.parentRunId": parent, STAGE_TAG: stage}
        ).info.run_id
        now = int(time.time() * 1000)
        metrics = [Metric(k, v, now, step) for k, v, step in stage_epoch_metrics(stage_dir)]
        metrics += [Metric(k, v, now, 0) for k, v in stage_summary_metrics(stage_dir).items()]
        params = [Param(k, str(v)) for k, v in stage_params(stage_dir).items()]
        for start in range(0, len(params), 100):  # log_batch takes at most 100 params and 1000 metrics a call
            self.client.log_batch(run_id, params=params[start : start + 100])
        for start in range(0, len(metrics), 1000):
            self.client.log_batch(run_id, metrics=metrics[start : start + 1000])
        for name in STAGE_FILES:
            if (stage_dir / name).is_file():
                self.client.log_artifact(run_id, str(stage_dir / name))
        if self.log_weights and (stage_dir / "weights" / "last.pt").is_file():
            self.client.log_artifact(run_id, str(stage_dir / "weights" / "last.pt"), "weights")
        self.client.set_terminated(run_id)
        return {
            "backend": "mlflow",
            "store": str(self.store),
            "parent_run_id": parent,
            "run_id": run_id,
            "metrics": len(metrics),
            "params": len(params),
        }

    def log_run(self, run_name: str, metrics: dict, files: list[Path]) -> dict:
        from mlflow.entities import Metric

        parent = self.parent_run(run_name)
        now = int(time.time() * 1000)
        self.client.log_batch(parent, metrics=[Metric(k, v, now, 0) for k, v in metrics.items()])
        for path in files:
            self.client.log_artifact(parent, str(path), Path(path).parent.name)
        self.client.set_terminated(parent)
        return {"backend": "mlflow", "store": str(self.store), "parent_run_id": parent, "metrics": len(metrics)}


class TensorBoardTracker:
    """One TensorBoard run folder per stage (`tensorboard --logdir <dir>` shows them side by side), plus `run/` for
    the test score and export check. Params and files are copied beside the events (TensorBoard has no artifacts).
    All of it goes into the pipeline run's own folder, ``<dir>/<run>`` (``<run>-<key>`` when that name is taken by
    something else): a rerun stage's earlier events are deleted there, and nowhere else."""

    def __init__(self, settings: dict, run_dir: str | os.PathLike):
        self.logdir = tracking_dir(settings, run_dir)
        self.run_dir = str(Path(run_dir).resolve())

    def log_stage(self, stage: str, stage_dir: Path, run_name: str) -> dict:
        folder = self._fresh_folder(run_name, stage)  # a rerun stage replaces its earlier events
        scalars = [*stage_epoch_metrics(stage_dir), *((k, v, 0) for k, v in stage_summary_metrics(stage_dir).items())]
        self._write(folder, scalars, [stage_dir / name for name in STAGE_FILES])
        write_json(folder / "params.json", stage_params(stage_dir))
        return {"backend": "tensorboard", "logdir": str(folder), "metrics": len(scalars)}

    def log_run(self, run_name: str, metrics: dict, files: list[Path]) -> dict:
        folder = self._fresh_folder(run_name, "run")
        self._write(folder, [(k, v, 0) for k, v in metrics.items()], files)
        return {"backend": "tensorboard", "logdir": str(folder), "metrics": len(metrics)}

    def run_folder(self, run_name: str) -> Path:
        """This pipeline run's folder: ``<dir>/<run name>`` if it is free or already this run's, else the name with
        a key of the results folder (another run of that name, or a folder that is not the pipeline's: yolov5's
        ``runs/train``)."""
        key = hashlib.sha256(self.run_dir.encode()).hexdigest()[:8]
        for name in (run_name, f"{run_name}-{key}"):
            folder = self.logdir / name
            facts = owner_facts(folder)
            if facts is not None and facts.get("run_dir") == self.run_dir:
                return folder
            if facts is None:
                try:
                    return claim(folder, "TensorBoard logs of one pipeline run", run_dir=self.run_dir)
                except NotOwnedError:
                    continue
        raise NotOwnedError(f"{self.logdir}: {run_name} and {run_name}-{key} both belong to something else")

    def _fresh_folder(self, run_name: str, name: str) -> Path:
        folder = require_owned(self.run_folder(run_name), "TensorBoard logs") / name
        shutil.rmtree(folder, ignore_errors=True)  # inside the run's own marked folder only
        return folder

    @staticmethod
    def _write(folder: Path, scalars: list, files: list[Path]) -> None:
        from stagedyolo.report import ScalarWriter

        folder.mkdir(parents=True, exist_ok=True)
        writer = ScalarWriter(folder)
        try:
            for name, value, step in scalars:
                writer.add_scalar(name, value, step)
        finally:
            writer.close()
        for path in files:
            if Path(path).is_file():
                (folder / "files").mkdir(exist_ok=True)
                shutil.copy2(path, folder / "files" / Path(path).name)


BACKENDS = {"mlflow": MLflowTracker, "tensorboard": TensorBoardTracker}


# ---------------------------------------------------------------------------------------------------------------------
# Rules


def track_stage_for_rule(stage_dir: str, record_json: str, *, settings: dict, run_name: str, log_path: str) -> dict:
    """The track_stage rule: log one published stage. `record_json` (R/tracking/<stage>.json) says where it went, or
    why it did not."""
    stage_dir = Path(stage_dir)
    run_dir = stage_dir.parent.parent

    def log_stage():
        return BACKENDS[settings["backend"]](settings, run_dir).log_stage(stage_dir.name, stage_dir, run_name)

    return _track(f"stage {stage_dir.name}", record_json, settings, log_path, log_stage)


def track_run_for_rule(
    record_json: str,
    *,
    test_json: str,
    export_json: str | None,
    files: list[str],
    settings: dict,
    run_name: str,
    log_path: str,
) -> dict:
    """The track_run rule, after every stage is tracked: the test score, the export check and the run's files."""
    run_dir = Path(record_json).parent.parent

    def log_run():
        test, export = read_json(test_json), read_json(export_json) if export_json else None
        return BACKENDS[settings["backend"]](settings, run_dir).log_run(
            run_name, run_summary_metrics(test, export), [Path(f) for f in files if Path(f).is_file()]
        )

    return _track(f"run {run_name}", record_json, settings, log_path, log_run)


def _track(what: str, record_json: str, settings: dict, log_path: str, log_it) -> dict:
    """Run one tracking call; a failure of the tracker (store, disk, package) is logged and recorded, never raised:
    tracking must never stop training, and a failed job would stop every stage after it. The record exists either
    way, so Snakemake does not retry a failed one by itself: `--forcerun track_stage` does."""
    try:
        record = log_it()
        _log(log_path, f"tracked {what}: {record}")
    except Exception as e:  # noqa: BLE001 - whatever the backend raises
        record = {"backend": settings["backend"], "failed": f"{type(e).__name__}: {e}"}
        _log(log_path, f"WARNING: tracking {what} failed; training goes on, untracked:\n{traceback.format_exc()}")
    write_json(record_json, record)
    return record


def _log(log_path: str, line: str) -> None:
    Path(log_path).parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "a") as log:
        log.write(line + "\n")

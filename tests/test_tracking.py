"""Tracking against a real local MLflow store and real TensorBoard event files, from published stage folders
(made by the report tests' helper: timing.json, telemetry.csv, diagnosis and yolov5-format results.csv)."""

import json
import math
from pathlib import Path

import pytest
from test_report import make_stage

from stagedyolo.config import ConfigError, check_config
from stagedyolo.ownership import MARKER
from stagedyolo.tracking import (
    BACKENDS,
    run_summary_metrics,
    stage_epoch_metrics,
    track_run_for_rule,
    track_stage_for_rule,
)

NAN = float("nan")
SETTINGS = {"dir": None, "experiment": "exp", "log_weights": True}


@pytest.fixture
def run_dir(tmp_path):
    """A pipeline run with two published stages; the second validated only its last epoch."""
    return make_run(tmp_path)


def make_run(tmp_path):
    for name, ips, map50s in (("frozen", [20.0, 40.0], [0.1, 0.3]), ("finetune", [30.0, 35.0, 36.0], [NAN, NAN, 0.5])):
        folder = tmp_path / "stages" / name
        make_stage(folder, name, ips, map50s)
        (folder / "stage.json").write_text(
            json.dumps(
                {
                    "stage": name,
                    "epochs": len(ips),
                    "img": 128,
                    "batch": 16,
                    "hyp": {"lr0": 0.002, "mosaic": 0.0},
                    "work_dir": "/x",
                    "attempts": [{"attempt": 1}],
                }
            )
        )
        (folder / "weights").mkdir()
        (folder / "weights" / "last.pt").write_bytes(b"weights of " + name.encode())
    return tmp_path


def track_all(run_dir, settings):
    for stage in ("frozen", "finetune"):
        record = run_dir / "tracking" / "stages" / f"{stage}.json"
        track_stage_for_rule(
            str(run_dir / "stages" / stage),
            str(record),
            settings=settings,
            run_name="demo",
            log_path=str(run_dir / "logs" / f"{stage}.log"),
        )
    test = run_dir / "test" / "test_metrics.json"
    test.parent.mkdir()
    test.write_text(
        json.dumps(
            {
                "test_split": ["/t"],
                "all": {"precision": 0.5, "recall": 0.4, "ap50": 0.6, "ap50_95": 0.3},
                "classes": [
                    {"class": "circle", "instances": 3, "precision": 0.5, "recall": 0.4, "ap50": 0.6, "ap50_95": 0.3},
                    {
                        "class": "square",
                        "instances": 0,
                        "precision": None,
                        "recall": None,
                        "ap50": None,
                        "ap50_95": None,
                    },
                ],
            }
        )
    )
    return track_run_for_rule(
        str(run_dir / "tracking" / "run.json"),
        test_json=str(test),
        export_json=None,
        files=[str(test)],
        settings=settings,
        run_name="demo",
        log_path=str(run_dir / "logs" / "run.log"),
    )


def mlflow_runs(store):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=store.as_uri())
    experiment = client.get_experiment_by_name("exp")
    return client, {r.info.run_name: r for r in client.search_runs([experiment.experiment_id])}


def test_mlflow_logs_every_stage_under_one_parent_run(run_dir):
    record = track_all(run_dir, {**SETTINGS, "backend": "mlflow"})
    client, runs = mlflow_runs(run_dir / "tracking" / "mlflow")
    assert set(runs) == {"demo", "frozen", "finetune"}
    parent = runs["demo"]
    assert parent.info.run_id == record["parent_run_id"] and parent.info.status == "FINISHED"
    assert parent.data.metrics["test/ap50"] == 0.6 and "test/square/ap50" not in parent.data.metrics  # no made-up AP
    finetune = runs["finetune"]
    assert finetune.data.tags["mlflow.parentRunId"] == parent.info.run_id
    assert finetune.data.params["hyp.lr0"] == "0.002" and finetune.data.params["epochs"] == "3"
    assert "work_dir" not in finetune.data.params and "attempts" not in finetune.data.params
    history = client.get_metric_history(finetune.info.run_id, "metrics/mAP_0.5")
    assert [(m.step, m.value) for m in history] == [(2, 0.5)]  # unvalidated epochs: no point, not a zero
    assert [m.value for m in client.get_metric_history(finetune.info.run_id, "epoch/images_per_s")] == [30, 35, 36]
    timing = json.loads((run_dir / "stages" / "finetune" / "timing.json").read_text())
    assert finetune.data.metrics["stage/wall_s"] == timing["wall_s"]
    artifacts = {a.path for a in client.list_artifacts(finetune.info.run_id)}
    assert {"timing.json", "results.csv", "stage.json", "diagnosis.md", "weights"} <= artifacts
    assert [a.path for a in client.list_artifacts(parent.info.run_id, "test")] == ["test/test_metrics.json"]


def test_a_rerun_stage_replaces_its_mlflow_record(run_dir):
    settings = {**SETTINGS, "backend": "mlflow"}
    track_all(run_dir, settings)
    first = json.loads((run_dir / "tracking" / "stages" / "finetune.json").read_text())["run_id"]
    track_stage_for_rule(
        str(run_dir / "stages" / "finetune"),
        str(run_dir / "tracking" / "stages" / "finetune.json"),
        settings=settings,
        run_name="demo",
        log_path=str(run_dir / "logs" / "again.log"),
    )
    client, runs = mlflow_runs(run_dir / "tracking" / "mlflow")
    assert set(runs) == {"demo", "frozen", "finetune"} and runs["finetune"].info.run_id != first
    assert client.get_run(first).info.lifecycle_stage == "deleted"  # kept in the store's trash, not erased


def test_tensorboard_writes_one_run_folder_per_stage(run_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    track_all(run_dir, {**SETTINGS, "backend": "tensorboard", "dir": str(run_dir / "tb")})
    tb = run_dir / "tb" / "demo"  # the pipeline run's own folder, named after config `run`
    assert sorted(p.name for p in tb.iterdir()) == [MARKER, "finetune", "frozen", "run"]
    events = EventAccumulator(str(tb / "frozen")).Reload()
    assert [(e.step, e.value) for e in events.Scalars("epoch/images_per_s")] == [(0, 20.0), (1, 40.0)]
    assert [round(e.value, 4) for e in events.Scalars("metrics/mAP_0.5")] == [0.1, 0.3]
    assert json.loads((tb / "frozen" / "params.json").read_text())["hyp.mosaic"] == 0.0
    assert (tb / "frozen" / "files" / "timing.json").is_file()
    run = EventAccumulator(str(tb / "run")).Reload()
    assert run.Scalars("test/ap50_95")[0].value == pytest.approx(0.3)


def test_tensorboard_leaves_what_it_did_not_write_in_a_shared_tracking_dir(run_dir):
    """tracking.dir: runs holds yolov5's runs/<name>/exp and whatever else; a stage or run of the same name as one
    of them must not erase it (it used to rmtree <dir>/<stage> and <dir>/run)."""
    tb = run_dir / "runs"
    theirs = [tb / "frozen" / "exp" / "results.csv", tb / "run" / "notes.txt", tb / "demo" / "exp" / "best.pt"]
    for path in theirs:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("not the pipeline's")
    record = track_all(run_dir, {**SETTINGS, "backend": "tensorboard", "dir": str(tb)})
    assert all(path.read_text() == "not the pipeline's" for path in theirs)
    ours = Path(record["logdir"]).parent
    assert ours.parent == tb and ours.name.startswith("demo-")  # `demo` is someone else's: a keyed name instead
    assert sorted(p.name for p in ours.iterdir()) == [MARKER, "finetune", "frozen", "run"]


def test_two_runs_sharing_a_tracking_dir_keep_their_own_events(tmp_path):
    settings = {**SETTINGS, "backend": "tensorboard", "dir": str(tmp_path / "tb")}
    first, second = make_run(tmp_path / "a" / "demo"), make_run(tmp_path / "b" / "demo")  # one run name, twice
    track_all(first, settings)
    before = {p: p.read_bytes() for p in (tmp_path / "tb" / "demo").rglob("*") if p.is_file()}
    record = track_all(second, settings)
    assert {p: p.read_bytes() for p in (tmp_path / "tb" / "demo").rglob("*") if p.is_file()} == before
    assert Path(record["logdir"]).parent.name.startswith("demo-")


@pytest.mark.parametrize("backend", ["tensorboard", "mlflow"])
def test_a_tracking_backend_failure_never_fails_the_job(run_dir, backend):
    """The tracker's store cannot be written (here: a file where its folder should be). The jobs still succeed and
    write their records, which say what failed; the logs keep the traceback. A failed job would stop every stage
    still to come."""
    (run_dir / "store").write_text("a file, not a folder")
    record = track_all(run_dir, {**SETTINGS, "backend": backend, "dir": str(run_dir / "store")})
    assert record["backend"] == backend and "Error" in record["failed"]
    stage_record = json.loads((run_dir / "tracking" / "stages" / "frozen.json").read_text())
    assert "failed" in stage_record
    assert "Traceback" in (run_dir / "logs" / "frozen.log").read_text()
    assert "training goes on" in (run_dir / "logs" / "run.log").read_text()


def test_epoch_metrics_skip_what_was_not_measured(run_dir):
    metrics = stage_epoch_metrics(run_dir / "stages" / "finetune")
    assert all(math.isfinite(v) for _, v, _ in metrics)
    assert [(step, v) for name, v, step in metrics if name == "metrics/mAP_0.5"] == [(2, 0.5)]


def test_run_metrics_carry_the_export_check():
    export = {"formats": {"onnx": {"raw_max_box_diff_px": 1e-5, "raw_max_score_diff": 1e-7, "passed": True}}}
    assert run_summary_metrics(None, export) == {
        "export/onnx/raw_max_box_diff_px": 1e-5,
        "export/onnx/raw_max_score_diff": 1e-7,
        "export/onnx/passed": 1.0,
    }


def test_mlflow_without_the_package_fails_before_any_job(monkeypatch):
    import importlib.util

    import yaml
    from snakemake_runner import REPO

    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "mlflow" else real(name, *a))
    with pytest.raises(ConfigError, match=r"tracking.backend: mlflow needs the mlflow package.*stagedyolo\[tracking\]"):
        check_config({**config, "tracking": {"backend": "mlflow"}}, workdir=REPO)


def test_every_backend_named_in_the_schema_exists():
    import yaml
    from snakemake_runner import REPO

    schema = yaml.safe_load((REPO / "workflow" / "schemas" / "config.schema.yaml").read_text())
    assert set(schema["properties"]["tracking"]["properties"]["backend"]["enum"]) == {"none", *BACKENDS}

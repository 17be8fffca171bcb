"""The real pipeline end to end: real Snakemake, the real yolov5 engine, the tiny demo config (~2-3 minutes)."""

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch
from snakemake_runner import REPO, make_workdir, planned_jobs, snakemake

from stagedyolo.telemetry import validate_timing

pytestmark = pytest.mark.e2e
TINY = REPO / "tests" / "configs" / "tiny.yaml"
MLFLOW = REPO / "tests" / "configs" / "mlflow.yaml"  # the same run logs to a local MLflow store
STAGES = ["smoke", "frozen", "finetune", "highres"]


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    workdir = make_workdir(tmp_path_factory.mktemp("tiny"), TINY, MLFLOW)
    net_log = workdir / "network_attempts.log"
    result = snakemake(workdir, configfiles=configs(workdir), net_log=net_log)
    (workdir / "console.txt").write_text(result.stderr)  # what Snakemake showed
    return workdir, workdir / "results" / "tiny", net_log


def configs(workdir: Path) -> list[Path]:
    return [workdir / TINY.name, workdir / MLFLOW.name]


def read_results(stage_dir: Path) -> pd.DataFrame:
    frame = pd.read_csv(stage_dir / "results.csv", skipinitialspace=True)
    frame.columns = [c.strip() for c in frame.columns]
    return frame


def tensorboard_epochs(stage_dir: Path) -> list[int]:
    """The epochs whose scalars yolov5 logged to TensorBoard and that reached the stage's events file (the worker
    closes the writer before it ends the process)."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    (events,) = stage_dir.glob("events.out.tfevents.*")
    return sorted({event.step for event in EventFileLoader(str(events)).Load() if event.summary.value})


def test_every_stage_publishes_weights_results_and_a_valid_timing_report(tiny_run):
    _, run, _ = tiny_run
    for stage, epochs in zip(STAGES, (1, 2, 2, 1)):
        folder = run / "stages" / stage
        for name in ("weights/last.pt", "stage.json", "timing.json", "timing.md", "diagnosis.json", "telemetry.csv"):
            assert (folder / name).is_file(), f"{stage}: {name} missing"
        assert list(read_results(folder)["epoch"]) == list(range(epochs))
        assert tensorboard_epochs(folder) == list(range(epochs)), f"{stage}: TensorBoard lacks an epoch's scalars"
        timing = json.loads((folder / "timing.json").read_text())
        validate_timing(timing)
        phases = sum(p["s"] for p in timing["phases"].values())
        assert phases == pytest.approx(timing["wall_s"], rel=0.05)
        for epoch in timing["epochs"]:
            assert epoch["data_wait_s"] + epoch["compute_s"] == pytest.approx(epoch["train_s"], rel=0.05)
        assert not (run / "work" / stage).exists(), "a finished stage leaves no work folder behind"
        assert timing["config"]["val_img"] == 96, f"{stage} validated at another size than the target"
    smoke_log = (run / "logs" / "stages" / "smoke.log").read_text()
    assert "Image sizes 64 train, 96 val" in smoke_log  # trains at its own size, validates at the target's
    frozen_log = (run / "logs" / "stages" / "frozen.log").read_text()
    assert (run / "stages" / "frozen" / "weights" / "best.pt").is_file() and "Validating " not in frozen_log


def test_the_images_are_decoded_once_per_run_not_in_every_stage(tiny_run):
    _, run, _ = tiny_run
    store = json.loads((run / "data" / "cache.json").read_text())["store"]
    assert store["root"] and store["decoded"] > 0, store  # cache_dataset decoded them
    assert store["sizes"] == {"train": [64, 96], "val": [96]}  # every stage validates at the 96-px target
    for stage in STAGES:
        setup = json.loads((run / "stages" / stage / "timing.json").read_text())["setup_detail"]
        assert (setup["cache_source"], setup["cache_images_decoded"]) == ("prebuilt", 0), (stage, setup)


def test_every_stage_reports_the_probes_prediction_beside_its_measured_steady_rate(tiny_run):
    _, run, _ = tiny_run
    tuning = json.loads((run / "probe" / "tuning.json").read_text())
    assert set(tuning["stages"]) == set(STAGES)
    request = json.loads((run / "probe" / "probe_work" / "request.json").read_text())
    # The candidates are timed at 64 px, where 5 of the 6 epochs train; the budget counts the 96-px epoch by its area.
    assert (request["img"], request["largest_img"]) == (64, 96)
    assert request["planned_train_images"] == round((1 + 2 + 2 + (96 / 64) ** 2) * 32)
    # smoke and finetune train alike (64 px, nothing frozen), frozen and highres differ: three loops were measured
    assert sorted(sorted(group["stages"]) for group in tuning["measurements"]["stages"]) == [
        ["finetune", "smoke"],
        ["frozen"],
        ["highres"],
    ]
    for stage, epochs in zip(STAGES, (1, 2, 2, 1)):
        timing = json.loads((run / "stages" / stage / "timing.json").read_text())
        prediction = timing["prediction"]
        assert prediction["predicted_images_per_s"] == tuning["stages"][stage]["predicted_images_per_s"] > 0
        assert prediction["settings_differ"] == {}, (stage, prediction)  # the stage ran what was predicted
        if epochs > 1:  # a steady rate needs an epoch after the first
            measured = timing["throughput"]["steady_images_per_s"]
            assert prediction["ratio"] == pytest.approx(measured / prediction["predicted_images_per_s"], abs=1e-3)
        else:
            assert prediction["ratio"] is None and "steady" in prediction["reason"]
        assert timing["config"]["amp"] is False and "CPU" in timing["config"]["amp_reason"]


def test_the_chain_passes_weights_on(tiny_run):
    _, run, _ = tiny_run
    plan = {s: json.loads((run / "stages" / s / "stage.json").read_text()) for s in STAGES}
    pretrained = str((run / "demo" / "pretrained.pt").resolve())
    assert plan["smoke"]["weights"] == pretrained and plan["frozen"]["weights"] == pretrained
    assert plan["finetune"]["weights"] == str((run / "stages" / "frozen" / "continue.pt").resolve())
    assert plan["highres"]["weights"] == str((run / "stages" / "finetune" / "continue.pt").resolve())
    assert plan["highres"]["img"] == 96 and plan["frozen"]["freeze"] == 10


def test_the_report_shows_the_fixed_costs_from_the_snakemake_call_to_every_stages_first_step(tiny_run):
    _, run, _ = tiny_run
    costs = json.loads((run / "report" / "plot_data.json").read_text())["fixed_costs"]
    startup, *stages = costs["rows"]
    # verify_env found the snakemake call among its parents: the clock starts there, not at the first job
    assert startup["after"] == "the snakemake call" and startup["gap_s"] > 0, costs
    assert costs["clock_from"] == "the snakemake call"
    assert [row["stage"] for row in stages] == STAGES
    assert all(row["gap_s"] > 0 and 0 < row["setup_s"] <= row["gap_s"] for row in stages), costs
    assert 0 < costs["share"] < 1
    assert "## Fixed costs" in (run / "report" / "summary.md").read_text()
    # Every stage's worker found the same snakemake call among its parents as verify_env: one call, every gap given.
    call = json.loads((run / "env" / "env.json").read_text())["snakemake_call_unix"]
    for stage in STAGES:
        clock = json.loads((run / "stages" / stage / "timing.json").read_text())["clock"]
        assert clock["snakemake_call"] == pytest.approx(call, abs=0.01), (stage, clock, call)
    assert not any(row["other_call"] for row in costs["rows"])


def test_the_continuing_stages_take_up_the_training_at_the_handed_over_lr(tiny_run):
    _, run, _ = tiny_run
    for stage, previous in (("finetune", "frozen"), ("highres", "finetune")):
        record = json.loads((run / "stages" / stage / "stage.json").read_text())["continuation"]
        assert record["optimizer"] == "restored" and record["lr0_source"] == "the previous stage's handover"
        handover = torch.load(run / "stages" / previous / "continue.pt", map_location="cpu", weights_only=False)
        assert record["lr0"] == pytest.approx(handover["optimizer"]["param_groups"][0]["lr"])
        assert record["ema_updates"] == handover["updates"] > 0
        first_epoch = read_results(run / "stages" / stage)[["x/lr0", "x/lr1", "x/lr2"]].to_numpy()[0]
        # no warmup: every group at the handed-over LR (results.csv keeps 5 significant digits)
        assert first_epoch == pytest.approx([record["lr0"]] * 3, rel=1e-4)


def test_the_frozen_stage_leaves_the_backbone_weights_unchanged(tiny_run):
    _, run, _ = tiny_run

    def weights(path):
        state = torch.load(path, map_location="cpu", weights_only=False)["model"].float().state_dict()
        return {k: v for k, v in state.items() if k.endswith((".weight", ".bias"))}

    before = weights(run / "demo" / "pretrained.pt")
    after = weights(run / "stages" / "frozen" / "weights" / "last.pt")
    backbone = [k for k in after if int(k.split(".")[1]) < 10]
    head = [k for k in after if int(k.split(".")[1]) >= 10 and k in before and before[k].shape == after[k].shape]
    assert backbone and head
    assert all(torch.equal(before[k], after[k]) for k in backbone)
    assert any(not torch.equal(before[k], after[k]) for k in head)  # the head did train


def test_the_console_shows_every_epoch_and_status_reads_the_finished_run(tiny_run):
    workdir, run, _ = tiny_run
    console = (workdir / "console.txt").read_text()
    for stage, epochs in zip(STAGES, (1, 2, 2, 1)):
        for epoch in range(1, epochs + 1):
            assert f"[{stage}] epoch {epoch}/{epochs}  " in console, stage
    status = subprocess.run(
        [sys.executable, "-m", "stagedyolo.cli", "status", str(run)], capture_output=True, text=True, check=True
    ).stdout
    assert [line.split()[:2] for line in status.splitlines()[1:]] == [[stage, "done"] for stage in STAGES]


def test_the_run_made_no_network_attempt(tiny_run):
    _, _, net_log = tiny_run
    assert not net_log.exists(), net_log.read_text()[:3000]


def test_a_finished_run_plans_nothing(tiny_run):
    workdir, _, _ = tiny_run
    result = snakemake(workdir, "-n", configfiles=configs(workdir))
    assert planned_jobs(result.stdout) == {}, result.stdout[-2000:]


def test_changing_one_stage_reruns_exactly_it_and_what_follows(tiny_run):
    workdir, _, _ = tiny_run
    result = snakemake(workdir, "-n", "--config", "stages={finetune: {epochs: 3}}", configfiles=configs(workdir))
    assert planned_jobs(result.stdout) == {
        "train_stage": 2,
        "evaluate_test": 1,
        "export": 1,
        "report": 1,
        "track_stage": 2,
        "track_run": 1,
        "all": 1,
    }, result.stdout[-3000:]
    assert "stage=finetune" in result.stdout and "stage=highres" in result.stdout


@pytest.mark.parametrize(
    "change, stages_rerun",
    [
        ("telemetry={interval_s: 0.5}", 4),  # every stage samples at it
        ("model={cfg: yolov5s.yaml}", 4),  # every stage builds from it (and the demo weights are pretrained anew)
        ("tune={measure_batches: 7}", 0),  # no tiny stage tunes: none reads the window
        ("stages={highres: {img: 128}}", 4),  # the target size: every stage validates at it
        ("stages={finetune: {hyp: {lrf: 0.2}}}", 2),  # its LR line: finetune and highres, which starts from it
        ("stages={smoke: {hyp: {mosaic: 0.5}}}", 4),  # the first stage's augmentation: it and all after it
        # A later stage's speed settings rerun it and what follows, not the probe and every stage before it
        # (its prediction is dropped instead: recipe.probe_rerun_stages).
        ("stages={highres: {hyp: {mosaic: 0.5}}}", 1),
        ("stages={finetune: {workers: 0}}", 2),
        # A stage added after the last at its size: it alone (the image store already holds that size).
        (("stage_order=[smoke,frozen,finetune,highres,polish]", "stages={polish: {epochs: 1, img: 96}}"), 1),
    ],
)
def test_a_config_setting_outside_the_stage_reruns_exactly_the_stages_that_read_it(tiny_run, change, stages_rerun):
    workdir, _, _ = tiny_run
    changes = (change,) if isinstance(change, str) else change
    result = snakemake(workdir, "-n", "--config", *changes, configfiles=configs(workdir))
    assert planned_jobs(result.stdout).get("train_stage", 0) == stages_rerun, result.stdout[-3000:]


def test_the_report_renders_and_snakemake_report_embeds_it(tiny_run):
    workdir, run, _ = tiny_run
    plots = ("phases", "utilization", "throughput", "map50")
    for name in plots:
        assert (run / "report" / f"{name}.png").stat().st_size > 10_000
    plotted = json.loads((run / "report" / "plot_data.json").read_text())
    highres = json.loads((run / "stages" / "highres" / "timing.json").read_text())
    train_index = plotted["phase_names"].index("train")
    assert plotted["phases_s"]["highres"][train_index] == pytest.approx(highres["phases"]["train"]["s"])
    finetune_map = read_results(run / "stages" / "finetune")["metrics/mAP_0.5"].dropna().tolist()
    plotted_map = [m for m, s in zip(plotted["map50"]["map50"], plotted["map50"]["stage"]) if s == "finetune"]
    assert [m for m in plotted_map if m is not None] == pytest.approx(finetune_map)
    summary = (run / "report" / "summary.md").read_text()
    assert all(f"[{stage}]" in summary for stage in STAGES)  # every stage's verdict
    snakemake(workdir, "--report", "report.html", configfiles=configs(workdir))
    html = (workdir / "report.html").read_text()
    assert all(f"{name}.png" in html for name in plots) and "summary.html" in html


def test_the_onnx_export_gives_pytorchs_boxes_on_a_test_image(tiny_run):
    """Independently of the export rule's own check: the test's own preprocessing and model loading."""
    import numpy as np
    import onnxruntime
    from PIL import Image

    _, run, _ = tiny_run
    check = json.loads((run / "export" / "export.json").read_text())
    assert check["passed"] and set(check["formats"]) == {"onnx", "torchscript"}
    rows = {row["name"] for row in check["patches"] if row["applied"]}  # the job's own record of the patch table
    assert {"onnx_torchscript_exporter", "atomic_save", "deferred_imports"} <= rows
    assert check["image"].endswith("test_0000.jpg") and check["img"] == 96  # a held-out image, at highres' size
    image = Image.open(check["image"]).convert("RGB").resize((96, 96), Image.BILINEAR)  # square: no letterbox bars
    x = (np.asarray(image, dtype=np.float32) / 255).transpose(2, 0, 1)[None].copy()
    model = torch.load(run / "stages" / "highres" / "weights" / "last.pt", map_location="cpu", weights_only=False)
    model = model["model"].float().fuse().eval()
    with torch.no_grad():
        expected = model(torch.from_numpy(x))[0].numpy()
    session = onnxruntime.InferenceSession(str(run / "export" / "model.onnx"), providers=["CPUExecutionProvider"])
    got = session.run(None, {"images": x})[0]
    assert got.shape == expected.shape == (1, 3 * (12 * 12 + 6 * 6 + 3 * 3), 5 + 3)  # anchors at strides 8, 16, 32
    np.testing.assert_allclose(got[..., :4], expected[..., :4], atol=0.01)  # pixels
    np.testing.assert_allclose(got[..., 4:], expected[..., 4:], atol=1e-4)
    assert (run / "export" / "model.torchscript").stat().st_size > 1_000_000


def test_the_test_split_is_scored_per_class_and_reported(tiny_run):
    _, run, _ = tiny_run
    metrics = json.loads((run / "test" / "test_metrics.json").read_text())
    labels = [
        line.split()[0]
        for f in (run / "demo" / "target" / "labels" / "test").glob("*.txt")
        for line in f.read_text().splitlines()
        if line.strip()
    ]
    assert len(list((run / "demo" / "target" / "images" / "test").glob("*.jpg"))) == 8
    assert [c["class"] for c in metrics["classes"]] == ["circle", "square", "triangle"]
    assert {"ap_per_class_record", "atomic_save", "complete_nms"} <= {
        row["name"] for row in metrics["patches"] if row["applied"]
    }
    assert [c["instances"] for c in metrics["classes"]] == [labels.count(str(k)) for k in range(3)]
    for row in [metrics["all"], *(c for c in metrics["classes"] if c["instances"])]:
        assert 0 <= row["ap50_95"] <= row["ap50"] <= 1
    summary = (run / "report" / "summary.md").read_text()
    assert "## Test split" in summary and "| circle |" in summary.split("## Test split")[1]


def test_mlflow_holds_every_stage_under_one_run(tiny_run):
    import os

    from mlflow.tracking import MlflowClient

    _, run, _ = tiny_run
    os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"
    client = MlflowClient(tracking_uri=(run / "tracking" / "mlflow").resolve().as_uri())
    experiment = client.get_experiment_by_name("stagedyolo")
    runs = {r.info.run_name: r for r in client.search_runs([experiment.experiment_id])}
    assert set(runs) == {"tiny", *STAGES}
    parent = runs["tiny"].info.run_id
    assert runs["tiny"].info.status == "FINISHED" and "test/ap50" in runs["tiny"].data.metrics
    for stage in STAGES:
        stage_run = runs[stage]
        assert stage_run.data.tags["mlflow.parentRunId"] == parent
        plan = json.loads((run / "stages" / stage / "stage.json").read_text())
        params = stage_run.data.params
        assert params["epochs"] == str(plan["epochs"]) and params["img"] == str(plan["img"])
        logged = [m.value for m in client.get_metric_history(stage_run.info.run_id, "train/box_loss")]
        assert logged == pytest.approx(read_results(run / "stages" / stage)["train/box_loss"].tolist())
        timing = json.loads((run / "stages" / stage / "timing.json").read_text())
        assert stage_run.data.metrics["stage/wall_s"] == pytest.approx(timing["wall_s"])
        artifacts = {a.path for a in client.list_artifacts(stage_run.info.run_id)}
        assert {"timing.json", "results.csv", "stage.json", "weights"} <= artifacts


def test_the_gpu_check_summary_reads_a_real_run_and_invents_no_gpu_figure(tiny_run):
    sys.path.insert(0, str(REPO / "benchmarks"))
    from gpu_check import goals, summarise_run

    _, run, _ = tiny_run
    summary = summarise_run(run)
    assert [s["stage"] for s in summary["stages"]] == STAGES
    assert summary["probe_s"] > 0 and summary["amp_verdict"]["amp"] is False
    assert all(s["predicted_images_per_s"] > 0 and s["gpu_util_mean_pct"] is None for s in summary["stages"])
    assert goals(summary, busy=None)["gpu_busy_share"]["met"] is None


def test_the_reports_advice_agrees_with_its_own_figures(tiny_run):
    """The CPU demo's report once called every stage data-loading bound beside a 4.5 % data wait, told the last
    stage to lower the image size it exists to train at, and advised nosave without saying that gives up resume."""
    from stagedyolo.diagnosis import THRESHOLDS

    _, run, _ = tiny_run
    summary = (run / "report" / "summary.md").read_text()
    for stage in STAGES:
        timing = json.loads((run / "stages" / stage / "timing.json").read_text())
        diagnosis = json.loads((run / "stages" / stage / "diagnosis.json").read_text())
        codes = [f["code"] for f in diagnosis["findings"]]
        advice = [change for f in diagnosis["findings"] for change in (f["change"], *f["also"])]
        shares = [s for s in (timing["data_wait"]["share"], timing["data_wait"]["steady_share"]) if s is not None]
        if min(shares) <= THRESHOLDS["data_wait_share"][0]:
            assert "data_loading_bound" not in codes, (stage, timing["data_wait"], diagnosis["verdict"])
        if stage == STAGES[-1] or not timing["gpu"]["available"]:  # the target size; a CPU run's loader
            assert not any(".img:" in change for change in advice), (stage, advice)
        if any("nosave: true" in change for change in advice):
            assert "no resume" in diagnosis["verdict"], diagnosis["verdict"]
        assert diagnosis["verdict"] in summary, stage

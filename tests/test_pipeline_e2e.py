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
STAGES = ["smoke", "frozen", "finetune", "highres"]


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    workdir = make_workdir(tmp_path_factory.mktemp("tiny"), TINY)
    net_log = workdir / "network_attempts.log"
    result = snakemake(workdir, configfiles=[workdir / "tiny.yaml"], net_log=net_log)
    (workdir / "console.txt").write_text(result.stderr)  # what Snakemake showed
    return workdir, workdir / "results" / "tiny", net_log


def read_results(stage_dir: Path) -> pd.DataFrame:
    frame = pd.read_csv(stage_dir / "results.csv", skipinitialspace=True)
    frame.columns = [c.strip() for c in frame.columns]
    return frame


def test_every_stage_publishes_weights_results_and_a_valid_timing_report(tiny_run):
    _, run, _ = tiny_run
    for stage, epochs in zip(STAGES, (1, 2, 2, 1)):
        folder = run / "stages" / stage
        for name in ("weights/last.pt", "stage.json", "timing.json", "timing.md", "diagnosis.json", "telemetry.csv"):
            assert (folder / name).is_file(), f"{stage}: {name} missing"
        assert list(folder.glob("events.out.tfevents.*")), f"{stage}: no TensorBoard events"
        assert list(read_results(folder)["epoch"]) == list(range(epochs))
        timing = json.loads((folder / "timing.json").read_text())
        validate_timing(timing)
        phases = sum(p["s"] for p in timing["phases"].values())
        assert phases == pytest.approx(timing["wall_s"], rel=0.05)
        for epoch in timing["epochs"]:
            assert epoch["data_wait_s"] + epoch["compute_s"] == pytest.approx(epoch["train_s"], rel=0.05)
        assert not (run / "work" / stage).exists(), "a finished stage leaves no work folder behind"


def test_the_images_are_decoded_once_per_run_not_in_every_stage(tiny_run):
    _, run, _ = tiny_run
    store = json.loads((run / "data" / "cache.json").read_text())["store"]
    assert store["root"] and store["sizes"] == [64, 96] and store["decoded"] > 0, store  # cache_dataset decoded them
    for stage in STAGES:
        setup = json.loads((run / "stages" / stage / "timing.json").read_text())["setup_detail"]
        assert (setup["cache_source"], setup["cache_images_decoded"]) == ("prebuilt", 0), (stage, setup)


def test_the_chain_passes_weights_on(tiny_run):
    _, run, _ = tiny_run
    plan = {s: json.loads((run / "stages" / s / "stage.json").read_text()) for s in STAGES}
    pretrained = str((run / "demo" / "pretrained.pt").resolve())
    assert plan["smoke"]["weights"] == pretrained and plan["frozen"]["weights"] == pretrained
    assert plan["finetune"]["weights"] == str((run / "stages" / "frozen" / "weights" / "last.pt").resolve())
    assert plan["highres"]["weights"] == str((run / "stages" / "finetune" / "weights" / "last.pt").resolve())
    assert plan["highres"]["img"] == 96 and plan["frozen"]["freeze"] == 10


def test_a_low_lr_stage_trains_at_its_lr(tiny_run):
    _, run, _ = tiny_run
    lrs = read_results(run / "stages" / "finetune")[["x/lr0", "x/lr1", "x/lr2"]].to_numpy()
    assert (lrs > 0).all() and lrs.max() <= 0.0005 * (1 + 1e-6)  # the bias group's warmup LR included


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
    status = subprocess.run([sys.executable, "-m", "stagedyolo.cli", "status", str(run)], capture_output=True,
                            text=True, check=True).stdout  # fmt: skip
    assert [line.split()[:2] for line in status.splitlines()[1:]] == [[stage, "done"] for stage in STAGES]


def test_the_run_made_no_network_attempt(tiny_run):
    _, _, net_log = tiny_run
    assert not net_log.exists(), net_log.read_text()[:3000]


def test_a_finished_run_plans_nothing(tiny_run):
    workdir, _, _ = tiny_run
    result = snakemake(workdir, "-n", configfiles=[workdir / "tiny.yaml"])
    assert planned_jobs(result.stdout) == {}, result.stdout[-2000:]


def test_changing_one_stage_reruns_exactly_it_and_what_follows(tiny_run):
    workdir, _, _ = tiny_run
    result = snakemake(workdir, "-n", "--config", "stages={finetune: {epochs: 3}}", configfiles=[workdir / "tiny.yaml"])
    assert planned_jobs(result.stdout) == {"train_stage": 2, "report": 1, "all": 1}, result.stdout[-3000:]
    assert "stage=finetune" in result.stdout and "stage=highres" in result.stdout


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
    snakemake(workdir, "--report", "report.html", configfiles=[workdir / "tiny.yaml"])
    html = (workdir / "report.html").read_text()
    assert all(f"{name}.png" in html for name in plots) and "summary.html" in html

"""benchmarks/gpu_check.py without a GPU: it trains nothing, says why, and summarises a real run's files honestly."""

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from gpu_check import goals, gpu_busy_share  # noqa: E402


@pytest.mark.skipif(torch.cuda.is_available(), reason="with a GPU the check would train the 640-px load")
def test_without_a_gpu_nothing_is_trained_and_the_file_says_why(tmp_path):
    out, data_dir = tmp_path / "gpu_check.json", tmp_path / "det640"
    result = subprocess.run(
        [
            sys.executable,
            str(REPO / "benchmarks" / "gpu_check.py"),
            "--out",
            str(out),
            "--data-dir",
            str(data_dir),
            "--workdir",
            str(tmp_path / "work"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 3, result.stderr
    written = json.loads(out.read_text())
    assert written["gpu"] is None and written["gpu_reason"].startswith("no GPU")
    assert "pipeline" not in written and "bare_yolov5" not in written  # no figure invented
    assert not data_dir.exists() and not (tmp_path / "work").exists()  # and nothing made or trained


def write_telemetry(path, rows, gpus):
    columns = ["timestamp", "gpu_status"] + [f"gpu{i}_util_pct" for i in range(gpus)]
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(columns)
        writer.writerows(rows)


def test_gpu_busy_share_is_the_mean_over_the_whole_run_or_null_with_a_reason(tmp_path):
    write_telemetry(tmp_path / "gpu.csv", [[1, "ok", 20, 40], [2, "ok", 80, ""], [3, "ok", 60, 100]], gpus=2)
    assert gpu_busy_share(tmp_path / "gpu.csv") == (0.6, None)  # (20 + 40 + 80 + 60 + 100) / 5; blanks skipped
    write_telemetry(tmp_path / "cpu.csv", [[1, "no GPU visible"]], gpus=0)
    share, reason = gpu_busy_share(tmp_path / "cpu.csv")
    assert share is None and "no GPU visible" in reason


def test_goals_are_judged_against_the_fixed_targets_and_unknowns_stay_unknown():
    stage = {"setup_s": 2.0, "amp": True, "ratio": 1.1}
    summary = {"probe_s": 8.0, "stages": [stage, {**stage, "ratio": 0.7}]}
    verdict = goals(summary, busy=0.65)
    assert verdict["gpu_busy_share"]["met"] and verdict["probe_s"]["met"] and verdict["amp_on"]["met"]
    assert verdict["predictions"]["met"] is False  # 0.7 is outside +-25 %
    unknown = goals({"probe_s": None, "stages": [{**stage, "ratio": None}]}, busy=None)
    assert unknown["gpu_busy_share"]["met"] is None and unknown["probe_s"]["met"] is None
    assert unknown["predictions"]["met"] is None

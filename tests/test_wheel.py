"""A non-editable install (a wheel: a cluster image, `pip install .`, a git install) runs a stage.

An editable install reads files from the checkout, so it hides package data missing from the wheel; the first
stage of a wheel install once failed on the timing schema it validates against."""

import os
import shutil
import subprocess
import sys
import textwrap

import pytest
from snakemake_runner import REPO

pytestmark = pytest.mark.e2e

STAGE = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    import stagedyolo
    from stagedyolo.demo import TARGET_CLASSES, DemoSpec, write_demo_dataset
    from stagedyolo.stage_plan import build_plan
    from stagedyolo.stage import run_stage

    assert Path(stagedyolo.__file__).is_relative_to(Path(sys.argv[1])), stagedyolo.__file__
    data = write_demo_dataset(Path("data"), DemoSpec(TARGET_CLASSES, 8, 4))
    spec = {"epochs": 1, "img": 64, "batch": 4, "workers": 0, "freeze": 0, "lr0": 0.002, "optimizer": "AdamW",
            "hyp": {}, "cache": "none", "amp": "auto", "device": "cpu", "val_period": 1, "gpus": 1, "sync_bn": False,
            "plots": False, "nosave": False, "lr_scaling": "none"}
    plan = build_plan(spec, stage="s", data=data, weights=None, cfg="yolov5n.yaml", cache_mode="none", threads=1,
                      work_dir=Path("work/s"))
    run_stage(plan, stage_dir=Path("stages/s"), attempt=1, log_path="s.log", engine_home=Path("engine"))
    print(json.loads(Path("stages/s/timing.json").read_text())["stage"])
""")


def test_a_wheel_installed_stagedyolo_runs_a_stage(tmp_path):
    # Built from a copy of what git tracks: a checkout's *.egg-info (left by `pip install -e`) can smuggle files
    # into the wheel that a clean build leaves out.
    source = tmp_path / "source"
    shutil.copytree(REPO / "stagedyolo", source / "stagedyolo", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path / "dist"),
            str(source),
        ],
        check=True,
        cwd=tmp_path,
    )
    wheel = next((tmp_path / "dist").glob("stagedyolo-*.whl"))
    site = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site), str(wheel)],
        check=True,
        cwd=tmp_path,
    )
    run = tmp_path / "run"
    run.mkdir()
    # The wheel's copy first on the path, and a working folder outside the checkout.
    env = {**os.environ, "PYTHONPATH": str(site)}
    result = subprocess.run(
        [sys.executable, "-c", STAGE, str(site)], cwd=run, env=env, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr[-4000:] + (run / "s.log").read_text()[-4000:]
    assert result.stdout.strip().splitlines()[-1] == "s"

"""Publishing a stage: a rerun's folder holds only its own run, the old folder goes only
once the new one is complete, and a kill while the work folder is removed still leaves a stage a rerun publishes.
Real stages on a tiny dataset, stopped with SIGKILL in a process of their own."""

import json
import signal
import subprocess
import sys

import pytest
from stage_specs import small_stage_spec

from stagedyolo import stage
from stagedyolo.demo import TARGET_CLASSES, DemoSpec, write_demo_dataset
from stagedyolo.stage import run_stage
from stagedyolo.stage_plan import build_plan

SPEC = small_stage_spec(optimizer="SGD")
RULE_OUTPUTS = ("stage.json", "timing.json", "weights/last.pt", "results.csv", "continue.pt")

STAGE_PROCESS = """
import json, os, shutil, signal, sys
from stagedyolo import stage
args = json.loads(sys.argv[1])
work = args["plan"]["work_dir"]
real_rmtree = shutil.rmtree

def killed(*_args, **_kwargs):
    os.kill(os.getpid(), signal.SIGKILL)

def killed_while_removing_the_work_folder(path, *a, **k):
    if os.path.abspath(path).startswith(work):
        os.unlink(os.path.join(work, "weights", "last.pt"))  # the checkpoint goes, the rest is left
        killed()
    return real_rmtree(path, *a, **k)

if args["kill"] == "at_publish":
    stage.publish = killed
else:
    shutil.rmtree = killed_while_removing_the_work_folder
stage.run_stage(args["plan"], stage_dir=args["stage_dir"], attempt=1, log_path=args["log"], engine_home=args["engine"])
"""


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory):
    return write_demo_dataset(tmp_path_factory.mktemp("data"), DemoSpec(TARGET_CLASSES, 16, 8))


@pytest.fixture
def trained(tmp_path, tiny_data):
    """A stage that trained and was SIGKILLed as it began to publish: its work folder holds the finished run."""
    run_killed(tmp_path, tiny_data, "at_publish")
    assert (tmp_path / "work" / "s" / "weights" / "last.pt").is_file()
    return tmp_path


def plan_for(tmp_path, data):
    return build_plan(
        SPEC,
        stage="s",
        data=data,
        weights=None,
        cfg="yolov5n.yaml",
        cache_mode="none",
        threads=1,
        work_dir=tmp_path / "work" / "s",
    )


def run_killed(tmp_path, data, kill):
    args = {
        "plan": plan_for(tmp_path, data),
        "stage_dir": str(tmp_path / "stages" / "s"),
        "log": str(tmp_path / "s.log"),
        "engine": str(tmp_path / "engine"),
        "kill": kill,
    }
    done = subprocess.run([sys.executable, "-c", STAGE_PROCESS, json.dumps(args)], capture_output=True, text=True)
    assert done.returncode == -signal.SIGKILL, done.stderr[-3000:]


def rerun(tmp_path, data):
    return run_stage(
        plan_for(tmp_path, data),
        stage_dir=tmp_path / "stages" / "s",
        attempt=1,
        log_path=tmp_path / "s.log",
        engine_home=tmp_path / "engine",
    )


def leave_a_previous_publish(stage_dir):
    """What the run before published, and the output folders Snakemake creates before it starts the job."""
    (stage_dir / "weights").mkdir(parents=True)
    for name in ("weights/best.pt", "weights/epoch9.pt", "events.out.tfevents.1.old", "timing.json"):
        (stage_dir / name).write_text("the previous run's")


def test_a_rerun_publishes_into_a_fresh_folder_without_the_previous_runs_files(trained, tiny_data):
    stage_dir = trained / "stages" / "s"
    leave_a_previous_publish(stage_dir)
    rerun(trained, tiny_data)
    assert not (stage_dir / "weights" / "epoch9.pt").exists() and not (stage_dir / "events.out.tfevents.1.old").exists()
    assert (stage_dir / "weights" / "best.pt").read_bytes() != b"the previous run's"
    assert all((stage_dir / name).is_file() for name in RULE_OUTPUTS if name != "continue.pt")
    assert sorted(path.name for path in stage_dir.parent.iterdir()) == ["s"]  # no sibling left behind
    assert not (trained / "work" / "s").exists()


def disk_full(*args):
    raise OSError("disk full")


def test_a_publish_that_fails_leaves_the_previous_folder_as_it_was(trained, tiny_data, monkeypatch):
    stage_dir = trained / "stages" / "s"
    leave_a_previous_publish(stage_dir)
    monkeypatch.setattr(stage, "write_diagnosis", disk_full)
    with pytest.raises(OSError, match="disk full"):
        rerun(trained, tiny_data)
    assert (stage_dir / "timing.json").read_text() == "the previous run's"
    assert (stage_dir / "weights" / "epoch9.pt").exists() and not (stage_dir / "weights" / "last.pt").exists()
    assert (trained / "work" / "s" / "weights" / "last.pt").is_file()  # the next run publishes it


def test_a_kill_while_the_work_folder_is_removed_still_leaves_a_stage_the_rerun_publishes(trained, tiny_data):
    run_killed(trained, tiny_data, "while_removing_the_work_folder")
    stage_dir = trained / "stages" / "s"
    for name in RULE_OUTPUTS:  # Snakemake deletes an incomplete job's outputs before it runs the job again
        (stage_dir / name).unlink(missing_ok=True)
    rerun(trained, tiny_data)
    log = (trained / "s.log").read_text()
    assert log.count("Starting training") == 1  # published, not trained again
    assert all((stage_dir / name).is_file() for name in RULE_OUTPUTS if name != "continue.pt")
    assert json.loads((stage_dir / "stage.json").read_text())["stage"] == "s"
    assert sorted(path.name for path in stage_dir.parent.iterdir()) == ["s"]

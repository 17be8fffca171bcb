"""Warm start: a child forked from the warm server behaves as `python -m` would, and trains exactly as cold does."""

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pandas as pd
import pytest

from stagedyolo.demo import TARGET_CLASSES, DemoSpec, write_demo_dataset
from stagedyolo.engine.offline import engine_environment
from stagedyolo.launch import WarmStart, run_supervised
from stagedyolo.launch.warm import plain_module_command, server_name, start_warm
from stagedyolo.stage import build_plan, run_stage

CHILD = """
import os, sys, time
print("args", sys.argv[1:], "var", os.environ.get("WARM_TEST_VAR"), "cwd", os.getcwd())
print("own session", os.getsid(0) == os.getpid(), "torch already imported", "torch" in sys.modules)
print("on stderr", file=sys.stderr)
if sys.argv[1] == "sleep":
    time.sleep(60)
sys.exit(int(sys.argv[2]))
"""


@pytest.fixture(scope="module")
def warm_setup(tmp_path_factory):
    """One engine home (so one server, started once) for the module's tests; the server exits when idle."""
    home = tmp_path_factory.mktemp("warm")
    (home / "warm_test_child.py").write_text(CHILD)
    env = engine_environment(home / "engine")
    env["WARM_TEST_VAR"] = "from-the-caller"
    return home, env, WarmStart(home / "engine", idle_s=60)


def run_child(warm_setup, *args, **options):
    home, env, warm = warm_setup
    log_path = home / f"log-{time.monotonic_ns()}.txt"
    with open(log_path, "w") as log:
        rc = run_supervised([sys.executable, "-m", "warm_test_child", *args], env, cwd=home, stdout=log,
                            stderr=subprocess.STDOUT, warm=warm, **options)  # fmt: skip
    return rc, log_path.read_text()


def test_a_warm_child_is_what_python_m_would_start(warm_setup):
    rc, log = run_child(warm_setup, "exit", "3")
    assert rc == 3
    assert "forked from a new warm server" in log or "forked from the running warm server" in log
    assert f"args ['exit', '3'] var from-the-caller cwd {warm_setup[0]}" in log
    assert "own session True torch already imported True" in log
    assert "on stderr" in log

    rc, log = run_child(warm_setup, "exit", "0")
    assert rc == 0 and "forked from the running warm server" in log  # the second one reuses the server


def test_a_stop_signal_reaches_the_warm_child(warm_setup):
    started = time.monotonic()
    threading.Timer(8.0, os.kill, (os.getpid(), signal.SIGTERM)).start()  # run_supervised forwards it
    rc, log = run_child(warm_setup, "sleep", "0")
    assert rc == -signal.SIGTERM
    assert time.monotonic() - started < 30  # not the child's 60 s sleep
    assert "forked from" in log


def test_commands_that_are_not_plain_python_m_start_cold(warm_setup):
    assert plain_module_command([sys.executable, "-m", "torch.distributed.run", "x.py"]) == (
        "torch.distributed.run", ["x.py"])  # fmt: skip
    assert plain_module_command(["torchrun", "-m", "stagedyolo.engine.worker"]) is None
    assert plain_module_command([sys.executable, "script.py"]) is None
    _, env, warm = warm_setup
    assert start_warm([sys.executable, "-m", "json.tool"], env, warm, stdout=subprocess.PIPE) is None


def test_the_server_identity_ignores_per_job_threads_but_not_the_rest():
    base = {"PATH": "/usr/bin", "YOLOV5_CONFIG_DIR": "/a"}
    assert server_name(base) == server_name({**base, "OMP_NUM_THREADS": "2", "CUDA_VISIBLE_DEVICES": "0"})
    assert server_name(base) != server_name({**base, "YOLOV5_CONFIG_DIR": "/b"})  # yolov5 reads it at import


SPEC = {
    "epochs": 2, "img": 64, "batch": 8, "workers": 0, "freeze": 0, "lr0": 0.002, "optimizer": "AdamW", "hyp": {},
    "cache": "none", "amp": "auto", "device": "cpu", "val_period": 1, "gpus": 1, "sync_bn": False, "plots": False,
    "nosave": False, "lr_scaling": "none", "nominal_batch": 8, "min_warmup_iters": 0,
}  # fmt: skip


def test_a_warm_stage_trains_exactly_as_a_cold_one(tmp_path):
    data = write_demo_dataset(tmp_path / "data", DemoSpec(TARGET_CLASSES, 16, 8))
    losses = {}
    for mode, warm in (("cold", None), ("warm", WarmStart(tmp_path / "engine", idle_s=5))):
        plan = build_plan(SPEC, stage=mode, data=data, weights=None, cfg="yolov5n.yaml", cache_mode="none", threads=1,
                          work_dir=tmp_path / "work" / mode)  # fmt: skip
        run_stage(plan, stage_dir=tmp_path / mode, attempt=1, log_path=tmp_path / f"{mode}.log",
                  engine_home=tmp_path / "engine", warm=warm)  # fmt: skip
        results = pd.read_csv(tmp_path / mode / "results.csv", skipinitialspace=True)
        losses[mode] = results[[c for c in results.columns if "loss" in c]].to_numpy()
        timing = json.loads((tmp_path / mode / "timing.json").read_text())
        assert timing["setup_detail"]["warm_start"] is (mode == "warm")
        # Both paid the imports once: cold in the worker, warm waiting for this engine home's new server.
        assert timing["setup_detail"]["imports_s"] > 1.0
    assert "warm start: pid" in (tmp_path / "warm.log").read_text()
    assert losses["warm"].tolist() == losses["cold"].tolist()  # same seed, same numbers: the fork changed nothing

"""Sampler: CSV columns, no invented GPU zeros, fake NVML, CUDA_VISIBLE_DEVICES mapping, process-tree RSS."""

import csv
import subprocess
import sys
import time
import types

import pytest

from stagedyolo.telemetry import Sampler
from stagedyolo.telemetry.sampler import _visible_nvml_indices

pytestmark = pytest.mark.exclusive  # sample counts and CPU cost per sample are timed (tests/conftest.py)


def read(path):
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


class NVMLError_NotSupported(Exception):
    pass


def fake_nvml(n=2, util=(37, 88), fail_power=False):
    m = types.SimpleNamespace(NVML_TEMPERATURE_GPU=0, NVML_CLOCK_SM=1, shutdown=[])
    m.nvmlInit = lambda: None
    m.nvmlShutdown = lambda: m.shutdown.append(True)
    m.nvmlDeviceGetCount = lambda: n
    m.nvmlDeviceGetHandleByIndex = lambda i: i
    m.nvmlDeviceGetName = lambda h: f"FakeGPU{h}"
    m.nvmlDeviceGetUUID = lambda h: f"GPU-aaaa{h}"
    m.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=util[h], memory=0)
    m.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(used=(h + 1) * 1024 * 2**20, total=80 * 1024 * 2**20)

    def power(h):
        if fail_power:
            raise NVMLError_NotSupported()
        return 250_000 + h

    m.nvmlDeviceGetPowerUsage = power
    m.nvmlDeviceGetTemperature = lambda h, kind: 60 + h
    m.nvmlDeviceGetClockInfo = lambda h, kind: 1980
    return m


def test_no_nvml_gives_empty_gpu_and_reason(tmp_path):
    def boom():
        raise RuntimeError("NVML Shared Library Not Found")

    nv = types.SimpleNamespace(nvmlInit=boom)
    p = tmp_path / "telemetry.csv"
    with Sampler(p, interval_s=0.05, nvml=nv) as s:
        time.sleep(0.3)
    rows = read(p)
    assert len(rows) >= 3
    assert not any(c.startswith("gpu0") for c in rows[0])
    assert all(r["gpu_status"].startswith("no NVML") for r in rows)
    assert "Not Found" in s.info()["gpu_status"]
    # host columns present; the first CPU sample is blank (psutil gives 0.0 over an empty interval), later ones filled
    assert rows[0]["cpu0_pct"] == ""
    assert any(r["cpu0_pct"] != "" for r in rows[1:]) and float(rows[-1]["ram_total_mb"]) > 0
    assert float(rows[-1]["rss_tree_mb"]) > 10  # this pytest process


def test_fake_nvml_columns(tmp_path, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    nv = fake_nvml(fail_power=True)
    p = tmp_path / "t.csv"
    with Sampler(p, interval_s=0.05, nvml=nv) as s:
        time.sleep(0.2)
    rows = read(p)
    r = rows[-1]
    assert r["gpu_status"] == "ok"
    assert float(r["gpu0_util_pct"]) == 37 and float(r["gpu1_util_pct"]) == 88
    assert float(r["gpu1_mem_used_mb"]) == 2048 and float(r["gpu0_mem_total_mb"]) == 81920
    assert r["gpu0_power_w"] == ""  # NotSupported: empty, not zero
    assert float(r["gpu1_temp_c"]) == 61 and float(r["gpu0_sm_clock_mhz"]) == 1980
    assert s.info()["gpu_names"] == ["FakeGPU0", "FakeGPU1"]
    assert nv.shutdown == [True]


def test_gpu_indices_and_cuda_visible_devices(tmp_path, monkeypatch):
    nv = fake_nvml(n=4, util=(1, 2, 3, 4))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,1")
    assert _visible_nvml_indices(nv, 4, None) == [3, 1]
    assert _visible_nvml_indices(nv, 4, [1]) == [1]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-aaaa2")
    assert _visible_nvml_indices(nv, 4, None) == [2]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert _visible_nvml_indices(nv, 4, None) == []
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2")
    p = tmp_path / "t.csv"
    with Sampler(p, interval_s=0.05, nvml=nv):
        time.sleep(0.1)
    r = read(p)[-1]
    assert float(r["gpu0_util_pct"]) == 3 and "gpu1_util_pct" not in r


def test_no_gpu_visible(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "-1")
    p = tmp_path / "t.csv"
    with Sampler(p, interval_s=0.05, nvml=fake_nvml()):
        time.sleep(0.1)
    assert read(p)[-1]["gpu_status"] == "no GPU visible"


def test_rss_tree_includes_children(tmp_path):
    code = (
        "import sys, time; b = bytearray(80 * 2**20); b[::4096] = b'x' * len(b[::4096]); "
        "print('ready', flush=True); time.sleep(30)"
    )
    root = subprocess.Popen(
        [sys.executable, "-c", "import subprocess, sys; subprocess.run([sys.executable, '-c', " + repr(code) + "])"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert root.stdout.readline().strip() == "ready"  # the grandchild has touched its 80 MB
        p = tmp_path / "t.csv"
        with Sampler(p, interval_s=0.05, root_pid=root.pid, nvml=types.SimpleNamespace()):
            time.sleep(0.15)
        assert max(float(r["rss_tree_mb"]) for r in read(p)) >= 80  # root + its child (like dataloader workers)
    finally:
        for c in __import__("psutil").Process(root.pid).children(recursive=True):
            c.kill()
        root.kill()
        root.wait()


def test_overhead_per_sample_small(tmp_path):
    p = tmp_path / "t.csv"
    with Sampler(p, interval_s=0.02, nvml=types.SimpleNamespace()) as s:
        time.sleep(0.4)
    info = s.info()
    assert info["samples"] >= 5
    assert info["sample_cpu_s"] / info["samples"] < 0.01  # < 10 ms CPU per sample -> < 1 % of a core at 1 Hz

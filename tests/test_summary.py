"""build_timing / write_timing: accounting, steady state, GPU stats from telemetry, schema."""

import csv
import json

import jsonschema
import pytest

from stagedyolo.telemetry import build_timing, write_timing
from stagedyolo.telemetry.summary import effective_batch, load_schema, validate_timing

META = {
    "stage": "s1",
    "batch": 16,
    "workers": 2,
    "amp": True,
    "img": 640,
    "cache": "none",
    "device": "0",
    "epochs": 3,
    "attempts": [{"attempt": 1, "rc": 0}],
    "threads": 4,
    "gpus": 1,
}


def epoch(i, train=10.0, dw=1.0, cp=8.5, val=2.0, log=0.2, ckpt=0.5, images=320, batches=20, blog=0.0):
    return {
        "epoch": i,
        "complete": True,
        "validated": True,
        "saved": True,
        "gap_before_s": 0.0,
        "tail_s": 0.01,
        "batches": batches,
        "images": images,
        "data_wait_s": dw,
        "compute_s": cp,
        "batch_logging_s": blog,
        "train_s": train,
        "val_s": val,
        "logging_s": log,
        "checkpoint_s": ckpt,
        "compute_p50_s": cp / batches,
        "data_wait_p90_s": 0.1,
        "t_start_unix": 1000.0 + 20 * i,
    }


def raw(epochs, setup=30.0, final=None, t0=1000.0, t1=1100.0, memory=None):
    return {
        "version": 1,
        "setup_s": setup,
        "setup_imports_s": 10.0,
        "setup_build_s": setup - 10.0,
        "train_start_unix": t0,
        "train_end_unix": t1,
        "finished": True,
        "epochs": epochs,
        "final": final or {"checkpoint_s": 0.5, "val_s": 3.0, "logging_s": 1.0},
        "memory": memory
        or {
            "torch_max_allocated_bytes": None,
            "torch_max_reserved_bytes": None,
            "total_bytes": None,
            "reason": "device is not CUDA",
        },
        "sync": "x",
        "errors": [],
    }


def write_csv(path, rows, gpus=0, status="ok"):
    cols = ["timestamp", "elapsed_s", "gpu_status"]
    for k in range(gpus):
        cols += [
            f"gpu{k}_{f}" for f in ("util_pct", "mem_used_mb", "mem_total_mb", "power_w", "temp_c", "sm_clock_mhz")
        ]
    cols += [
        "cpu0_pct",
        "cpu1_pct",
        "cpu_mean_pct",
        "rss_tree_mb",
        "ram_available_mb",
        "ram_total_mb",
        "disk_read_bytes",
        "disk_read_mb_s",
    ]
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(cols)
        for r in rows:
            line = [r["ts"], r["ts"] - 990, status]
            for k in range(gpus):
                line += [r["util"][k], r["mem"][k], 81920, 300, 60, 1980]
            line += [
                r["cpu"],
                r["cpu"],
                r["cpu"],
                r.get("rss", 1000),
                r.get("avail", 30000),
                64000,
                r.get("disk", 0),
                "",
            ]
            w.writerow(line)
    return path


def test_phases_sum_to_wall_and_steady_state(tmp_path):
    eps = [epoch(0, train=20.0, dw=10.0, cp=9.0), epoch(1), epoch(2)]
    t = build_timing(raw(eps), None, wall_s=100.0, meta=META)
    ph = t["phases"]
    assert sum(p["s"] for p in ph.values()) == pytest.approx(100.0, abs=1e-3)
    assert sum(p["share"] for p in ph.values()) == pytest.approx(1.0, abs=1e-4)
    assert ph["setup"]["s"] == 30.0 and ph["train"]["s"] == pytest.approx(40.0)
    assert ph["val"]["s"] == pytest.approx(6.0 + 3.0)
    assert ph["checkpoint"]["s"] == pytest.approx(1.5 + 0.5)
    assert ph["logging"]["s"] == pytest.approx(0.6 + 1.0)
    assert t["throughput"]["steady_images_per_s"] == pytest.approx(32.0)  # epochs 1,2 only
    assert t["throughput"]["steady_epochs"] == [1, 2]
    assert t["first_epoch_overhead"] == pytest.approx(2.0)
    assert t["data_wait"]["share"] == pytest.approx(12.0 / (12.0 + 26.0), abs=1e-4)
    assert t["data_wait"]["steady_share"] == pytest.approx(1.0 / 9.5, abs=1e-4)
    assert t["config"]["effective_batch"] == 64 and t["attempts"] == META["attempts"]
    validate_timing(t)


def test_no_gpu_is_null_with_reason(tmp_path):
    rows = [{"ts": 1000 + i, "cpu": 50 + i} for i in range(5)]
    p = write_csv(tmp_path / "telemetry.csv", rows, gpus=0, status="no NVML: NVMLError_LibraryNotFound")
    t = build_timing(raw([epoch(0)]), p, wall_s=60.0, meta=dict(META, device="cpu", gpus=0))
    g = t["gpu"]
    assert g["available"] is False and g["util_pct"] is None and g["peak_memory_share"] is None
    assert "NVML" in g["reason"]
    assert t["first_epoch_overhead"] is None and t["first_epoch_overhead_reason"]
    assert t["throughput"]["basis"] == "the only epoch"
    assert t["cpu"]["util_mean_pct"] == pytest.approx(52.0) and t["cpu"]["cores"] == 2
    out = write_timing(tmp_path, t)
    assert json.loads(out["json"].read_text()) == t
    md = out["md"].read_text()
    assert "GPU: none" in md and "| train |" in md


def test_nvml_memory_without_utilisation_readings_is_null_and_torch_share_stays(tmp_path):
    # NVML answered memory but no utilisation (gpu_status says why): the GPU is not "available", so no NVML figure
    # may be reported, the memory share included; torch's own reserved peak is a measurement and stays
    rows = [{"ts": 1000 + i, "util": [""], "mem": [70000], "cpu": 50} for i in range(5)]
    p = write_csv(tmp_path / "telemetry.csv", rows, gpus=1, status="NVMLError_NotSupported: utilization")
    t = build_timing(raw([epoch(0)]), p, wall_s=60.0, meta=META)
    g = t["gpu"]
    assert g["available"] is False and "NotSupported" in g["reason"]
    assert g["nvml_peak_used_mb"] is None and g["peak_memory_share"] is None
    mem = {"torch_max_allocated_bytes": 8 * 2**30, "torch_max_reserved_bytes": 10 * 2**30, "total_bytes": 80 * 2**30}
    g = build_timing(raw([epoch(0)], memory=mem), p, wall_s=60.0, meta=META)["gpu"]
    assert g["peak_memory_share"] == pytest.approx(0.125) and g["torch_peak_reserved_mb"] == pytest.approx(10240.0)


def test_gpu_stats_use_training_window(tmp_path):
    # samples before train start (t<1000) have util 0 (setup) and must not dilute the training utilisation
    rows = [{"ts": 990 + i, "util": [0, 0], "mem": [500, 500], "cpu": 10} for i in range(10)]
    rows += [{"ts": 1000 + i, "util": [10 * (i % 10), 90], "mem": [70000, 40000], "cpu": 80} for i in range(100)]
    p = write_csv(tmp_path / "telemetry.csv", rows, gpus=2)
    mem = {
        "torch_max_allocated_bytes": 60000 * 2**20,
        "torch_max_reserved_bytes": 65000 * 2**20,
        "total_bytes": 81920 * 2**20,
        "reason": None,
    }
    t = build_timing(raw([epoch(0), epoch(1)], t0=1000.0, t1=1099.0, memory=mem), p, wall_s=200, meta=META)
    g = t["gpu"]
    assert g["available"] and g["window"] == "train" and g["count"] == 2
    assert g["per_gpu"][1]["util_pct"]["mean"] == pytest.approx(90.0)
    assert g["per_gpu"][0]["util_pct"]["p50"] == pytest.approx(45.0)  # 0..90, ten each
    assert g["util_pct"]["n"] == 200
    assert g["nvml_peak_used_mb"] == 70000
    assert g["peak_memory_share"] == pytest.approx(70000 / 81920, abs=1e-4)
    assert g["torch_peak_reserved_mb"] == pytest.approx(65000.0)
    assert t["cpu"]["util_mean_pct"] == pytest.approx(80.0)
    validate_timing(t)


def test_phases_exceeding_wall_raise_wall_with_warning():
    t = build_timing(raw([epoch(0)]), None, wall_s=10.0, meta=META)
    assert t["wall_s"] == pytest.approx(sum(p["s"] for p in t["phases"].values()), abs=1e-3)
    assert t["phases"]["other"]["s"] == 0
    assert any("exceed" in w for w in t["warnings"])


def test_empty_raw_still_valid():
    t = build_timing({}, None, wall_s=5.0, meta={"stage": "x"})
    validate_timing(t)
    assert t["phases"]["other"]["share"] == pytest.approx(1.0)
    assert t["throughput"]["steady_images_per_s"] is None


def test_schema_rejects_bad_documents():
    t = build_timing(raw([epoch(0), epoch(1)]), None, wall_s=100.0, meta=META)
    bad = json.loads(json.dumps(t))
    bad["phases"]["train"]["share"] = 1.5
    with pytest.raises(jsonschema.ValidationError):
        validate_timing(bad)
    bad = json.loads(json.dumps(t))
    bad["gpu"]["reason"] = None  # no GPU readings must come with a reason
    with pytest.raises(jsonschema.ValidationError):
        validate_timing(bad)
    jsonschema.Draft202012Validator.check_schema(load_schema())


@pytest.mark.parametrize("b,e", [(16, 64), (64, 64), (48, 48), (128, 128), (1, 64), (None, None)])
def test_effective_batch(b, e):
    assert effective_batch(b) == e


def test_ddp_rank0_images_scaled():
    t = build_timing(raw([epoch(0), epoch(1)]), None, wall_s=100.0, meta=dict(META, gpus=4))
    assert t["epochs"][1]["images"] == 4 * 320 and t["throughput"]["rank0_images_scale"] == 4
    assert t["throughput"]["steady_images_per_s"] == pytest.approx(4 * 32.0)


def test_sampler_info_spread_into_meta():
    info = {"gpu_status": "ok", "gpu_names": ["H200"], "samples": 3, "sample_cpu_s": 0.01, "interval_s": 1.0}
    t = build_timing(raw([epoch(0)]), None, wall_s=100.0, meta={**META, **info})
    assert t["telemetry"]["sampler"] == info and t["gpu"]["names"] == ["H200"]
    validate_timing(t)

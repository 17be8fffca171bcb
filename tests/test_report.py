"""build_report: the plotted DATA equals the inputs (sidecar JSON, figure artists, TensorBoard read-back)."""

import csv
import json
import math

import pytest

from stagedyolo.diagnosis import diagnose, write_diagnosis
from stagedyolo.report import FILES, build_report, collect, plot_map50, plot_phases, plot_throughput, series
from stagedyolo.telemetry import build_timing, write_timing

COLS = [
    "epoch",
    "train/box_loss",
    "train/obj_loss",
    "train/cls_loss",
    "metrics/precision",
    "metrics/recall",
    "metrics/mAP_0.5",
    "metrics/mAP_0.5:0.95",
    "val/box_loss",
    "val/obj_loss",
    "val/cls_loss",
    "x/lr0",
    "x/lr1",
    "x/lr2",
]


def write_results(path, map50s):
    """yolov5's format: every field padded to 20 characters."""
    lines = [",".join(f"{c:>20}" for c in COLS)]
    for i, m in enumerate(map50s):
        vals = [i, 0.1, 0.05, 0.02, 0.5, 0.4, m, m / 2 if m == m else m, 0.1, 0.05, 0.02, 0.01, 0.01, 0.01]
        lines.append(",".join(f"{v:20.5g}" for v in vals))
    path.write_text("\n".join(lines) + "\n")


def make_stage(d, name, ips, map50s, gpu_util=None):
    d.mkdir(parents=True)
    eps = []
    for i, v in enumerate(ips):
        train = 320 / v
        eps.append(
            {
                "epoch": i,
                "complete": True,
                "validated": True,
                "saved": True,
                "batches": 20,
                "images": 320,
                "train_s": train,
                "data_wait_s": 0.1 * train,
                "compute_s": 0.9 * train,
                "val_s": 1.0,
                "logging_s": 0.1,
                "checkpoint_s": 0.2,
                "batch_logging_s": 0.0,
                "tail_s": 0.0,
                "gap_before_s": 0.0,
            }
        )
    raw = {
        "setup_s": 12.0,
        "train_start_unix": 1000.0,
        "train_end_unix": 1100.0,
        "finished": True,
        "epochs": eps,
        "final": {"val_s": 1.0, "checkpoint_s": 0.1, "logging_s": 0.5},
        "memory": {"reason": "device is not CUDA"},
    }
    cols = (
        ["timestamp", "elapsed_s", "gpu_status"]
        + (
            [
                "gpu0_util_pct",
                "gpu0_mem_used_mb",
                "gpu0_mem_total_mb",
                "gpu0_power_w",
                "gpu0_temp_c",
                "gpu0_sm_clock_mhz",
            ]
            if gpu_util
            else []
        )
        + [
            "cpu0_pct",
            "cpu_mean_pct",
            "rss_tree_mb",
            "ram_available_mb",
            "ram_total_mb",
            "disk_read_bytes",
            "disk_read_mb_s",
        ]
    )
    cpu = [10.0 * (i % 10) for i in range(12)]
    with open(d / "telemetry.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(cols)
        for i, c in enumerate(cpu):
            g = [gpu_util[i], 1000, 80000, 200, 50, 1900] if gpu_util else []
            w.writerow([1000 + i, i, "ok" if gpu_util else "no NVML: x"] + g + [c, c, 500, 9000, 16000, 0, ""])
    t = build_timing(
        raw,
        d / "telemetry.csv",
        wall_s=60.0,
        meta={"stage": name, "batch": 16, "workers": 2, "img": 128, "cache": "none", "epochs": len(ips)},
    )
    write_timing(d, t)
    write_diagnosis(d, diagnose(t))
    write_results(d / "results.csv", map50s)
    return t, cpu


@pytest.fixture(scope="module")
def two_stages(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("stages")
    nan = float("nan")
    a = make_stage(tmp_path / "a", "frozen", [20.0, 40.0, 41.0], [0.1, nan, 0.3])
    b = make_stage(tmp_path / "b", "unfrozen", [30.0, 35.0], [0.35, 0.42], gpu_util=[50 + i for i in range(12)])
    dirs = {"frozen": tmp_path / "a", "unfrozen": tmp_path / "b"}
    out = tmp_path / "report"
    return dirs, a, b, build_report(dirs, out)


def test_report_files_and_table(two_stages):
    dirs, (ta, _), (tb, _), paths = two_stages
    assert set(paths) == set(FILES)
    for k, p in paths.items():
        assert p.exists(), k
        if k.endswith("_png"):
            assert p.read_bytes()[:4] == b"\x89PNG"
    rows = list(csv.DictReader(open(paths["table_csv"])))
    assert [r["stage"] for r in rows] == ["frozen", "unfrozen"]
    assert float(rows[0]["map50_final"]) == pytest.approx(0.3) and float(rows[0]["map50_best"]) == pytest.approx(0.3)
    assert float(rows[1]["map50_final"]) == pytest.approx(0.42)
    assert float(rows[0]["images_per_s"]) == pytest.approx(ta["throughput"]["steady_images_per_s"])
    assert rows[0]["gpu_util_mean_%"] == "" and float(rows[1]["gpu_util_mean_%"]) == pytest.approx(55.5, abs=0.1)
    md = paths["table_md"].read_text()
    assert "| frozen" in md and "## Diagnoses" in md and "### unfrozen" in md
    assert "<table" in paths["table_html"].read_text()


def test_plot_data_matches_inputs(two_stages):
    dirs, (ta, cpu_a), (tb, cpu_b), paths = two_stages
    d = json.loads(paths["plot_data"].read_text())
    for name, t in (("frozen", ta), ("unfrozen", tb)):
        assert d["phases_s"][name] == [t["phases"][k]["s"] for k in d["phase_names"]]
        assert sum(d["phases_s"][name]) == pytest.approx(t["wall_s"], abs=1e-3)
    assert d["throughput"]["images_per_s"] == pytest.approx([20.0, 40.0, 41.0, 30.0, 35.0], abs=1e-3)
    assert d["throughput"]["x"] == [0, 1, 2, 3, 4]
    assert d["map50"]["map50"][:3] == [0.1, None, 0.3] and d["map50"]["map50"][3:] == [0.35, 0.42]
    assert d["map50"]["x"] == [0, 1, 2, 3, 4] and d["stage_bounds"] == [3, 5]
    assert d["utilization"]["frozen"]["cpu"] == cpu_a and d["utilization"]["frozen"]["gpu"] == {}
    assert d["utilization"]["unfrozen"]["gpu"]["0"] == [50.0 + i for i in range(12)]


def test_figures_draw_the_series(two_stages):
    dirs, (ta, _), (tb, _), _ = two_stages
    data = series(collect(dirs))
    fig = plot_phases(data)
    ax = fig.axes[0]
    n = len(dirs)
    heights = [p.get_height() for p in ax.patches]  # phase-major: 6 phases x n stages
    for i, k in enumerate(data["phase_names"]):
        assert heights[i * n : (i + 1) * n] == pytest.approx([ta["phases"][k]["s"], tb["phases"][k]["s"]], abs=1e-3)
    lines = plot_map50(data).axes[0].get_lines()
    drawn = {ln.get_label(): list(ln.get_ydata()) for ln in lines if not ln.get_label().startswith("_")}
    assert drawn["frozen"] == pytest.approx([0.1, 0.3]) and drawn["unfrozen"] == pytest.approx([0.35, 0.42])
    lines = plot_throughput(data).axes[0].get_lines()
    drawn = {ln.get_label(): list(ln.get_xdata()) for ln in lines}
    assert drawn == {"frozen": [0, 1, 2], "unfrozen": [3, 4]}


def test_tensorboard_scalars(two_stages):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    dirs, _, _, paths = two_stages
    ea = EventAccumulator(str(paths["tensorboard"]))
    ea.Reload()
    tags = set(ea.Tags()["scalars"])
    assert {
        "throughput/images_per_s/frozen",
        "utilization/unfrozen/gpu0_util_pct",
        "utilization/frozen/cpu_mean_pct",
    } <= tags
    assert "utilization/frozen/gpu0_util_pct" not in tags
    thr = [(e.step, e.value) for e in ea.Scalars("throughput/images_per_s/unfrozen")]
    assert thr == [(3, pytest.approx(30.0, abs=1e-3)), (4, pytest.approx(35.0, abs=1e-3))]
    g = [e.value for e in ea.Scalars("utilization/unfrozen/gpu0_util_pct")]
    assert g == [50.0 + i for i in range(12)]


def test_missing_files_tolerated(tmp_path):
    (tmp_path / "empty").mkdir()
    paths = build_report({"ghost": tmp_path / "empty"}, tmp_path / "r")
    rows = list(csv.DictReader(open(paths["table_csv"])))
    assert rows[0]["stage"] == "ghost" and rows[0]["verdict"] == "no diagnosis"
    d = json.loads(paths["plot_data"].read_text())
    assert d["phases_s"]["ghost"] == [0.0] * 6 and not any(math.isnan(x) for x in d["phases_s"]["ghost"])


def test_build_report_for_rule(two_stages, tmp_path):
    from stagedyolo.report import build_report_for_rule

    dirs, _, _, _ = two_stages
    out = tmp_path / "rep" / "summary.md"
    log = tmp_path / "logs" / "report.log"
    paths = build_report_for_rule(
        [dirs["frozen"] / "timing.json", dirs["unfrozen"] / "timing.json"], summary_md=out, log_path=log
    )
    assert paths["table_md"] == out and out.exists() and (out.parent / "map50.png").exists()
    rows = list(csv.DictReader(open(paths["table_csv"])))
    assert [r["stage"] for r in rows] == ["a", "b"]  # folder names, in the given order
    assert "phases_png" in log.read_text()


def test_the_report_shows_the_test_split_table(two_stages, tmp_path):
    dirs = two_stages[0]
    metrics = tmp_path / "test_metrics.json"
    metrics.write_text(
        json.dumps(
            {
                "test_split": ["/data/test"],
                "weights": "last.pt",
                "img": 160,
                "all": {"precision": 0.9, "recall": 0.8, "ap50": 0.95, "ap50_95": 0.7},
                "classes": [
                    {"class": "circle", "instances": 5, "precision": 0.9, "recall": 0.8, "ap50": 0.95, "ap50_95": 0.7}
                ],
            }
        )
    )
    paths = build_report(dirs, tmp_path / "report", test_metrics=metrics)
    summary = paths["table_md"].read_text()
    assert "## Test split" in summary and "| circle | 5 | 0.9000 | 0.8000 | 0.9500 | 0.7000 |" in summary
    assert "<h2>Test split</h2>" in paths["table_html"].read_text()
    none = tmp_path / "none.json"
    none.write_text(json.dumps({"test_split": None, "reason": "data.yaml has no test: split"}))
    paths = build_report(dirs, tmp_path / "report2", test_metrics=none)
    assert "No test-split score: data.yaml has no test: split." in paths["table_md"].read_text()


def test_a_finding_that_changes_what_is_trained_says_so_in_the_report():
    from stagedyolo.report import _diagnoses_md

    finding = {
        "title": "Data-loading bound",
        "change": "stages.s.img: 96",
        "why": "CPUs are saturated",
        "also": [],
        "trade_off": {"summary": "changes what is trained", "detail": "trains and detects at a lower resolution"},
    }
    plain = {**finding, "change": "stages.s.workers: 4", "trade_off": None}
    md = _diagnoses_md([{"name": "s", "diagnosis": {"verdict": "v", "findings": [finding, plain]}}])
    assert md.count("trade-off:") == 1 and "  - trade-off: trains and detects at a lower resolution" in md

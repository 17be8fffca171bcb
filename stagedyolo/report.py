"""Cross-stage report: one table, plots, all diagnoses and TensorBoard scalars.

``build_report(stage_dirs, out_dir, test_metrics)`` reads, per stage dir: timing.json, telemetry.csv, diagnosis.json
and results.csv (yolov5 format), and the evaluate_test rule's test_metrics.json (the "Test split" section). Missing
files are tolerated (the stage shows n/a). Every plotted series is also
written to ``plot_data.json`` so tests and readers can check what was drawn.
"""

from __future__ import annotations

import html
import json
import time
from pathlib import Path

from stagedyolo.jsonio import read_json
from stagedyolo.telemetry.summary import PHASES
from stagedyolo.telemetry.summary import finite as _num
from stagedyolo.yolov5_facts import MAP50_COLUMN

FILES = {
    "table_md": "summary.md",
    "table_html": "summary.html",
    "table_csv": "stages.csv",
    "phases_png": "phases.png",
    "utilization_png": "utilization.png",
    "throughput_png": "throughput.png",
    "map50_png": "map50.png",
    "plot_data": "plot_data.json",
    "tensorboard": "tensorboard",
}


def read_results(path) -> dict:
    """yolov5 results.csv -> {'epoch': [...], 'map50': [...]} (nan -> None). Padded columns are handled."""
    import pandas as pd

    p = Path(path)
    if not p.exists():
        return {"epoch": [], "map50": []}
    df = pd.read_csv(p, skipinitialspace=True)
    df.columns = [c.strip() for c in df.columns]
    if MAP50_COLUMN not in df.columns:
        return {"epoch": [], "map50": []}
    ep = [int(_num(e)) if _num(e) is not None else i for i, e in enumerate(df.get("epoch", range(len(df))))]
    return {"epoch": ep, "map50": [_num(v) for v in pd.to_numeric(df[MAP50_COLUMN], errors="coerce")]}


def read_telemetry_series(path) -> dict:
    """telemetry.csv -> {'t': elapsed seconds, 'cpu': cpu_mean_pct, 'gpu': {k: util list}} (blanks -> None)."""
    from stagedyolo.telemetry.summary import gpu_ids, read_telemetry

    cols, rows = read_telemetry(path)
    out = {"t": [_num(r.get("elapsed_s")) for r in rows], "cpu": [_num(r.get("cpu_mean_pct")) for r in rows], "gpu": {}}
    for k in gpu_ids(cols):
        vals = [_num(r.get(f"gpu{k}_util_pct")) for r in rows]
        if any(v is not None for v in vals):
            out["gpu"][str(k)] = vals
    return out


def collect(stage_dirs: dict) -> list[dict]:
    """Load everything the report needs, in stage order."""
    stages = []
    for name, d in stage_dirs.items():
        d = Path(d)
        stages.append(
            {
                "name": name,
                "dir": str(d),
                "timing": read_json(d / "timing.json"),
                "diagnosis": read_json(d / "diagnosis.json"),
                "results": read_results(d / "results.csv"),
                "telemetry": read_telemetry_series(d / "telemetry.csv"),
            }
        )
    return stages


def _pct(x):
    return None if x is None else round(100 * x, 1)


def table_rows(stages) -> list[dict]:
    rows = []
    for s in stages:
        t = s["timing"] or {}
        ph, config = t.get("phases") or {}, t.get("config") or {}
        g, c, th = t.get("gpu") or {}, t.get("cpu") or {}, t.get("throughput") or {}
        m = [v for v in s["results"]["map50"] if v is not None]
        diag = s["diagnosis"] or {}
        rows.append(
            {
                "stage": s["name"],
                "epochs": t.get("epochs_completed"),
                "img": config.get("img"),  # the size it trained at (img_from_boxes may raise it)
                "wall_s": _num(t.get("wall_s")),
                **{f"{k}_%": _pct((ph.get(k) or {}).get("share")) for k in PHASES},
                "images_per_s": th.get("steady_images_per_s"),
                "it_per_s": th.get("steady_it_per_s"),
                "predicted_images_per_s": (t.get("prediction") or {}).get("predicted_images_per_s"),
                "data_wait_%": _pct((t.get("data_wait") or {}).get("share")),
                "gpu_util_mean_%": (g.get("util_pct") or {}).get("mean") if g.get("available") else None,
                "gpu_peak_mem_%": _pct(g.get("peak_memory_share")),
                "cpu_util_mean_%": c.get("util_mean_pct"),
                "peak_rss_mb": c.get("peak_rss_mb"),
                "first_epoch_x": t.get("first_epoch_overhead"),
                "map50_final": round(m[-1], 4) if m else None,
                "map50_best": round(max(m), 4) if m else None,
                "batch": config.get("batch"),
                "workers": config.get("workers"),
                "verdict": diag.get("verdict") or ("no diagnosis" if not diag else ""),
            }
        )
    return rows


def series(stages) -> dict:
    """Every plotted series (written to plot_data.json)."""
    phases = {
        s["name"]: [((s["timing"] or {}).get("phases") or {}).get(k, {}).get("s", 0.0) for k in PHASES] for s in stages
    }
    throughput, map50, bounds = [], [], []  # points (x on the run's epoch axis, value, stage)
    offset = 0
    for s in stages:
        eps = (s["timing"] or {}).get("epochs") or []
        throughput += [(offset + e["epoch"], e.get("images_per_s"), s["name"]) for e in eps]
        map50 += [(offset + i, v, s["name"]) for i, v in enumerate(s["results"]["map50"])]
        offset += max(len(eps), len(s["results"]["epoch"]))
        bounds.append(offset)
    return {
        "phase_names": list(PHASES),
        "phases_s": phases,
        "throughput": _columns(throughput, ("x", "images_per_s", "stage")),
        "map50": _columns(map50, ("x", "map50", "stage")),
        "stage_bounds": bounds,
        "utilization": {s["name"]: s["telemetry"] for s in stages},
    }


def _columns(points: list[tuple], names: tuple[str, ...]) -> dict:
    return {name: [p[i] for p in points] for i, name in enumerate(names)}


def _mpl():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_phases(data):
    plt = _mpl()
    names = list(data["phases_s"])
    fig, ax = plt.subplots(figsize=(max(5, 1.2 * len(names) + 2), 4))
    bottom = [0.0] * len(names)
    for i, ph in enumerate(data["phase_names"]):
        vals = [data["phases_s"][n][i] or 0.0 for n in names]
        ax.bar(names, vals, bottom=bottom, label=ph)
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.set_ylabel("seconds")
    ax.set_title("Wall time by phase")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1, 1))
    fig.tight_layout()
    return fig


def plot_utilization(data):
    plt = _mpl()
    util = data["utilization"]
    n = max(len(util), 1)
    fig, axes = plt.subplots(n, 1, figsize=(8, 2.2 * n), squeeze=False)
    for ax, (name, u) in zip(axes[:, 0], util.items()):
        lines = {"CPU mean %": u["cpu"], **{f"GPU{k} util %": v for k, v in u["gpu"].items()}}
        for label, vals in lines.items():
            pts = [(t, v) for t, v in zip(u["t"], vals) if t is not None and v is not None]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], label=label)
        ax.set_ylim(0, 105)
        ax.set_ylabel("%")
        ax.set_title(name + ("" if u["gpu"] else " (no GPU readings)"), fontsize=9)
        ax.legend(fontsize=7, loc="lower right")
    axes[-1, 0].set_xlabel("seconds since stage start")
    fig.tight_layout()
    return fig


def _by_stage(xs, ys, stages):
    out = {}
    for x, y, s in zip(xs, ys, stages):
        if y is not None:
            stage_x, stage_y = out.setdefault(s, ([], []))
            stage_x.append(x)
            stage_y.append(y)
    return out


def _epoch_lines(series, key, ylabel, title, stage_bounds=()):
    """One line per stage over the run's epoch axis, with a dashed line where each stage ends."""
    plt = _mpl()
    fig, ax = plt.subplots(figsize=(8, 3.5))
    for s, (x, y) in _by_stage(series["x"], series[key], series["stage"]).items():
        ax.plot(x, y, marker="o", label=s)
    for b in stage_bounds:
        ax.axvline(b - 0.5, color="grey", lw=0.5, ls="--")
    ax.set_xlabel("epoch (all stages)")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    if series["x"]:
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_throughput(data):
    return _epoch_lines(data["throughput"], "images_per_s", "train images/s", "Throughput per epoch")


def plot_map50(data):
    return _epoch_lines(
        data["map50"], "map50", "mAP@0.5", "Validation mAP@0.5 across stages", data["stage_bounds"][:-1]
    )


PLOTS = {
    "phases_png": plot_phases,
    "utilization_png": plot_utilization,
    "throughput_png": plot_throughput,
    "map50_png": plot_map50,
}


class ScalarWriter:
    """Scalar-only TensorBoard writer on tensorboard's own EventFileWriter: the same event files
    torch.utils.tensorboard.SummaryWriter writes (it wraps the same class), without importing torch (~5 s)."""

    def __init__(self, logdir):
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        self._w = EventFileWriter(str(logdir))

    def add_scalar(self, tag, value, step, walltime=None):
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary

        ev = Event(
            wall_time=walltime or time.time(),
            step=int(step),
            summary=Summary(value=[Summary.Value(tag=tag, simple_value=float(value))]),
        )
        self._w.add_event(ev)

    def close(self):
        self._w.close()


def write_tensorboard(data, logdir) -> Path:
    """Scalars: throughput/images_per_s/<stage> per global epoch; utilization/<stage>/cpu_mean_pct and
    utilization/<stage>/gpu<k>_util_pct per telemetry sample (step = sample index, walltime = sample time)."""
    logdir = Path(logdir)
    logdir.mkdir(parents=True, exist_ok=True)
    w = ScalarWriter(logdir)
    try:
        d = data["throughput"]
        for x, y, s in zip(d["x"], d["images_per_s"], d["stage"]):
            if y is not None:
                w.add_scalar(f"throughput/images_per_s/{s}", y, x)
        for s, u in data["utilization"].items():
            lines = {"cpu_mean_pct": u["cpu"], **{f"gpu{k}_util_pct": v for k, v in u["gpu"].items()}}
            for name, vals in lines.items():
                for i, v in enumerate(vals):
                    if v is not None:
                        w.add_scalar(f"utilization/{s}/{name}", v, i)
    finally:
        w.close()
    return logdir


def _diagnoses_md(stages) -> str:
    out = ["## Diagnoses", ""]
    for s in stages:
        d = s["diagnosis"]
        out.append(f"### {s['name']}")
        out.append("")
        if not d:
            out += ["No diagnosis.json.", ""]
            continue
        out += [d.get("verdict", ""), ""]
        for f in d.get("findings", []):
            out.append(f"- **{f['title']}**: `{f['change']}` ({f.get('why', '')})")
            out += [f"  - trade-off: {f['trade_off']['detail']}"] if f.get("trade_off") else []
            out += [f"  - also: `{a}`" for a in f.get("also", [])]
        for n in d.get("not_evaluated", []):
            out.append(f"- not evaluated `{n['code']}`: {n['reason']}")
        out.append("")
    return "\n".join(out)


def build_report(stage_dirs: dict, out_dir, test_metrics=None, env=None) -> dict:
    """Write the cross-stage report into ``out_dir``; return {key: path} for every file/dir in FILES. ``env``: the
    run's env.json, whose first-job stamp starts the fixed costs' clock (stagedyolo.fixed_costs)."""
    import pandas as pd

    from stagedyolo import fixed_costs, recipe_budget
    from stagedyolo.evaluate import markdown as test_markdown

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {k: out / v for k, v in FILES.items()}
    stages = collect(stage_dirs)
    rows = table_rows(stages)
    df = pd.DataFrame(rows)
    data = series(stages)
    data["table"] = rows

    df.to_csv(paths["table_csv"], index=False)
    diag_md = _diagnoses_md(stages)
    test = read_json(test_metrics) if test_metrics else None
    test_md = test_markdown(test, heading="##") if test else ""
    env_facts = (read_json(env) or {}) if env else {}
    costs = fixed_costs.fixed_costs(
        env_facts.get("job_started_unix"),
        stages,
        env_facts.get("snakemake_started_unix"),
        env_facts.get("snakemake_call_unix"),
    )
    data["fixed_costs"] = costs
    costs_md = fixed_costs.markdown(costs)
    data["time_budget"] = recipe_budget.budget_use(stages)
    budget_md = recipe_budget.budget_markdown(data["time_budget"])
    costs_md += f"\n{budget_md}" if budget_md else ""
    paths["table_md"].write_text(
        f"# Stages\n\n{df.to_markdown(index=False, floatfmt='.4g')}\n\n{costs_md}\n{test_md}\n{diag_md}\n"
    )
    imgs = "".join(f'<h3>{k[:-4]}</h3><img src="{FILES[k]}" style="max-width:100%">' for k in PLOTS)
    diag_html = "".join(
        f"<h3>{s['name']}</h3><p>{(s['diagnosis'] or {}).get('verdict', 'no diagnosis')}</p><ul>"
        + "".join(
            f"<li><b>{f['title']}</b>: <code>{f['change']}</code> ({f.get('why', '')})"
            + (f"; trade-off: {f['trade_off']['detail']}" if f.get("trade_off") else "")
            + "</li>"
            for f in (s["diagnosis"] or {}).get("findings", [])
        )
        + "</ul>"
        for s in stages
    )
    paths["table_html"].write_text(
        "<!doctype html><html><head><meta charset='utf-8'><title>stagedyolo stages</title></head><body>"
        f"<h2>Stages</h2>{df.to_html(index=False, na_rep='n/a', float_format=lambda v: f'{v:.4g}')}"
        f"<pre>{html.escape(costs_md)}</pre>{_test_html(test)}"
        f"<h2>Diagnoses</h2>{diag_html}<h2>Plots</h2>{imgs}</body></html>\n"
    )

    plt = _mpl()
    for key, plot in PLOTS.items():
        fig = plot(data)
        fig.savefig(paths[key], dpi=100)
        plt.close(fig)
    paths["plot_data"].write_text(json.dumps(data, indent=1))
    write_tensorboard(data, paths["tensorboard"])
    return paths


def _test_html(test: dict | None) -> str:
    if not test:
        return ""
    if test.get("test_split") is None:
        return f"<h2>Test split</h2><p>No test-split score: {test['reason']}.</p>"
    import pandas as pd

    from stagedyolo.evaluate import caption, table_rows

    table = pd.DataFrame(table_rows(test)).to_html(index=False, na_rep="n/a", float_format=lambda v: f"{v:.4f}")
    return f"<h2>Test split</h2><p>{html.escape(caption(test))}</p>{table}"


def build_report_for_rule(timings, summary_md, log_path=None, test_metrics=None, env=None, **_unused) -> dict:
    """Snakemake adapter: ``timings`` are the stages' timing.json paths in stage order (stage name = folder name);
    everything is written next to ``summary_md``. Extra keyword arguments are accepted and ignored."""
    import logging

    stage_dirs = {Path(t).parent.name: Path(t).parent for t in timings}
    out_dir = Path(summary_md).parent
    log = logging.getLogger("stagedyolo.report")
    handler = None
    if log_path:
        Path(log_path).parent.mkdir(parents=True, exist_ok=True)
        handler = logging.FileHandler(log_path)
        log.addHandler(handler)
        log.setLevel(logging.INFO)
    try:
        log.info("report for stages %s -> %s", list(stage_dirs), out_dir)
        paths = build_report(stage_dirs, out_dir, test_metrics, env)
        for k, p in paths.items():
            log.info("%s: %s", k, p)
        return paths
    finally:
        if handler:
            log.removeHandler(handler)
            handler.close()

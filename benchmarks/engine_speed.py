"""Engine speed: `engine.mode: fast` vs `reproducible` vs bare `python -m yolov5.train`, at the same settings,
in one run,
plus each fast-mode patch's own effect (fast vs fast with that one row skipped: `engine.skip_patches`).

Every variant trains the demo target set (the staged copy, as the pipeline prepares it) from the demo
pretrained.pt: `--epochs` (3) epochs, img 128, batch 16, 1 loader worker + 1 torch thread (2 cores), AdamW with
the complete hyp of the default config's stage_defaults, nominal_batch 64 and min_warmup_iters 100 (yolov5's own
constants, which bare yolov5 cannot change), no cache, no plots, validation every epoch, seed 0, CPU.
- bare: `python -m yolov5.train` with those options, OMP_NUM_THREADS=1, the engine's offline environment.
- reproducible / fast / fast-minus-<row>: one stage each through stagedyolo.stage_plan.build_plan + run_stage (what the
  train_stage rule runs), the engine section of the plan set per variant.
The variants run in rounds; the order rotates each round (>= 3 rounds: the spread is reported).

Measures:
- steady train images/s (stages): timing.json throughput.steady_images_per_s (epochs after the first, training only).
- epoch-loop images/s (all, bare included): a poller stamps each results.csv row (one per epoch, after validation);
  train images / the median interval between rows after the first. Bare yolov5 has no timing.json, so
  speedup_vs_bare uses this measure on both sides.
- final mAP50: the last results.csv row.
Ratios are taken within a round (same machine state), then the median and min-max over rounds are reported.

Targets, fixed before the first run (2026-11-30), for this CPU:
- map50_delta (fast - reproducible, same seed and epochs): |delta| <= 0.02 (the fast mode's acceptance: equal accuracy).
- speedup_vs_reproducible >= 1.0 (fast never slower; on a CPU most rows are guarded off, so ~1.0 is expected).
- speedup_vs_bare >= 1.0 (the fast stage is not slower than bare yolov5 at the same settings).
- each row that applies on this machine: fast / fast-minus-row >= 1.0 (a row applies only where it helps).
The fast mode's GPU goal (H200, 640 px: speedup_vs_bare >= 2.0 at equal mAP50, GPU busy >= 85 %) needs a GPU:
without one those fields stay null with the reason. No GPU number is estimated.

Run:  python benchmarks/engine_speed.py [--rounds 3] [--epochs 3] [--source <finished demo workdir>]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (
    PYTHON,
    ROOT,
    WORK,
    CsvPoller,
    LoadSampler,
    find_demo_source,
    machine_info,  # noqa: E402
    read_results_csv,
    save,
    stage_dataset_copy,
    write_hyp,
    yolov5_env,
)

ROWS_MEASURED = ("foreach_ema", "fused_optimizer")  # the fast rows whose guard holds on a CPU
TARGETS = {
    "map50_delta_abs_max": 0.02,
    "speedup_vs_reproducible_min": 1.0,
    "speedup_vs_bare_min": 1.0,
    "patch_effect_min": 1.0,
}


def settings(a) -> dict:
    import yaml

    cfg = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    defaults = cfg["stage_defaults"]
    return {
        "epochs": a.epochs,
        "img": 128,
        "batch": 16,
        "workers": 1,
        "threads": 1,
        "optimizer": "AdamW",
        "lr0": defaults["lr0"],
        "hyp": defaults.get("hyp") or {},
        "nominal_batch": 64,
        "min_warmup_iters": 100,
        "cache": "none",
        "plots": False,
        "val_period": 1,
        "seed": 0,
        "device": "cpu",
    }


def variants() -> dict[str, dict | None]:
    """name -> the plan's engine section (None: bare yolov5)."""
    fast = {"mode": "fast", "compile": False, "skip_patches": []}
    return {
        "bare": None,
        "reproducible": {**fast, "mode": "reproducible"},
        "fast": fast,
        **{f"fast-minus-{row}": {**fast, "skip_patches": [row]} for row in ROWS_MEASURED},
    }


def epoch_loop_images_per_s(events: list[dict], images: int) -> float | None:
    times = [e["t"] for e in sorted(events, key=lambda e: e["row"])]
    gaps = [b - a for a, b in zip(times, times[1:])]
    return images / statistics.median(gaps) if gaps else None


def run_stage_variant(name: str, engine: dict, s: dict, data: Path, weights: Path, workdir: Path, rnd: int) -> dict:
    from stagedyolo.stage import run_stage
    from stagedyolo.stage_plan import build_plan

    spec = {
        "epochs": s["epochs"],
        "img": s["img"],
        "batch": s["batch"],
        "workers": s["workers"],
        "freeze": 0,
        "lr0": s["lr0"],
        "optimizer": s["optimizer"],
        "hyp": s["hyp"],
        "cache": s["cache"],
        "amp": "auto",
        "device": s["device"],
        "val_period": s["val_period"],
        "gpus": 1,
        "sync_bn": False,
        "plots": s["plots"],
        "nosave": False,
        "lr_scaling": "none",
        "nominal_batch": s["nominal_batch"],
        "min_warmup_iters": s["min_warmup_iters"],
        "engine": engine,
    }
    label = f"{name}_r{rnd}"
    plan = build_plan(
        spec,
        stage=label,
        data=str(data),
        weights=str(weights),
        cfg="yolov5n.yaml",
        cache_mode="none",
        threads=s["workers"] + s["threads"],
        work_dir=workdir / "work" / label,
    )
    assert plan["workers"] == s["workers"] and plan["torch_threads"] == s["threads"], plan
    stage_dir = workdir / "stages" / label
    poller = CsvPoller(workdir / "work", [f"{label}/results.csv"]).start()
    start = time.time()
    run_stage(
        plan,
        stage_dir=stage_dir,
        attempt=1,
        log_path=workdir / f"{label}.log",
        engine_home=workdir / "engine",
        warm=None,
    )
    wall = time.time() - start
    poller.stop()
    timing = json.loads((stage_dir / "timing.json").read_text())
    record = json.loads((stage_dir / "stage.json").read_text())
    rows = read_results_csv(stage_dir / "results.csv")
    images = timing["epochs"][0]["images"]
    return {
        "wall_s": wall,
        "steady_images_per_s": timing["throughput"]["steady_images_per_s"],
        "epoch_loop_images_per_s": epoch_loop_images_per_s(poller.events, images),
        "map50": rows[-1]["metrics/mAP_0.5"],
        "map50_per_epoch": [r["metrics/mAP_0.5"] for r in rows],
        "train_images": images,
        "engine": timing["engine"],
        "patches_applied": [p["name"] for p in record["patches"] if p["applied"]],
    }


def run_bare(s: dict, data: Path, weights: Path, hyp: Path, workdir: Path, rnd: int, images: int) -> dict:
    out = workdir / "bare"
    argv = [
        PYTHON,
        "-m",
        "yolov5.train",
        "--data",
        str(data),
        "--weights",
        str(weights),
        "--epochs",
        str(s["epochs"]),
        "--img",
        str(s["img"]),
        "--batch-size",
        str(s["batch"]),
        "--workers",
        str(s["workers"]),
        "--hyp",
        str(hyp),
        "--optimizer",
        s["optimizer"],
        "--noplots",
        "--seed",
        str(s["seed"]),
        "--patience",
        "0",
        "--device",
        "cpu",
        "--project",
        str(out),
        "--name",
        f"r{rnd}",
        "--exist-ok",
    ]
    poller = CsvPoller(out, [f"r{rnd}/results.csv"]).start()
    start = time.time()
    with open(workdir / f"bare_r{rnd}.log", "w") as log:
        rc = subprocess.call(
            argv, env=yolov5_env(workdir, s["threads"]), stdout=log, stderr=subprocess.STDOUT, cwd=workdir
        )
    wall = time.time() - start
    poller.stop()
    if rc:
        raise RuntimeError(f"bare yolov5 failed ({rc}): {workdir / f'bare_r{rnd}.log'}")
    rows = read_results_csv(out / f"r{rnd}" / "results.csv")
    return {
        "wall_s": wall,
        "steady_images_per_s": None,
        "epoch_loop_images_per_s": epoch_loop_images_per_s(poller.events, images),
        "map50": rows[-1]["metrics/mAP_0.5"],
        "map50_per_epoch": [r["metrics/mAP_0.5"] for r in rows],
        "argv": argv,
    }


def component_effects(blocks: int = 7, per_block: int = 10, threads: int = 1) -> dict:
    """The CPU rows' own cost, in-process and interleaved (far less noisy than whole stages on a shared machine):
    ms per call of yolov5's ModelEMA.update vs the foreach one, and of its AdamW step vs the fused one, on yolov5n
    with real gradients of a batch of 16 at 128 px; and that step's forward + backward for scale."""
    import torch
    from yolov5.models.yolo import Model
    from yolov5.utils.torch_utils import ModelEMA, smart_optimizer

    from stagedyolo.engine.options import yolov5_dir
    from stagedyolo.engine.patches import foreach_model_ema

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = Model(str(yolov5_dir() / "models" / "yolov5n.yaml"), ch=3, nc=3)
    images = torch.rand(16, 3, 128, 128)

    def forward_backward():
        model.zero_grad()
        sum(p.sum() for p in model(images)).backward()

    forward_backward()
    plain_ema, fast_ema = ModelEMA(model), foreach_model_ema(ModelEMA, torch)(model)
    plain_opt = smart_optimizer(model, "AdamW", 0.001, 0.937, 5e-4)
    groups = [{k: v for k, v in g.items() if k not in ("foreach", "fused")} for g in plain_opt.param_groups]
    fused_opt = type(plain_opt)(groups, fused=True)
    calls = {
        "ema_plain": lambda: plain_ema.update(model),
        "ema_foreach": lambda: fast_ema.update(model),
        "optimizer_plain": plain_opt.step,
        "optimizer_fused": fused_opt.step,
    }
    times = {name: [] for name in calls}
    for _ in range(blocks):
        for name, call in calls.items():
            start = time.perf_counter()
            for _ in range(per_block):
                call()
            times[name].append((time.perf_counter() - start) / per_block * 1000)
    step_ms = []
    for _ in range(3):
        start = time.perf_counter()
        forward_backward()
        step_ms.append((time.perf_counter() - start) * 1000)
    ms = {name: spread(values) for name, values in times.items()}
    fb = statistics.median(step_ms)
    return {
        "ms_per_call": ms,
        "forward_backward_ms": spread(step_ms),
        "threads": threads,
        "foreach_ema": {
            "saved_ms_per_step": ms["ema_plain"]["median"] - ms["ema_foreach"]["median"],
            "speedup": ms["ema_plain"]["median"] / ms["ema_foreach"]["median"],
            "share_of_forward_backward": (ms["ema_plain"]["median"] - ms["ema_foreach"]["median"]) / fb,
        },
        "fused_optimizer": {
            "saved_ms_per_step": ms["optimizer_plain"]["median"] - ms["optimizer_fused"]["median"],
            "speedup": ms["optimizer_plain"]["median"] / ms["optimizer_fused"]["median"],
            "share_of_forward_backward": (ms["optimizer_plain"]["median"] - ms["optimizer_fused"]["median"]) / fb,
        },
    }


def spread(values: list) -> dict:
    values = [v for v in values if v is not None]
    if not values:
        return {"median": None, "min": None, "max": None, "values": []}
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "values": values}


def summarise(rounds: list[dict]) -> dict:
    def ratio(a: str, b: str, key: str) -> dict:
        return spread([r[a][key] / r[b][key] for r in rounds if r[a][key] and r[b][key]])

    return {
        "speedup_vs_bare": ratio("fast", "bare", "epoch_loop_images_per_s"),
        "speedup_vs_reproducible": ratio("fast", "reproducible", "steady_images_per_s"),
        "speedup_vs_reproducible_epoch_loop": ratio("fast", "reproducible", "epoch_loop_images_per_s"),
        "reproducible_vs_bare": ratio("reproducible", "bare", "epoch_loop_images_per_s"),
        "map50_delta": spread([r["fast"]["map50"] - r["reproducible"]["map50"] for r in rounds]),
        "map50_reproducible_minus_bare": spread([r["reproducible"]["map50"] - r["bare"]["map50"] for r in rounds]),
        "patches": {
            row: {
                "effect": ratio("fast", f"fast-minus-{row}", "steady_images_per_s"),
                "measure": f"fast / fast with {row} skipped, steady train images/s (timing.json)",
            }
            for row in ROWS_MEASURED
        },
    }


def patch_rows(fast_run: dict, summary: dict, components: dict) -> dict:
    """Every fast row: measured here (whole stages, and the component alone), or why not (its guard did not hold)."""
    from stagedyolo.engine.patches import PATCHES

    applied, skipped = fast_run["engine"]["patches_applied"], fast_run["engine"]["patches_not_applied"]
    rows = {}
    for p in (p for p in PATCHES if p.fast_only):
        if p.name in summary["patches"]:
            rows[p.name] = {"applied": True, **summary["patches"][p.name], "component": components[p.name]}
        else:
            rows[p.name] = {
                "applied": p.name in applied,
                "effect": None,
                "reason": skipped.get(p.name, "applied but not measured"),
            }
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--source", type=Path, help="a finished demo workdir (its demo data and pretrained.pt)")
    ap.add_argument("--workdir", type=Path, default=WORK / "engine_speed")
    ap.add_argument("--name", default="engine_speed")
    ap.add_argument("--reuse-rounds", type=Path, help="an earlier results JSON: keep its rounds, rerun the rest")
    a = ap.parse_args(argv)
    if a.reuse_rounds:
        earlier = json.loads(a.reuse_rounds.read_text())
        return report(a, earlier["rounds"], earlier["load"], earlier["total_s"])

    source = find_demo_source(a.source)
    workdir = a.workdir.resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    s = settings(a)
    data = stage_dataset_copy(source / "results/demo/demo/target/data.yaml", workdir / "data")
    weights = (source / "results/demo/demo/pretrained.pt").resolve()
    hyp = write_hyp(workdir / "hyp.yaml", s["lr0"], s["hyp"])
    images = _train_images(data)
    names = list(variants())
    rounds = []
    started = time.time()
    with LoadSampler() as load:
        for rnd in range(a.rounds):
            order = names[rnd % len(names) :] + names[: rnd % len(names)]
            r = {"order": order}
            for name in order:
                engine = variants()[name]
                if engine is None:
                    r[name] = run_bare(s, data, weights, hyp, workdir, rnd, images)
                else:
                    r[name] = run_stage_variant(name, engine, s, data, weights, workdir, rnd)
                print(
                    f"round {rnd} {name}: wall {r[name]['wall_s']:.1f} s, steady {r[name]['steady_images_per_s']}, "
                    f"epoch loop {r[name]['epoch_loop_images_per_s']} img/s, mAP50 {r[name]['map50']:.4f}",
                    flush=True,
                )
            rounds.append(r)
            (workdir / "rounds.json").write_text(json.dumps(rounds, default=str))  # kept if a later step fails
    report(a, rounds, load.summary(), time.time() - started)


def report(a, rounds: list[dict], load: dict, total_s: float) -> None:
    summary = summarise(rounds)
    components = component_effects()
    res = {
        "device": f"cpu: {machine_info()['cpu_model']}, {machine_info()['cores']} cores, shared with other agents",
        "gpu": None,
        "gpu_reason": "no GPU on this machine: the fast mode's H200 goal (speedup_vs_bare >= 2.0, GPU busy "
        ">= 85 %) stays open; no GPU number is estimated",
        "speedup_vs_bare": summary["speedup_vs_bare"]["median"],
        "speedup_vs_reproducible": summary["speedup_vs_reproducible"]["median"],
        "map50_delta": summary["map50_delta"]["median"],
        "patches": patch_rows(rounds[0]["fast"], summary, components),
        "components": components,
        "summary": summary,
        "targets": TARGETS,
        "settings": settings(a),
        "rounds": rounds,
        "machine": machine_info(),
        "load": load,
        "total_s": total_s,
    }
    res["met"] = met(res)
    save(a.name, res, markdown(res))


def _train_images(data: Path) -> int:
    import yaml

    spec = yaml.safe_load(data.read_text())
    root = Path(spec["path"]) if spec.get("path") else data.parent
    return sum(1 for p in (root / spec["train"]).rglob("*") if p.suffix.lower() in (".jpg", ".jpeg", ".png"))


def met(res: dict) -> dict:
    s = res["summary"]
    return {
        "map50_delta": all(abs(v) <= TARGETS["map50_delta_abs_max"] for v in s["map50_delta"]["values"]),
        "speedup_vs_reproducible": (s["speedup_vs_reproducible"]["median"] or 0)
        >= TARGETS["speedup_vs_reproducible_min"],
        "speedup_vs_bare": (s["speedup_vs_bare"]["median"] or 0) >= TARGETS["speedup_vs_bare_min"],
        **{
            f"patch {row}": (s["patches"][row]["effect"]["median"] or 0) >= TARGETS["patch_effect_min"]
            for row in ROWS_MEASURED
        },
    }


def markdown(res: dict) -> list[str]:
    s, L, st = res["summary"], res["load"], res["settings"]

    def f(x, digits=3):
        return "—" if x is None else f"{x:.{digits}f}"

    def sp(d):
        return f"**{f(d['median'])}** ({f(d['min'])}–{f(d['max'])})"

    lines = [
        "# Engine speed: fast vs reproducible vs bare `python -m yolov5.train`",
        "",
        f"{res['device']}; 1-min load {L['load1_min']:.2f}–{L['load1_max']:.2f} (mean {L['load1_mean']:.2f}). "
        f"{len(res['rounds'])} rounds, order rotated. {st['epochs']} epochs, img {st['img']}, batch {st['batch']}, "
        f"{st['workers']} worker + {st['threads']} torch thread, AdamW, nominal_batch 64, min_warmup_iters 100, "
        f"from the demo pretrained.pt, seed 0. Total {res['total_s'] / 60:.1f} min.",
        "",
        "| figure | median (min–max over rounds) | target | met |",
        "|---|---|---|---|",
        f"| speedup_vs_bare (epoch-loop images/s, fast / bare) | {sp(s['speedup_vs_bare'])} | ≥ 1.0 | "
        f"{res['met']['speedup_vs_bare']} |",
        f"| speedup_vs_reproducible (steady train images/s) | {sp(s['speedup_vs_reproducible'])} | ≥ 1.0 | "
        f"{res['met']['speedup_vs_reproducible']} |",
        f"| same, epoch-loop images/s | {sp(s['speedup_vs_reproducible_epoch_loop'])} | — | — |",
        f"| reproducible / bare (epoch-loop images/s) | {sp(s['reproducible_vs_bare'])} | — | — |",
        f"| map50_delta (fast − reproducible) | {sp(s['map50_delta'])} | abs ≤ 0.02 | {res['met']['map50_delta']} |",
        f"| mAP50 reproducible − bare | {sp(s['map50_reproducible_minus_bare'])} | — | — |",
        "",
        "| fast-mode row | applied here | own effect: fast / fast without it (median, min–max) | met (≥ 1.0) |",
        "|---|---|---|---|",
    ]
    for name, row in res["patches"].items():
        effect = sp(row["effect"]) if row.get("effect") else f"not measured: {row.get('reason')}"
        lines.append(f"| `{name}` | {row['applied']} | {effect} | {res['met'].get(f'patch {name}', '—')} |")
    c = res["components"]
    lines += [
        "",
        f"Each CPU row's component alone (yolov5n, batch 16 at 128 px, {c['threads']} thread, in-process, "
        "interleaved blocks; forward + backward of that batch: "
        f"{f(c['forward_backward_ms']['median'], 0)} ms):",
        "",
        "| row | yolov5's call, ms | patched call, ms | speed-up of the call | saved ms per optimizer step | "
        "share of forward + backward |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for row, (plain, patched) in {
        "foreach_ema": ("ema_plain", "ema_foreach"),
        "fused_optimizer": ("optimizer_plain", "optimizer_fused"),
    }.items():
        lines.append(
            f"| `{row}` | {f(c['ms_per_call'][plain]['median'], 2)} | {f(c['ms_per_call'][patched]['median'], 2)} "
            f"| {f(c[row]['speedup'])} | {f(c[row]['saved_ms_per_step'], 2)} | "
            f"{c[row]['share_of_forward_backward'] * 100:.1f} % |"
        )
    lines += [
        "",
        "| round | variant | wall s | steady train img/s | epoch-loop img/s | final mAP50 |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for i, r in enumerate(res["rounds"]):
        for name in r["order"]:
            v = r[name]
            lines.append(
                f"| {i} | {name} | {v['wall_s']:.1f} | {f(v['steady_images_per_s'], 1)} | "
                f"{f(v['epoch_loop_images_per_s'], 1)} | {v['map50']:.4f} |"
            )
    lines += ["", f"GPU: {res['gpu_reason']}."]
    return lines


if __name__ == "__main__":
    main()

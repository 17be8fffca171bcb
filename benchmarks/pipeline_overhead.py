"""Pipeline overhead: one training stage through Snakemake + the stage supervisor/worker (A) vs the same training
by a bare `python -m yolov5.train` (B), with the same settings, interleaved A/B rounds (order alternates).

Both: the staged data.yaml (prepare_dataset's copy; its labels .cache is already built by the warm-up), the demo
pretrained.pt (absolute path), 5 epochs, img 128, batch 16, 1 loader worker, 1 torch thread, the same complete hyp
(stage_hyp of the stage), AdamW, no plots, no cache, seed 0, val every epoch.
- A: a one-stage config (probe off, cache none, dataset = the demo target data.yaml, weights = pretrained.pt);
  a warm-up run builds verify_env/prepare/cache; each measured round is
  `snakemake --forcerun train_stage results/ovh/stages/only/timing.json` (only that job runs).
- B: OMP_NUM_THREADS=1 (checked: torch.get_num_threads() after importing yolov5.train in that environment), same
  offline environment as the engine, --workers 1.
A poller stamps each results.csv row, which splits each run into [launch → first row] (startup + setup + epoch 1),
[first → last row] (the epoch loop, per epoch) and [last row → exit] (final save, strip, final val, publish).
For A the snakemake benchmark TSV (job wall) and timing.json (supervisor wall, worker phases) split it further;
`snakemake -n` on the same target measures Snakemake's own start-up and DAG cost.

Run:  python benchmarks/pipeline_overhead.py [--rounds 3] [--epochs 5] [--source <finished demo workdir>] [--name N]
"""

from __future__ import annotations

import argparse
import csv
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
    SNAKEMAKE,
    WORK,
    CsvPoller,
    LoadSampler,
    find_demo_source,
    machine_info,  # noqa: E402
    make_snakemake_workdir,
    run_snakemake,
    save,
    snakemake_jobs,
    write_hyp,
    yolov5_env,
)

STAGE = "only"


def config_text(source: Path, a) -> str:
    import yaml

    cfg = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    cfg["run"] = "ovh"
    cfg["dataset"] = str((source / "results/demo/demo/target/data.yaml").resolve())
    cfg["model"]["weights"] = str((source / "results/demo/demo/pretrained.pt").resolve())
    cfg["probe"]["enabled"] = False
    cfg["cache"]["mode"] = "none"
    # nominal_batch and min_warmup_iters at yolov5's own constants: bare yolov5 cannot change them, and a smaller
    # nominal batch means more optimizer steps, i.e. more work per epoch.
    cfg["stage_order"] = [STAGE]
    cfg["stages"] = {
        STAGE: {
            "epochs": a.epochs,
            "img": a.img,
            "batch": a.batch,
            "workers": 1,
            "start_from": "model",
            "cache": "none",
            "val_period": 1,
            "plots": False,
            "nominal_batch": 64,
            "min_warmup_iters": 100,
        }
    }
    return yaml.safe_dump(cfg, sort_keys=False)


def segments(events: list[dict], start: float, end: float) -> dict:
    ts = sorted(e["t"] for e in events)
    if not ts:
        return {"to_first_row_s": None, "loop_s": None, "per_epoch_s": None, "after_last_row_s": None}
    gaps = [b - a for a, b in zip(ts, ts[1:])]
    return {
        "to_first_row_s": ts[0] - start,
        "loop_s": ts[-1] - ts[0],
        "per_epoch_s": gaps,
        "epoch_median_s": statistics.median(gaps) if gaps else None,
        "after_last_row_s": end - ts[-1],
    }


def run_a(workdir: Path, rnd: int) -> dict:
    target = f"results/ovh/stages/{STAGE}/timing.json"
    poller = CsvPoller(workdir, [f"results/ovh/work/{STAGE}/results.csv"]).start()
    log = workdir / f"snakemake_{rnd}.log"
    run = run_snakemake(workdir, "--rerun-triggers", "mtime", "--forcerun", "train_stage", targets=(target,), log=log)
    poller.stop()
    rules = [j["rule"] for j in snakemake_jobs(log.read_text())]
    assert rules == ["train_stage"], f"expected only the stage job, snakemake ran {rules}"
    bench = list(csv.DictReader(open(workdir / f"results/ovh/benchmarks/stages/{STAGE}.tsv"), delimiter="\t"))[-1]
    timing = json.loads((workdir / f"results/ovh/stages/{STAGE}/timing.json").read_text())
    phases = {k: v["s"] for k, v in timing["phases"].items()}
    return {
        "wall_s": run["wall_s"],
        "job_s": float(bench["s"]),
        "supervisor_wall_s": timing["wall_s"],
        "phases": phases,
        "setup_detail": timing.get("setup_detail"),
        "epochs": [{k: e.get(k) for k in ("train_s", "val_s", "checkpoint_s", "logging_s")} for e in timing["epochs"]],
        **segments(poller.events, run["start"], run["end"]),
    }


def run_b(workdir: Path, data: Path, weights: str, hyp: Path, a, rnd: int) -> dict:
    out = workdir / "bare"
    env = yolov5_env(workdir, 1)
    argv = [
        PYTHON,
        "-m",
        "yolov5.train",
        "--data",
        str(data),
        "--weights",
        weights,
        "--epochs",
        str(a.epochs),
        "--img",
        str(a.img),
        "--batch-size",
        str(a.batch),
        "--workers",
        "1",
        "--hyp",
        str(hyp),
        "--optimizer",
        "AdamW",
        "--noplots",
        "--seed",
        "0",
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
    with open(workdir / f"bare_{rnd}.log", "w") as log:
        rc = subprocess.call(argv, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=workdir)
    end = time.time()
    poller.stop()
    if rc:
        raise RuntimeError(f"bare yolov5 failed ({rc}): {workdir / f'bare_{rnd}.log'}")
    return {"wall_s": end - start, "argv": argv, **segments(poller.events, start, end)}


def thread_check(workdir: Path) -> int:
    code = "import yolov5.train, torch; print(torch.get_num_threads())"
    out = subprocess.run([PYTHON, "-c", code], env=yolov5_env(workdir, 1), capture_output=True, text=True, cwd=workdir)
    return int(out.stdout.strip().splitlines()[-1])


def dry_run_s(workdir: Path) -> float:
    start = time.time()
    subprocess.run(
        [
            SNAKEMAKE,
            f"results/ovh/stages/{STAGE}/timing.json",
            "-s",
            str(ROOT / "Snakefile"),
            "-d",
            str(workdir),
            "--cores",
            "2",
            "--resources",
            "gpu=1",
            "-n",
            "--rerun-triggers",
            "mtime",
            "--forcerun",
            "train_stage",
        ],
        cwd=ROOT,
        capture_output=True,
        check=True,
    )
    return time.time() - start


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--img", type=int, default=128)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--source", type=Path, help="a finished demo workdir (its demo data and pretrained.pt)")
    ap.add_argument("--workdir", type=Path, default=WORK / "pipeline_overhead")
    ap.add_argument("--name", default="pipeline_overhead", help="results file name")
    a = ap.parse_args(argv)
    import yaml

    from stagedyolo.recipe import stage_spec

    source = find_demo_source(a.source)
    workdir = make_snakemake_workdir(a.workdir, config_text(source, a))
    cfg = yaml.safe_load((workdir / "config/config.yaml").read_text())
    spec = stage_spec(cfg, STAGE)
    hyp = write_hyp(workdir / "hyp.yaml", spec["lr0"], spec["hyp"])
    with LoadSampler() as load:
        warm = run_snakemake(
            workdir, targets=(f"results/ovh/stages/{STAGE}/timing.json",), log=workdir / "snakemake_warm.log"
        )
        data = workdir / "results/ovh/data/data.yaml"
        plan = json.loads((workdir / f"results/ovh/stages/{STAGE}/stage.json").read_text())
        assert plan["workers"] == 1 and plan["torch_threads"] == 1 and plan["optimizer"] == "AdamW", plan
        assert plan["hyp"] == yaml.safe_load(hyp.read_text()), "hyp differs"
        threads_b = thread_check(workdir)
        dry = [dry_run_s(workdir) for _ in range(2)]
        rounds = []
        for rnd in range(a.rounds):
            order = ("A", "B") if rnd % 2 == 0 else ("B", "A")
            r = {"order": "".join(order)}
            for side in order:
                r[side] = run_a(workdir, rnd) if side == "A" else run_b(workdir, data, plan["weights"], hyp, a, rnd)
                print(f"round {rnd} {side}: {r[side]['wall_s']:.1f} s", flush=True)
            r["ratio"] = r["A"]["wall_s"] / r["B"]["wall_s"]
            rounds.append(r)
    A = [r["A"] for r in rounds]
    B = [r["B"] for r in rounds]
    ratio = med([r["ratio"] for r in rounds])
    a_wall, b_wall = med([x["wall_s"] for x in A]), med([x["wall_s"] for x in B])
    seg = {
        k: (med([x[k] for x in A]), med([x[k] for x in B]))
        for k in ("to_first_row_s", "epoch_median_s", "loop_s", "after_last_row_s")
    }
    a_job, a_sup = med([x["job_s"] for x in A]), med([x["supervisor_wall_s"] for x in A])
    phases = {k: med([x["phases"][k] for x in A]) for k in A[0]["phases"]}
    ckpt = med([sum(e["checkpoint_s"] or 0 for e in x["epochs"]) for x in A])
    res = {
        "settings": {
            "epochs": a.epochs,
            "img": a.img,
            "batch": a.batch,
            "workers": 1,
            "threads": 1,
            "optimizer": "AdamW",
            "cache": "none",
            "plots": False,
        },
        "bare_torch_threads_checked": threads_b,
        "snakemake_dry_run_s": dry,
        "warmup_wall_s": warm["wall_s"],
        "rounds": rounds,
        "ratio_median": ratio,
        "ratio_per_round": [r["ratio"] for r in rounds],
        "a_wall_median_s": a_wall,
        "b_wall_median_s": b_wall,
        "segments_median": seg,
        "a_job_s_median": a_job,
        "a_supervisor_wall_s_median": a_sup,
        "a_phases_median": phases,
        "a_checkpoint_s_median": ckpt,
        "machine": machine_info(),
        "load": load.summary(),
        "target_ratio": 1.03,
    }
    L = res["load"]
    md = [
        "# Pipeline overhead: one stage via Snakemake + supervisor vs bare `python -m yolov5.train`",
        "",
        f"{a.epochs} epochs, img {a.img}, batch {a.batch}, 1 worker, 1 torch thread (bare: OMP_NUM_THREADS=1, checked "
        f"torch.get_num_threads() = {threads_b}), AdamW + the same complete hyp, no cache, no plots, val every epoch. "
        f"{a.rounds} interleaved rounds. Machine: {res['machine']['cores']} cores, {res['machine']['cpu_model']}; "
        f"1-min load {L['load1_min']:.2f}–{L['load1_max']:.2f} (mean {L['load1_mean']:.2f}).",
        "",
        "| round | order | A: snakemake stage (s) | B: bare yolov5 (s) | A/B |",
        "|---|---|---:|---:|---:|",
        *[
            f"| {i} | {r['order']} | {r['A']['wall_s']:.1f} | {r['B']['wall_s']:.1f} | {r['ratio']:.3f} |"
            for i, r in enumerate(rounds)
        ],
        f"| **median** | | **{a_wall:.1f}** | **{b_wall:.1f}** | **{ratio:.3f}** (target ≤ 1.03) |",
        "",
        "| segment (median) | A | B | A − B |",
        "|---|---:|---:|---:|",
        *[
            f"| {k} | {va:.2f} | {vb:.2f} | {va - vb:+.2f} |"
            for k, (va, vb) in seg.items()
            if va is not None and vb is not None
        ],
        "",
        "| where A's time goes (median) | s |",
        "|---|---:|",
        f"| snakemake call, whole | {a_wall:.1f} |",
        f"| snakemake -n on the same target (start-up + DAG, no job) | {med(dry):.1f} |",
        f"| snakemake outside the job (call − benchmark TSV job wall) | {a_wall - a_job:.1f} |",
        f"| job wall (TSV) | {a_job:.1f} |",
        f"| job − supervisor wall (script start, imports, plan, publish, diagnosis) | {a_job - a_sup:.1f} |",
        f"| supervisor wall (timing.json wall_s) | {a_sup:.1f} |",
        *[f"| · phase {k} | {v:.2f} |" for k, v in phases.items()],
        f"| · of which per-epoch checkpoint saves (atomic) | {ckpt:.2f} |",
        f"| bare yolov5, whole | {b_wall:.1f} |",
        "",
    ]
    save(a.name, res, md)


if __name__ == "__main__":
    main()

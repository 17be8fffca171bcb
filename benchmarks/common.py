"""Shared helpers for the wall-clock benchmarks (naive_vs_staged, pipeline_overhead, val_period, cache_first_epoch).

Everything here measures real processes: real Snakemake on the repo's Snakefile, real `python -m yolov5.train`,
real stage supervisors. Work folders live under benchmarks/work/ (git-ignored) unless --workdir says otherwise.
"""

from __future__ import annotations

import csv
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import threading
import time
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
RESULTS = ROOT / "benchmarks" / "results"
WORK = ROOT / "benchmarks" / "work"
PYTHON = sys.executable
SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))


# --------------------------------------------------------------------------------------------------- baseline
def commit_of(revision: str) -> str:
    return subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", revision], check=True, text=True, capture_output=True
    ).stdout.strip()


def baseline_tree(commit: str) -> tuple:
    """A worktree of ``commit`` (made once, reused), and the environment that makes its package the imported one."""
    tree = WORK / f"baseline_{commit[:12]}"
    if not tree.exists():
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), commit], check=True)
    return tree, {"PYTHONPATH": str(tree)}


# --------------------------------------------------------------------------------------------------- machine
def machine_info() -> dict:
    model = ""
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count()
    import torch

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {
        "cores": cores,
        "cpu_model": model,
        "gpu": gpu,
        "platform": platform.platform(),
        "python": platform.python_version(),
    }


class LoadSampler:
    """Records the 1-minute load average every few seconds while a benchmark runs (the machine is shared)."""

    def __init__(self, interval_s: float = 5.0):
        self.interval_s, self.samples = interval_s, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            self.samples.append(os.getloadavg()[0])
            self._stop.wait(self.interval_s)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def summary(self) -> dict:
        s = self.samples or [os.getloadavg()[0]]
        return {"load1_min": min(s), "load1_mean": sum(s) / len(s), "load1_max": max(s), "n": len(s)}


# --------------------------------------------------------------------------------------------------- results.csv
def read_results_csv(path: Path) -> list[dict]:
    """yolov5's results.csv (padded columns) as a list of {stripped column: float}."""
    rows = []
    with open(path) as handle:
        reader = csv.reader(handle, skipinitialspace=True)
        header = [h.strip() for h in next(reader)]
        for row in reader:
            if row:
                rows.append({h: float(v) for h, v in zip(header, row)})
    return rows


class CsvPoller:
    """Polls results.csv files matching glob patterns and stamps every new row with the wall clock (time.time()).

    yolov5 appends a row in on_fit_epoch_end, i.e. after the epoch's training and validation and before its
    checkpoint save; the poll period (0.2 s) bounds the timestamp error."""

    def __init__(self, root: Path, patterns: list[str], period_s: float = 0.2):
        self.root, self.patterns, self.period_s = Path(root), patterns, period_s
        self.events: list[dict] = []
        self._seen: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _scan(self):
        for pattern in self.patterns:
            for path in sorted(self.root.glob(pattern)):
                try:
                    lines = path.read_text().splitlines()
                except OSError:
                    continue
                n = len(lines) - 1
                if n > self._seen.get(str(path), 0):
                    now = time.time()
                    header = [h.strip() for h in lines[0].split(",")]
                    for i in range(self._seen.get(str(path), 0), n):
                        values = [v.strip() for v in lines[i + 1].split(",")]
                        try:
                            row = {h: float(v) for h, v in zip(header, values)}
                        except ValueError:  # a half-written line: read it again next time
                            n = i
                            break
                        self.events.append(
                            {
                                "t": now,
                                "path": str(path),
                                "row": i + 1,
                                "epoch": int(row["epoch"]),
                                "map50": row.get("metrics/mAP_0.5"),
                            }
                        )
                    self._seen[str(path)] = n

    def _run(self):
        while not self._stop.is_set():
            self._scan()
            self._stop.wait(self.period_s)
        self._scan()

    def start(self):
        self._thread.start()
        return self

    def stop(self):
        self._stop.set()
        self._thread.join()

    def first_reaching(self, target: float) -> dict | None:
        hits = [e for e in self.events if e["map50"] is not None and e["map50"] >= target]
        return min(hits, key=lambda e: e["t"]) if hits else None


# --------------------------------------------------------------------------------------------------- snakemake
def make_snakemake_workdir(workdir: Path, config_text: str | None = None) -> Path:
    """A fresh working directory holding config/config.yaml (the default demo config unless given)."""
    if workdir.exists():
        shutil.rmtree(workdir)
    (workdir / "config").mkdir(parents=True)
    if config_text is None:
        shutil.copy(ROOT / "config" / "config.yaml", workdir / "config" / "config.yaml")
    else:
        (workdir / "config" / "config.yaml").write_text(config_text)
    return workdir


def run_snakemake(
    workdir: Path,
    *args: str,
    log: Path,
    targets: tuple = (),
    cores: int = 2,
    env: dict | None = None,
    snakefile: Path = ROOT / "Snakefile",
) -> dict:
    """Run the repo's Snakefile (or ``snakefile``) in `workdir` (cwd = repo root, so the default profile applies as
    for a user). Targets go first: --resources and --forcerun take any number of values and would swallow them."""
    argv = [
        SNAKEMAKE,
        *targets,
        "-s",
        str(snakefile),
        "-d",
        str(workdir),
        "--cores",
        str(cores),
        "--resources",
        "gpu=1",
        *args,
    ]
    started = time.time()
    with open(log, "w") as handle:
        rc = subprocess.call(
            argv,
            cwd=ROOT,
            stdout=handle,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
        )
    ended = time.time()
    if rc != 0:
        raise RuntimeError(f"snakemake {' '.join(args)} failed ({rc}); log: {log}\n" + log.read_text()[-3000:])
    return {"start": started, "end": ended, "wall_s": ended - started, "argv": argv}


_STAMP = re.compile(r"^\[(\w{3} \w{3} +\d+ \d\d:\d\d:\d\d \d{4})\]$")


def snakemake_jobs(log_text: str) -> list[dict]:
    """Jobs from a Snakemake log: rule, stage wildcard, start and end (UNIX time, 1 s resolution: the log prints
    whole seconds, so a start is floored and an end is floored too)."""
    jobs, by_id, stamp, pending = [], {}, None, None
    lines = log_text.splitlines()
    for line in lines:
        m = _STAMP.match(line.strip())
        if m:
            stamp = datetime.strptime(m.group(1), "%a %b %d %H:%M:%S %Y").timestamp()
            continue
        m = re.match(r"^(local)?rule (\w+):$", line.strip())
        if m and stamp is not None:
            pending = {"rule": m.group(2), "start": stamp, "stage": None, "jobid": None}
            jobs.append(pending)
            continue
        if pending is not None:
            m = re.match(r"^jobid: (\d+)$", line.strip())
            if m:
                pending["jobid"] = int(m.group(1))
                by_id[pending["jobid"]] = pending
            m = re.match(r"^wildcards: .*stage=(\w+)", line.strip())
            if m:
                pending["stage"] = m.group(1)
        m = re.match(r"^Finished jobid: (\d+)", line.strip())
        if m and int(m.group(1)) in by_id:
            by_id[int(m.group(1))]["end"] = stamp
            pending = None
    return jobs


# --------------------------------------------------------------------------------------------------- bare yolov5
def yolov5_env(workdir: Path, threads: int) -> dict:
    """The offline environment a bare `python -m yolov5.train` needs here, with an explicit thread budget."""
    from stagedyolo.engine.offline import engine_environment

    env = engine_environment(workdir / "engine_home")
    env["TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"] = "1"
    env["OMP_NUM_THREADS"] = str(threads)
    env["MKL_NUM_THREADS"] = str(threads)
    return env


def copy_dataset(data_yaml: Path, dest: Path) -> Path:
    """Copy a YOLOv5 dataset (data.yaml + the folder it points to) so yolov5's .cache/.npy files stay out of the
    original. Returns the copy's data.yaml, with `path` rewritten to the copy."""
    import yaml

    data_yaml = Path(data_yaml).resolve()
    spec = yaml.safe_load(data_yaml.read_text())
    src_root = Path(spec.get("path") or data_yaml.parent)
    if not src_root.is_absolute():
        src_root = (data_yaml.parent / src_root).resolve()
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(src_root, dest / "data", ignore=shutil.ignore_patterns("*.cache", "*.npy"))
    spec["path"] = str((dest / "data").resolve())
    out = dest / "data.yaml"
    out.write_text(yaml.safe_dump(spec, sort_keys=False))
    return out


def write_hyp(path: Path, lr0: float, overrides: dict) -> Path:
    import yaml

    from stagedyolo.engine.options import stage_hyp

    path.write_text(yaml.safe_dump(stage_hyp(lr0, overrides), sort_keys=False))
    return path


def save(name: str, data: dict, md_lines: list[str]) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(data, indent=2, default=str))
    (RESULTS / f"{name}.md").write_text("\n".join(md_lines) + "\n")
    print("\n".join(md_lines))


def fmt_s(x: float | None) -> str:
    return "—" if x is None else f"{x:.1f} s"


# --------------------------------------------------------------------------------------------------- one stage
def find_demo_source(explicit: Path | None = None) -> Path:
    """A finished demo workdir (results/demo/demo/pretrained.pt and the demo target set); builds one if none."""
    for cand in [explicit, WORK / "naive_vs_staged_inputs" / "pretrain", WORK / "pipe1", WORK / "demo_source"]:
        if cand and (Path(cand) / "results/demo/demo/pretrained.pt").exists():
            return Path(cand)
    src = WORK / "demo_source"
    make_snakemake_workdir(src)
    run_snakemake(src, targets=("results/demo/demo/pretrained.pt",), log=src / "snakemake.log")
    return src


def stage_dataset_copy(data_yaml: Path, dest: Path) -> Path:
    """A staged working copy (prepare_dataset, as the pipeline makes it) of `data_yaml` under `dest`."""
    from stagedyolo.dataset.staging import prepare_dataset

    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    out = dest / "data.yaml"
    prepare_dataset(
        str(data_yaml),
        str(dest / "cache"),
        str(out),
        str(dest / "report.json"),
        str(dest / "report.md"),
        log=lambda *a: None,
        hardlinks=False,
    )
    return out


def run_one_stage(
    stage: str, overrides: dict, *, data: Path, weights: str, workdir: Path, name: str, threads: int = 2
) -> dict:
    """One stage of the default config (plus `overrides`) through stagedyolo.stage_plan.build_plan/run_stage, as the
    train_stage rule runs it. Returns {wall_s, timing, stage_json}."""
    import yaml

    from stagedyolo.recipe import stage_spec
    from stagedyolo.stage import run_stage
    from stagedyolo.stage_plan import build_plan

    cfg = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    spec = {**stage_spec(cfg, stage), **overrides}
    stage_dir = workdir / "stages" / name
    if stage_dir.exists():
        shutil.rmtree(stage_dir)
    plan = build_plan(
        spec,
        stage=name,
        data=str(data),
        weights=weights,
        cfg=cfg["model"]["cfg"],
        cache_mode=spec["cache"] if spec["cache"] != "auto" else "none",
        threads=threads,
        work_dir=workdir / "work" / name,
    )
    t0 = time.time()
    run_stage(plan, stage_dir=stage_dir, attempt=1, log_path=workdir / f"{name}.log", engine_home=workdir / "engine")
    wall = time.time() - t0
    return {
        "wall_s": wall,
        "timing": json.loads((stage_dir / "timing.json").read_text()),
        "stage_json": json.loads((stage_dir / "stage.json").read_text()),
    }

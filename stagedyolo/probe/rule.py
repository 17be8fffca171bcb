"""The probe rule: plan the measurements, run them in a child process, choose, write tuning.json."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import time
from pathlib import Path

import yaml

from stagedyolo.dataset.validate import list_split_images
from stagedyolo.engine.offline import engine_environment
from stagedyolo.engine.plan import available_cores, cpu_budget, stage_hyp
from stagedyolo.jsonio import read_json, write_json
from stagedyolo.launch import supervise
from stagedyolo.probe.child import LOADER_AMPLE_FACTOR, LOADER_MIN_BATCHES
from stagedyolo.probe.choice import TIE_TOLERANCE, choose, combine

# Images the loader probe reads from: enough for mosaic's random partners, few enough that building the dataset
# (label scan, a RAM cache) costs a second, not minutes, on a large dataset.
SUBSET_IMAGES = 256
# A hung child (a dead GPU, a stuck worker) must not hold the pipeline forever: planned time x this, plus start-up.
CHILD_TIMEOUT_FACTOR, CHILD_STARTUP_S = 4, 300


def probe_for_rule(data: str, *, cache_decision: str, weights: list[str], tuning_out: str, settings: dict,
                   stage_defaults: dict, cfg: str, device: str, img: int, threads: int, log_path: str,
                   batches: list[int] | None = None) -> dict:  # fmt: skip
    """The probe rule: measure, choose and write `tuning_out`; returns what it wrote. ``batches``: the batch sizes
    to time the model at (default: all of settings["batch"]; plan.probe_batches narrows them to those a stage can
    take)."""
    tuning_out = Path(tuning_out)
    tuning_out.parent.mkdir(parents=True, exist_ok=True)
    if not settings.get("enabled", True):
        tuning = {"choice": {}, "candidates": [], "notes": ["probe disabled: stages keep their defaults"]}
        write_json(tuning_out, tuning)
        return tuning
    work = tuning_out.parent / "probe_work"
    work.mkdir(exist_ok=True)
    request = plan_request(data, cache_mode=read_json(cache_decision)["mode"], weights=weights, settings=settings,
                           stage_defaults=stage_defaults, cfg=cfg, device=device, img=img, threads=threads,
                           work=work, batches=batches)  # fmt: skip
    run_dir = tuning_out.parent.parent  # R/probe/tuning.json: the stages' engine home is R/engine
    load_before = os.getloadavg()
    measured = run_child(request, work, engine_home=run_dir / "engine", log_path=log_path)
    tuning = build_tuning(request, measured, settings, threads=threads, load=(load_before, os.getloadavg()))
    write_json(tuning_out, tuning)
    with open(log_path, "a") as log:
        log.write(f"probe: choice {tuning['choice'] or 'none (stages keep their defaults)'}\n")
    return tuning


def plan_request(data: str, *, cache_mode: str, weights: list[str], settings: dict, stage_defaults: dict, cfg: str,
                 device: str, img: int, threads: int, work: Path, batches: list[int] | None = None) -> dict:  # fmt: skip
    """What the child measures. On CPU the model is timed at every torch thread count a worker candidate leaves
    it (cpu_budget), because that is what compute really gets while the workers load. Whether CUDA is there is the
    child's to find out (it imports torch anyway; importing it here too would cost seconds), so the request holds
    the candidates and the child expands them into model runs (model_runs)."""
    cores = cpu_budget(threads, 0)[1]
    loader_runs = [{"workers": w, "torch_threads": cpu_budget(threads, w)[1]} for w in settings["workers"]]
    thread_counts = sorted({r["torch_threads"] for r in loader_runs}, reverse=True)
    seconds = float(settings["seconds_per_candidate"])
    data_yaml = yaml.safe_load(Path(data).read_text(encoding="utf-8"))
    hyp_defaults = stage_defaults.get("hyp") or {}
    return {
        "data_list": str(write_subset(data_yaml, Path(data), work / "train_subset.txt")),
        "cache": None if cache_mode == "none" else cache_mode,
        "hyp": stage_hyp(stage_defaults["lr0"], hyp_defaults),
        "img": int(img),
        # Loader throughput hardly depends on the batch (each worker builds whole batches); the default is typical.
        "loader_batch": _typical_batch(stage_defaults.get("batch"), settings["batch"]),
        "loader_runs": loader_runs,
        "batches": list(batches or settings["batch"]),
        "thread_counts": thread_counts,
        "seconds_per_loader_run": seconds,
        # Each batch gets seconds_per_candidate in all, shared by its thread counts and AMP settings, so the probe
        # stays near (len(workers) + len(batch)) x seconds_per_candidate.
        "seconds_per_batch": seconds,
        "device_setting": str(device),
        "weights": str(Path(weights[0]).resolve()) if weights else "",
        "cfg": cfg,
        "nc": int(data_yaml.get("nc") or len(data_yaml["names"])),
        "freeze": int(stage_defaults.get("freeze") or 0),
        "optimizer": stage_defaults.get("optimizer") or "SGD",
        "cores": cores,
        "out": str(work / "measured.json"),
    }


def write_subset(data_yaml: dict, data_path: Path, list_path: Path) -> Path:
    """A list file of up to SUBSET_IMAGES training images (a fixed random sample), outside the dataset, so yolov5's
    label cache for it lands next to the list and never in the user's data."""
    root = Path(data_yaml.get("path") or data_path.parent)
    sources = data_yaml["train"] if isinstance(data_yaml["train"], list) else [data_yaml["train"]]
    images, _ignored = list_split_images([str(s if Path(s).is_absolute() else root / s) for s in sources])
    if not images:
        raise ValueError(f"probe: no training images found for {data_path}")
    sample = sorted(random.Random(0).sample(images, min(SUBSET_IMAGES, len(images))))
    list_path.write_text("\n".join(sample) + "\n")
    return list_path


def run_child(request: dict, work: Path, *, engine_home: Path, log_path: str) -> dict:
    request_path = work / "request.json"
    write_json(request_path, request)
    Path(request["out"]).unlink(missing_ok=True)
    env = engine_environment(engine_home)
    env["OMP_NUM_THREADS"] = str(request["cores"])  # the child sets each measurement's count itself
    planned = planned_seconds(request)
    with open(log_path, "a") as log:
        log.write(f"probe: measuring {len(request['loader_runs'])} loader runs and {len(request['batches'])} batch "
                  f"sizes, about {planned:.0f} s plus imports\n")  # fmt: skip
        log.flush()
        argv = [sys.executable, "-m", "stagedyolo.probe.child", str(request_path)]
        # Like a stage's worker: its own session, its loader workers ended with it, a hung child stopped.
        limit_s = CHILD_STARTUP_S + CHILD_TIMEOUT_FACTOR * planned
        result = supervise(argv, env, stdout=log, stderr=subprocess.STDOUT, timeout_s=limit_s)
    if result.timed_out:
        raise RuntimeError(f"probe: the measuring process ran past its {limit_s:.0f} s limit and was stopped; "
                           f"see {log_path}")  # fmt: skip
    if result.returncode != 0:
        raise RuntimeError(f"probe: the measuring process exited {result.returncode}; see {log_path}")
    return read_json(request["out"])


def planned_seconds(request: dict) -> float:
    return len(request["loader_runs"]) * request["seconds_per_loader_run"] + len(request["batches"]) * request[
        "seconds_per_batch"]  # fmt: skip


def build_tuning(request: dict, measured: dict, settings: dict, *, threads: int, load: tuple) -> dict:
    cuda = measured["cuda"]
    total = measured.get("gpu_total_memory_bytes")
    limit = int(total * settings["max_memory_fraction"]) if cuda and total else None
    candidates = combine(measured["loader"], measured["model"], cores=request["cores"],
                         shares_cpu=not cuda, memory_limit_bytes=limit)  # fmt: skip
    shared_cores = "" if cuda else ", and cores/(W/loader + threads/model): workers and compute share cores"
    notes = [
        f"predicted images/s: W=0 loads then computes (1/(1/loader+1/model)); W>0 overlaps them (min of both"
        f"{shared_cores})",
        f"ties within {TIE_TOLERANCE:.0%} of the best go to the smaller batch",
        "model steps use synthetic images and a few random targets; the optimizer steps every batch (yolov5 "
        "accumulates to the stage's nominal_batch, so real steps cost a little less at smaller batches)",
        "each run's budget includes its warm-up batch; a run whose warm-up alone outlasted the budget is timed "
        "from that batch (pessimistic; flagged timed_from_warmup)",
        f"the model runs first; a loader run stops before its budget once it delivers {LOADER_AMPLE_FACTOR}x the "
        f"fastest model rate after {LOADER_MIN_BATCHES} batches, not counting its workers' prefetched batches "
        "(flagged stopped_early)",
        f"loader measured on {request['data_list']} (at most {SUBSET_IMAGES} training images), cache "
        f"{request['cache'] or 'none'}, at batch {request['loader_batch']}",
    ]
    if sorted(request["batches"]) != sorted(settings["batch"]):
        notes.append(f"model timed at batch {request['batches']} only: no stage leaves batch at auto, so the other "
                     f"candidates {settings['batch']} could not be chosen")  # fmt: skip
    if not cuda:
        notes.append("AMP needs CUDA: measured with AMP off only; peak memory is not measured on CPU (null)")
    choice = choose(candidates)
    if not choice:
        notes.append("no usable candidate: the stages keep their defaults")
    return {
        "choice": choice,
        "candidates": candidates,
        "measurements": {"loader": measured["loader"], "model": measured["model"]},
        "machine": {
            "device": measured["device"], "device_name": measured["device_name"],
            "gpu_total_memory_bytes": total, "memory_limit_bytes": limit,
            "threads_granted": threads, "available_cores": available_cores(), "cores_used": request["cores"],
            "torch": measured["torch"], "load_average_before": load[0][0], "load_average_after": load[1][0],
        },  # fmt: skip
        "budget_s": {
            "seconds_per_candidate": settings["seconds_per_candidate"],
            "planned_measuring_s": round(planned_seconds(request), 3),
            "import_s": measured["import_s"],
            "child_s": measured["child_s"],
        },
        "settings": {"img": request["img"], "workers": settings["workers"], "batch": settings["batch"],
                     "batch_measured": request["batches"],
                     "max_memory_fraction": settings["max_memory_fraction"]},  # fmt: skip
        "notes": notes,
        "written_unix": round(time.time(), 3),
    }


def _typical_batch(default, candidates: list[int]) -> int:
    if isinstance(default, int) and not isinstance(default, bool):
        return default
    return sorted(candidates)[len(candidates) // 2]

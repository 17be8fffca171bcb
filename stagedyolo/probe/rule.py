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
from stagedyolo.engine.options import stage_hyp
from stagedyolo.jsonio import read_json, write_json
from stagedyolo.launch import supervise
from stagedyolo.probe.choice import TIE_TOLERANCE
from stagedyolo.probe.reuse import keep_for_reuse, read_reusable, reuse_key
from stagedyolo.probe.stages import predictions
from stagedyolo.probe.steady import MIN_TIMED_STEPS, MODEL_WARMUP_STEPS, SEEN_SHAPE_WARMUP_STEPS, TRAINING_SHARE, unpaid
from stagedyolo.recipe import PROBED_KEYS, boxes_need_img, stage_img
from stagedyolo.stage_plan import available_cores, cpu_budget
from stagedyolo.yolov5_facts import NOMINAL_BATCH

# Images the loader probe reads from: enough for mosaic's random partners, few enough that building the dataset
# (label scan, a RAM cache) costs a second, not minutes, on a large dataset.
SUBSET_IMAGES = 256
# A hung child (a dead GPU, a stuck worker) must not hold the pipeline forever: planned time x this, plus start-up.
CHILD_TIMEOUT_FACTOR, CHILD_STARTUP_S = 4, 300


# probe.workers: auto spreads the loader candidates over the cores a job may use, beside 0 (the main process loads):
# 0, 1, 2 on the 2-core demo machine and 0, 4, 8, 12 on the 16-core H200 box. A fixed [0, 1, 2] there held a 640-px
# mosaic load to 4 workers at most, and the frozen stage waited on them 45 % of its time.
WORKER_CANDIDATE_SHARES = (0.25, 0.5, 0.75)


def worker_candidates(setting: list[int] | str, cores: int) -> list[int]:
    """probe.workers as the loader candidates to measure: the listed counts, or for `auto` 0 and a quarter, half
    and three quarters of ``cores`` (rounded half up, at least 1)."""
    if setting != "auto":
        return sorted({int(workers) for workers in setting})
    return sorted({0} | {max(1, int(cores * share + 0.5)) for share in WORKER_CANDIDATE_SHARES})


def probe_for_rule(
    data: str,
    *,
    cache_decision: str,
    tuning_out: str,
    log_path: str,
    started_unix: float | None = None,
    dataset_report: str | None = None,
    **plan,
) -> dict:
    """The probe rule: measure, choose and write `tuning_out`; returns what it wrote. ``plan``: plan_request's
    keywords (weights, settings, stage_defaults, cfg, device, img, threads; optionally batches, stages and
    planned_epochs). With ``settings["reuse"]`` measurements are kept in <results_dir>/probe_cache (derived from
    `tuning_out`, R/probe/tuning.json, so a Snakemake module's prefix applies) for later runs on the same machine,
    data, model and settings. ``started_unix``: when the probe's process started (the rule's script passes it, so
    the budget covers its Python start-up too); default now. ``dataset_report``: prepare_dataset's report, whose box
    sizes may raise a stage's img (recipe.stage_img)."""
    tuning_out = Path(tuning_out)
    tuning_out.parent.mkdir(parents=True, exist_ok=True)
    if not plan["settings"].get("enabled", True):
        tuning = {"choice": {}, "candidates": [], "stages": {}, "notes": ["probe disabled: stages keep their defaults"]}
        write_json(tuning_out, tuning)
        return tuning
    started_unix = time.time() if started_unix is None else started_unix
    started = time.perf_counter() - (time.time() - started_unix)
    work = tuning_out.parent / "probe_work"
    work.mkdir(exist_ok=True)
    decision = read_json(cache_decision)
    request = plan_request(
        data,
        cache_mode=decision["mode"],
        work=work,
        image_store=(decision.get("store") or {}).get("root"),
        boxes_need=boxes_need_img(dataset_report),
        **plan,
    )
    request["deadline_unix"] = started_unix + request["budget_s"]  # this run's; not part of the reuse key
    tuning = reuse_or_measure(request, plan["weights"], plan["settings"], work=work, log_path=log_path)
    for name, entry in tuning["stages"].items():  # what each stage was measured at, for a stage that changes later
        entry["measured_for"] = (plan.get("stages") or {}).get(name)
    tuning["budget_s"]["rule_s"] = round(time.perf_counter() - started, 3)
    write_json(tuning_out, tuning)
    with open(log_path, "a") as log:
        source = f"reused from {tuning['reused']['from']}" if "reused" in tuning else "measured"
        log.write(f"probe: choice {tuning['choice'] or 'none (stages keep their defaults)'} ({source})\n")
        for note in payoff_notes(tuning.get("payoff")):
            log.write(f"probe: {note}\n")
        for name, stage in tuning["stages"].items():
            if stage["predicted_images_per_s"] is not None:
                log.write(f"probe: {name} predicted {stage['predicted_images_per_s']} images/s\n")
    return tuning


def reuse_or_measure(request: dict, weights: list[str], settings: dict, *, work: Path, log_path: str) -> dict:
    """tuning.json's content: a reusable earlier measurement when settings["reuse"] allows and one matches, else a
    fresh one, kept for later runs. ``work``: R/probe/probe_work, R = <results_dir>/<run>; the measurements are kept
    in <results_dir>/probe_cache, and the stages' engine home is R/engine."""
    run_dir = work.parent.parent
    reuse_dir = run_dir.parent / "probe_cache"
    key = reuse_key(request, weights) if settings.get("reuse", True) else None
    reused = read_reusable(reuse_dir, key) if key else None
    if reused is not None:
        return {
            **reused,
            "reused": {
                "key": key,
                "from": str(reuse_dir / f"{key}.json"),
                "measured_unix": reused.get("written_unix"),
                "measured_child_s": reused["budget_s"]["child_s"],
            },
        }
    load_before = os.getloadavg()
    measured = run_child(request, work, engine_home=run_dir / "engine", log_path=log_path)
    load = (load_before, os.getloadavg())
    tuning = build_tuning(request, measured, settings, load=load)
    if key:
        tuning["reuse_cache"] = keep_for_reuse(reuse_dir, key, tuning, load=load, log_path=log_path)
    return tuning


def plan_request(
    data: str,
    *,
    cache_mode: str,
    weights: list[str],
    settings: dict,
    stage_defaults: dict,
    cfg: str,
    device: str,
    img: int,
    threads: int,
    work: Path,
    batches: list[int] | None = None,
    stages: dict | None = None,
    image_store: str | None = None,
    planned_epochs: dict[str, int] | None = None,
    boxes_need: int | None = None,
    planned_training_s: float | None = None,
) -> dict:
    """What the child measures, each stage at the size it will train at (``boxes_need``: recipe.stage_img).
    ``batches``: the batch sizes to time the model at (default: all of settings["batch"]; recipe.probe_batches narrows
    them to those a stage can take). ``stages``: each training stage's speed settings (recipe.probe_stage_specs),
    whose steady images/s the probe predicts. ``planned_epochs`` (each stage's, recipe.planned_epochs) lets the budget
    grow to TRAINING_SHARE of the planned training and decides the size the candidates are timed at (candidate_img);
    ``planned_training_s`` (recipe.planned_training_s, the recipe's time budget) is that training's length where the
    recipe has one.

    On CPU the model is timed at every torch thread count a worker candidate leaves it (cpu_budget), because that is
    what compute really gets while the workers load. Whether CUDA is there is the child's to find out (it imports
    torch anyway; importing it here too would cost seconds), so the request holds the candidates and the child
    expands them into model runs (model_runs_for)."""
    cores = cpu_budget(threads, 0)[1]
    loader_runs = [
        {"workers": w, "torch_threads": cpu_budget(threads, w)[1]}
        for w in worker_candidates(settings["workers"], cores)
    ]
    thread_counts = sorted({r["torch_threads"] for r in loader_runs}, reverse=True)
    data_yaml = yaml.safe_load(Path(data).read_text(encoding="utf-8"))
    stages = stages or {}
    stage_requests = {name: _stage_request(spec, stage_defaults, boxes_need) for name, spec in stages.items()}
    timed_img = candidate_img(stage_requests, planned_epochs or {}, int(img))  # img: the largest stage size
    data_list, train_images = write_subset(data_yaml, Path(data), work / "train_subset.txt")
    return {
        "data_list": str(data_list),
        # The budget's TRAINING_SHARE: the planned images, each counted at the candidates' size by its area.
        "planned_train_images": round(epochs_at(timed_img, stage_requests, planned_epochs or {}) * train_images),
        "planned_training_s": planned_training_s,  # recipe_minutes: the training's length whatever the rate
        "cache": None if cache_mode == "none" else cache_mode,
        "image_store": image_store if cache_mode == "ram" else None,
        "hyp": stage_hyp(stage_defaults["lr0"], stage_defaults.get("hyp") or {}),
        "img": timed_img,
        "largest_img": int(img),  # what the candidates' memory is judged at (choice.decide)
        # Loader throughput hardly depends on the batch (each worker builds whole batches); the default is typical.
        "loader_batch": _typical_batch(stage_defaults.get("batch"), settings["batch"]),
        "loader_runs": loader_runs,
        "batches": list(batches or settings["batch"]),
        "thread_counts": thread_counts,
        "choose": any(spec.get(k) == "auto" for spec in stages.values() for k in PROBED_KEYS) or not stages,
        "min_steps": int(settings["min_steps"]),
        "stable_within": float(settings["stable_within"]),
        "max_seconds": float(settings["seconds_per_candidate"]),
        "budget_s": float(settings["budget_s"]),
        "stop_when_unpaid": bool(settings.get("stop_when_unpaid", True)),
        "max_memory_fraction": float(settings["max_memory_fraction"]),
        "stages": stage_requests,
        # The model runs time the step of the first stage's engine (stages share engine.mode unless one overrides it).
        "engine": next((spec.get("engine") or {} for spec in stages.values()), {}),
        "threads": int(threads),
        "device_setting": str(device),
        "weights": str(Path(weights[0]).resolve()) if weights else "",
        "cfg": cfg,
        "nc": int(data_yaml.get("nc") or len(data_yaml["names"])),
        "freeze": int(stage_defaults.get("freeze") or 0),
        "optimizer": stage_defaults.get("optimizer") or "SGD",
        "cores": cores,
        "out": str(work / "measured.json"),
    }


def candidate_img(stage_requests: dict, planned_epochs: dict[str, int], largest: int) -> int:
    """The size the candidates (loader and model runs) are timed at: the stage size, as trained, that carries most
    of the planned training (area_epochs), the larger of equals; ``largest`` without stages or epochs. The one choice
    serves every stage, and it pays where the training spends its time: at half the size a step takes about a
    quarter as long while the loader's work per image hardly changes, so a worker count that keeps up with the
    largest size may starve the phases below it (det at 480 px: 84 of 90 epochs at 256)."""
    by_img = area_epochs(stage_requests, planned_epochs)
    if not any(by_img.values()):
        return largest
    return max(by_img, key=lambda img: (by_img[img], img))


def area_epochs(stage_requests: dict, planned_epochs: dict[str, int]) -> dict[int, int]:
    """Each stage size's planned epochs x img^2: a step's cost grows with its image area."""
    by_img: dict[int, int] = {}
    for name, spec in stage_requests.items():
        img = spec["img"]
        by_img[img] = by_img.get(img, 0) + planned_epochs.get(name, 0) * img**2
    return by_img


def epochs_at(img: int, stage_requests: dict, planned_epochs: dict[str, int]) -> float:
    """The planned epochs, each counted at ``img`` by its image area: the planned training in epochs at the
    candidates' size, whose rate the budget knows first (det at 480 px: 78 + 4 + 2 at 256 and 6 at 480 are 105
    epochs at 256). The plain sum where no stage has a size."""
    by_img = area_epochs(stage_requests, planned_epochs)
    return sum(by_img.values()) / img**2 if by_img else float(sum(planned_epochs.values()))


def _stage_request(spec: dict, stage_defaults: dict, boxes_need: int | None) -> dict:
    """The part of a stage spec its speed depends on, with a complete hyp (yolov5 needs every key): the stage's
    augmentations over stage_defaults' LR and loss gains, which do not change a step's cost."""
    hyp = {**(stage_defaults.get("hyp") or {}), **(spec.get("hyp") or {})}
    return {
        **{key: spec[key] for key in ("freeze", "batch", "workers", "amp", "gpus")},
        "img": stage_img(spec, boxes_need)[0],
        "nominal_batch": spec.get("nominal_batch") or NOMINAL_BATCH,
        "hyp": stage_hyp(stage_defaults["lr0"], hyp),
        "engine": spec.get("engine") or {},  # mode, compile, skipped rows: the step the stage runs
    }


def write_subset(data_yaml: dict, data_path: Path, list_path: Path) -> tuple[Path, int]:
    """A list file of up to SUBSET_IMAGES training images (a fixed random sample), outside the dataset, so yolov5's
    label cache for it lands next to the list and never in the user's data; and the number of training images."""
    root = Path(data_yaml.get("path") or data_path.parent)
    sources = data_yaml["train"] if isinstance(data_yaml["train"], list) else [data_yaml["train"]]
    images, _ignored = list_split_images([str(s if Path(s).is_absolute() else root / s) for s in sources])
    if not images:
        raise ValueError(f"probe: no training images found for {data_path}")
    sample = sorted(random.Random(0).sample(images, min(SUBSET_IMAGES, len(images))))
    list_path.write_text("\n".join(sample) + "\n")
    return list_path, len(images)


def run_child(request: dict, work: Path, *, engine_home: Path, log_path: str) -> dict:
    request_path = work / "request.json"
    write_json(request_path, request)
    Path(request["out"]).unlink(missing_ok=True)
    env = engine_environment(engine_home)
    env["OMP_NUM_THREADS"] = str(request["cores"])  # the child sets each measurement's count itself
    planned = planned_seconds(request)
    candidates = ""
    if request["choose"]:
        candidates = f", {len(request['loader_runs'])} loader runs and {len(request['batches'])} batch sizes"
    with open(log_path, "a") as log:
        log.write(
            f"probe: measuring {len(request['stages'])} stages' loops{candidates} within a budget of "
            f"{request['budget_s']:.0f} s\n"
        )
        log.flush()
        argv = [sys.executable, "-m", "stagedyolo.probe.child", str(request_path)]
        # Like a stage's worker: its own session, its loader workers ended with it, a hung child stopped.
        limit_s = CHILD_STARTUP_S + CHILD_TIMEOUT_FACTOR * planned
        result = supervise(argv, env, stdout=log, stderr=subprocess.STDOUT, timeout_s=limit_s)
    if result.timed_out:
        raise RuntimeError(
            f"probe: the measuring process ran past its {limit_s:.0f} s limit and was stopped; see {log_path}"
        )
    if result.returncode != 0:
        raise RuntimeError(f"probe: the measuring process exited {result.returncode}; see {log_path}")
    return read_json(request["out"])


def planned_seconds(request: dict) -> float:
    """The timed measuring at most (the runs' caps), without imports and warm-ups; the budget may end it sooner."""
    model_runs = len(request["batches"]) * len(request["thread_counts"]) * 2 if request["choose"] else 0
    loader_runs = len(request["loader_runs"]) if request["choose"] else 0
    return (model_runs + loader_runs + len(request["stages"])) * request["max_seconds"]


def build_tuning(request: dict, measured: dict, settings: dict, *, load: tuple) -> dict:
    cuda = measured["cuda"]
    choice = measured["choice"]
    notes = [
        "predicted images/s per stage: the stage's own loop measured end to end (yolov5's loader with the stage's "
        "workers, image size and augmentation; training steps at its freeze, batch, AMP, nominal batch and EMA)",
        "candidates for the auto settings: W=0 loads then computes (1/(1/loader+1/model)); W>0 overlaps them (min "
        "of both" + ("" if cuda else ", and cores/(W/loader + threads/model): workers and compute share cores") + ")",
        f"ties within {TIE_TOLERANCE:.0%} of the best go to the smaller batch",
        f"every run excludes its warm-up (worker start and prefetched batches, {MODEL_WARMUP_STEPS} model steps at a "
        f"new step shape, {SEEN_SHAPE_WARMUP_STEPS} at one already run) and "
        f"is timed for at least {request['min_steps']} steps, until its halves agree within "
        f"{request['stable_within']:.0%} or {request['max_seconds']} s run out (flagged stable: false)",
        f"budget: {request['budget_s']:g} s for the whole probe, imports included, or {TRAINING_SHARE:.0%} of the "
        f"planned training ({_planned_training(request)}) if longer; each "
        f"run gets an equal share of what is left when it starts, and one whose share runs out ends with the steps "
        f"it timed (cut_by_budget, at least {MIN_TIMED_STEPS}); a candidate run that would leave the stage loops "
        f"less than their least time is not measured (status skipped)",
        f"AMP: {measured['amp_verdict']['reason']}",
        f"candidates timed at {request['img']} px, the stage size most of the planned training runs at (epochs x "
        f"img^2; largest stage size {request['largest_img']} px, at which their peak memory is judged)",
        f"loader measured on {request['data_list']} (at most {SUBSET_IMAGES} training images), cache "
        f"{request['cache'] or 'none'}" + (", served from the run's image store" if request["image_store"] else ""),
    ]
    if any(spec["engine"].get("compile") for spec in request["stages"].values()):
        notes.append("engine.compile: the probe times the uncompiled step (compiling takes longer than its budget)")
    if sorted(request["batches"]) != sorted(settings["batch"]):
        notes.append(
            f"model timed at batch {request['batches']} only: no stage leaves batch at auto, so the other "
            f"candidates {settings['batch']} could not be chosen"
        )
    if not cuda:
        notes.append("AMP needs CUDA: measured with AMP off only; peak memory is not measured on CPU (null)")
    skipped = [run for run in measured["model"] + measured["loader"] if run.get("status") == "skipped"]
    if skipped:
        notes.append(
            f"{len(skipped)} candidate runs not measured, so their candidates could not be chosen (a larger "
            f"probe.budget_s measures them): " + "; ".join(sorted({run["message"] for run in skipped}))
        )
    payoff = measured.get("payoff")
    notes += payoff_notes(payoff)
    if request["choose"] and not choice and not unpaid(payoff, "candidates"):
        notes.append("no usable candidate: the stages keep their defaults")
    return {
        "choice": choice,
        "amp_verdict": measured["amp_verdict"],
        "payoff": payoff,
        "stages": unpaid_stages(request) if unpaid(payoff, "stage_loops") else predictions(measured["stage_runs"]),
        "candidates": measured["candidates"],
        "measurements": {"loader": measured["loader"], "model": measured["model"], "stages": measured["stage_runs"]},
        "machine": {
            "device": measured["device"],
            "device_name": measured["device_name"],
            "gpu_total_memory_bytes": measured["gpu_total_memory_bytes"],
            "memory_limit_bytes": measured["memory_limit_bytes"],
            "bf16_supported": measured["bf16_supported"],
            "threads_granted": request["threads"],
            "available_cores": available_cores(),
            "cores_used": request["cores"],
            "torch": measured["torch"],
            "load_average_before": load[0][0],
            "load_average_after": load[1][0],
        },
        "budget_s": {
            "budget_s": request["budget_s"],
            "allowed_s": measured.get("budget_allowed_s"),  # budget_s, or TRAINING_SHARE of the training if longer
            "seconds_per_candidate": settings["seconds_per_candidate"],
            "planned_measuring_s": round(planned_seconds(request), 3),
            "import_s": measured["import_s"],
            "child_s": measured["child_s"],
        },
        "settings": {
            "img": request["img"],  # the candidates' (candidate_img)
            "largest_img": request["largest_img"],
            "workers": [run["workers"] for run in request["loader_runs"]],
            "workers_setting": settings["workers"],
            "batch": settings["batch"],
            "batch_measured": request["batches"],
            "min_steps": request["min_steps"],
            "stable_within": request["stable_within"],
            "max_memory_fraction": settings["max_memory_fraction"],
        },
        "notes": notes,
        "patches": measured.get("patches"),  # the patch rows the probe's process applied
        "written_unix": round(time.time(), 3),
    }


def payoff_notes(payoff: dict | None) -> list[str]:
    """One note per part of the probe judged not to pay (MeasuringBudget.payoff), with its figures."""
    if payoff is None:
        return []
    by_budget = payoff.get("training_from") == "recipe_minutes"
    source = "recipe_minutes" if by_budget else f"at {payoff['at_images_per_s']:g} images/s"
    head = f"the planned training takes about {payoff['training_s']:g} s ({source})"
    what = {
        "candidates": "the other candidates were not measured: the choice may save {share:.0%} of it, {worth_s:g} s, "
        "less than the {cost_s:g} s they would take; the stages keep their defaults for workers, batch and amp",
        "stage_loops": "the stage loops were not measured: predictions may take {share:.0%} of it, {worth_s:g} s, "
        "less than the {cost_s:g} s they would take; no stage has a prediction",
    }
    return [
        f"{head}; {what[part].format(**payoff[part])} (probe.stop_when_unpaid: false measures anyway)"
        for part in what
        if unpaid(payoff, part)
    ]


def _planned_training(request: dict) -> str:
    if request.get("planned_training_s"):
        return f"recipe_minutes: {request['planned_training_s']:g} s"
    return f"{request['planned_train_images']} images at the fastest rate measured"


def unpaid_stages(request: dict) -> dict:
    """tuning.json `stages` when the stage loops did not pay: no prediction for any stage, and why."""
    why = (
        "the probe did not measure the stage loops: on a training this short they would cost more than "
        f"{TRAINING_SHARE:.0%} of it"
    )
    return {name: {"predicted_images_per_s": None, "reason": why} for name in request["stages"]}


def _typical_batch(default, candidates: list[int]) -> int:
    if isinstance(default, int) and not isinstance(default, bool):
        return default
    return sorted(candidates)[len(candidates) // 2]

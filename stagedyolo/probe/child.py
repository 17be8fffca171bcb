"""The measuring process: `python -m stagedyolo.probe.child request.json` writes the request's `out` JSON.

It runs in a process of its own, with the offline engine environment, for the same reasons a stage does (yolov5
keeps global state and reaches for the network), and so that its torch threads and dataloader workers are
exactly what it sets, not what the calling Snakemake process happened to have.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import time
from pathlib import Path

from stagedyolo.engine import compat
from stagedyolo.engine.amp import AMP_MIN_STEPS
from stagedyolo.engine.patches import apply_job_patches, step_engine
from stagedyolo.engine.worker import resolve_device
from stagedyolo.probe.choice import decide
from stagedyolo.probe.stages import stage_groups
from stagedyolo.probe.steady import (
    MIN_TIMED_STEPS,
    MODEL_WARMUP_STEPS,
    SEEN_SHAPE_WARMUP_STEPS,
    MeasuringBudget,
    area_ratio,
    time_steady,
    unpaid,
)
from stagedyolo.yolov5_facts import accumulate

# Objects per synthetic image: enough that the loss builds targets on every detection layer, as real labels do.
SYNTHETIC_OBJECTS = 4
# A loader-only run may stop early once it delivers this many times the fastest model rate (after min_steps
# batches): then it cannot be the bottleneck, and the rest of its budget would measure nothing that matters.
LOADER_AMPLE_FACTOR = 3
# Batches each DataLoader worker queues ahead (PyTorch's prefetch_factor default): they arrive at once, so they
# are warm-up, not steady state.
PREFETCH_PER_WORKER = 2
# Seconds kept after the child's deadline for the rule to write tuning.json.
WRITE_RESERVE_S = 0.3
# Why the candidate runs after the first model run were not measured (MeasuringBudget.payoff).
UNPAID_WHY = "measuring the other candidates would cost more than the choice may save (tuning.json payoff)"


def main(request_path: str) -> int:
    started = time.perf_counter()
    request = json.loads(Path(request_path).read_text())
    # Before yolov5's first import (its import shims act on imports still to come); a RAM cache is read from the
    # run's store, as the stages do.
    compat.quiet_engine_warnings()
    patches = apply_job_patches(("ram_cache_store",), {"cache": "ram", "image_store": request.get("image_store")})
    import torch

    torch.set_num_threads(max(request["thread_counts"]))
    from yolov5.utils.dataloaders import create_dataloader
    from yolov5.utils.loss import ComputeLoss  # noqa: F401  (imported here so its cost counts as import time)

    import_s = time.perf_counter() - started
    cuda = resolve_device(request["device_setting"], torch.cuda.is_available()) != "cpu"
    device = torch.device(_torch_device(request["device_setting"]) if cuda else "cpu")
    model = build_model(request, device)
    engines = StepEngines(request, "" if cuda else "cpu", torch)
    model_engine = engines.prepare(model, request.get("engine"))  # the model runs' (the first stage's)
    model.probe_optimizer = model_engine["optimizer"]
    stride = max(int(model.stride.max()), 32)  # train.py's grid size: images are padded to a multiple of it
    # The first step of a process pays one-off set-up (kernel selection, allocator, thread pools): not a candidate's.
    # One step at batch 1 pays it; each run then warms up at its own shape (WarmShapes).
    torch.set_num_threads(min(request["thread_counts"]))
    measure_model(model, {**request, "min_steps": 1, "max_seconds": 0}, 1, False, device, warmup_steps=0)
    # Everything so far lives until the end: the cyclic garbage collector need not scan it again. Each run's
    # gc.collect() then took milliseconds instead of 0.17 s, and loader workers forked later share those pages.
    gc.freeze()

    total = torch.cuda.get_device_properties(device).total_memory if cuda else None
    bf16 = torch.cuda.is_bf16_supported() if cuda else None
    measured = measure_all(
        request,
        model,
        create_dataloader,
        stride,
        device,
        engines,
        cuda=cuda,
        bf16_supported=bf16,
        gpu_total_memory_bytes=total,
    )
    for run in measured["model"]:
        run["engine_rows"] = model_engine["rows"]
    result = {
        "cuda": cuda,
        **measured,
        "import_s": round(import_s, 3),
        "child_s": round(time.perf_counter() - started, 3),
        "torch": torch.__version__,
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if cuda else "cpu",
        "bf16_supported": bf16,
        "gpu_total_memory_bytes": total,
        "patches": patches,
    }
    Path(request["out"]).write_text(json.dumps(result, indent=2))
    return 0


def measure_all(
    request: dict,
    model,
    create_dataloader,
    stride: int,
    device,
    engines,
    *,
    cuda: bool,
    bf16_supported: bool | None,
    gpu_total_memory_bytes: int | None,
) -> dict:
    """Every measurement within the request's budget, and the choice: the candidates' model runs, then their loader
    runs (which may stop once they clearly outpace the fastest model run), then each stage group's loop at the
    chosen settings. The stage loops make the predictions, so a candidate run is skipped (``affords``) when it would
    leave them less than their least time: its figure would only have widened the choice. Once the first model run
    gives a rate, each part of the rest is measured only where it pays (``MeasuringBudget.payoff``): the other
    candidates (else the stages keep their defaults) and the stage loops (else no stage has a prediction)."""
    model_plan = model_runs_for(request, cuda) if request["choose"] else []
    loader_plan = request["loader_runs"] if request["choose"] else []
    loop_imgs = [group["img"] for group in stage_groups(request, {}, cuda, bf16_supported)]
    stage_runs_planned = len(loop_imgs)
    budget = MeasuringBudget(
        _deadline(request),
        len(model_plan) + len(loader_plan) + stage_runs_planned,
        request["budget_s"],
        request.get("planned_train_images") or 0,
        planned_training_s=request.get("planned_training_s"),
    )
    warm = WarmShapes()
    model_runs, payoff = measure_model_candidates(
        model, request, model_plan, device, budget, warm, loop_imgs, cuda, loader_plan
    )
    if unpaid(payoff, "candidates"):
        loader_runs = [skipped(run, UNPAID_WHY) for run in loader_plan]
    else:
        loader_runs = measure_loader_candidates(
            create_dataloader, request, loader_plan, model_runs, stride, budget, cuda
        )
    decision = decide(request, loader_runs, model_runs, cuda=cuda, gpu_total_memory_bytes=gpu_total_memory_bytes)
    groups = [] if unpaid(payoff, "stage_loops") else stage_groups(request, decision["choice"], cuda, bf16_supported)
    stage_runs = []
    for group in groups:
        warmup_steps = warm.steps(
            group["img"], group["batch"], group["amp"] and cuda and group["amp_dtype"], group["engine"]
        )
        stage_runs.append(
            measure_stage_run(
                create_dataloader, model, request, group, stride, device, engines, budget.next_deadline(), warmup_steps
            )
        )
        rate = stage_runs[-1]["images_per_s"]  # in images at the candidates' size, as the budget counts them
        budget.note_rate(rate and rate * area_ratio(group["img"], request["img"]))
    return {
        **decision,
        "loader": loader_runs,
        "model": model_runs,
        "stage_runs": stage_runs,
        "budget_allowed_s": None if budget.allowed_s is None else round(budget.allowed_s, 3),
        "payoff": payoff,
    }


def measure_model_candidates(
    model,
    request: dict,
    plan: list[dict],
    device,
    budget: MeasuringBudget,
    warm: WarmShapes,
    loop_imgs: list[int],
    cuda: bool,
    loader_plan: list[dict],
) -> tuple[list[dict], dict | None]:
    """The model runs of ``plan`` (model_runs_for), each skipped once it would leave the stage loops to come (one at
    each of ``loop_imgs``) less than their least time (RunCosts); and, after the first (with
    probe.stop_when_unpaid), whether the other candidates and the stage loops pay (MeasuringBudget.payoff, returned as
    the second item; None when not judged).
    A part that does not pay is dropped from the budget with its share of the time: the runs after it skip."""
    runs, payoff = [], None
    for run in plan:
        if unpaid(payoff, "candidates"):
            runs.append(skipped(run, UNPAID_WHY))
            continue
        shape = model_shape(request, run, cuda)
        costs = RunCosts.of(runs, request, cuda)
        loops = [] if unpaid(payoff, "stage_loops") else loop_imgs
        if costs and not budget.affords(costs.model_run(run, warm.needed(*shape)), costs.stages(loops)):
            runs.append(skipped(run, "within the budget it would leave the stage loops less than their least time"))
            budget.skip()
            continue
        runs.append(measure_model_run(model, request, run, device, budget.next_deadline(), warm.steps(*shape)))
        budget.note_rate(runs[-1]["images_per_s"])  # may lengthen the budget for the runs after it
        if len(runs) == 1 and request.get("stop_when_unpaid", True):
            costs = RunCosts.of(runs, request, cuda)
            rest = costs and costs.expected_rest(plan[1:], loader_plan, loop_imgs, warm)
            payoff = judge_the_rest(budget, cuda, rest)
    return runs, payoff


def model_shape(request: dict, run: dict, cuda: bool) -> tuple:
    """A model run's step shape (WarmShapes): the candidates' size, its batch and autocast dtype, the engine."""
    return request["img"], run["batch"], run["amp"] and cuda and "float16", request.get("engine")


def judge_the_rest(budget: MeasuringBudget, cuda: bool, expected: dict | None) -> dict | None:
    """MeasuringBudget.payoff for the runs still planned (``expected``: each one's seconds by part), each part that
    does not pay dropped from the budget."""
    payoff = budget.payoff(cuda, expected)
    for part in ("candidates", "stage_loops"):
        if unpaid(payoff, part):
            budget.drop(payoff[part]["runs"])
    return payoff


def measure_loader_candidates(
    create_dataloader,
    request: dict,
    plan: list[dict],
    model_runs: list[dict],
    stride: int,
    budget: MeasuringBudget,
    cuda: bool,
) -> list[dict]:
    """The loader runs of ``plan``; on CPU one whose torch-thread count has no measured model run is skipped (its
    candidate pairs with that run only)."""
    ample = LOADER_AMPLE_FACTOR * max((run["images_per_s"] or 0 for run in model_runs), default=0)
    timed_threads = {run["torch_threads"] for run in model_runs if run["status"] != "skipped"}
    runs = []
    for run in plan:
        if not cuda and run["torch_threads"] not in timed_threads:
            runs.append(skipped(run, f"no model run at the {run['torch_threads']} torch threads it leaves"))
            budget.skip()
            continue
        runs.append(measure_loader_run(create_dataloader, request, run, stride, ample, budget.next_deadline()))
    return runs


def skipped(run: dict, why: str) -> dict:
    """A planned candidate run that was not measured, and why: its candidates are not usable (choice.combine)."""
    print(f"probe: not measured: {json.dumps(run)}: {why}", flush=True)
    return {**run, "status": "skipped", "message": f"not measured: {why}", "images_per_s": None}


class RunCosts:
    """What a run still to come takes, from the first model run's steady step (at ``img``, the candidates' size,
    via ``request``): its least time (warm-up and MIN_TIMED_STEPS), which decides whether a candidate may still
    start, and its expected time (warm-up and min_steps, the timed part at most max_seconds), which the payoff charges
    a part of the probe. A model run's step is scaled by batch and on CPU by torch threads (as if a step's work were
    spread evenly over them); a stage loop's by its image area, at the first run's batch and threads, with a full
    warm-up; a loader run is taken to deliver LOADER_AMPLE_FACTOR times the first run's rate, where it stops early
    (a slower loader runs longer, up to its share, and then the choice is worth more). Rough by design: it decides
    what may start and what is worth measuring, never what a run measures."""

    def __init__(self, reference: dict, request: dict, cuda: bool):
        self.reference, self.request, self.cuda = reference, request, cuda
        self.img, self.min_steps, self.max_seconds = request["img"], request["min_steps"], request["max_seconds"]
        self.step_s = reference["seconds"] / reference["steps"]

    @classmethod
    def of(cls, model_runs: list[dict], request: dict, cuda: bool) -> RunCosts | None:
        """From the first model run, once it has a steady figure (None before, or when it failed)."""
        first = model_runs[0] if model_runs else None
        usable = first and first["status"] == "ok" and first.get("steps") and first.get("seconds")
        return cls(first, request, cuda) if usable else None

    def _model_step_s(self, run: dict) -> float:
        scale = run["batch"] / self.reference["batch"]
        if not self.cuda:
            scale *= self.reference["torch_threads"] / run["torch_threads"]
        return self.step_s * scale

    def _stage_step_s(self, img: int) -> float:
        return self.step_s * area_ratio(img, self.img)

    def _expected(self, step_s: float, warmup_steps: int, min_steps: int) -> float:
        timed = max(MIN_TIMED_STEPS * step_s, min(min_steps * step_s, self.max_seconds))
        return warmup_steps * step_s + timed

    def model_run(self, run: dict, warmup_steps: int) -> float:
        """A model run's least time."""
        return self._model_step_s(run) * (warmup_steps + MIN_TIMED_STEPS)

    def stages(self, imgs: list[int]) -> float:
        """The least time of the stage loops at ``imgs``, one each."""
        return sum(self._stage_step_s(img) * (MODEL_WARMUP_STEPS + MIN_TIMED_STEPS) for img in imgs)

    def expected_model_run(self, run: dict, warmup_steps: int) -> float:
        return self._expected(self._model_step_s(run), warmup_steps, run["min_steps"])

    def expected_loader_run(self, run: dict) -> float:
        batch_s = self.request["loader_batch"] / (LOADER_AMPLE_FACTOR * self.reference["images_per_s"])
        return self._expected(batch_s, loader_warmup_steps(run["workers"]), self.min_steps)

    def expected_stage_loops(self, imgs: list[int]) -> list[float]:
        return [self._expected(self._stage_step_s(img), MODEL_WARMUP_STEPS, self.min_steps) for img in imgs]

    def expected_rest(
        self, model_plan: list[dict], loader_plan: list[dict], loop_imgs: list[int], warm: WarmShapes
    ) -> dict:
        """Each run still planned, its expected seconds, by part of the probe (MeasuringBudget.payoff): the other
        candidates (model and loader runs) and the stage loops."""
        model_s = [
            self.expected_model_run(run, warm.needed(*model_shape(self.request, run, self.cuda))) for run in model_plan
        ]
        loader_s = [self.expected_loader_run(run) for run in loader_plan]
        return {"candidates": model_s + loader_s, "stage_loops": self.expected_stage_loops(loop_imgs)}


class WarmShapes:
    """The step shapes this process has run, and so how many untimed model steps a run at a shape needs. A shape
    includes the engine, whose rows choose the kernels (cuDNN autotuning, memory format)."""

    def __init__(self):
        self.run: set[tuple] = set()

    def needed(self, img: int, batch: int, autocast_dtype: str | bool | None, engine: dict | None = None) -> int:
        """The untimed steps a run at this shape needs."""
        seen = self._key(img, batch, autocast_dtype, engine) in self.run
        return SEEN_SHAPE_WARMUP_STEPS if seen else MODEL_WARMUP_STEPS

    def steps(self, img: int, batch: int, autocast_dtype: str | bool | None, engine: dict | None = None) -> int:
        """The untimed steps a run at this shape needs, which from now on the process has run."""
        needed = self.needed(img, batch, autocast_dtype, engine)
        self.run.add(self._key(img, batch, autocast_dtype, engine))
        return needed

    @staticmethod
    def _key(img: int, batch: int, autocast_dtype: str | bool | None, engine: dict | None) -> tuple:
        return img, batch, autocast_dtype or None, engine_key(engine)


def _deadline(request: dict) -> float | None:
    """The request's deadline (wall clock, set by the rule from probe.budget_s) on this process's perf_counter."""
    if request.get("deadline_unix") is None:
        return None
    return time.perf_counter() + request["deadline_unix"] - WRITE_RESERVE_S - time.time()


def model_runs_for(request: dict, cuda: bool) -> list[dict]:
    """The model runs (batch, amp, torch threads). On CUDA the GPU computes: each batch is timed once, with the
    fewest threads any candidate gets, with AMP on and off (at least AMP_MIN_STEPS steps each: the AMP policy's
    evidence). On CPU AMP does not apply, and each batch is timed at every thread count the worker candidates leave."""
    thread_counts = request["thread_counts"][-1:] if cuda else request["thread_counts"]
    amps = (True, False) if cuda else (False,)
    min_steps = max(request["min_steps"], AMP_MIN_STEPS) if cuda else request["min_steps"]
    return [
        {"batch": b, "amp": a, "torch_threads": t, "min_steps": min_steps}
        for b in request["batches"]
        for a in amps
        for t in thread_counts
    ]


def measure_model_run(
    model, request: dict, run: dict, device, deadline: float | None, warmup_steps: int = MODEL_WARMUP_STEPS
) -> dict:
    import torch

    torch.set_num_threads(run["torch_threads"])
    measured = measure_model(
        model, {**request, "min_steps": run["min_steps"]}, run["batch"], run["amp"], device, deadline, warmup_steps
    )
    print(
        f"probe: model batch={run['batch']} amp={run['amp']} threads={run['torch_threads']}: "
        f"{measured.get('images_per_s')} images/s",
        flush=True,
    )
    return {**run, **measured}


def _torch_device(device: str) -> str:
    """The first CUDA device of a yolov5 device string ('' = the first one, '0,1' = several: measure on one)."""
    return "cuda:" + (resolve_device(device, True).split(",")[0] or "0")


def build_model(request: dict, device):
    """The stage's network, as train.py builds it: the checkpoint's own yaml (or cfg) with the data's class count.

    A checkpoint's model is rebuilt rather than used as is: the stage trains with the data's nc, which may differ
    from the checkpoint's, and the step cost depends on the architecture only, not on the weights' values.
    """
    import torch
    from yolov5.models.yolo import Model
    from yolov5.utils.general import check_yaml

    hyp = request["hyp"]
    if request["weights"]:
        architecture = torch.load(request["weights"], map_location="cpu", weights_only=False)["model"].yaml
    else:
        architecture = check_yaml(request["cfg"])  # finds yolov5n.yaml & co. inside the package
    model = Model(architecture, ch=3, nc=request["nc"], anchors=hyp.get("anchors")).float().to(device)
    _freeze(model, request["freeze"])
    model.nc, model.hyp, model.gr = request["nc"], hyp, 1.0  # what train.py attaches before ComputeLoss
    model.train()
    return model


def engine_key(engine: dict | None) -> str:
    """A stage's engine setting (mode, compile, skipped rows) as one comparable value."""
    return json.dumps(engine or {}, sort_keys=True)


class StepEngines:
    """The stage engine's pieces of a training step (stagedyolo.engine.patches.step_engine: the rows that change a
    step's speed, such as the fused optimizer, the foreach EMA and, on CUDA, cuDNN autotuning and channels_last),
    made once per distinct engine setting, so that the probe times the step each stage will run."""

    def __init__(self, request: dict, device: str, torch):
        self.request, self.device, self.torch, self.made = request, device, torch, {}

    def prepare(self, model, engine: dict | None) -> dict:
        """Set the process and ``model`` up as a stage of ``engine`` runs them, from torch's and yolov5's defaults
        (the last run may have had another engine), and return {optimizer, ema_class, rows}: rows applied."""
        key = engine_key(engine)
        if key not in self.made:
            self.made[key] = step_engine(engine or {}, self.request["optimizer"], self.device, self.torch)
        pieces, report = self.made[key]
        torch = self.torch
        torch.use_deterministic_algorithms(False)
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = False, False
        pieces.init_seeds(0, deterministic=True)  # as train.py calls it; a fast engine's row makes it nondeterministic
        model.to(memory_format=torch.contiguous_format)
        pieces.check_amp(model)  # where train.py lets the rows change the built model (channels_last)
        hyp = self.request["hyp"]
        return {
            "optimizer": pieces.smart_optimizer(
                model, self.request["optimizer"], hyp["lr0"], hyp["momentum"], hyp["weight_decay"]
            ),
            "ema_class": pieces.ModelEMA,
            "rows": [row["name"] for row in report if row["applied"]],
        }


def loader_warmup_steps(workers: int) -> int:
    """A loader run's untimed batches: the first, and those the workers queued meanwhile, which arrive at once."""
    return 1 + PREFETCH_PER_WORKER * workers


def measure_loader_run(
    create_dataloader, request: dict, run: dict, stride: int, ample_images_per_s: float, deadline: float | None
) -> dict:
    """Steady images/s from yolov5's own training dataloader (augment, mosaic, cache as the stage will have them).
    Warm-up: worker start-up and the batches the workers queued meanwhile (PREFETCH_PER_WORKER each, which arrive
    at once). The run may end early once the loader clearly outpaces the model (LOADER_AMPLE_FACTOR)."""
    import torch

    torch.set_num_threads(run["torch_threads"])  # with 0 workers the main process does the loading
    loader = _training_loader(
        create_dataloader, request, request["img"], request["loader_batch"], stride, run["workers"], request["hyp"]
    )
    batches = _endless(loader)
    measured = time_steady(
        lambda: next(batches)[0].shape[0],  # noqa: F821 (bound above; deleted only after the timing)
        warmup_steps=loader_warmup_steps(loader.num_workers),
        min_steps=request["min_steps"],
        stable_within=request["stable_within"],
        max_seconds=request["max_seconds"],
        deadline=deadline,
        enough=lambda images, seconds: 0 < ample_images_per_s <= images / seconds,
    )
    effective = loader.num_workers  # yolov5 caps workers at min(cpu_count, batch, workers)
    _stop_workers(loader)  # idle workers would otherwise keep cores and memory during the next measurement
    del batches, loader
    gc.collect()
    print(f"probe: loader workers={run['workers']}: {measured['images_per_s']} images/s", flush=True)
    return {**run, "workers_effective": effective, "batch": request["loader_batch"], **measured}


def measure_model(
    model,
    request: dict,
    batch: int,
    amp: bool,
    device,
    deadline: float | None = None,
    warmup_steps: int = MODEL_WARMUP_STEPS,
) -> dict:
    """Steady images/s of full training steps (forward, ComputeLoss, backward, optimizer step) on synthetic batches,
    after ``warmup_steps`` untimed ones (WarmShapes)."""
    import torch
    from yolov5.utils.loss import ComputeLoss

    cuda = device.type == "cuda"
    img = request["img"]
    generator = torch.Generator().manual_seed(batch)
    imgs = torch.rand(batch, 3, img, img, generator=generator).to(device)
    targets = synthetic_targets(batch, request["nc"], generator).to(device)
    compute_loss = ComputeLoss(model)
    optimizer = model.probe_optimizer
    scaler = torch.amp.GradScaler("cuda", enabled=amp and cuda)

    def train_step() -> int:
        with torch.autocast(device.type, enabled=amp and cuda):
            loss, _items = compute_loss(model(imgs), targets)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.synchronize(device)  # kernels run asynchronously: time them, not their launch
        return batch

    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    try:
        measured = time_steady(
            train_step,
            warmup_steps=warmup_steps,
            min_steps=request["min_steps"],
            stable_within=request["stable_within"],
            max_seconds=request["max_seconds"],
            deadline=deadline,
        )
    except torch.cuda.OutOfMemoryError as error:
        optimizer.zero_grad(set_to_none=True)
        torch.cuda.empty_cache()
        return {
            "status": "oom",
            "message": str(error).splitlines()[0],
            "images_per_s": None,
            "peak_memory_bytes": None,
            "peak_memory_reason": "ran out of memory",
        }
    return {
        "status": "ok",
        **measured,
        "peak_memory_bytes": torch.cuda.max_memory_allocated(device) if cuda else None,
        "peak_memory_reason": None if cuda else "not measured on CPU (torch tracks peak memory on CUDA only)",
    }


def measure_stage_run(
    create_dataloader,
    model,
    request: dict,
    group: dict,
    stride: int,
    device,
    engines,
    deadline: float | None,
    warmup_steps: int = MODEL_WARMUP_STEPS,
) -> dict:
    """One stage's steady images/s, end to end: yolov5's loader with the workers the stage will run, feeding
    training steps at the stage's image size, freeze, batch, AMP and nominal batch (accumulation, EMA), in one
    process with the torch threads the stage gets. This is the prediction the stage's timing.json is compared with.
    """
    import torch
    from yolov5.utils.loss import ComputeLoss

    torch.set_num_threads(group["torch_threads"])
    _freeze(model, group["freeze"])
    engine = engines.prepare(model, group["engine"])
    optimizer = engine["optimizer"]
    loader = _training_loader(
        create_dataloader, request, group["img"], group["batch"], stride, group["workers"], group["hyp"]
    )
    batches = _endless(loader)
    cuda = device.type == "cuda"
    dtype = torch.bfloat16 if group["amp_dtype"] == "bfloat16" else torch.float16
    scaler = torch.amp.GradScaler("cuda", enabled=group["amp"] and cuda)
    compute_loss, ema = ComputeLoss(model), engine["ema_class"](model)
    every = accumulate(group["batch"], group["nominal_batch"])  # train.py's optimizer step every N batches
    count = [0]

    def train_step() -> int:
        imgs, targets, _paths, _shapes = next(batches)  # noqa: F821 (deleted only after the timing)
        imgs = imgs.to(device, non_blocking=True).float() / 255
        with torch.autocast(device.type, enabled=group["amp"] and cuda, dtype=dtype):
            loss, _items = compute_loss(model(imgs), targets.to(device))
        scaler.scale(loss).backward()
        count[0] += 1
        if count[0] % every == 0:  # as train.py: gradients unscaled and clipped before each optimizer step
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=10.0)
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
            ema.update(model)  # noqa: F821 (deleted only after the timing)
        if cuda:
            torch.cuda.synchronize(device)
        return imgs.shape[0]

    measured = time_steady(
        train_step,
        warmup_steps=warmup_steps + PREFETCH_PER_WORKER * loader.num_workers,
        min_steps=request["min_steps"],
        stable_within=request["stable_within"],
        max_seconds=request["max_seconds"],
        deadline=deadline,
    )
    _stop_workers(loader)
    del batches, loader, ema
    optimizer.zero_grad(set_to_none=True)
    gc.collect()
    print(
        f"probe: stages {', '.join(group['stages'])} (img {group['img']}, freeze {group['freeze']}, "
        f"batch {group['batch']}, workers {group['workers']}): {measured['images_per_s']} images/s",
        flush=True,
    )
    return {**{k: v for k, v in group.items() if k != "hyp"}, **measured, "engine_rows": engine["rows"]}


def _freeze(model, layers: int) -> None:
    frozen = [f"model.{layer}." for layer in range(layers)]  # train.py's --freeze N
    for name, parameter in model.named_parameters():
        parameter.requires_grad = not any(prefix in name for prefix in frozen)


def synthetic_targets(batch: int, nc: int, generator):
    """yolov5 targets rows (image index, class, x, y, w, h), normalised, a few objects per image."""
    import torch

    count = batch * SYNTHETIC_OBJECTS
    image_index = torch.arange(batch).repeat_interleave(SYNTHETIC_OBJECTS).float()
    classes = torch.randint(0, nc, (count,), generator=generator).float()
    sizes = 0.05 + 0.3 * torch.rand(count, 2, generator=generator)
    centres = sizes / 2 + (1 - sizes) * torch.rand(count, 2, generator=generator)
    return torch.cat([image_index[:, None], classes[:, None], centres, sizes], dim=1)


def _training_loader(create_dataloader, request: dict, img: int, batch: int, stride: int, workers: int, hyp: dict):
    """yolov5's training dataloader over the probe's subset, with the augmentation and cache a stage has."""
    loader, _dataset = create_dataloader(
        request["data_list"],
        img,
        batch,
        stride,
        hyp=hyp,
        augment=True,
        cache=request["cache"],
        rect=False,
        rank=-1,
        workers=workers,
        shuffle=True,
        prefix="probe: ",
        seed=0,
    )
    return loader


def _endless(loader):
    while True:
        yield from loader


def _stop_workers(loader) -> None:
    iterator = getattr(loader, "iterator", None)  # InfiniteDataLoader keeps its workers alive in `iterator`
    shutdown = getattr(iterator, "_shutdown_workers", None)
    if callable(shutdown):
        shutdown()


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    code = main(sys.argv[1])
    # The result is on disk and the loader workers are stopped: skip the interpreter's teardown (unwinding torch,
    # yolov5 and their thread pools took 1.5-2 s on the 2-core demo machine), which the pipeline would wait for.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)

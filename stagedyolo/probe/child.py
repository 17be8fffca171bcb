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
import warnings
from pathlib import Path

from stagedyolo.engine import compat
from stagedyolo.engine.worker import resolve_device

# Objects per synthetic image: enough that the loss builds targets on every detection layer, as real labels do.
SYNTHETIC_OBJECTS = 4
# A loader run may stop early once it delivers this many times the fastest model rate, after at least this many
# batches: then it cannot be the bottleneck, and the rest of its budget would measure nothing that matters.
LOADER_AMPLE_FACTOR = 3
LOADER_MIN_BATCHES = 10
# Batches each DataLoader worker queues ahead (PyTorch's prefetch_factor default): they arrive at once.
PREFETCH_PER_WORKER = 2


def main(request_path: str) -> int:
    started = time.perf_counter()
    request = json.loads(Path(request_path).read_text())
    compat.install()
    warnings.filterwarnings("ignore", message=r".*torch\.cuda\.amp\.(autocast|GradScaler).*", category=FutureWarning)
    import torch

    torch.set_num_threads(max(request["thread_counts"]))
    from yolov5.utils.dataloaders import create_dataloader
    from yolov5.utils.loss import ComputeLoss  # noqa: F401  (imported here so its cost counts as import time)

    import_s = time.perf_counter() - started
    cuda = resolve_device(request["device_setting"], torch.cuda.is_available()) != "cpu"
    device = torch.device(_torch_device(request["device_setting"]) if cuda else "cpu")
    runs, seconds_per_model_run = model_runs_for(request, cuda)
    request = {**request, "seconds_per_model_run": seconds_per_model_run}
    model = build_model(request, device)
    stride = max(int(model.stride.max()), 32)  # train.py's grid size: images are padded to a multiple of it

    # The model first: its fastest rate tells each loader run when it has shown it cannot be the bottleneck.
    # The first step of a process pays one-off set-up (kernel selection, allocator, thread pools): not a candidate's.
    torch.set_num_threads(min(r["torch_threads"] for r in runs))  # the cheapest on a busy box
    measure_model(model, {**request, "seconds_per_model_run": 0}, 1, False, device)
    model_runs = []
    for run in runs:
        torch.set_num_threads(run["torch_threads"])
        model_runs.append({**run, **measure_model(model, request, run["batch"], run["amp"], device)})
        print(f"probe: model batch={run['batch']} amp={run['amp']} threads={run['torch_threads']}: "
              f"{model_runs[-1].get('images_per_s')} images/s", flush=True)  # fmt: skip

    fastest_model = max((r["images_per_s"] or 0 for r in model_runs), default=0)
    loader_runs = []
    for run in request["loader_runs"]:
        torch.set_num_threads(run["torch_threads"])  # with 0 workers the main process does the loading
        loader_runs.append({**run, **measure_loader(create_dataloader, request, run["workers"], stride,
                                                    ample_images_per_s=LOADER_AMPLE_FACTOR * fastest_model)})
        print(f"probe: loader workers={run['workers']}: {loader_runs[-1]['images_per_s']} images/s", flush=True)

    result = {
        "cuda": cuda,
        "loader": loader_runs,
        "model": model_runs,
        "import_s": round(import_s, 3),
        "child_s": round(time.perf_counter() - started, 3),
        "torch": torch.__version__,
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if cuda else "cpu",
        "gpu_total_memory_bytes": torch.cuda.get_device_properties(device).total_memory if cuda else None,
    }
    Path(request["out"]).write_text(json.dumps(result, indent=2))
    return 0


def model_runs_for(request: dict, cuda: bool) -> tuple[list[dict], float]:
    """The model runs (batch, amp, torch threads) and each one's budget. On CUDA the GPU computes: each batch is
    timed once, with the fewest threads any candidate gets, with AMP on and off. On CPU AMP does not apply, and each
    batch is timed at every thread count the worker candidates leave."""
    thread_counts = request["thread_counts"][-1:] if cuda else request["thread_counts"]
    amps = (True, False) if cuda else (False,)
    runs = [{"batch": b, "amp": a, "torch_threads": t} for b in request["batches"] for a in amps for t in thread_counts]
    return runs, request["seconds_per_batch"] / (len(thread_counts) * len(amps))


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
    from yolov5.utils.torch_utils import smart_optimizer

    hyp = request["hyp"]
    if request["weights"]:
        architecture = torch.load(request["weights"], map_location="cpu", weights_only=False)["model"].yaml
    else:
        architecture = check_yaml(request["cfg"])  # finds yolov5n.yaml & co. inside the package
    model = Model(architecture, ch=3, nc=request["nc"], anchors=hyp.get("anchors")).float().to(device)
    frozen = [f"model.{layer}." for layer in range(request["freeze"])]  # train.py's --freeze N
    for name, parameter in model.named_parameters():
        parameter.requires_grad = not any(prefix in name for prefix in frozen)
    model.nc, model.hyp, model.gr = request["nc"], hyp, 1.0  # what train.py attaches before ComputeLoss
    model.train()
    model.probe_optimizer = smart_optimizer(model, request["optimizer"], hyp["lr0"], hyp["momentum"],
                                            hyp["weight_decay"])  # fmt: skip
    return model


def loader_is_ample(batches: int, workers: int, batch: int, seconds: float, ample_images_per_s: float) -> bool:
    """Whether a loader run may stop before its budget: it has delivered at least LOADER_MIN_BATCHES batches, and
    even without the batches its workers had prefetched (PyTorch queues 2 per worker, which arrive at once) it is
    LOADER_AMPLE_FACTOR times faster than the fastest model run, so it cannot be the bottleneck and its exact rate
    hardly moves the prediction (W = 0: 1/(1/L + 1/M) changes by about M/L; W > 0: min(L, M) = M)."""
    if ample_images_per_s <= 0 or batches < LOADER_MIN_BATCHES or seconds <= 0:
        return False
    return (batches - PREFETCH_PER_WORKER * workers) * batch / seconds >= ample_images_per_s


def measure_loader(create_dataloader, request: dict, workers: int, stride: int, ample_images_per_s: float = 0) -> dict:
    """Images/s from yolov5's own training dataloader (augment, mosaic, cache as the stage will have them).
    The run stops at its budget, or earlier once loader_is_ample says the loader is clearly not the bottleneck."""
    loader, _dataset = create_dataloader(
        request["data_list"], request["img"], request["loader_batch"], stride, hyp=request["hyp"], augment=True,
        cache=request["cache"], rect=False, rank=-1, workers=workers, shuffle=True, prefix="probe: ", seed=0,
    )  # fmt: skip
    batches = _endless(loader)
    budget = request["seconds_per_loader_run"]
    start = time.perf_counter()
    warmup_images = next(batches)[0].shape[0]  # warm-up: worker start-up and first reads are paid once per stage
    timed_start = time.perf_counter()
    images = count = 0
    ample = False
    while time.perf_counter() - start < budget and not ample:
        imgs, _targets, _paths, _shapes = next(batches)
        images += imgs.shape[0]
        count += 1
        ample = loader_is_ample(count, workers, request["loader_batch"], time.perf_counter() - timed_start,
                                ample_images_per_s)  # fmt: skip
    seconds = time.perf_counter() - timed_start
    from_warmup = count == 0
    if from_warmup:  # the warm-up alone used the budget: its time is the (pessimistic) measurement
        images, count, seconds = warmup_images, 1, timed_start - start
    effective = loader.num_workers
    _stop_workers(loader)  # idle workers would otherwise keep cores and memory during the next measurement
    del batches, loader
    gc.collect()
    # The batches the workers had queued during the warm-up arrive at once: they are not the timed window's work.
    prefetched = min(PREFETCH_PER_WORKER * effective, count - 1) if not from_warmup else 0
    return {
        "workers_effective": effective,  # yolov5 caps workers at min(cpu_count, batch, workers)
        "batch": request["loader_batch"],
        "batches": count,
        "images": images,
        "seconds": round(seconds, 4),
        "warmup_s": round(timed_start - start, 4),
        "timed_from_warmup": from_warmup,
        "stopped_early": ample,  # clearly faster than the model: the rest of the budget was not needed
        "prefetched_batches_not_counted": prefetched,
        "images_per_s": round(images * (count - prefetched) / count / seconds, 3),
    }


def measure_model(model, request: dict, batch: int, amp: bool, device) -> dict:
    """Images/s of full training steps (forward, ComputeLoss, backward, optimizer step) on synthetic batches."""
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

    def train_step():
        with torch.autocast(device.type, enabled=amp and cuda):
            loss, _items = compute_loss(model(imgs), targets)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.synchronize(device)  # kernels run asynchronously: time them, not their launch

    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    budget = request["seconds_per_model_run"]
    start = time.perf_counter()
    try:
        train_step()  # warm-up: allocator, cuDNN autotuning and lazy initialisation
        timed_start = time.perf_counter()
        steps = 0
        while time.perf_counter() - start < budget:
            train_step()
            steps += 1
    except torch.cuda.OutOfMemoryError as error:
        optimizer.zero_grad(set_to_none=True)
        torch.cuda.empty_cache()
        return {"status": "oom", "message": str(error).splitlines()[0], "images_per_s": None,
                "peak_memory_bytes": None, "peak_memory_reason": "ran out of memory"}  # fmt: skip
    seconds = time.perf_counter() - timed_start
    from_warmup = steps == 0
    if from_warmup:  # one step outlasted the budget: the warm-up's time is the (pessimistic) measurement
        steps, seconds = 1, timed_start - start
    return {
        "status": "ok",
        "steps": steps,
        "timed_from_warmup": from_warmup,
        "images": steps * batch,
        "seconds": round(seconds, 4),
        "warmup_s": round(timed_start - start, 4),
        "images_per_s": round(steps * batch / seconds, 3),
        "peak_memory_bytes": torch.cuda.max_memory_allocated(device) if cuda else None,
        "peak_memory_reason": None if cuda else "not measured on CPU (torch tracks peak memory on CUDA only)",
    }


def synthetic_targets(batch: int, nc: int, generator):
    """yolov5 targets rows (image index, class, x, y, w, h), normalised, a few objects per image."""
    import torch

    count = batch * SYNTHETIC_OBJECTS
    image_index = torch.arange(batch).repeat_interleave(SYNTHETIC_OBJECTS).float()
    classes = torch.randint(0, nc, (count,), generator=generator).float()
    sizes = 0.05 + 0.3 * torch.rand(count, 2, generator=generator)
    centres = sizes / 2 + (1 - sizes) * torch.rand(count, 2, generator=generator)
    return torch.cat([image_index[:, None], classes[:, None], centres, sizes], dim=1)


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
    sys.exit(main(sys.argv[1]))

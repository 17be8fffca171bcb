"""Sampler: a background thread writing host and GPU utilisation to ``telemetry.csv`` at a fixed interval.

Runs in the (torch-free) supervisor process. Columns, in order:

- ``timestamp`` (UNIX s), ``elapsed_s`` (since the sampler started)
- ``gpu_status``: ``ok`` when GPU columns hold NVML readings, otherwise the reason they are empty
  (``no NVML: ...``, ``no GPU visible``, ``nvml error: ...``). GPU cells are never filled with invented zeros.
- per visible GPU k (0.. in CUDA ordinal order): ``gpu{k}_util_pct`` (NVML utilization.gpu: share of time any
  kernel ran), ``gpu{k}_mem_used_mb``, ``gpu{k}_mem_total_mb``, ``gpu{k}_power_w``, ``gpu{k}_temp_c``,
  ``gpu{k}_sm_clock_mhz``. A reading the device does not support is an empty cell.
- per core j: ``cpu{j}_pct`` (psutil.cpu_percent(percpu=True) since the previous sample), ``cpu_mean_pct``
- ``rss_tree_mb``: RSS of the root process and all its descendants (the trainer and its dataloader workers)
- ``ram_available_mb``, ``ram_total_mb``
- ``disk_read_bytes`` (system-wide, cumulative since boot) and ``disk_read_mb_s`` (over the last interval)

Cost per sample: a few NVML queries per GPU, one /proc scan of the process tree; at 1 s intervals it is well under
1 % of one core (see benchmarks/telemetry_overhead.py).
"""

from __future__ import annotations

import csv
import os
import threading
import time
from pathlib import Path

import psutil

MB = 1024 * 1024
# The gpu{k}_* columns and how each is read from NVML, as f(pynvml, handle).
GPU_READINGS = {
    "util_pct": lambda p, h: p.nvmlDeviceGetUtilizationRates(h).gpu,
    "mem_used_mb": lambda p, h: p.nvmlDeviceGetMemoryInfo(h).used / MB,
    "mem_total_mb": lambda p, h: p.nvmlDeviceGetMemoryInfo(h).total / MB,
    "power_w": lambda p, h: p.nvmlDeviceGetPowerUsage(h) / 1000.0,
    "temp_c": lambda p, h: p.nvmlDeviceGetTemperature(h, getattr(p, "NVML_TEMPERATURE_GPU", 0)),
    "sm_clock_mhz": lambda p, h: p.nvmlDeviceGetClockInfo(h, getattr(p, "NVML_CLOCK_SM", 1)),
}


def _uuid_matches(pynvml, i: int, tok: str) -> bool:
    """NVML device i's UUID and the CUDA_VISIBLE_DEVICES entry tok (GPU-..., MIG-...) match by prefix."""
    try:
        uuid = pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(i))
        uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
    except Exception:
        return False
    return uuid.startswith(tok) or tok.startswith(uuid)


def _visible_nvml_indices(pynvml, count: int, gpu_indices) -> list[int]:
    """Map CUDA-visible ordinals to NVML indices (NVML ignores CUDA_VISIBLE_DEVICES)."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is None:
        visible = list(range(count))
    elif env.strip() == "-1":
        visible = []
    else:
        visible = []
        for tok in filter(None, (t.strip() for t in env.split(","))):
            if tok.isdigit():
                index = int(tok) if int(tok) < count else None
            else:
                index = next((i for i in range(count) if _uuid_matches(pynvml, i, tok)), None)
            if index is None:
                break  # CUDA stops at the first invalid entry
            visible.append(index)
    if gpu_indices is not None:
        visible = [visible[k] for k in gpu_indices if 0 <= k < len(visible)]
    return visible


class Sampler:
    """Context manager: ``with Sampler(csv_path, interval_s=1.0, root_pid=pid, gpu_indices=None) as s: ...``.

    ``gpu_indices``: CUDA ordinals (as the training process sees them) to sample; None = all visible.
    ``nvml``: inject a pynvml-like module (tests); default imports ``pynvml``.
    After start, ``gpu_status`` holds ``ok`` or the reason GPU columns are empty; ``info()`` a summary.
    """

    def __init__(self, csv_path, interval_s: float = 1.0, root_pid: int | None = None, gpu_indices=None, nvml=None):
        self.csv_path = Path(csv_path)
        self.interval_s = float(interval_s)
        self.root_pid = root_pid if root_pid is not None else os.getpid()
        self.gpu_indices = None if gpu_indices is None else list(gpu_indices)
        self._nvml_mod = nvml
        self._nvml = None
        self._handles: list = []
        self.nvml_indices: list[int] = []
        self.gpu_names: list[str] = []
        self.gpu_status = "not started"
        self.samples = 0
        self.sample_cpu_s = 0.0  # CPU time spent in _sample (thread time), for overhead accounting
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._fh = None
        self._writer = None
        self._t0 = None
        self._last_disk = None
        self._cpu_t = 0.0
        self._root = None
        self._tree: dict[int, psutil.Process] = {}
        self.ncpu = psutil.cpu_count(logical=True) or 1

    # ------------------------------------------------------------------ setup
    def _init_gpu(self) -> None:
        def failed(what, exc):
            return f"{what}: {type(exc).__name__}: {exc}".replace("\n", " ")[:200]

        try:
            pynvml = self._nvml_mod
            if pynvml is None:
                import pynvml  # nvidia-ml-py
            pynvml.nvmlInit()
        except Exception as exc:
            self.gpu_status = failed("no NVML", exc)
            return
        self._nvml = pynvml
        try:
            count = pynvml.nvmlDeviceGetCount()
            self.nvml_indices = _visible_nvml_indices(pynvml, count, self.gpu_indices)
            self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in self.nvml_indices]
            for h in self._handles:
                try:
                    n = pynvml.nvmlDeviceGetName(h)
                    self.gpu_names.append(n.decode() if isinstance(n, bytes) else str(n))
                except Exception:
                    self.gpu_names.append("?")
        except Exception as exc:
            self.gpu_status = failed("nvml error", exc)
            return
        self.gpu_status = "ok" if self._handles else "no GPU visible"

    def columns(self) -> list[str]:
        cols = ["timestamp", "elapsed_s", "gpu_status"]
        for k in range(len(self._handles)):
            cols += [f"gpu{k}_{f}" for f in GPU_READINGS]
        cols += [f"cpu{j}_pct" for j in range(self.ncpu)]
        cols += ["cpu_mean_pct", "rss_tree_mb", "ram_available_mb", "ram_total_mb", "disk_read_bytes", "disk_read_mb_s"]
        return cols

    # ------------------------------------------------------------------ sampling
    def _gpu_row(self) -> list:
        row = []
        status = self.gpu_status
        for h in self._handles:
            for read in GPU_READINGS.values():
                try:
                    row.append(round(float(read(self._nvml, h)), 1))
                except Exception as exc:  # NotSupported etc.: an empty cell, never a zero
                    row.append("")
                    if "NotSupported" not in type(exc).__name__:
                        status = f"partial: {type(exc).__name__}"
        return [status] + row

    def _rss_tree(self) -> float | str:
        try:
            if self._root is None:
                self._root = psutil.Process(self.root_pid)
            procs = [self._root] + self._root.children(recursive=True)
        except psutil.Error:
            return ""
        total = 0
        cache = {}
        for pr in procs:
            pr = self._tree.get(pr.pid, pr)  # reuse Process objects (cheaper, and pid-reuse safe)
            cache[pr.pid] = pr
            try:
                total += pr.memory_info().rss
            except psutil.Error:
                pass
        self._tree = cache
        return round(total / MB, 1)

    def _sample(self) -> None:
        c0 = time.thread_time()
        now = time.time()
        row = [round(now, 3), round(now - self._t0, 3)]
        row += self._gpu_row()
        per = psutil.cpu_percent(percpu=True)
        tc = time.monotonic()
        if tc - self._cpu_t < 0.02:  # psutil gives 0.0 below one clock tick (10 ms): blank, not a fake zero
            per = [""] * self.ncpu
        self._cpu_t = tc
        per = (list(per) + [""] * self.ncpu)[: self.ncpu]
        row += per
        nums = [v for v in per if v != ""]
        row.append(round(sum(nums) / len(nums), 1) if nums else "")
        row.append(self._rss_tree())
        vm = psutil.virtual_memory()
        row += [round(vm.available / MB, 1), round(vm.total / MB, 1)]
        try:
            d = psutil.disk_io_counters()
            rb = d.read_bytes if d is not None else None
        except Exception:
            rb = None
        if rb is None:
            row += ["", ""]
        else:
            last = self._last_disk
            dt = now - last[0] if last is not None else 0
            row += [rb, round((rb - last[1]) / MB / dt, 3) if dt > 0 else ""]
            self._last_disk = (now, rb)
        self._writer.writerow(row)
        self._fh.flush()
        self.samples += 1
        self.sample_cpu_s += time.thread_time() - c0

    def _run(self) -> None:
        next_t = time.monotonic()
        while True:
            try:
                self._sample()
            except Exception as exc:  # keep sampling; record the first few errors
                if len(self.errors) < 10:
                    self.errors.append(repr(exc))
            next_t += self.interval_s
            delay = next_t - time.monotonic()
            if delay < 0:  # fell behind (suspended machine, very short interval): don't burst
                next_t = time.monotonic()
                delay = 0
            if self._stop.wait(delay):
                break

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> Sampler:
        self._init_gpu()
        self.csv_path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = open(self.csv_path, "w", newline="")
        self._writer = csv.writer(self._fh)
        self._writer.writerow(self.columns())
        psutil.cpu_percent(percpu=True)  # prime: the first call has no reference interval
        self._cpu_t = time.monotonic()
        self._t0 = time.time()
        self._thread = threading.Thread(target=self._run, name="stagedyolo-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout=max(5.0, 2 * self.interval_s))
            self._thread = None
            try:
                self._sample()  # a final sample closes the timeline at stop time
            except Exception as exc:
                self.errors.append(repr(exc))
        if self._fh is not None:
            self._fh.close()
            self._fh = None
        if self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except Exception:
                pass
            self._nvml = None

    def __enter__(self) -> Sampler:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def info(self) -> dict:
        """Summary for timing meta: gpu status/names, sample count and the sampler's own CPU cost."""
        return {
            "gpu_status": self.gpu_status,
            "gpu_names": list(self.gpu_names),
            "nvml_indices": list(self.nvml_indices),
            "interval_s": self.interval_s,
            "samples": self.samples,
            "sample_cpu_s": round(self.sample_cpu_s, 4),
            "errors": list(self.errors),
        }

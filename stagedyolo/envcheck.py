"""verify_env: record the software/hardware the run will use, and stop early when the requested device cannot work.

The facts are gathered by small probe functions (torch, NVML, host, packages) and judged by a pure function
(``judge``), so the GPU logic can be tested with synthetic facts on a CPU-only machine. Missing GPU facts are
``None`` with a ``*_reason`` string, never zeros: a zero would read as "a GPU with 0 bytes".
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import os
import platform
import re
import shutil
import warnings
from pathlib import Path

import psutil

from stagedyolo import fixed_costs

# Minimum Linux driver for CUDA "minor version compatibility": a torch built with CUDA X.y runs on any driver at or
# above the floor of its major version X. Source: NVIDIA CUDA Toolkit release notes, table "CUDA Toolkit and Minimum
# Required Driver Version for CUDA Minor Version Compatibility" (11.x: >= 450.80.02, 12.x: >= 525.60.13,
# 13.x: >= 580). Windows floors differ slightly (452.39 / 527.41); this pipeline targets Linux.
MIN_DRIVER_FOR_CUDA_MAJOR = {11: (450, 80), 12: (525, 60), 13: (580,)}

PACKAGES = (
    "torch",
    "torchvision",
    "yolov5",
    "ultralytics",
    "numpy",
    "pillow",
    "snakemake",
    "opencv-python",
    "opencv-python-headless",
    "nvidia-ml-py",
    "psutil",
    "setuptools",
)
GPU_CHECKLIST = (
    "`nvidia-smi` lists the GPU (if not: install/repair the NVIDIA driver; in a container start it with --gpus all)",
    "CUDA_VISIBLE_DEVICES does not hide it",
    "torch is a CUDA build (torch.version.cuda is not None) whose CUDA major version the driver supports",
)


class EnvironmentCheckError(RuntimeError):
    """The requested device cannot be used. ``info`` holds everything gathered (it is also in the env report)."""

    def __init__(self, message: str, info: dict | None = None):
        super().__init__(message)
        self.info = info


# ---------------------------------------------------------------------------------------------------------------------
# pure logic


def parse_version(text: str | None) -> tuple[int, ...] | None:
    """'535.104.05' -> (535, 104, 5); None or junk -> None."""
    nums = re.findall(r"\d+", text or "")
    return tuple(int(n) for n in nums) if nums else None


def driver_compatibility(driver: str | None, cuda_build: str | None) -> dict:
    """Is the NVIDIA driver new enough for torch's CUDA build? ok is True/False, or None (unknown) with a reason."""
    out = {"driver": driver, "cuda_build": cuda_build, "min_driver": None, "ok": None, "reason": None}
    cuda = parse_version(cuda_build)
    if cuda is None:
        out["reason"] = "torch is a CPU-only build (no CUDA version)"
        return out
    floor = MIN_DRIVER_FOR_CUDA_MAJOR.get(cuda[0])
    if floor is None:
        out["reason"] = f"no driver floor known for CUDA {cuda[0]}.x (table covers {sorted(MIN_DRIVER_FOR_CUDA_MAJOR)})"
        return out
    out["min_driver"] = ".".join(map(str, floor))
    drv = parse_version(driver)
    if drv is None:
        out["reason"] = "driver version unknown (NVML unavailable)"
        return out
    out["ok"] = drv >= floor
    if not out["ok"]:
        out["reason"] = (
            f"NVIDIA driver {driver} is too old for torch's CUDA {cuda_build} build (CUDA {cuda[0]}.x needs driver >= "
            f"{out['min_driver']}). Fix: upgrade the NVIDIA driver to >= {out['min_driver']}, or install a torch built "
            f"for an older CUDA that this driver supports (https://pytorch.org/get-started/previous-versions/)"
        )
    return out


def arch_supported(capability: str, arch_list: list[str]) -> bool:
    """Does torch ship kernels for this compute capability? sm_XY runs on X.Z >= X.Y (same major); compute_XY (PTX)
    is JIT-compiled for any newer GPU. An empty list means unknown: assume yes rather than block."""
    if not arch_list:
        return True
    major, minor = (int(x) for x in capability.split("."))
    for arch in arch_list:
        m = re.fullmatch(r"(sm|compute)_(\d+?)(\d)a?", arch)
        if not m:
            continue
        a_major, a_minor = int(m.group(2)), int(m.group(3))
        if m.group(1) == "sm" and a_major == major and a_minor <= minor:
            return True
        if m.group(1) == "compute" and (a_major, a_minor) <= (major, minor):
            return True
    return False


def parse_device(device: str) -> tuple[str, list[int]]:
    """'auto' | 'cpu' | 'mps' | 'cuda' | 'cuda:1' | '0' | '0,1' -> (kind, cuda indices)."""
    d = str(device).strip().lower().replace(" ", "")
    if d in ("auto", "", "none"):
        return "auto", []
    if d in ("cpu", "mps"):
        return d, []
    if d == "cuda":
        return "cuda", [0]
    d = d.removeprefix("cuda:")
    if re.fullmatch(r"\d+(,\d+)*", d):
        return "cuda", [int(x) for x in d.split(",")]
    raise EnvironmentCheckError(f"device '{device}' is not understood. Fix: set device to auto, cpu, cuda, 0 or 0,1")


def judge(device: str, facts: dict) -> dict:
    """Verdict from gathered facts: {'ok', 'resolved_device' (a YOLOv5 --device value), 'warnings', 'errors'}."""
    t = facts["torch"]
    kind, wanted = parse_device(device)
    usable = bool(t["cuda_available"]) and (t["device_count"] or 0) > 0
    compat = facts["driver_compatibility"]
    v = {"ok": True, "resolved_device": None, "warnings": [], "errors": []}

    if kind == "cpu":
        v["resolved_device"] = "cpu"
    elif kind == "mps":
        v["resolved_device"] = "mps"
        if not t.get("mps_available"):
            v["errors"].append("device mps requested but torch reports MPS unavailable. Fix: use auto or cpu")
    elif kind == "auto" and not usable:
        v["resolved_device"] = "cpu"
        v["warnings"].append(
            "NO GPU: training will run on the CPU, which is many times slower. To use a GPU check: "
            + _why_no_cuda(facts)
        )
    else:
        wanted = wanted or [0]
        v["resolved_device"] = ",".join(map(str, wanted))
        if not usable:
            v["errors"].append(
                f"device '{device}' requested, but no CUDA device is visible to torch "
                f"(torch.cuda.is_available() is False). Check: " + _why_no_cuda(facts)
            )
        elif max(wanted) >= t["device_count"]:
            v["errors"].append(
                f"device '{device}' requested, but only {t['device_count']} CUDA device(s) are visible "
                f"(indices 0..{t['device_count'] - 1}; CUDA_VISIBLE_DEVICES={facts['cuda_visible_devices']!r}). "
                "Fix: request existing indices, or change CUDA_VISIBLE_DEVICES"
            )
        else:
            for i in wanted:
                gpu = t["gpus"][i]
                if not arch_supported(gpu["compute_capability"], t.get("arch_list") or []):
                    v["warnings"].append(
                        f"GPU {i} ({gpu['name']}, sm_{gpu['compute_capability'].replace('.', '')}) is not in this "
                        f"torch build's arch list {t['arch_list']}: kernels may fail with 'no kernel image is "
                        "available'. Fix: install a torch build that supports this GPU"
                    )
    if compat["ok"] is False and usable and kind != "cpu":
        # torch initialised anyway (e.g. a forward-compatibility package): note it, don't block a working setup
        v["warnings"].append(compat["reason"] + " (torch initialised CUDA anyway, probably via a compat package)")
    v["warnings"] += facts.get("package_warnings", [])
    v["ok"] = not v["errors"]
    return v


def _why_no_cuda(facts: dict) -> str:
    """The checklist, with what we found for each item, most likely cause first."""
    t, nvml, compat = facts["torch"], facts["nvml"], facts["driver_compatibility"]
    cvd = facts["cuda_visible_devices"]
    found = []
    if compat["ok"] is False:
        found.append(compat["reason"])
    if t["cuda_build"] is None:
        found.append(
            f"torch {t['version']} is a CPU-only build. Fix: install a CUDA build of torch "
            "(pip install torch --index-url https://download.pytorch.org/whl/cu<version>)"
        )
    if cvd is not None and cvd.strip() in ("", "-1"):
        found.append(f"CUDA_VISIBLE_DEVICES={cvd!r} hides every GPU. Fix: unset it or list the GPU indices")
    elif cvd is not None and nvml["gpus"]:
        found.append(
            f"CUDA_VISIBLE_DEVICES={cvd!r} is set: it must name GPUs that exist (NVML sees "
            f"{len(nvml['gpus'])}: indices 0..{len(nvml['gpus']) - 1} or their UUIDs)"
        )
    if not nvml["available"]:
        found.append(f"no NVIDIA driver found ({nvml['reason']}): install the driver; `nvidia-smi` must list the GPU")
    elif not nvml["gpus"]:
        found.append(f"the NVIDIA driver {nvml['driver_version']} sees no GPU (`nvidia-smi` should list one)")
    if t.get("cuda_init_warning"):
        found.append(f"torch said: {t['cuda_init_warning']}")
    checklist = "; ".join(f"({i + 1}) {c}" for i, c in enumerate(GPU_CHECKLIST))
    state = (
        f"[found: torch {t['version']} CUDA build {t['cuda_build']}, driver {nvml['driver_version']}, "
        f"CUDA_VISIBLE_DEVICES={cvd!r}]"
    )
    return (" ".join(f"{f}." for f in found) + " " if found else "") + checklist + " " + state


# ---------------------------------------------------------------------------------------------------------------------
# probes


def torch_facts() -> dict:
    import torch  # here, not at module top, so the pure logic above imports fast

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        available = torch.cuda.is_available()  # an old driver shows up as a warning here, not an exception
    out = {
        "version": torch.__version__,
        "torchvision": package_version("torchvision"),
        "cuda_build": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "cuda_available": available,
        "device_count": torch.cuda.device_count() if available else 0,
        "arch_list": torch.cuda.get_arch_list() if torch.version.cuda else [],
        "mps_available": bool(getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()),
        "cuda_init_warning": "; ".join(str(w.message) for w in caught if "cuda" in str(w.message).lower()) or None,
        "gpus": None,
        "gpus_reason": None,
    }
    if out["device_count"]:
        props = [torch.cuda.get_device_properties(i) for i in range(out["device_count"])]
        out["gpus"] = [_gpu(i, p.name, p.major, p.minor, p.total_memory) for i, p in enumerate(props)]
    else:
        out["gpus_reason"] = (
            "torch is a CPU-only build" if torch.version.cuda is None else "torch.cuda.is_available() is False"
        )
    return out


def nvml_facts() -> dict:
    """Driver and GPUs as the driver sees them (NVML ignores CUDA_VISIBLE_DEVICES)."""
    out = {"available": False, "reason": None, "driver_version": None, "cuda_driver_version": None, "gpus": None}
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as e:  # ImportError, NVMLError_LibraryNotFound, NVMLError_DriverNotLoaded, ...
        out["reason"] = f"NVML unavailable: {type(e).__name__}: {e}"
        return out
    try:
        out["available"] = True
        out["driver_version"] = _text(pynvml.nvmlSystemGetDriverVersion())
        cuda = pynvml.nvmlSystemGetCudaDriverVersion()  # e.g. 12040
        out["cuda_driver_version"] = f"{cuda // 1000}.{cuda % 1000 // 10}"
        out["gpus"] = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(h)
            name, memory = _text(pynvml.nvmlDeviceGetName(h)), pynvml.nvmlDeviceGetMemoryInfo(h).total
            out["gpus"].append(_gpu(i, name, major, minor, memory))
    except Exception as e:
        out["reason"] = f"NVML query failed: {type(e).__name__}: {e}"
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()
    return out


def _gpu(index: int, name: str, major: int, minor: int, total_memory_bytes: int) -> dict:
    """One GPU, the same fields whether torch or NVML saw it."""
    return {
        "index": index,
        "name": name,
        "compute_capability": f"{major}.{minor}",
        "total_memory_bytes": total_memory_bytes,
    }


def _text(x) -> str:
    return x.decode() if isinstance(x, bytes) else str(x)


def host_facts(cache_dir: str) -> dict:
    checked = Path(cache_dir).absolute()
    while not checked.exists():  # the cache dir is usually created later: measure the filesystem it will be on
        checked = checked.parent
    disk = shutil.disk_usage(checked)
    mem = psutil.virtual_memory()
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu": {"os_cpu_count": os.cpu_count(), "usable_cores": len(os.sched_getaffinity(0))},
        "ram": {"total_bytes": mem.total, "available_bytes": mem.available},
        "disk": {
            "cache_dir": str(cache_dir),
            "checked_path": str(checked),
            "free_bytes": disk.free,
            "total_bytes": disk.total,
        },
    }


def package_version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def package_warnings(versions: dict) -> list[str]:
    """Known breakages of yolov5 7.0.14 on current dependencies (see the engine notes)."""
    out = []
    st, np_ = parse_version(versions.get("setuptools")), parse_version(versions.get("numpy"))
    if st and st >= (81,):
        out.append(
            f"setuptools {versions['setuptools']} has no pkg_resources: importing yolov5 fails. Fix: setuptools<81"
        )
    if np_ and np_ >= (2, 4):
        out.append(f"numpy {versions['numpy']} has no np.trapz: YOLOv5's first validation fails unless shimmed")
    return out


def package_notes(versions: dict) -> list[str]:
    """Worth recording, not worth a warning."""
    if versions.get("opencv-python") and versions.get("opencv-python-headless"):
        same = versions["opencv-python"] == versions["opencv-python-headless"]
        return [
            f"opencv-python and opencv-python-headless are both installed and share the cv2 module "
            f"({'same version' if same else 'DIFFERENT versions: the last installed wins'})"
        ]
    return []


# ---------------------------------------------------------------------------------------------------------------------
# entry points


def _process_start_unix() -> float | None:
    try:
        return psutil.Process().create_time()
    except psutil.Error:
        return None


def gather(cache_dir: str, torch_info: dict | None = None, nvml_info: dict | None = None) -> dict:
    """All facts. ``torch_info``/``nvml_info`` let tests inject a synthetic machine."""
    t = torch_info if torch_info is not None else torch_facts()
    nvml = nvml_info if nvml_info is not None else nvml_facts()
    versions = {p: package_version(p) for p in PACKAGES}
    facts = {
        "torch": t,
        "nvml": nvml,
        "driver_compatibility": driver_compatibility(nvml["driver_version"], t["cuda_build"]),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "host": host_facts(cache_dir),
        "packages": versions,
        # the run's first job: the report measures the fixed costs before the first training step from here
        "job_started_unix": _process_start_unix(),
        "package_warnings": package_warnings(versions),
        "package_notes": package_notes(versions),
    }
    # The call's identity (its process's start, which each stage's worker stamps alike) and when it started.
    call = fixed_costs.snakemake_call_unix()
    facts["snakemake_call_unix"] = call[0]
    facts["snakemake_started_unix"], facts["snakemake_started_reason"] = fixed_costs.snakemake_started(call)
    facts["gpus"], facts["gpus_reason"] = _visible_gpus(t, nvml)
    facts["capabilities"] = _capabilities(facts["gpus"], facts["gpus_reason"])
    return facts


def _visible_gpus(t: dict, nvml: dict) -> tuple[list | None, str | None]:
    if not t["gpus"]:
        return None, t["gpus_reason"] or "no CUDA device visible"
    driver = nvml["driver_version"]
    return [dict(g, driver_version=driver, driver_reason=None if driver else nvml["reason"]) for g in t["gpus"]], None


def _capabilities(gpus: list | None, reason: str | None) -> dict:
    """Of the first visible GPU (what device 0 / auto trains on). AMP fp16 works on any CUDA GPU YOLOv5 supports;
    bf16 and TF32 need Ampere (8.0) or newer."""
    if not gpus:
        return {"amp_fp16": None, "bf16": None, "tf32": None, "reason": f"no GPU: {reason}"}
    cc = tuple(int(x) for x in gpus[0]["compute_capability"].split("."))
    return {"amp_fp16": True, "bf16": cc >= (8, 0), "tf32": cc >= (8, 0), "reason": None}


def collect_environment(device: str, cache_dir: str, torch_info=None, nvml_info=None) -> dict:
    """Facts plus verdict; never raises for an unusable device (the verdict says so)."""
    info = {"device_requested": str(device), **gather(cache_dir, torch_info, nvml_info)}
    try:
        info["verdict"] = judge(device, info)
    except EnvironmentCheckError as e:  # an unparseable device string
        info["verdict"] = {"ok": False, "resolved_device": None, "warnings": [], "errors": [str(e)]}
    return info


def check_environment(device: str, cache_dir: str, torch_info=None, nvml_info=None) -> dict:
    """Gather facts and judge them; raise EnvironmentCheckError when the requested device cannot work."""
    info = collect_environment(device, cache_dir, torch_info, nvml_info)
    _raise_if_failed(info)
    return info


def _raise_if_failed(info: dict) -> None:
    if not info["verdict"]["ok"]:
        raise EnvironmentCheckError("\n".join(info["verdict"]["errors"]), info)


def write_env_report(info: dict, json_path: str, md_path: str) -> None:
    for p in (json_path, md_path):
        Path(p).parent.mkdir(parents=True, exist_ok=True)
    Path(json_path).write_text(json.dumps(info, indent=2, default=str) + "\n", encoding="utf-8")
    Path(md_path).write_text(_markdown(info), encoding="utf-8")


def _markdown(info: dict) -> str:
    v, t, h = info["verdict"], info["torch"], info["host"]
    gib = 1 << 30
    lines = [
        "# Environment",
        "",
        f"**Verdict: {'OK' if v['ok'] else 'FAILED'}** - device requested `{info['device_requested']}`, "
        f"resolved `{v['resolved_device']}`",
        "",
    ]
    lines += [f"- ERROR: {e}" for e in v["errors"]] + [f"- WARNING: {w}" for w in v["warnings"]]
    lines += [
        "",
        f"- torch {t['version']} (CUDA build {t['cuda_build']}, cuDNN {t['cudnn']}), torchvision {t['torchvision']}",
        f"- NVIDIA driver: {info['nvml']['driver_version'] or 'n/a (' + str(info['nvml']['reason']) + ')'}",
        f"- CUDA_VISIBLE_DEVICES: {info['cuda_visible_devices']!r}",
        f"- CPU cores: {h['cpu']['os_cpu_count']} (usable {h['cpu']['usable_cores']}); RAM "
        f"{h['ram']['available_bytes'] / gib:.1f}/{h['ram']['total_bytes'] / gib:.1f} GiB available; free disk at "
        f"{h['disk']['checked_path']}: {h['disk']['free_bytes'] / gib:.1f} GiB",
        f"- capabilities: {info['capabilities']}",
        "",
        "| GPU | name | compute capability | memory GiB | driver |",
        "|---|---|---|---|---|",
    ]
    if info["gpus"]:
        lines += [
            f"| {g['index']} | {g['name']} | {g['compute_capability']} | {g['total_memory_bytes'] / gib:.1f} "
            f"| {g['driver_version']} |"
            for g in info["gpus"]
        ]
    else:
        lines.append(f"| - | none: {info['gpus_reason']} | | | |")
    lines += ["", "| package | version |", "|---|---|"]
    lines += [f"| {p} | {ver} |" for p, ver in info["packages"].items()]
    return "\n".join(lines) + "\n"


def verify_env(
    device: str, cache_dir: str | None, json_path: str, md_path: str, log=print, log_path: str | None = None
) -> dict:
    """Check, write the report, log warnings loudly; raise EnvironmentCheckError AFTER the report is written.
    ``log_path``: also append every logged line to this file (the Snakemake rule's log). With no ``cache_dir``, free
    disk is measured at ``<run>/cache``, next to ``json_path`` (``<run>/env/env.json``), where the default copy goes."""
    log = tee_log(log, log_path)
    info = collect_environment(device, cache_dir or str(Path(json_path).parent.parent / "cache"))
    write_env_report(info, json_path, md_path)
    for w in info["verdict"]["warnings"]:
        log(f"\n{'!' * 80}\nWARNING: {w}\n{'!' * 80}" if w.startswith("NO GPU") else f"WARNING: {w}")
    for note in info["package_notes"]:
        log(f"note: {note}")
    if not info["verdict"]["ok"]:
        log("ERROR: " + "\n".join(info["verdict"]["errors"]))
    _raise_if_failed(info)
    log(f"environment OK: device {info['verdict']['resolved_device']} (report: {md_path})")
    return info


def tee_log(log=print, log_path: str | None = None):
    """A log function that calls ``log`` and, when given, appends the line to ``log_path``."""
    if not log_path:
        return log
    Path(log_path).parent.mkdir(parents=True, exist_ok=True)

    def both(message: str) -> None:
        log(message)
        with open(log_path, "a", encoding="utf-8") as f:
            f.write(message + "\n")

    return both

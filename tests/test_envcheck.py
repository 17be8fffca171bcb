"""verify_env: the real (CPU-only) machine, plus synthetic GPU machines for the logic no CPU box can reach."""

import json

import pytest

from stagedyolo.envcheck import (
    EnvironmentCheckError,
    arch_supported,
    check_environment,
    collect_environment,
    driver_compatibility,
    parse_device,
    verify_env,
)

NO_NVML = {
    "available": False,
    "reason": "NVML unavailable: LibraryNotFound",
    "driver_version": None,
    "cuda_driver_version": None,
    "gpus": None,
}


def torch_info(cuda_build="12.4", gpus=(), available=None):
    gpus = [dict(index=i, name=n, compute_capability=cc, total_memory_bytes=80 << 30) for i, (n, cc) in enumerate(gpus)]
    available = bool(gpus) if available is None else available
    return {
        "version": "2.5.0",
        "torchvision": "0.20.0",
        "cuda_build": cuda_build,
        "cudnn": 90100,
        "cuda_available": available,
        "device_count": len(gpus),
        "arch_list": ["sm_80", "sm_90"],
        "mps_available": False,
        "cuda_init_warning": None,
        "gpus": gpus or None,
        "gpus_reason": None if gpus else "torch.cuda.is_available() is False",
    }


def nvml_info(driver="550.54.15", n=1):
    return {
        "available": True,
        "reason": None,
        "driver_version": driver,
        "cuda_driver_version": "12.4",
        "gpus": [
            {"index": i, "name": "H100", "compute_capability": "9.0", "total_memory_bytes": 80 << 30} for i in range(n)
        ],
    }


@pytest.fixture(scope="module")
def cpu_machine():
    import torch

    if torch.cuda.is_available():
        pytest.skip("these assertions describe a machine without a usable GPU")


def test_auto_on_cpu_machine_passes_with_one_loud_warning(cpu_machine, tmp_path):
    logged = []
    info = verify_env(
        "auto", str(tmp_path / "not" / "yet" / "cache"), tmp_path / "env.json", tmp_path / "env.md", log=logged.append
    )
    assert info["verdict"]["ok"] and info["verdict"]["resolved_device"] == "cpu"
    no_gpu = [w for w in info["verdict"]["warnings"] if "training will run on the CPU" in w]
    assert len(no_gpu) == 1 and "nvidia-smi" in no_gpu[0] and "CUDA_VISIBLE_DEVICES" in no_gpu[0]
    assert any("!!!!" in line and "training will run on the CPU" in line for line in logged)
    saved = json.loads((tmp_path / "env.json").read_text())
    assert saved["host"]["disk"]["checked_path"] == str(tmp_path)  # nearest existing parent of the cache dir
    assert "Verdict: OK" in (tmp_path / "env.md").read_text()


def test_device_0_on_cpu_machine_fails_after_writing_the_report(cpu_machine, tmp_path):
    with pytest.raises(EnvironmentCheckError) as e:
        verify_env("0", str(tmp_path), tmp_path / "env.json", tmp_path / "env.md", log=lambda m: None)
    msg = str(e.value)
    assert "no CUDA device is visible" in msg
    for hint in ("nvidia-smi", "CUDA_VISIBLE_DEVICES", "CUDA build", "driver"):
        assert hint in msg
    assert json.loads((tmp_path / "env.json").read_text())["verdict"]["ok"] is False


def test_gpu_fields_are_null_with_reason_without_gpu(tmp_path):
    info = collect_environment("auto", str(tmp_path), torch_info(gpus=()), NO_NVML)
    assert info["gpus"] is None and "is_available" in info["gpus_reason"]
    caps = info["capabilities"]
    assert caps["amp_fp16"] is None and caps["bf16"] is None and caps["tf32"] is None and caps["reason"]
    assert info["nvml"]["driver_version"] is None and "NVML" in info["nvml"]["reason"]
    assert info["driver_compatibility"]["ok"] is None and info["driver_compatibility"]["reason"]


@pytest.mark.parametrize(
    "driver,cuda,ok",
    [
        ("450.80.02", "11.8", True),
        ("450.51", "11.0", False),
        ("470.82.01", "12.1", False),
        ("525.60.13", "12.4", True),
        ("535.104.05", "12.8", True),
        ("570.86", "13.0", False),
        ("580.65.06", "13.0", True),
    ],
)
def test_driver_compatibility_table(driver, cuda, ok):
    result = driver_compatibility(driver, cuda)
    assert result["ok"] is ok
    if not ok:
        assert "too old" in result["reason"] and f">= {result['min_driver']}" in result["reason"]


def test_driver_compatibility_unknown_cases():
    assert driver_compatibility(None, "12.4")["ok"] is None
    assert driver_compatibility("550.1", None)["ok"] is None  # CPU-only torch
    assert driver_compatibility("550.1", "99.0")["ok"] is None  # no table entry: unknown, not "ok"


def test_old_driver_error_names_the_fix(tmp_path):
    # the driver is too old, so torch cannot initialise CUDA although NVML sees the GPU
    with pytest.raises(EnvironmentCheckError) as e:
        check_environment("0", str(tmp_path), torch_info("12.4", gpus=()), nvml_info("470.82.01"))
    assert "470.82.01 is too old" in str(e.value) and "upgrade the NVIDIA driver to >= 525.60" in str(e.value)


def test_gpu_machine_resolves_device_and_capabilities(tmp_path):
    info = check_environment("auto", str(tmp_path), torch_info(gpus=[("H100", "9.0")]), nvml_info())
    assert info["verdict"]["resolved_device"] == "0"
    assert not any("CPU" in w for w in info["verdict"]["warnings"])
    assert info["gpus"][0]["driver_version"] == "550.54.15"
    assert info["capabilities"] == {"amp_fp16": True, "bf16": True, "tf32": True, "reason": None}


def test_requesting_more_gpus_than_visible_fails(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    with pytest.raises(EnvironmentCheckError, match=r"only 1 CUDA device\(s\) are visible.*CUDA_VISIBLE_DEVICES='0'"):
        check_environment("0,1", str(tmp_path), torch_info(gpus=[("H100", "9.0")]), nvml_info(n=2))


def test_empty_cuda_visible_devices_is_named(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(EnvironmentCheckError, match="hides every GPU"):
        check_environment("cuda", str(tmp_path), torch_info(gpus=()), nvml_info())


def test_cpu_only_torch_build_is_named(tmp_path):
    with pytest.raises(EnvironmentCheckError, match="CPU-only build"):
        check_environment("cuda:0", str(tmp_path), torch_info(cuda_build=None, gpus=()), nvml_info())


def test_parse_device_and_arch():
    assert parse_device("0,1") == ("cuda", [0, 1]) and parse_device("cuda") == ("cuda", [0])
    assert parse_device("AUTO") == ("auto", []) and parse_device("cuda:1") == ("cuda", [1])
    with pytest.raises(EnvironmentCheckError, match="not understood"):
        parse_device("gpu0")
    assert arch_supported("8.6", ["sm_80", "sm_90"]) and arch_supported("12.0", ["sm_120"])
    assert not arch_supported("6.1", ["sm_75", "sm_80"]) and arch_supported("10.0", ["sm_80", "compute_90"])


def test_verify_env_writes_errors_to_the_rule_log(cpu_machine, tmp_path):
    with pytest.raises(EnvironmentCheckError):
        verify_env(
            "cuda",
            str(tmp_path),
            tmp_path / "e.json",
            tmp_path / "e.md",
            log=lambda m: None,
            log_path=str(tmp_path / "log.txt"),
        )
    assert "no CUDA device is visible" in (tmp_path / "log.txt").read_text()

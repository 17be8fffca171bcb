"""The probe cache's key and its writes: what must make a measurement unusable for a later run (another model yaml
under the same name, another GPU, CUDA unusable when it was taken, a busy machine), image paths with spaces, and a
cache that cannot be written."""

import json
import subprocess
import sys

import pytest

from stagedyolo.probe import reuse
from stagedyolo.probe.reuse import keep_for_reuse, read_reusable, reuse_key

IDLE, BUSY = (0.1, 0.1, 0.1), (1000.0, 1000.0, 1000.0)


def listed_images(folder, names) -> str:
    """Images and labels under `folder` (a YOLOv5 images/labels pair) and the list file naming them, one a line."""
    for name in names:
        (folder / "images").mkdir(parents=True, exist_ok=True)
        (folder / "labels").mkdir(parents=True, exist_ok=True)
        (folder / "images" / f"{name}.jpg").write_bytes(b"jpeg " + name.encode())
        (folder / "labels" / f"{name}.txt").write_text("0 0.5 0.5 0.2 0.2\n")
    listing = folder / "subset.txt"
    listing.write_text("".join(f"{folder / 'images' / name}.jpg\n" for name in names))
    return str(listing)


@pytest.fixture
def request_(tmp_path):
    return {"data_list": listed_images(tmp_path / "data", ["a", "b"]), "cfg": "yolov5n.yaml", "img": 64}


def test_image_paths_with_spaces_are_read_one_per_line(tmp_path):
    request = {"data_list": listed_images(tmp_path / "my data set", ["photo 1", "photo 2"]), "cfg": "yolov5n.yaml"}
    key = reuse_key(request, [])
    (tmp_path / "my data set" / "labels" / "photo 2.txt").write_text("1 0.5 0.5 0.2 0.2\n")
    assert reuse_key(request, []) != key  # the second image's label is part of the key, space and all


def test_a_model_yaml_of_the_users_counts_by_its_text_not_its_name(tmp_path, request_):
    cfg = tmp_path / "my_model.yaml"
    cfg.write_text("nc: 3\ndepth_multiple: 0.33\n")
    request_ = {**request_, "cfg": str(cfg)}
    key = reuse_key(request_, [])
    assert reuse_key(request_, []) == key
    cfg.write_text("nc: 3\ndepth_multiple: 1.0\n")  # a larger model under the same name
    assert reuse_key(request_, []) != key


def test_another_gpu_model_its_memory_or_cuda_being_unusable_changes_the_key(monkeypatch, request_):
    def machine(name, memory, cuda):
        monkeypatch.setattr(
            reuse,
            "nvml_facts",
            lambda: {"gpus": [{"name": name, "total_memory_bytes": memory, "index": 0, "compute_capability": "9.0"}]},
        )
        monkeypatch.setattr(reuse, "_cuda_usable", lambda: cuda)
        return reuse_key(request_, [])

    h200 = machine("NVIDIA H200", 141 << 30, True)
    assert machine("NVIDIA H200", 141 << 30, True) == h200
    assert machine("NVIDIA A100-SXM4-80GB", 141 << 30, True) != h200
    assert machine("NVIDIA H200", 80 << 30, True) != h200  # e.g. a MIG slice or another card of the family
    assert machine("NVIDIA H200", 141 << 30, False) != h200  # taken while CUDA was not usable: amp false, CPU figures


def test_without_a_gpu_the_key_is_computed_without_importing_torch(tmp_path):
    code = (
        "import sys\nfrom stagedyolo.probe import reuse\n"
        "reuse.nvml_facts = lambda: {'gpus': None}\n"  # what NVML reports without an NVIDIA driver
        "identity = reuse.machine_identity()\n"
        "print(identity['gpus'], identity['cuda_usable'], 'torch' in sys.modules)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.split() == ["[]", "False", "False"]


def test_a_measurement_taken_on_a_busy_machine_is_not_kept_and_says_why(tmp_path):
    log = tmp_path / "probe.log"
    kept = keep_for_reuse(tmp_path / "cache", "k1", {"choice": {"batch": 8}}, load=(IDLE, IDLE), log_path=str(log))
    assert kept == {"kept": True, "file": str(tmp_path / "cache" / "k1.json")}
    assert read_reusable(tmp_path / "cache", "k1") == {"choice": {"batch": 8}}
    for load in ((BUSY, IDLE), (IDLE, BUSY)):
        busy = keep_for_reuse(tmp_path / "cache", "k2", {"choice": {}}, load=load, log_path=str(log))
        assert not busy["kept"] and "measured under load" in busy["reason"] and "1000.0" in busy["reason"]
    assert read_reusable(tmp_path / "cache", "k2") is None
    assert log.read_text().count("not kept for reuse: measured under load") == 2


def test_a_cache_that_cannot_be_written_is_logged_and_the_probe_goes_on(tmp_path):
    (tmp_path / "probe_cache").write_text("a file where the cache folder would be")
    log = tmp_path / "probe.log"
    record = keep_for_reuse(tmp_path / "probe_cache", "k", {"choice": {}}, load=(IDLE, IDLE), log_path=str(log))
    assert not record["kept"] and "writing" in record["reason"] and "failed" in record["reason"]
    assert "not kept for reuse: writing" in log.read_text()
    assert json.dumps(record)  # goes into tuning.json

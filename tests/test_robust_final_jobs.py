"""The jobs after all training, on real (untrained, tiny) yolov5n checkpoints: export at an image size that is not a
multiple of 32, a failed export check whose numbers must survive Snakemake deleting export.json, a signalled export,
and the test score of single_cls weights."""

import json
import signal
import subprocess
import sys
import time

import pytest
from test_export import offline_yolov5  # noqa: F401  (autouse: yolov5 imported offline, as the jobs import it)

from stagedyolo.demo import TARGET_CLASSES, DemoSpec, write_demo_dataset

SETTINGS = {"formats": ["onnx", "torchscript"], "opset": 12, "box_tolerance_px": 0.1, "score_tolerance": 1e-3}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_demo_dataset(tmp_path_factory.mktemp("data"), DemoSpec(TARGET_CLASSES, 2, 2, 2, image_size=64))


def checkpoint(path, nc: int, names: list[str]):
    """An untrained yolov5n checkpoint as yolov5's train.py saves one (the model under "model", with its names)."""
    import torch
    from yolov5.models.yolo import Model

    from stagedyolo.engine.options import yolov5_dir

    torch.manual_seed(0)
    model = Model(str(yolov5_dir() / "models" / "yolov5n.yaml"), ch=3, nc=nc)
    model.names = names
    torch.save({"model": model, "epoch": -1}, path)
    return str(path)


def export(tmp_path, data, settings=SETTINGS, img=70):
    from stagedyolo.export import export_for_rule

    weights = checkpoint(tmp_path / "last.pt", 3, list(TARGET_CLASSES))
    out = tmp_path / "R" / "export"
    outputs = {fmt: str(out / f"model.{fmt}") for fmt in settings["formats"]}
    return export_for_rule(
        weights,
        str(data),
        outputs,
        str(out / "export.json"),
        settings=settings,
        img=img,
        threads=1,
        log_path=str(tmp_path / "export.log"),
    )


def test_an_image_size_that_is_not_a_multiple_of_32_is_checked_at_the_exporters_size(tmp_path, data):
    # TorchScript only: the check's image size is the same for every format, and the ONNX export takes 3x longer.
    record = export(tmp_path, data, settings={**SETTINGS, "formats": ["torchscript"]}, img=70)
    assert record["passed"] and (record["img"], record["img_setting"]) == (96, 70)  # yolov5n's stride is 32
    assert all(check["anchors"] == 3 * (12 * 12 + 6 * 6 + 3 * 3) for check in record["formats"].values())
    assert not (tmp_path / "R" / "export" / "model.pt").exists()


def test_a_failed_check_writes_its_numbers_to_the_log_and_stderr(tmp_path, data, capfd):
    from stagedyolo.export import ExportFailed

    strict = {**SETTINGS, "formats": ["torchscript"], "score_tolerance": -1.0}  # no comparison can pass
    with pytest.raises(ExportFailed, match="its numbers are above and in"):
        export(tmp_path, data, settings=strict, img=64)
    (tmp_path / "R" / "export" / "export.json").unlink()  # what Snakemake does to a failed job's outputs
    logged = (tmp_path / "export.log").read_text()
    assert "export check failed: torchscript:" in logged and '"raw_max_score_diff"' in logged
    assert "export check failed: torchscript:" in capfd.readouterr().err
    assert not (tmp_path / "R" / "export" / "model.pt").exists()


SIGNALLED_EXPORT = """
import sys, time
from pathlib import Path
from stagedyolo import export

def slow_step(model_pt, *args):  # the first step after the checkpoint's copy: time to stop the job
    Path(sys.argv[2]).write_text(str(model_pt))
    time.sleep(60)

export.load_model = export.run_exporter = slow_step
out = Path(sys.argv[3])
export.export_for_rule(sys.argv[1], "data.yaml", {}, str(out / "export.json"), settings={"formats": [], "opset": 12},
                       img=64, threads=1, log_path=str(out / "export.log"))
"""


def test_a_signalled_export_leaves_no_model_pt(tmp_path):
    weights = tmp_path / "last.pt"
    weights.write_bytes(b"checkpoint")
    ready, out = tmp_path / "ready", tmp_path / "R" / "export"
    job = subprocess.Popen([sys.executable, "-c", SIGNALLED_EXPORT, str(weights), str(ready), str(out)])
    deadline = time.time() + 60
    while not ready.exists() and job.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    assert ready.exists() and (out / "model.pt").exists()
    job.send_signal(signal.SIGTERM)  # Snakemake stopping the job
    returncode = job.wait(timeout=30)
    assert not (out / "model.pt").exists() and returncode == 128 + signal.SIGTERM


EVALUATE = """
import sys
from stagedyolo.evaluate import evaluate_for_rule

weights, data, out = sys.argv[1:4]
evaluate_for_rule(weights, data, out + "/m.json", out + "/m.md", img=64, batch=2, device="cpu", threads=1,
                  log_path=out + "/evaluate.log", single_cls=True)
"""


def test_single_cls_weights_are_scored_as_one_class(tmp_path, data):
    weights = checkpoint(tmp_path / "last.pt", 1, ["item"])  # what a stage with single_cls: true publishes
    # In a process of its own, as the evaluate_test job runs: yolov5 fixes its config folder (where the offline font
    # is placed) when it is first imported, and this test process may have imported it before the offline set-up.
    subprocess.run(
        [sys.executable, "-c", EVALUATE, weights, str(data), str(tmp_path / "test")], check=True, timeout=600
    )
    result = json.loads((tmp_path / "test" / "m.json").read_text())
    labels = [line for f in (data.parent / "labels" / "test").glob("*.txt") for line in f.read_text().splitlines()]
    assert result["single_cls"] and [row["class"] for row in result["classes"]] == ["item"]
    assert result["classes"][0]["instances"] == len(set(labels)) > 0
    assert result["classes"][0]["ap50"] is not None  # scored: 0.0 when the untrained model finds nothing
    assert json.loads((tmp_path / "test" / "m.json").read_text()) == result
    assert "single_cls" in (tmp_path / "test" / "m.md").read_text()

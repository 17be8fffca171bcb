"""Export the final weights with yolov5's own exporter (ONNX, TorchScript), offline, and check each exported
file against the PyTorch model on one real image: ONNX through onnxruntime on the CPU, TorchScript through
torch.jit. The check compares every raw prediction (all anchors: box centre/size in pixels, objectness and class
scores) and the boxes left after non-maximum suppression; it is written to ``export.json`` and a file that does not
match fails the job (a silently wrong ONNX file is worse than none). Snakemake deletes a failed job's export.json,
so the numbers also go to the job's log and stderr.

The exporter rounds the image size up to a multiple of the model's stride (yolov5's check_img_size): the check
feeds every model an image of that rounded size, the only one the exported files take.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import signal
import sys
import threading
from pathlib import Path

import numpy as np

from stagedyolo.jsonio import write_json

FORMATS = {"onnx": ".onnx", "torchscript": ".torchscript"}
CONF_THRESHOLD = 0.25  # yolov5 detect.py's default: the boxes a user of the exported model sees
IOU_THRESHOLD = 0.45


class ExportFailed(RuntimeError):
    """The exporter produced no file, or the exported model disagrees with the PyTorch model."""


def export_for_rule(
    weights: str,
    data_yaml: str,
    outputs: dict,
    comparison_json: str,
    *,
    settings: dict,
    img: int,
    threads: int,
    log_path: str,
) -> dict:
    """The export rule: ``outputs`` maps each format in settings['formats'] to the file the rule promises.
    Folders follow the output path (R/export/export.json; the engine's settings folder is R/engine)."""
    from stagedyolo.engine.job import engine_job

    out_dir = Path(comparison_json).parent
    out_dir.mkdir(parents=True, exist_ok=True)
    model_pt = out_dir / "model.pt"  # yolov5 writes each format next to the weights it reads
    job = engine_job(out_dir.parent / "engine", log_path, threads, rows=("onnx_torchscript_exporter",))
    with job as patches, removed_on_exit(model_pt):
        shutil.copy2(weights, model_pt)
        model = load_model(model_pt)
        size = stride_rounded(img, model)
        written = run_exporter(model_pt, size, settings["formats"], settings["opset"])
        image = check_image(data_yaml)
        x = letterboxed(image, size)
        reference = pytorch_predictions(model, x)
        checks = {
            fmt: compare_predictions(
                reference,
                predictions(fmt, written[fmt], x, threads),
                settings["box_tolerance_px"],
                settings["score_tolerance"],
            )
            for fmt in settings["formats"]
        }
    for fmt, path in written.items():
        if Path(path) != Path(outputs[fmt]):
            shutil.move(path, outputs[fmt])
    record = {
        "weights": str(Path(weights).resolve()),
        "image": image,
        "img": size,
        "img_setting": img,
        "opset": settings["opset"],
        "box_tolerance_px": settings["box_tolerance_px"],
        "score_tolerance": settings["score_tolerance"],
        "formats": {fmt: {"file": str(outputs[fmt]), **check} for fmt, check in checks.items()},
        "passed": all(check["passed"] for check in checks.values()),
        "patches": patches,
    }
    write_json(comparison_json, record)
    failed = [fmt for fmt, check in checks.items() if not check["passed"]]
    if failed:
        log_failed_checks(record, failed, log_path)
        raise ExportFailed(
            f"export: the {', '.join(failed)} model disagrees with the PyTorch model on {image} beyond "
            f"export.box_tolerance_px / export.score_tolerance: its numbers are above and in "
            f"{log_path} (Snakemake deletes the failed job's {comparison_json})."
        )
    return record


@contextlib.contextmanager
def removed_on_exit(path: Path):
    """Remove ``path`` when the block ends, also when SIGTERM or SIGHUP ends it (Snakemake stopping the job): their
    default action ends the process at once, skipping every cleanup. Here they raise SystemExit in the main thread,
    which unwinds the block (yolov5's exporter catches Exception, not SystemExit)."""

    def stop(signum, _frame):
        raise SystemExit(128 + signum)

    in_main_thread = threading.current_thread() is threading.main_thread()
    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGHUP)} if in_main_thread else {}
    try:
        yield path
    finally:
        Path(path).unlink(missing_ok=True)
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def log_failed_checks(record: dict, failed: list[str], log_path: str) -> None:
    """Each failed format's comparison, to the job's log and stderr."""
    lines = [f"export check failed: {fmt}: {json.dumps(record['formats'][fmt])}" for fmt in failed]
    lines.append(
        f"export check: tolerances box {record['box_tolerance_px']} px, score {record['score_tolerance']}; "
        f"image {record['image']} at {record['img']} px"
    )
    with open(log_path, "a") as log:
        log.write("\n".join(lines) + "\n")
    print("\n".join(lines), file=sys.stderr, flush=True)


def run_exporter(model_pt: Path, img: int, formats: list[str], opset: int) -> dict:
    """yolov5.export.run on the CPU; returns {format: file}. yolov5 catches an exporter's exception and logs it, so a
    missing file is the only sign of failure."""
    from yolov5 import export

    export.run(weights=str(model_pt.resolve()), imgsz=(img, img), include=tuple(formats), device="cpu", opset=opset)
    written = {fmt: model_pt.with_suffix(FORMATS[fmt]) for fmt in formats}
    missing = [fmt for fmt, path in written.items() if not path.is_file()]
    if missing:
        raise ExportFailed(
            f"export: yolov5's exporter wrote no {', '.join(missing)} file; its reason is in the "
            "job's log (the line with 'export failure')."
        )
    return written


def check_image(data_yaml: str) -> str:
    """The image the check runs on: the first of the test split, else of the val split (real data, real boxes)."""
    from stagedyolo.dataset.validate import list_split_images, load_data_yaml

    splits = load_data_yaml(data_yaml)["splits"]
    for split in ("test", "val"):
        images = list_split_images(splits[split])[0] if split in splits else []
        if images:
            return images[0]
    raise ExportFailed(f"export: {data_yaml} lists no test or val image to check the exported model on.")


def letterboxed(image_path: str, img: int) -> np.ndarray:
    """The image as yolov5's detect.py feeds it: letterboxed to img x img, RGB, CHW, 0..1, batch of one."""
    import cv2
    from yolov5.utils.augmentations import letterbox

    im = letterbox(cv2.imread(image_path), img, auto=False)[0]
    return np.ascontiguousarray(im.transpose(2, 0, 1)[::-1])[None].astype(np.float32) / 255


def load_model(weights: Path):
    """The reference: the checkpoint as yolov5 loads it for inference (fused, eval), not the exporter's copy."""
    import torch
    from yolov5.models.experimental import attempt_load

    model = attempt_load(str(Path(weights).resolve()), device=torch.device("cpu"), inplace=True, fuse=True)
    return model.float().eval()


def stride_rounded(img: int, model) -> int:
    """The image size the exporter uses: img rounded up to a multiple of the model's largest stride."""
    from yolov5.utils.general import check_img_size

    return int(check_img_size(img, int(max(model.stride))))


def pytorch_predictions(model, x: np.ndarray) -> np.ndarray:
    """A torch model's raw predictions on x: the checkpoint's, or a TorchScript file's."""
    import torch

    with torch.no_grad():
        return model(torch.from_numpy(x))[0].numpy()


def predictions(fmt: str, path: Path, x: np.ndarray, threads: int) -> np.ndarray:
    if fmt == "onnx":
        import onnxruntime

        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = threads
        session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        return session.run(None, {session.get_inputs()[0].name: x})[0]
    import torch

    return pytorch_predictions(torch.jit.load(str(path), map_location="cpu"), x)


def compare_predictions(
    reference: np.ndarray, candidate: np.ndarray, box_tolerance_px: float, score_tolerance: float
) -> dict:
    """Raw predictions (1, anchors, 5 + classes) of two models on the same input, and the boxes each keeps after
    NMS at detect.py's thresholds. Passes when every raw box and score and every kept box agree within tolerance."""
    if reference.shape != candidate.shape:
        return {"passed": False, "reason": f"output shape {list(candidate.shape)} != PyTorch's {list(reference.shape)}"}
    box_diff = float(np.abs(reference[..., :4] - candidate[..., :4]).max())
    score_diff = float(np.abs(reference[..., 4:] - candidate[..., 4:]).max())
    kept_ref, kept = detections(reference), detections(candidate)
    same_boxes = len(kept) == len(kept_ref) and np.array_equal(kept[:, 5], kept_ref[:, 5])
    kept_diff = float(np.abs(kept[:, :4] - kept_ref[:, :4]).max()) if same_boxes and len(kept) else None
    return {
        "anchors": int(reference.shape[1]),
        "raw_max_box_diff_px": box_diff,
        "raw_max_score_diff": score_diff,
        "detections": len(kept_ref),
        "detections_exported": len(kept),
        "detections_max_box_diff_px": kept_diff,
        "passed": bool(same_boxes and box_diff <= box_tolerance_px and score_diff <= score_tolerance),
    }


def detections(prediction: np.ndarray) -> np.ndarray:
    """(n, 6) boxes x1 y1 x2 y2 conf class kept by yolov5's own NMS, by class, then position: NMS orders them by
    confidence, and two equally confident boxes may swap places between two models without anything being wrong."""
    import torch
    from yolov5.utils.general import non_max_suppression

    kept = non_max_suppression(torch.from_numpy(prediction), CONF_THRESHOLD, IOU_THRESHOLD)[0].numpy()
    return kept[np.lexsort((kept[:, 1], kept[:, 0], kept[:, 5]))]

"""The final score on data held out from training: the last stage's weights on the `test:` split of data.yaml,
through yolov5's own val.py (task "test"), with per-class AP50 and AP50-95.

Per-class figures come from yolov5's ap_per_class, recorded as val.py calls it (the patch table's
`ap_per_class_record` row): val.run returns per-class mAP with the mean filled in for classes absent from the split,
which would print a made-up AP for them. Here such a class
shows its instance count of 0 and no AP. val.py calls ap_per_class only when some detection is right, so the
instances are counted from the split's label files, and a class with instances that nothing detected scores 0.

Weights trained with single_cls (the last stage's setting) detect one class: val.py then scores every label as that
class, named "item" as yolov5's train.py names it.
"""

from __future__ import annotations

import os
from pathlib import Path

from stagedyolo.dataset.validate import img2label_path, list_split_images, load_data_yaml
from stagedyolo.jsonio import write_json

COLUMNS = ("class", "instances", "precision", "recall", "ap50", "ap50_95")
SCORES = ("precision", "recall", "ap50", "ap50_95")
SINGLE_CLASS_NAME = "item"  # yolov5 train.py's name for the one class of a single_cls model


def evaluate_for_rule(
    weights: str,
    data_yaml: str,
    metrics_json: str,
    metrics_md: str,
    *,
    img: int,
    batch: int,
    device: str,
    threads: int,
    log_path: str,
    single_cls: bool = False,
) -> dict:
    """The evaluate_test rule. Without a `test:` split it writes that there is none, and succeeds. Folders follow
    the output path (R/test/test_metrics.json; the engine's settings folder is R/engine). ``single_cls``: the
    weights were trained with it (the last stage's setting)."""
    data = load_data_yaml(data_yaml)
    if "test" not in data["splits"]:
        result = {
            "test_split": None,
            "reason": f"{source_yaml(data_yaml)} has no test: split",
            "weights": str(Path(weights).resolve()),
        }
        Path(log_path).parent.mkdir(parents=True, exist_ok=True)
        Path(log_path).write_text(result["reason"] + "; nothing to evaluate\n")
    else:
        from stagedyolo.engine.job import engine_job

        engine_home = Path(metrics_json).parent.parent / "engine"
        with engine_job(engine_home, log_path, threads, rows=("ap_per_class_record", "complete_nms")) as patches:
            result = run_val(
                weights,
                data_yaml,
                data,
                img=img,
                batch=batch,
                device=device,
                workers=0 if threads <= 2 else min(8, threads // 2),
                out_dir=Path(metrics_json).parent / "val",
                single_cls=single_cls,
            )
        result["patches"] = patches
    write_json(metrics_json, result)
    Path(metrics_md).write_text(markdown(result))
    return result


def source_yaml(data_yaml: str) -> str:
    """The user's data.yaml the staged copy was made from (prepare_dataset records it), else the file itself."""
    import yaml

    return yaml.safe_load(Path(data_yaml).read_text()).get("source_data_yaml") or data_yaml


def narrow_to_device_setting(device: str, env) -> None:
    """An explicit ``device`` ('1') counts the GPUs the scheduler left visible, as a stage's does: make its GPU the only
    visible one (and mark it, so resolve_device hands yolov5 ''), or yolov5's select_device would write the index
    itself into CUDA_VISIBLE_DEVICES and score on another job's physical GPU."""
    from stagedyolo.launch.command import explicit_gpu_indices, stage_gpu_env

    if explicit_gpu_indices(device):
        env.update(stage_gpu_env(1, env, stage="evaluate_test", device=str(device).split(",")[0]))


def run_val(
    weights: str,
    data_yaml: str,
    data: dict,
    *,
    img: int,
    batch: int,
    device: str,
    workers: int,
    out_dir: Path,
    single_cls: bool = False,
) -> dict:
    narrow_to_device_setting(device, os.environ)  # before torch first touches CUDA
    import torch
    from yolov5 import val
    from yolov5.utils.callbacks import Callbacks

    from stagedyolo.engine.worker import resolve_device

    recorder = val.ap_per_class  # the ap_per_class_record row's (engine_job applies it)
    if not hasattr(recorder, "last"):
        raise RuntimeError("the ap_per_class_record patch row is not applied: run the evaluation inside engine_job")
    recorder.last = None  # val.py calls it only when some detection is right
    (mp, mr, map50, map50_95, *_losses), _maps, _map50s, speed = val.run(
        data=str(Path(data_yaml).resolve()),
        weights=str(Path(weights).resolve()),
        batch_size=batch,
        imgsz=img,
        task="test",
        device=resolve_device(device, torch.cuda.is_available()),
        workers=workers,
        plots=False,
        single_cls=single_cls,
        project=str(out_dir),
        name="test",
        exist_ok=True,
        callbacks=Callbacks(),
    )
    names = class_names(data["names"], single_cls)
    counts = instance_counts(data["splits"]["test"], len(names), single_cls)
    return {
        "test_split": data["splits"]["test"],
        "weights": str(Path(weights).resolve()),
        "img": img,
        "single_cls": single_cls,
        "all": {"precision": float(mp), "recall": float(mr), "ap50": float(map50), "ap50_95": float(map50_95)},
        "classes": per_class(names, counts, recorder.last),
        "ms_per_image": dict(zip(("pre", "inference", "nms"), speed)),
    }


def class_names(names: list[str], single_cls: bool) -> list[str]:
    """The classes the weights detect: data.yaml's, or the one class of single_cls training."""
    return [SINGLE_CLASS_NAME] if single_cls and len(names) != 1 else list(names)


def instance_counts(sources: list[str], nc: int, single_cls: bool = False) -> list[int]:
    """Labelled objects per class in the split's label files, as val.py loads them: a row repeated in one file
    counts once, and with single_cls every object is class 0."""
    counts = [0] * nc
    for image in list_split_images(sources)[0]:
        for row in _label_rows(Path(img2label_path(image))):
            counts[0 if single_cls else int(row[0])] += 1
    return counts


def _label_rows(label: Path) -> set[tuple[float, ...]]:
    if not label.is_file():  # an image without objects
        return set()
    return {tuple(map(float, line.split())) for line in label.read_text().splitlines() if line.strip()}


def per_class(names: list[str], counts: list[int], scored: tuple | None) -> list[dict]:
    """One row per class from ``scored``, ap_per_class's return (None when val.py never called it): a class with no
    instances in the split has no precision, recall or AP; one with instances that ap_per_class did not score (val.py
    skips it when no detection is right) scores 0."""
    rows = {
        i: {"class": name, "instances": counts[i], **dict.fromkeys(SCORES, 0.0 if counts[i] else None)}
        for i, name in enumerate(names)
    }
    if scored is not None:
        _tp, _fp, p, r, _f1, ap, classes = scored
        for k, c in enumerate(classes):
            rows[int(c)].update(
                precision=float(p[k]), recall=float(r[k]), ap50=float(ap[k, 0]), ap50_95=float(ap[k].mean())
            )
    return list(rows.values())


def markdown(result: dict, heading: str = "#") -> str:
    """The test table (also the report's "Test split" section, one heading level down)."""
    if result.get("test_split") is None:
        return f"{heading} Test split\n\nNo test-split score: {result['reason']}.\n"
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(_cell(row[c]) for c in COLUMNS) + " |" for row in table_rows(result)]
    return f"{heading} Test split\n\n{caption(result)}\n\n" + "\n".join(lines) + "\n"


def table_rows(result: dict) -> list[dict]:
    """The `all` row, then one per class."""
    total = sum(row["instances"] for row in result["classes"])
    return [{"class": "all", "instances": total, **result["all"]}, *result["classes"]]


def caption(result: dict) -> str:
    single = ", single_cls: every class scored as one" if result.get("single_cls") else ""
    return (
        f"Weights `{result['weights']}` at {result['img']} px on `{', '.join(result['test_split'])}` "
        f"(yolov5 val.py, task test{single})."
    )


def _cell(value) -> str:
    if value is None:
        return "n/a"
    return f"{value:.4f}" if isinstance(value, float) else str(value)

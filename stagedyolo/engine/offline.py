"""Keep the engine offline and quiet. Every variable here answers one documented place where yolov5 or
ultralytics reaches out at run time (docs/offline.md lists them)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

# What each variable stops.
OFFLINE_ENV = {
    "YOLO_OFFLINE": "1",  # ultralytics' is_online() DNS look-ups at import
    "YOLO_AUTOINSTALL": "false",  # ultralytics pip-installing missing packages
    "ULTRALYTICS_SKIP_REQUIREMENTS_CHECKS": "1",  # yolov5 check_requirements() pip installs
    "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1",  # torch>=2.6 refuses yolov5 checkpoints (pickled DetectionModel)
    "WANDB_MODE": "disabled",  # online loggers, in case one is installed
    "COMET_MODE": "disabled",
    "CLEARML_OFFLINE_MODE": "1",
    "HF_HUB_OFFLINE": "1",
    "MLFLOW_DISABLE_TELEMETRY": "true",  # mlflow >= 3 sends usage telemetry unless told not to (tracking: mlflow)
    "DO_NOT_TRACK": "true",  # the cross-tool opt-out mlflow also honours
    "GIT_TERMINAL_PROMPT": "0",
    "PYTHONUNBUFFERED": "1",  # stage logs in order, as they happen
    "MPLBACKEND": "Agg",
}


def prepare_config_dir(config_dir: str | os.PathLike) -> Path:
    """A yolov5/ultralytics settings folder holding the fonts yolov5 would otherwise download.

    check_dataset() -> check_font() fetches Arial.ttf when it is missing, which is fatal offline. Any TTF under
    that name works, so we copy matplotlib's bundled DejaVuSans (it also covers non-ASCII class names).
    """
    from stagedyolo.jsonio import replaced_atomically

    config_dir = Path(config_dir)
    config_dir.mkdir(parents=True, exist_ok=True)
    missing = [config_dir / name for name in ("Arial.ttf", "Arial.Unicode.ttf") if not (config_dir / name).exists()]
    if not missing:  # every stage after the first: importing matplotlib would cost it 0.2-0.3 s on the demo machine
        return config_dir
    import matplotlib

    font = Path(matplotlib.get_data_path()) / "fonts" / "ttf" / "DejaVuSans.ttf"
    for target in missing:
        # Two stages may prepare the folder at once: each copies to a temporary file of its own, then renames.
        with open(font, "rb") as source, replaced_atomically(target, "wb") as copy:
            shutil.copyfileobj(source, copy)
    return config_dir


def engine_environment(config_dir: str | os.PathLike, base: dict | None = None) -> dict:
    """The environment for a stage process: `base` (default os.environ) plus the offline settings."""
    env = dict(os.environ if base is None else base)
    env.update(OFFLINE_ENV)
    config_dir = str(prepare_config_dir(config_dir))
    env["YOLOV5_CONFIG_DIR"] = config_dir  # fonts + yolov5 settings, never ~/.config
    env["YOLO_CONFIG_DIR"] = config_dir  # ultralytics settings
    return env

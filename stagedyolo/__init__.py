"""stagedyolo: a measured, staged YOLOv5 training pipeline."""

__version__ = "0.1.0"

"""The YOLO11 detector and segmenter in plain PyTorch (imports torch only); model files are ``model_files``."""

from yolo11_lightning.nn.attention import C2PSA, Attention, PSABlock
from yolo11_lightning.nn.blocks import SPPF, Bottleneck, C3k, C3k2, Concat, Conv, DWConv, Proto
from yolo11_lightning.nn.head import DFL, Detect, Segment, SegmentOutput
from yolo11_lightning.nn.yolo11 import SCALES, TASKS, YOLO11

__all__ = [
    "C2PSA",
    "DFL",
    "SCALES",
    "SPPF",
    "TASKS",
    "YOLO11",
    "Attention",
    "Bottleneck",
    "C3k",
    "C3k2",
    "Concat",
    "Conv",
    "DWConv",
    "Detect",
    "PSABlock",
    "Proto",
    "Segment",
    "SegmentOutput",
]

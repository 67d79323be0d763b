"""Box maths: anchors, distance/box conversions, IoU, post-processing."""

from yolo11_lightning.ops.anchors import box_to_dist, dist_to_box, make_anchors
from yolo11_lightning.ops.boxes import complete_iou, cxcywh_to_xyxy

__all__ = ["box_to_dist", "complete_iou", "cxcywh_to_xyxy", "dist_to_box", "make_anchors"]

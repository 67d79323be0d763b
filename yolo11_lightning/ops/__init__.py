"""Box maths: anchors, distance/box conversions, IoU, post-processing."""

from yolo11_lightning.ops.anchors import box_to_dist, dist_to_box, make_anchors

__all__ = ["box_to_dist", "dist_to_box", "make_anchors"]

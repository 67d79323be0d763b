"""The pictures a run leaves for people to look at, as (H, W, 3) uint8 RGB images.

labels.py            label statistics: boxes per class, box sizes and centres (OpenCV)
training_curves.py   losses, validation metrics and learning rates per epoch (matplotlib)
evaluation.py        confusion matrix, precision-recall, F1, precision and recall curves per class (matplotlib)

Drawing boxes and masks on images is ``yolo11_lightning.plots.drawing``.
"""

"""Oriented boxes, YOLO11-obb: the task in task.py and its own files.

task.py      ObbTask: what every layer asks of the task
head.py      OBB (Detect plus one angle per anchor) and the rotated decode
rotated.py   rotated-box maths: xywhr corners, distances to rotated boxes, probabilistic IoU (probiou)
assigner.py  RotatedTaskAlignedAssigner: the task-aligned assigner on rotated boxes
loss.py      ObbLoss: BCE classes, probiou box term and DFL on the distances
labels.py    ObbCorners (corner rows as outlines through augmentation), rotated_boxes (minAreaRect), corner checks
batch.py     the OBB batch: (N, 7) rotated targets (collate_obb)
nms.py       rotated NMS (probiou, class offset, the reference's fast NMS)
metric.py    ObbMAP: OBB mAP by the reference validator's rules, exact across ranks
"""

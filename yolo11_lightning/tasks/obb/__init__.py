"""Oriented boxes (YOLO11-obb): the task (``task.py``) and its own files.

task.py      ObbTask: what every layer asks of the task (the model and the loss so far; ``ObbTask.not_yet``)
head.py      OBB (Detect plus one angle per anchor) and the rotated decode
rotated.py   rotated-box maths: xywhr corners, distances to rotated boxes, probabilistic IoU (probiou)
assigner.py  RotatedTaskAlignedAssigner: the task-aligned assigner on rotated boxes
loss.py      ObbLoss: BCE classes, probiou box term and DFL on the distances
"""

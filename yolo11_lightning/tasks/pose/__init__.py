"""Keypoints (YOLO11-pose): the task (``task.py``) and its own files.

task.py   PoseTask: what every layer asks of the task (the model and the loss so far; ``PoseTask.not_yet``)
head.py   Pose (Detect plus K·D keypoint channels per anchor) and the keypoint decode
loss.py   PoseLoss: the detection terms plus the OKS-shaped keypoint term and the visibility BCE
"""

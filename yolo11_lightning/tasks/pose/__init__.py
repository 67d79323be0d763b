"""Keypoints, YOLO11-pose: the task in task.py and its own files.

task.py     PoseTask: what every layer asks of the task
head.py     Pose (Detect plus K·D keypoint channels per anchor) and the keypoint decode
loss.py     PoseLoss: the detection terms plus the OKS-shaped keypoint term and the visibility BCE
batch.py    PoseBatch / collate_pose: the batch's ``keypoints`` (N, K, 3)
metric.py   PoseMAP: box mAP plus keypoint mAP by OKS, as the reference validator scores it
drawing.py  keypoints and skeletons drawn, predicted keypoints mapped back to original pixels
"""

"""Image classification (YOLO11-cls): the task (``task.py``) and its own files.

task.py   ClassifyTask: what every layer asks of the task (the model and the loss so far; ``ClassifyTask.not_yet``)
head.py   Classify: 1×1 conv to 1280, global average pool, dropout, linear; softmax in eval
loss.py   ClassificationLoss: cross-entropy, the mean over the global batch
"""

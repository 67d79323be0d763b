"""Image classification, YOLO11-cls: the task in task.py and its own files.

task.py     ClassifyTask: what every layer asks of the task
head.py     Classify: 1×1 conv to 1280, global average pool, dropout, linear; softmax in eval
loss.py     ClassificationLoss: cross-entropy, the mean over the global batch
augment.py  ClassifyTransform: the reference's classification augmentations and evaluation transform (torchvision)
batch.py    collate_classification: the detection batch plus ``labels`` (B,)
metric.py   ClassificationAccuracy: top-1 / top-5 accuracy, fitness, loss; gathered by dataset index
draw.py     draw_top_classes: the top-5 classes written on an image
"""

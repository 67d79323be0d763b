"""Instance segmentation, YOLO11-seg: the task in task.py and its own files.

task.py      SegmentTask: what every layer asks of the task
head.py      Segment (Detect plus mask coefficients) and Proto (the prototype masks)
loss.py      SegmentationLoss: the detection terms plus the per-instance mask BCE
masks.py     the training masks rasterised from the polygons (overlap index maps or one per instance)
batch.py     SegmentationBatch and its collate
mask_ops.py  masks from the head's outputs after NMS, to original pixels, RLE
metric.py    SegmentationMAP: box and mask mAP, exact across ranks
"""

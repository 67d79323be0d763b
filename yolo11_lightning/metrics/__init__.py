"""Evaluation metrics.

coco.py          COCO's evaluation from arrays: the greedy per-image matching and the per-class precision
detection.py     ``DetectionMAP``: matches each batch in ``update``, accumulates once in ``compute`` (classes
                 shared out across ranks); COCO box mAP, exact across ranks; the base of a task's metric
reference_ap.py  the reference validator's AP rules (pose, OBB; box mAP beside COCO's on request)
class_results.py what an evaluation found per class: P/R/F1 curves, AP, the confusion matrix (pictures, summary)
"""

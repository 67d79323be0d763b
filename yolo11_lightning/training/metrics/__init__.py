"""Evaluation metrics.

detection.py     ``DetectionMAP``: COCO box mAP (torchmetrics), exact across ranks; the base of a task's metric
reference_ap.py  the reference validator's AP rules, logged beside the COCO mAP on request
class_results.py what an evaluation found per class: P/R/F1 curves, AP, the confusion matrix (pictures, summary)
"""

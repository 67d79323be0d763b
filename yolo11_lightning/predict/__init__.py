"""Prediction on images, folders and videos.

command.py  ``yolo11-lightning predict`` and ``predict()`` for notebooks
sources.py  what to read (images, folders, videos) as letterboxed ``PredictionBatch``es
writer.py   ``PredictionWriter``: annotated copies, json lines and COCO json
"""

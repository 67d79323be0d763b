"""The built-in synthetic datasets: exact labels, deterministic, generated in seconds.

shapes.py   the shapes set (boxes, or outlines for segmentation), written as YOLO and COCO folders
painter.py  its images, one per (seed, split, index)
hard.py     the harder detection set (look-alike classes, clutter, overlaps)
command.py  ``yolo11-lightning synthetic``
"""

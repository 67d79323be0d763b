"""An image's labels between the records and the batch.

instances.py  Instances: boxes, classes and per-instance fields, moved by one geometry (InstanceField)
polygons.py   Polygons, the outline field (and the polygon geometry the sources share: resampling, merging)
"""

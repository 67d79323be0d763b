"""Data: records -> samples -> the batch contract, and the LightningDataModule.

batch.py          the batch contract (``DetectionBatch``: keys, shapes, units) and ``collate_detection``
dataset.py        ``BoxDataset``: augmented or letterboxed samples from the records
datamodule.py     ``YOLODataModule``: dataset yaml or the synthetic set -> DataLoaders, the global batch
eval_shapes.py    the reference validator's resize and rectangular batches
agreement.py      every rank loaded the same data (one collective at setup)
check_data.py     ``yolo11-lightning check-data`` (its label statistics: ``plots.labels``)
loader_workers.py DataLoader workers (``num_workers: auto``, signals, OpenCV threads); cpu_cores.py the cores

Stages: ``sources/`` (files -> records), ``labels/`` (an image's instances), ``images/`` (reading, caches),
``augment/`` (the training pipeline), ``sampling/`` (the order), ``synthetic/`` (the built-in datasets).
"""

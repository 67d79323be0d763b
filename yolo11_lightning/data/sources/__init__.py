"""Dataset sources: a dataset yaml and its files -> checked ``ImageRecord``s, one module per job.

    config.py   the dataset yaml (``DatasetConfig``, ``load_dataset_config``)
    label_options.py  what the instances carry beyond boxes (a pose dataset's keypoints): ``LabelOptions``
    records.py  what a source hands to the pipeline: one ``ImageRecord`` per usable image
    checks.py   label-row checks shared by every format, and the report of what was skipped
    yolo.py     YOLO txt labels (image folders / lists, one label file per image; box or polygon rows)
    coco.py     COCO json (boxes, polygons / RLE masks as instance polygons, keypoints of a keypoints json)
    rle.py      COCO run-length masks: decoding and outlines, without pycocotools
    cache.py    the label cache (one checked ``.npz`` per split)
    split.py    ``load_split``: list a split's files, use the cache when valid, else parse and check
    task_hint.py  the task a dataset's files say (declared keypoints: pose; class folders: classification)

Everything after the records (image cache, Dataset, augmentation, sampler) does not know the format.
"""

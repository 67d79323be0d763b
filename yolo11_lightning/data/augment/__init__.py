"""Training augmentation, as the reference's: mosaic, random affine, mixup, HSV, flips.

pipeline.py    ``augment_train_sample`` and ``AugmentConfig``: the order and the random draws
transforms.py  image and box geometry (letterbox, warps, mosaic tiles, flips, mixup)
color.py       the HSV jitter
"""

"""The YOLO11 network in plain PyTorch.

    blocks.py     convolutions and the C3k2 / SPPF blocks of the backbone and neck
    attention.py  the C2PSA position-sensitive attention block
    head.py       the detection head (``Detect``, its ``DFL``); a task's own head lives with the task
    scales.py     the n/s/m/l/x depth and width multipliers
    yolo11.py     ``YOLO11``: backbone, neck and the task's head (``tasks.get_task(task).build_head``)
    summary.py    layer and parameter tables (``yolo11-lightning info``)

Model files (the reference's ``.pt``, our weights) are read by ``model_files``.
"""

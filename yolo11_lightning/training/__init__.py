"""Training with Lightning: the module, the recipe, and what keeps a run correct across ranks and restarts.

module.py         ``YOLO11Module``: model, loss, metrics, prediction (the task's hooks)
optim.py          optimiser groups, ``auto``, the warmup schedule as a function of the global batch index
step_exchange.py  the training step's one collective (loss normalisers, rank flags)
faults.py         skipping non-finite steps on every rank together
preemption.py     stop signals agreed across ranks; checkpointing.py atomic checkpoint files
run_identity.py   what makes a checkpoint part of "this run" (``--ckpt_path last``)
pretrained.py     pretrained weights, with rank-zero messages; lightning_cli.py the LightningCLI
defaults.py       our defaults beside the reference trainer's (the table of docs/defaults.md)
loggers.py, cpu_threads.py, host_memory.py  loggers, CPU threads, freed-memory reuse

``callbacks/`` holds one Lightning callback per module, ``metrics/`` the mAP.
"""

"""Training with Lightning: the module, the recipe, and what keeps a run correct across ranks and restarts.

module.py             ``YOLO11Module``: the Lightning hooks, wiring the modules below and the task's hooks
model_source.py       what model the module holds: its task, a fresh YOLO11 with pretrained weights, or ONNX
optim.py              optimiser groups, ``auto``, the warmup schedule as a function of the global batch index
step_exchange.py      the training step's one collective (loss normalisers, rank flags)
nonfinite_steps.py    skipping non-finite steps on every rank together
step_logging.py       the step's values read back on the host: loss items on log steps, the guard one step late
gradient_clipping.py  clipping a fused optimiser under mixed precision
rank_zero_buffers.py  rank 0's BatchNorm statistics on every rank before validation
tuners.py, lightning_noise.py  refused Lightning tuners; Lightning messages that do not apply here
datamodule.py         ``YOLODataModule``: datasets, loaders and the global batch split (the Lightning hooks);
                      ``loading/`` its parts (option checks, the splits a stage reads, the DataLoaders)
preemption.py     stop signals agreed across ranks; checkpointing.py atomic checkpoint files
run_identity.py   what makes a checkpoint part of "this run" (``--ckpt_path last``)
pretrained.py     pretrained weights, with rank-zero messages
loggers.py, cpu_threads.py, host_memory.py  loggers, CPU threads, freed-memory reuse

``callbacks/`` holds one Lightning callback per module; the CLI is in ``cli/``.
"""

"""Lightning callbacks, one per module.

checkpoints.py         ``LastCheckpoint`` and ``BestCheckpoint`` (``best.ckpt`` follows the task's monitor)
ema.py                 ``ModelEMA``: the weights validation scores and checkpoints hold
recipe.py              ``LoopRecipe``: warmup, accumulation ramp, loss scale, windows across epoch ends
learning_rates.py      ``LearningRates``: Lightning's LR monitor, idle when the Trainer has no logger
machine.py             ``MachineSettings``: compile, host memory, CPU threads (not saved with the model)
hang_watchdog.py       ``HangWatchdog``: which rank stopped, with every rank's stacks
throughput.py          images/s, data-wait share, peak memory
validation_images.py   predictions drawn on the first validation images
result_pictures.py     ``ResultPictures``: training curves, confusion matrix, per-class curves, labels, batches
closing_summary.py     ``ClosingSummary``: per-class table, best epoch, wall time and files when a run ends
unreadable_images.py   the account of images that could not be read, and its limit
"""

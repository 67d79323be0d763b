"""The entry points: the ``yolo11-lightning`` command and its subcommands, the only code that resolves a run's task.

main.py             the dispatcher: ``fit|validate|test|predict`` go to the LightningCLI, the small commands start
                    without importing Lightning
lightning_cli.py    the LightningCLI: packaged configs, the run's task set once, resume policy, ending ranks
cli/packaged_configs.py the configs shipped inside the package (``--config quickstart``)
info.py             ``yolo11-lightning info``: layers, parameters and GFLOPs of every scale of a task
check_data.py       ``yolo11-lightning check-data``: what a dataset holds, what was skipped and why, label plots
"""

"""The entry points: the ``yolo11-lightning`` command and its subcommands, the only code that resolves a run's task.

main.py             the dispatcher: ``fit|validate|test|predict`` go to the LightningCLI, the small commands start
                    without importing Lightning
lightning_cli.py    the LightningCLI: packaged configs, the run's task set once, the default callbacks
resume.py           how ``fit`` starts from a checkpoint: ``--ckpt_path last``, the global batch, another run
launched_ranks.py   ending the ranks this process launched when the run fails here
parser_errors.py    the parser's refusals in one line, with the closest options
packaged_configs.py the configs shipped inside the package (``--config quickstart``)
info.py             ``yolo11-lightning info``: layers, parameters and GFLOPs of every scale of a task
check_data.py       ``yolo11-lightning check-data``: what a dataset holds, what was skipped and why, label plots
"""

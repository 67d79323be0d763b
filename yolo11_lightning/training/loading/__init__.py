"""The DataModule's parts, one concern each: its option checks, the splits a stage reads, its DataLoaders.

options.py  ``check_data_options``: a ``data.<option>`` out of range, refused in one line
splits.py   which splits fit, validate, test and predict read; the refusal naming a missing one
loaders.py  the DataLoaders: workers, page-locked batches, the task's collate
"""

"""Every model file read or written, and the guards that read a file as data, never code.

weights.py      our weights format, Lightning checkpoints, reference ``.pt`` files: load, save, pretrained, and
                the task a file holds read from its pickle alone (``file_task``)
reference.py    a reference ``.pt``'s tensors mapped to our state dict (task inferred from the file)
torch_file.py   opening a torch file: archive layout and claimed sizes checked first
safe_pickle.py  the restricted unpickler's public face (``_unpickler.py``, ``_pickle_values.py``)
"""

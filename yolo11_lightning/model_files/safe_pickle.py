"""A restricted unpickler: reads the pickle inside a weights file without letting the file act on the process.

A pickle is a small program: opcodes that push data, name globals (``GLOBAL``), call them (``REDUCE``,
``NEWOBJ``) and write attributes (``BUILD``). ``Unpickler`` is the pure-Python ``pickle._Unpickler`` with an
opcode table of its own, so every opcode that can reach outside the data goes through a check here.

What a file may do, and why that is enough for weights files:

* **Name a global** only from a fixed table, and what it gets is never the real object: a fresh
  ``AllowedGlobal`` wrapper (owned by this load) around our own checked implementation, or a fresh inert class:

  - tensor rebuilding (``torch._utils._rebuild_tensor_v2``, ``_rebuild_parameter``): arguments are type- and
    bounds-checked (the view must lie inside its storage) and the tensor is a view of bytes we read;
  - storage types (``torch.HalfStorage`` ...) and dtypes (``torch.float16``): inert markers;
  - plain containers: ``collections.OrderedDict``, ``builtins.set``/``frozenset``, ``torch.Size``,
    ``torch.device`` (checked arguments, real instances);
  - ``_codecs.encode``: only ``(str, "latin1")``, which is how protocol 2 stores ``bytes`` (any other codec
    is refused: chains of e.g. ``hex`` double the size at each step);
  - with ``model_classes=True`` (reference ``.pt`` files, which pickle whole models): reference classes
    (``ultralytics.*``), torch module classes (``torch.nn.modules.*``), torchvision's transforms (a trained
    classifier's ``model.transforms``) and a few data types (numpy scalars,
    paths, namespaces) become classes derived from ``StandIn``, created fresh for each load: instances record
    their constructor arguments and pickled state and have no behaviour.

  Everything else (``os.system``, ``builtins.eval``, ``torch.load`` ...) raises ``UnsafeGlobalError`` before
  anything is called. ``EXT*`` (copyreg registry), ``INST``/``OBJ`` (protocol 0/1 instantiation) and
  out-of-band buffers are refused outright.
* **Call** (``REDUCE``/``NEWOBJ``) only those wrappers and stand-in classes of this load.
* **Write attributes** (``BUILD``) only on stand-in *instances* (the state is stored as data, never applied
  as attributes) and the ``_metadata`` of an ``OrderedDict`` (torch state dicts). A ``BUILD`` on a global,
  a wrapper, a class or a tensor is refused: nothing the file names can be changed, so a file cannot alter
  torch (or this module) for later loads.
* **Allocate** only what the file pays for: a length the file claims (strings, bytes, bytearrays, storages)
  must fit in the bytes it has; ``MARK`` nesting is limited (``MAX_MARK_DEPTH``), so is the number of
  opcodes (``MAX_OPS``: each builds at most one small object), of distinct globals (``MAX_GLOBALS``), the
  objects our functions build (``ALLOC_BUDGET``: a short ``REDUCE`` could otherwise copy a large memoised
  string or list again and again) and the nesting of the result (``MAX_DEPTH``, checked after loading
  without recursion). Not bounded: CPU time on crafted hash collisions in a dict (at most ``MAX_OPS`` keys).

Storages come from a ``records`` callback (the archive reader in ``torch_file``) that checks the size a
storage claims against the record's real size before reading it. The approach follows
``torch/_weights_only_unpickler.py``; unlike it, allowed globals are wrappers, the codec is fixed, and
claimed sizes are checked (``torch_file.load`` runs this one as a check before torch's own loader).

This module is the public face; the code is in ``_unpickler`` (the main loop, the opcode table, the allow-list
of globals, storages and tensors) and ``_pickle_values`` (errors, limits, stand-ins, checked constructors).
"""

from __future__ import annotations

from typing import Any

from yolo11_lightning.model_files._pickle_values import (
    ALLOC_BUDGET,
    MAX_DEPTH,
    MAX_DIMS,
    MAX_GLOBALS,
    MAX_MARK_DEPTH,
    MAX_OPS,
    ModelClassError,
    Records,
    StandIn,
    Storage,
    TensorRef,
    UnsafeGlobalError,
    UnsafePickleError,
    check_depth,
)
from yolo11_lightning.model_files._unpickler import Unpickler

__all__ = [
    "ALLOC_BUDGET",
    "MAX_DEPTH",
    "MAX_DIMS",
    "MAX_GLOBALS",
    "MAX_MARK_DEPTH",
    "MAX_OPS",
    "ModelClassError",
    "Records",
    "StandIn",
    "Storage",
    "TensorRef",
    "Unpickler",
    "UnsafeGlobalError",
    "UnsafePickleError",
    "check_depth",
    "loads",
]


def loads(data: bytes, **kwargs: Any) -> Any:
    """Unpickle ``data`` (see ``Unpickler`` for the keyword arguments)."""
    return Unpickler(data, **kwargs).load()

"""A restricted pickle module for reading reference checkpoints without running code from them.

Passed to ``torch.load(..., pickle_module=safe_pickle, weights_only=False)``. Its ``Unpickler``
resolves only:

* torch's tensor/parameter rebuild helpers and dtypes (what ``torch.save`` writes for tensors;
  storages are resolved by torch itself before ``find_class`` is asked),
* ``collections.OrderedDict``, ``builtins.set/frozenset``, ``_codecs.encode`` (plain containers, bytes),
* reference classes (``ultralytics.*``) and torch module classes (``torch.nn.modules.*``), plus a few
  data-only types (numpy scalars/arrays, paths, namespaces), all mapped to ``StandIn``: an inert
  class that records its constructor arguments and pickled state and has no behaviour.

Every other global (``os.system``, ``builtins.eval``, ``torch.load`` ...) raises ``UnsafeGlobalError``,
so a pickle that tries to call anything stops before the call. The approach follows
``torch/_weights_only_unpickler.py``: the file may only name things known to be inert.
"""

from __future__ import annotations

import _codecs
import collections
import io
import pickle
from typing import Any

import torch


class UnsafeGlobalError(pickle.UnpicklingError):
    """The pickle names a global outside the allow-list."""


class StandIn:
    """Inert placeholder for a pickled object of a class we refuse to import.

    ``args`` are the constructor arguments the pickle gave (REDUCE / NEWOBJ), ``state`` what BUILD gave
    (for an ``nn.Module`` the instance ``__dict__``: ``_modules``, ``_parameters``, ``_buffers`` ...).
    """

    qualname = "?"

    def __new__(cls, *args: Any, **kwargs: Any) -> StandIn:
        obj = super().__new__(cls)
        obj.args = args
        obj.state = None
        return obj

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __setstate__(self, state: Any) -> None:
        # Stored as data, never applied as attributes: the file cannot shadow our methods.
        self.state = state

    def __repr__(self) -> str:
        return f"<StandIn {self.qualname}>"


_STAND_INS: dict[str, type[StandIn]] = {}


def stand_in(qualname: str) -> type[StandIn]:
    """The StandIn subclass for ``module.Name`` (one class per name, so type checks stay cheap)."""
    if qualname not in _STAND_INS:
        _STAND_INS[qualname] = type(f"StandIn[{qualname}]", (StandIn,), {"qualname": qualname})
    return _STAND_INS[qualname]


def _allowed_globals() -> dict[str, Any]:
    allowed: dict[str, Any] = {
        "collections.OrderedDict": collections.OrderedDict,
        "builtins.set": set,
        "builtins.frozenset": frozenset,
        "_codecs.encode": _codecs.encode,  # protocol-2 bytes: encode(str, "latin1")
        "torch.Size": torch.Size,
        "torch._utils._rebuild_tensor_v2": torch._utils._rebuild_tensor_v2,
        "torch._utils._rebuild_parameter": torch._utils._rebuild_parameter,
    }
    v3 = getattr(torch._utils, "_rebuild_tensor_v3", None)
    if v3 is not None:
        allowed["torch._utils._rebuild_tensor_v3"] = v3
    for name in dir(torch):  # dtypes, pickled as e.g. "torch.float16" by the v3 rebuild
        value = getattr(torch, name, None)
        if isinstance(value, torch.dtype):
            allowed[f"torch.{name}"] = value
    return allowed


_ALLOWED = _allowed_globals()
# Data-only classes a reference file may hold outside the model (metrics, args): inert stand-ins.
_INERT_DATA = {
    "numpy.core.multiarray.scalar",
    "numpy._core.multiarray.scalar",
    "numpy.core.multiarray._reconstruct",
    "numpy._core.multiarray._reconstruct",
    "numpy.dtype",
    "numpy.ndarray",
    "pathlib.Path",
    "pathlib.PosixPath",
    "pathlib.WindowsPath",
    "types.SimpleNamespace",
    "argparse.Namespace",
}
_STAND_IN_PREFIXES = ("ultralytics.", "torch.nn.modules.")


def resolve(module: str, name: str) -> Any:
    """What ``find_class(module, name)`` returns; raises UnsafeGlobalError for anything not allowed."""
    if module == "__builtin__":  # protocol-2 pickles written by Python 2 naming
        module = "builtins"
    qualname = f"{module}.{name}"
    if qualname in _ALLOWED:
        return _ALLOWED[qualname]
    if qualname.startswith(_STAND_IN_PREFIXES) or qualname in _INERT_DATA:
        return stand_in(qualname)
    raise UnsafeGlobalError(
        f"refusing to load global {qualname!r}: not a tensor, container or known model class "
        f"(the file would run code on load)"
    )


class Unpickler(pickle.Unpickler):
    """``pickle.Unpickler`` whose ``find_class`` only resolves the allow-list above."""

    def find_class(self, module: str, name: str) -> Any:
        return resolve(module, name)


def load(file: Any, **kwargs: Any) -> Any:
    return Unpickler(file, **kwargs).load()


def loads(data: bytes, **kwargs: Any) -> Any:
    return Unpickler(io.BytesIO(data), **kwargs).load()


# torch.load reads these from its pickle_module.
Pickler = pickle.Pickler
UnpicklingError = pickle.UnpicklingError
HIGHEST_PROTOCOL = pickle.HIGHEST_PROTOCOL

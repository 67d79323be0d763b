"""The values an unpickled weights file may hold besides plain data, and the checks on them.

Error classes, the limits, the inert stand-ins (``StandIn``, dtype and storage markers, ``Storage``,
``TensorRef``, the ``AllowedGlobal`` wrapper), the small checked constructors the allowed globals call, and
``check_depth``. The security model is described in ``safe_pickle``; ``_unpickler`` builds these values.
"""

from __future__ import annotations

import collections
import pickle
from collections.abc import Callable
from typing import Any

import torch

# Limits. Real files are far below: a yolo11x release pickle is ~105k opcodes, MARK depth < 10, object
# nesting < 40; a Lightning checkpoint of it with optimiser state a few times more opcodes.
MAX_OPS = 2_000_000  # ~64 bytes of objects each at most: ~128 MB
MAX_MARK_DEPTH = 256
MAX_DEPTH = 256
MAX_DIMS = 64
MAX_GLOBALS = 2_000  # distinct names (a release names ~30); each stand-in class costs ~1 KB until GC
# Objects built by our functions are not paid for byte by byte (a 10-byte REDUCE can copy a memoised 1 MB
# string or list): they draw on this budget, estimated per object and per copied item.
ALLOC_BUDGET = 64 * 2**20
TENSOR_COST, OBJECT_COST, ITEM_COST = 512, 256, 64


class UnsafePickleError(pickle.UnpicklingError):
    """The pickle does something a weights file has no reason to do; nothing of it was executed."""


class UnsafeGlobalError(UnsafePickleError):
    """The pickle names a global outside the allow-list."""


class ModelClassError(UnsafeGlobalError):
    """The pickle holds model objects (reference classes) where only plain data was allowed."""


class StandIn:
    """Inert placeholder for a pickled object of a class we refuse to import.

    ``args`` are the constructor arguments the pickle gave (REDUCE / NEWOBJ), ``state`` what BUILD gave
    (for an ``nn.Module`` the instance ``__dict__``: ``_modules``, ``_parameters``, ``_buffers`` ...).
    Each load derives its own subclasses (one per class name), so nothing is shared between files.
    """

    qualname = "?"

    def __new__(cls, *args: Any, **kwargs: Any) -> StandIn:
        if cls is StandIn or not isinstance(cls, type) or not issubclass(cls, StandIn):
            raise UnsafePickleError("StandIn can only be created by the unpickler")
        obj = super().__new__(cls)
        obj.args = args
        obj.state = None
        return obj

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __repr__(self) -> str:
        return f"<StandIn {self.qualname}>"


class DTypeMarker:
    """A dtype named by the file (``torch.float16``): a marker, converted by our own rebuild functions."""

    __slots__ = ("dtype",)

    def __init__(self, dtype: torch.dtype) -> None:
        self.dtype = dtype

    def __repr__(self) -> str:
        return f"<dtype {self.dtype}>"


class StorageTypeMarker(DTypeMarker):
    """A storage class named by the file (``torch.HalfStorage``): only its element type matters."""

    __slots__ = ()


class Storage:
    """One storage record: ``numel`` elements of ``dtype``; ``flat`` is the 1-d tensor over its bytes, or None
    when only checking (``records`` returned no data)."""

    __slots__ = ("dtype", "flat", "key", "numel")

    def __init__(self, key: str, dtype: torch.dtype, numel: int, flat: torch.Tensor | None) -> None:
        self.key, self.dtype, self.numel, self.flat = key, dtype, numel, flat


class TensorRef:
    """A checked tensor when only checking: shape, dtype, and the storage it views (no data)."""

    __slots__ = ("dtype", "shape")

    def __init__(self, shape: tuple[int, ...], dtype: torch.dtype) -> None:
        self.shape, self.dtype = shape, dtype


class AllowedGlobal:
    """What a file gets for an allowed global: a wrapper owned by one load around our checked function.

    Not the real object, so BUILD/setattr cannot reach torch; it has no ``__dict__`` and refuses state.
    """

    __slots__ = ("_fn", "qualname")

    def __init__(self, qualname: str, fn: Callable[..., Any]) -> None:
        self.qualname, self._fn = qualname, fn

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._fn(*args, **kwargs)

    def __setstate__(self, state: Any) -> None:
        raise UnsafePickleError(f"refusing BUILD (attribute write) on global {self.qualname!r}")

    def __repr__(self) -> str:
        return f"<global {self.qualname}>"


# Records callback: (key, nbytes) -> the record's bytes (at least nbytes long) or None when only checking.
Records = Callable[[str, int], "bytearray | None"]


def checked_int(value: Any, what: str, low: int = 0) -> int:
    if type(value) is not int or value < low:
        raise UnsafePickleError(f"{what} must be an int >= {low}, got {type(value).__name__} {value!r:.40}")
    return value


def checked_ints(value: Any, what: str) -> tuple[int, ...]:
    if not isinstance(value, (tuple, list)) or len(value) > MAX_DIMS:
        raise UnsafePickleError(f"{what} must be a tuple of at most {MAX_DIMS} ints")
    return tuple(checked_int(v, what) for v in value)


def check_plain_hooks(value: Any) -> None:
    if not (value is None or (isinstance(value, dict) and not value)):
        raise UnsafePickleError("tensor backward hooks in the file are refused")


def describe(obj: Any) -> str:
    if isinstance(obj, AllowedGlobal):
        return f"global {obj.qualname!r}"
    if isinstance(obj, type) and issubclass(obj, StandIn):
        return f"class {obj.qualname!r}"
    if isinstance(obj, (DTypeMarker, Storage, TensorRef)):
        return repr(obj)
    return f"a {type(obj).__name__}"


SIZED_TYPES = (str, bytes, list, tuple, set, frozenset, dict, collections.OrderedDict)


def checked_items(items: Any, what: str) -> Any:
    if type(items) not in (list, tuple, set, frozenset):
        raise UnsafePickleError(f"{what}() from a {type(items).__name__}")
    return items


def checked_ordered_dict(items: Any = ()) -> collections.OrderedDict:
    if type(items) not in (list, tuple) or not all(type(p) is tuple and len(p) == 2 for p in items):
        raise UnsafePickleError("OrderedDict() takes a list of (key, value) pairs")
    return collections.OrderedDict(items)


def checked_encode(obj: Any, encoding: Any = "utf-8", errors: Any = "strict") -> bytes:
    """``_codecs.encode`` as protocol 2 uses it for ``bytes``: ``encode(str, "latin1")``, nothing else."""
    if type(obj) is not str or encoding not in ("latin1", "latin-1") or errors != "strict":
        raise UnsafePickleError(
            f"refusing _codecs.encode({type(obj).__name__}, {encoding!r:.20}): only (str, 'latin1') is allowed"
        )
    return obj.encode("latin1")


def checked_device(kind: Any, index: Any = None) -> torch.device:
    if type(kind) is not str or len(kind) > 32 or (index is not None and type(index) is not int):
        raise UnsafePickleError("malformed torch.device")
    return torch.device(kind) if index is None else torch.device(kind, index)


def itemsize_of(dtype: torch.dtype) -> int:
    return dtype.itemsize


def check_depth(obj: Any, limit: int = MAX_DEPTH) -> None:
    """Raise UnsafePickleError when containers in ``obj`` nest deeper than ``limit`` (iterative, no recursion)."""
    seen: set[int] = set()
    stack: list[tuple[Any, int]] = [(obj, 0)]
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            raise UnsafePickleError(f"pickled data nests deeper than {limit} levels")
        if isinstance(node, StandIn):
            children: Any = (node.args, node.state)
        elif type(node) in (dict, collections.OrderedDict):
            children = (*node.keys(), *node.values())
        elif type(node) in (list, tuple, set, frozenset):
            children = node
        else:
            continue
        if id(node) in seen:
            continue
        seen.add(id(node))
        stack.extend((child, depth + 1) for child in children)

"""A restricted unpickler: reads the pickle inside a weights file without letting the file act on the process.

A pickle is a small program: opcodes that push data, name globals (``GLOBAL``), call them (``REDUCE``,
``NEWOBJ``) and write attributes (``BUILD``). ``Unpickler`` is the pure-Python ``pickle._Unpickler`` with an
opcode table of its own, so every opcode that can reach outside the data goes through a check here.

What a file may do, and why that is enough for weights files:

* **Name a global** only from a fixed table, and what it gets is never the real object: a fresh
  ``_Global`` wrapper (owned by this load) around our own checked implementation, or a fresh inert class:

  - tensor rebuilding (``torch._utils._rebuild_tensor_v2``, ``_rebuild_parameter``): arguments are type- and
    bounds-checked (the view must lie inside its storage) and the tensor is a view of bytes we read;
  - storage types (``torch.HalfStorage`` ...) and dtypes (``torch.float16``): inert markers;
  - plain containers: ``collections.OrderedDict``, ``builtins.set``/``frozenset``, ``torch.Size``,
    ``torch.device`` (checked arguments, real instances);
  - ``_codecs.encode``: only ``(str, "latin1")``, which is how protocol 2 stores ``bytes`` (any other codec
    is refused: chains of e.g. ``hex`` double the size at each step);
  - with ``model_classes=True`` (reference ``.pt`` files, which pickle whole models): reference classes
    (``ultralytics.*``), torch module classes (``torch.nn.modules.*``) and a few data types (numpy scalars,
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
"""

from __future__ import annotations

import collections
import io
import pickle
import struct
from collections.abc import Callable
from typing import Any, ClassVar

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
_TENSOR_COST, _OBJECT_COST, _ITEM_COST = 512, 256, 64

_STORAGE_DTYPES = {
    "DoubleStorage": torch.float64,
    "FloatStorage": torch.float32,
    "HalfStorage": torch.float16,
    "BFloat16Storage": torch.bfloat16,
    "LongStorage": torch.int64,
    "IntStorage": torch.int32,
    "ShortStorage": torch.int16,
    "CharStorage": torch.int8,
    "ByteStorage": torch.uint8,
    "BoolStorage": torch.bool,
    "ComplexFloatStorage": torch.complex64,
    "ComplexDoubleStorage": torch.complex128,
    "UntypedStorage": torch.uint8,
}
_DTYPES = {f"torch.{str(d).split('.')[-1]}": d for d in _STORAGE_DTYPES.values()}
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


class _DType:
    """A dtype named by the file (``torch.float16``): a marker, converted by our own rebuild functions."""

    __slots__ = ("dtype",)

    def __init__(self, dtype: torch.dtype) -> None:
        self.dtype = dtype

    def __repr__(self) -> str:
        return f"<dtype {self.dtype}>"


class _StorageType(_DType):
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


class _Global:
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


def _int(value: Any, what: str, low: int = 0) -> int:
    if type(value) is not int or value < low:
        raise UnsafePickleError(f"{what} must be an int >= {low}, got {type(value).__name__} {value!r:.40}")
    return value


def _ints(value: Any, what: str) -> tuple[int, ...]:
    if not isinstance(value, (tuple, list)) or len(value) > MAX_DIMS:
        raise UnsafePickleError(f"{what} must be a tuple of at most {MAX_DIMS} ints")
    return tuple(_int(v, what) for v in value)


def _plain_hooks(value: Any) -> None:
    if not (value is None or (isinstance(value, dict) and not value)):
        raise UnsafePickleError("tensor backward hooks in the file are refused")


class Unpickler(pickle._Unpickler):  # type: ignore[name-defined]
    """Pure-Python unpickler whose opcodes can only build data (see the module docstring).

    ``data`` is the whole pickle in memory; ``records`` resolves storages (None: the pickle may hold none);
    ``model_classes`` allows reference/torch module classes as stand-ins; ``label`` names the file in errors.
    """

    dispatch: ClassVar[dict[int, Callable[[Unpickler], None]]] = {}

    def __init__(
        self, data: bytes, *, records: Records | None = None, model_classes: bool = False, label: str = ""
    ) -> None:
        self._data = io.BytesIO(data)
        super().__init__(self._data, encoding="utf-8")
        self._size = len(data)
        self._records = records
        self._model_classes = model_classes
        self._label = label
        self._globals: dict[str, Any] = {}
        self._storages: dict[tuple[str, torch.dtype], Storage] = {}
        self._spent = 0
        self._classes: dict[str, type[StandIn]] = {}
        self._class_ids: set[int] = set()

    # -- the main loop: our own, so opcodes are counted and unknown ones refused ---------------------
    def load(self) -> Any:
        data = self._data
        self.read, self.readline = data.read, data.readline
        self.metastack, self.stack, self.proto = [], [], 0
        self.append = self.stack.append
        dispatch = self.dispatch
        read = self.read
        ops = 0
        error: Exception | None = None
        try:
            while True:
                key = read(1)
                if not key:
                    raise EOFError("pickle data ends before STOP")
                ops += 1
                if ops > MAX_OPS:
                    raise UnsafePickleError(f"more than {MAX_OPS} pickle opcodes: not a weights file")
                handler = dispatch.get(key[0])
                if handler is None:
                    name = _OPCODE_NAMES.get(key[0], f"0x{key[0]:02x}")
                    raise UnsafePickleError(f"pickle opcode {name} is not allowed in a weights file")
                handler(self)
        except pickle._Stop as stop:  # type: ignore[attr-defined]
            value = stop.value
        except UnsafePickleError:
            raise
        except Exception as e:  # a malformed stream: stack underflow, bad memo index, wrong types ...
            error = pickle.UnpicklingError(
                f"malformed pickle near byte {data.tell()}: {type(e).__name__}: {e}"
            )
        finally:
            # Drop what the file built, in place: our wrappers hold bound methods of self (a cycle), and an
            # exception's traceback keeps the handlers' frames (and so the stacks) alive until it is freed.
            self._globals.clear()
            self._storages.clear()
            self.memo.clear()
            for pending in (self.stack, *self.metastack):
                pending.clear()
            self.metastack.clear()
        if error is not None:
            try:
                raise error
            finally:
                del error  # no frame -> exception -> traceback -> frame cycle
        check_depth(value)
        return value

    # -- globals -------------------------------------------------------------------------------------
    def find_class(self, module: str, name: str) -> Any:
        if module == "__builtin__":  # protocol-2 pickles written with Python 2 naming
            module = "builtins"
        if module == "torch.tensor":  # torch's own renaming (torch.serialization.load_module_mapping)
            module = "torch._tensor"
        qualname = f"{module}.{name}"
        if qualname in self._globals:
            return self._globals[qualname]
        value = self._resolve(qualname)
        self._globals[qualname] = value
        return value

    def _resolve(self, qualname: str) -> Any:
        functions: dict[str, Callable[..., Any]] = {
            "torch._utils._rebuild_tensor_v2": self._rebuild_tensor,
            "torch._utils._rebuild_parameter": self._rebuild_parameter,
            "collections.OrderedDict": self._copying(_ordered_dict, 2 * _ITEM_COST),
            "builtins.set": self._copying(lambda items=(): set(_items(items, "set")), _ITEM_COST),
            "builtins.frozenset": self._copying(
                lambda items=(): frozenset(_items(items, "frozenset")), _ITEM_COST
            ),
            "_codecs.encode": self._copying(_encode, 1),
            "torch.Size": lambda dims=(): torch.Size(_ints(dims, "torch.Size")),
            "torch.device": _device,
        }
        if len(self._globals) >= MAX_GLOBALS:
            raise UnsafePickleError(f"more than {MAX_GLOBALS} distinct globals: not a weights file")
        if qualname in functions:
            return _Global(qualname, functions[qualname])
        module, _, name = qualname.rpartition(".")
        if module in ("torch", "torch.cuda") and name in _STORAGE_DTYPES:
            return _StorageType(_STORAGE_DTYPES[name])
        if qualname in _DTYPES:
            return _DType(_DTYPES[qualname])
        if qualname.startswith(_STAND_IN_PREFIXES) or qualname in _INERT_DATA:
            if not self._model_classes:
                raise ModelClassError(
                    f"refusing to load global {qualname!r}: this file type holds plain data and tensors only"
                )
            return self._stand_in(qualname)
        raise UnsafeGlobalError(
            f"refusing to load global {qualname!r}: not a tensor, container or known model class "
            f"(the file would run code on load)"
        )

    def _stand_in(self, qualname: str) -> type[StandIn]:
        cls = type(f"StandIn[{qualname}]", (StandIn,), {"qualname": qualname})
        self._classes[qualname] = cls
        self._class_ids.add(id(cls))
        return cls

    def _charge(self, nbytes: int) -> None:
        """Count ``nbytes`` of objects built for the file against ``ALLOC_BUDGET``."""
        self._spent += nbytes
        if self._spent > ALLOC_BUDGET:
            raise UnsafePickleError(
                f"the file builds more than {ALLOC_BUDGET >> 20} MB of objects: not a weights file"
            )

    def _copying(self, fn: Callable[..., Any], per_item: int) -> Callable[..., Any]:
        """``fn`` charged ``per_item`` bytes per element of its first argument (which it copies)."""

        def call(*args: Any) -> Any:
            first = args[0] if args else ()
            self._charge(_OBJECT_COST + per_item * (len(first) if type(first) in _SIZED else 0))
            return fn(*args)

        return call

    def _is_stand_in_class(self, obj: Any) -> bool:
        return isinstance(obj, type) and id(obj) in self._class_ids

    # -- storages and tensors ------------------------------------------------------------------------
    def persistent_load(self, pid: Any) -> Storage:
        if self._records is None:
            raise UnsafePickleError("the pickle refers to tensor storages, which this file type has none of")
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
            raise UnsafePickleError(f"unsupported persistent id {pid!r:.80}")
        _, storage_type, key, _location, numel = pid
        if not isinstance(storage_type, _StorageType) or not isinstance(key, str) or len(key) > 64:
            raise UnsafePickleError(f"malformed storage reference {pid!r:.80}")
        numel = _int(numel, f"storage {key!r} size")
        dtype = storage_type.dtype
        cached = self._storages.get((key, dtype))
        if cached is not None:
            return cached
        nbytes = numel * _itemsize(dtype)
        data = self._records(key, nbytes)  # checks nbytes against the record (and the file) before reading
        flat = None
        if data is not None and nbytes:
            flat = torch.frombuffer(data, dtype=torch.uint8, count=nbytes).view(dtype)
        elif data is not None:
            flat = torch.empty(0, dtype=dtype)
        storage = Storage(key, dtype, numel, flat)
        self._storages[(key, dtype)] = storage
        return storage

    def _rebuild_tensor(
        self,
        storage: Any,
        offset: Any,
        size: Any,
        stride: Any,
        requires_grad: Any = False,
        backward_hooks: Any = None,
        metadata: Any = None,
    ) -> torch.Tensor | TensorRef:
        if not isinstance(storage, Storage):
            raise UnsafePickleError("tensor rebuild without a storage from this file")
        offset = _int(offset, "tensor storage offset")
        size, stride = _ints(size, "tensor size"), _ints(stride, "tensor stride")
        if len(size) != len(stride):
            raise UnsafePickleError(f"tensor size {size} and stride {stride} differ in length")
        if type(requires_grad) is not bool:
            raise UnsafePickleError("tensor requires_grad must be a bool")
        _plain_hooks(backward_hooks)
        if metadata not in (None, {}):
            raise UnsafePickleError("tensor metadata in the file is refused")
        numel = 1
        for s in size:
            numel *= s
        if numel:
            last = offset + sum((s - 1) * st for s, st in zip(size, stride))
            if last >= storage.numel:
                raise UnsafePickleError(
                    f"tensor of size {size} (stride {stride}, offset {offset}) reaches past its storage "
                    f"{storage.key!r} of {storage.numel} elements"
                )
        self._charge(_TENSOR_COST)
        if storage.flat is None:
            return TensorRef(size, storage.dtype)
        if not numel:
            return torch.empty(size, dtype=storage.dtype)
        return storage.flat.as_strided(size, stride, offset)

    def _rebuild_parameter(
        self, data: Any, requires_grad: Any = True, backward_hooks: Any = None
    ) -> torch.Tensor | TensorRef:
        if type(requires_grad) is not bool:
            raise UnsafePickleError("parameter requires_grad must be a bool")
        _plain_hooks(backward_hooks)
        if isinstance(data, TensorRef):
            return data
        if type(data) is not torch.Tensor:
            raise UnsafePickleError(f"parameter data is a {type(data).__name__}, not a tensor")
        return torch.nn.Parameter(data, requires_grad=requires_grad and data.is_floating_point())

    # -- opcodes that call or write ------------------------------------------------------------------
    def load_reduce(self) -> None:
        stack = self.stack
        args = stack.pop()
        func = stack[-1]
        if type(args) is not tuple:
            raise UnsafePickleError("REDUCE arguments must be a tuple")
        ours = isinstance(func, _Global) and self._globals.get(func.qualname) is func
        if ours or self._is_stand_in_class(func):
            self._charge(_OBJECT_COST + 8 * len(args))
            stack[-1] = func(*args)
        else:
            raise UnsafePickleError(f"refusing to call {_describe(func)} (REDUCE)")

    def load_newobj(self) -> None:
        args = self.stack.pop()
        cls = self.stack.pop()
        if not self._is_stand_in_class(cls) or type(args) is not tuple:
            raise UnsafePickleError(f"refusing to create an object of {_describe(cls)} (NEWOBJ)")
        self._charge(_OBJECT_COST + 8 * len(args))
        self.append(cls.__new__(cls, *args))

    def load_newobj_ex(self) -> None:
        kwargs = self.stack.pop()
        args = self.stack.pop()
        cls = self.stack.pop()
        if not self._is_stand_in_class(cls) or type(args) is not tuple or type(kwargs) is not dict:
            raise UnsafePickleError(f"refusing to create an object of {_describe(cls)} (NEWOBJ_EX)")
        self._charge(_OBJECT_COST + 8 * (len(args) + len(kwargs)))
        self.append(cls.__new__(cls, *args, **kwargs))

    def load_build(self) -> None:
        state = self.stack.pop()
        inst = self.stack[-1]
        if isinstance(inst, StandIn) and id(type(inst)) in self._class_ids:
            inst.state = state  # data only, never applied as attributes
        elif type(inst) is collections.OrderedDict:
            # torch state dicts: BUILD sets `_metadata` (per-module versions); nothing else is accepted.
            if not (isinstance(state, dict) and set(state) <= {"_metadata"}):
                raise UnsafePickleError("refusing BUILD on an OrderedDict with state other than _metadata")
            meta = state.get("_metadata")
            if meta is not None and type(meta) not in (dict, collections.OrderedDict):
                raise UnsafePickleError("OrderedDict _metadata must be a dict")
            inst._metadata = meta
        else:
            raise UnsafePickleError(f"refusing BUILD (attribute write) on {_describe(inst)}")

    def load_mark(self) -> None:
        if len(self.metastack) >= MAX_MARK_DEPTH:
            raise UnsafePickleError(f"pickle MARKs nested deeper than {MAX_MARK_DEPTH}")
        self.metastack.append(self.stack)
        self.stack = []
        self.append = self.stack.append

    def load_append(self) -> None:
        value = self.stack.pop()
        target = self.stack[-1]
        if type(target) is not list:
            raise UnsafePickleError(f"APPEND to {_describe(target)}")
        target.append(value)

    def load_appends(self) -> None:
        items = self.pop_mark()
        target = self.stack[-1]
        if type(target) is not list:
            raise UnsafePickleError(f"APPENDS to {_describe(target)}")
        target.extend(items)

    def load_setitem(self) -> None:
        value = self.stack.pop()
        key = self.stack.pop()
        target = self.stack[-1]
        if type(target) not in (dict, collections.OrderedDict):
            raise UnsafePickleError(f"SETITEM on {_describe(target)}")
        target[key] = value

    def load_setitems(self) -> None:
        items = self.pop_mark()
        target = self.stack[-1]
        if type(target) not in (dict, collections.OrderedDict) or len(items) % 2:
            raise UnsafePickleError(f"SETITEMS on {_describe(target)}")
        for i in range(0, len(items), 2):
            target[items[i]] = items[i + 1]

    def load_additems(self) -> None:
        items = self.pop_mark()
        target = self.stack[-1]
        if type(target) is not set:
            raise UnsafePickleError(f"ADDITEMS on {_describe(target)}")
        target.update(items)

    # -- opcodes with a length the file claims: checked against the bytes left -----------------------
    def _counted(self, size_format: str) -> bytes:
        (n,) = struct.unpack(size_format, self.read(struct.calcsize(size_format)))
        left = self._size - self._data.tell()
        if n < 0 or n > left:
            raise UnsafePickleError(
                f"pickle claims {n} bytes at byte {self._data.tell()}, only {left} follow"
            )
        return self.read(n)

    def load_binbytes(self) -> None:
        self.append(self._counted("<I"))

    def load_binbytes8(self) -> None:
        self.append(self._counted("<Q"))

    def load_short_binbytes(self) -> None:
        self.append(self._counted("<B"))

    def load_bytearray8(self) -> None:
        self.append(bytearray(self._counted("<Q")))

    def load_binunicode(self) -> None:
        self.append(str(self._counted("<I"), "utf-8", "surrogatepass"))

    def load_binunicode8(self) -> None:
        self.append(str(self._counted("<Q"), "utf-8", "surrogatepass"))

    def load_short_binunicode(self) -> None:
        self.append(str(self._counted("<B"), "utf-8", "surrogatepass"))

    def load_binstring(self) -> None:
        self.append(self._decode_string(self._counted("<i")))

    def load_short_binstring(self) -> None:
        self.append(self._decode_string(self._counted("<B")))

    def load_long4(self) -> None:
        self.append(pickle.decode_long(self._counted("<i")))

    def load_frame(self) -> None:
        # The whole stream is in memory: a frame is only a read-ahead hint, so its size is skipped.
        if len(self.read(8)) != 8:
            raise pickle.UnpicklingError("truncated FRAME")


def _describe(obj: Any) -> str:
    if isinstance(obj, _Global):
        return f"global {obj.qualname!r}"
    if isinstance(obj, type) and issubclass(obj, StandIn):
        return f"class {obj.qualname!r}"
    if isinstance(obj, (_DType, Storage, TensorRef)):
        return repr(obj)
    return f"a {type(obj).__name__}"


_SIZED = (str, bytes, list, tuple, set, frozenset, dict, collections.OrderedDict)


def _items(items: Any, what: str) -> Any:
    if type(items) not in (list, tuple, set, frozenset):
        raise UnsafePickleError(f"{what}() from a {type(items).__name__}")
    return items


def _ordered_dict(items: Any = ()) -> collections.OrderedDict:
    if type(items) not in (list, tuple) or not all(type(p) is tuple and len(p) == 2 for p in items):
        raise UnsafePickleError("OrderedDict() takes a list of (key, value) pairs")
    return collections.OrderedDict(items)


def _encode(obj: Any, encoding: Any = "utf-8", errors: Any = "strict") -> bytes:
    """``_codecs.encode`` as protocol 2 uses it for ``bytes``: ``encode(str, "latin1")``, nothing else."""
    if type(obj) is not str or encoding not in ("latin1", "latin-1") or errors != "strict":
        raise UnsafePickleError(
            f"refusing _codecs.encode({type(obj).__name__}, {encoding!r:.20}): only (str, 'latin1') is allowed"
        )
    return obj.encode("latin1")


def _device(kind: Any, index: Any = None) -> torch.device:
    if type(kind) is not str or len(kind) > 32 or (index is not None and type(index) is not int):
        raise UnsafePickleError("malformed torch.device")
    return torch.device(kind) if index is None else torch.device(kind, index)


def _itemsize(dtype: torch.dtype) -> int:
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


def loads(data: bytes, **kwargs: Any) -> Any:
    """Unpickle ``data`` (see ``Unpickler`` for the keyword arguments)."""
    return Unpickler(data, **kwargs).load()


def _build_dispatch() -> dict[int, Callable[[Unpickler], None]]:
    base = pickle._Unpickler.dispatch  # type: ignore[attr-defined]
    data_only = [
        "PROTO",
        "STOP",
        "POP",
        "POP_MARK",
        "DUP",
        "NONE",
        "NEWTRUE",
        "NEWFALSE",
        "INT",
        "BININT",
        "BININT1",
        "BININT2",
        "LONG",
        "LONG1",
        "FLOAT",
        "BINFLOAT",
        "STRING",
        "UNICODE",
        "EMPTY_TUPLE",
        "TUPLE",
        "TUPLE1",
        "TUPLE2",
        "TUPLE3",
        "EMPTY_LIST",
        "LIST",
        "EMPTY_DICT",
        "DICT",
        "EMPTY_SET",
        "FROZENSET",
        "GET",
        "BINGET",
        "LONG_BINGET",
        "PUT",
        "BINPUT",
        "LONG_BINPUT",
        "MEMOIZE",
        "GLOBAL",
        "STACK_GLOBAL",
        "PERSID",
        "BINPERSID",
    ]
    table = {getattr(pickle, name)[0]: base[getattr(pickle, name)[0]] for name in data_only}
    ours = {
        "REDUCE": Unpickler.load_reduce,
        "NEWOBJ": Unpickler.load_newobj,
        "NEWOBJ_EX": Unpickler.load_newobj_ex,
        "BUILD": Unpickler.load_build,
        "MARK": Unpickler.load_mark,
        "APPEND": Unpickler.load_append,
        "APPENDS": Unpickler.load_appends,
        "SETITEM": Unpickler.load_setitem,
        "SETITEMS": Unpickler.load_setitems,
        "ADDITEMS": Unpickler.load_additems,
        "BINBYTES": Unpickler.load_binbytes,
        "BINBYTES8": Unpickler.load_binbytes8,
        "SHORT_BINBYTES": Unpickler.load_short_binbytes,
        "BYTEARRAY8": Unpickler.load_bytearray8,
        "BINUNICODE": Unpickler.load_binunicode,
        "BINUNICODE8": Unpickler.load_binunicode8,
        "SHORT_BINUNICODE": Unpickler.load_short_binunicode,
        "BINSTRING": Unpickler.load_binstring,
        "SHORT_BINSTRING": Unpickler.load_short_binstring,
        "LONG4": Unpickler.load_long4,
        "FRAME": Unpickler.load_frame,
    }
    table.update({getattr(pickle, name)[0]: fn for name, fn in ours.items()})
    return table


Unpickler.dispatch = _build_dispatch()
_OPCODE_NAMES = {
    getattr(pickle, n)[0]: n
    for n in dir(pickle)
    if n.isupper() and isinstance(getattr(pickle, n), bytes) and len(getattr(pickle, n)) == 1
}

"""The restricted ``Unpickler``: its main loop (counted opcodes), its opcode table, the allow-list of globals,
storages and tensors; the opcodes that call or write (``REDUCE``, ``NEWOBJ``, ``BUILD``) and those that fill
containers or read a length the file claims (``DataOpcodes``).

What it allows and why is described in ``safe_pickle``, its public face.
"""

from __future__ import annotations

import collections
import io
import pickle
import struct
from collections.abc import Callable
from typing import Any, ClassVar

import torch

from yolo11_lightning.model_files._pickle_values import (
    ALLOC_BUDGET,
    ITEM_COST,
    MAX_GLOBALS,
    MAX_MARK_DEPTH,
    MAX_OPS,
    OBJECT_COST,
    SIZED_TYPES,
    TENSOR_COST,
    AllowedGlobal,
    DTypeMarker,
    ModelClassError,
    Records,
    StandIn,
    Storage,
    StorageTypeMarker,
    TensorRef,
    UnsafeGlobalError,
    UnsafePickleError,
    check_depth,
    check_plain_hooks,
    checked_device,
    checked_encode,
    checked_int,
    checked_ints,
    checked_items,
    checked_ordered_dict,
    describe,
    itemsize_of,
)


class DataOpcodes(pickle._Unpickler):  # type: ignore[name-defined]
    """The container and length-claiming opcodes of ``Unpickler`` (needs its ``_data`` and ``_size``)."""

    _data: io.BytesIO
    _size: int

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
            raise UnsafePickleError(f"APPEND to {describe(target)}")
        target.append(value)

    def load_appends(self) -> None:
        items = self.pop_mark()
        target = self.stack[-1]
        if type(target) is not list:
            raise UnsafePickleError(f"APPENDS to {describe(target)}")
        target.extend(items)

    def load_setitem(self) -> None:
        value = self.stack.pop()
        key = self.stack.pop()
        target = self.stack[-1]
        if type(target) not in (dict, collections.OrderedDict):
            raise UnsafePickleError(f"SETITEM on {describe(target)}")
        target[key] = value

    def load_setitems(self) -> None:
        items = self.pop_mark()
        target = self.stack[-1]
        if type(target) not in (dict, collections.OrderedDict) or len(items) % 2:
            raise UnsafePickleError(f"SETITEMS on {describe(target)}")
        for i in range(0, len(items), 2):
            target[items[i]] = items[i + 1]

    def load_additems(self) -> None:
        items = self.pop_mark()
        target = self.stack[-1]
        if type(target) is not set:
            raise UnsafePickleError(f"ADDITEMS on {describe(target)}")
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


def build_dispatch(cls: type[Unpickler]) -> dict[int, Callable[[Unpickler], None]]:
    """The opcode table of ``cls``: byte -> handler; an opcode not in it is refused."""
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
        "REDUCE": cls.load_reduce,
        "NEWOBJ": cls.load_newobj,
        "NEWOBJ_EX": cls.load_newobj_ex,
        "BUILD": cls.load_build,
        "MARK": cls.load_mark,
        "APPEND": cls.load_append,
        "APPENDS": cls.load_appends,
        "SETITEM": cls.load_setitem,
        "SETITEMS": cls.load_setitems,
        "ADDITEMS": cls.load_additems,
        "BINBYTES": cls.load_binbytes,
        "BINBYTES8": cls.load_binbytes8,
        "SHORT_BINBYTES": cls.load_short_binbytes,
        "BYTEARRAY8": cls.load_bytearray8,
        "BINUNICODE": cls.load_binunicode,
        "BINUNICODE8": cls.load_binunicode8,
        "SHORT_BINUNICODE": cls.load_short_binunicode,
        "BINSTRING": cls.load_binstring,
        "SHORT_BINSTRING": cls.load_short_binstring,
        "LONG4": cls.load_long4,
        "FRAME": cls.load_frame,
    }
    table.update({getattr(pickle, name)[0]: fn for name, fn in ours.items()})
    return table


OPCODE_NAMES = {
    getattr(pickle, n)[0]: n
    for n in dir(pickle)
    if n.isupper() and isinstance(getattr(pickle, n), bytes) and len(getattr(pickle, n)) == 1
}


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
# Reference classes, torch modules, and torchvision's transforms (a classifier the reference trained keeps its
# preprocessing, ``model.transforms``, in the file): stand-ins, never the real classes.
_STAND_IN_PREFIXES = ("ultralytics.", "torch.nn.modules.", "torchvision.transforms.")


class Unpickler(DataOpcodes):
    """Pure-Python unpickler whose opcodes can only build data (see ``safe_pickle``'s docstring).

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
                    name = OPCODE_NAMES.get(key[0], f"0x{key[0]:02x}")
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
            "collections.OrderedDict": self._copying(checked_ordered_dict, 2 * ITEM_COST),
            "builtins.set": self._copying(lambda items=(): set(checked_items(items, "set")), ITEM_COST),
            "builtins.frozenset": self._copying(
                lambda items=(): frozenset(checked_items(items, "frozenset")), ITEM_COST
            ),
            "_codecs.encode": self._copying(checked_encode, 1),
            "torch.Size": lambda dims=(): torch.Size(checked_ints(dims, "torch.Size")),
            "torch.device": checked_device,
        }
        if len(self._globals) >= MAX_GLOBALS:
            raise UnsafePickleError(f"more than {MAX_GLOBALS} distinct globals: not a weights file")
        if qualname in functions:
            return AllowedGlobal(qualname, functions[qualname])
        module, _, name = qualname.rpartition(".")
        if module in ("torch", "torch.cuda") and name in _STORAGE_DTYPES:
            return StorageTypeMarker(_STORAGE_DTYPES[name])
        if qualname in _DTYPES:
            return DTypeMarker(_DTYPES[qualname])
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
            self._charge(OBJECT_COST + per_item * (len(first) if type(first) in SIZED_TYPES else 0))
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
        if not isinstance(storage_type, StorageTypeMarker) or not isinstance(key, str) or len(key) > 64:
            raise UnsafePickleError(f"malformed storage reference {pid!r:.80}")
        numel = checked_int(numel, f"storage {key!r} size")
        dtype = storage_type.dtype
        cached = self._storages.get((key, dtype))
        if cached is not None:
            return cached
        nbytes = numel * itemsize_of(dtype)
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
        offset = checked_int(offset, "tensor storage offset")
        size, stride = checked_ints(size, "tensor size"), checked_ints(stride, "tensor stride")
        if len(size) != len(stride):
            raise UnsafePickleError(f"tensor size {size} and stride {stride} differ in length")
        if type(requires_grad) is not bool:
            raise UnsafePickleError("tensor requires_grad must be a bool")
        check_plain_hooks(backward_hooks)
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
        self._charge(TENSOR_COST)
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
        check_plain_hooks(backward_hooks)
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
        ours = isinstance(func, AllowedGlobal) and self._globals.get(func.qualname) is func
        if ours or self._is_stand_in_class(func):
            self._charge(OBJECT_COST + 8 * len(args))
            stack[-1] = func(*args)
        else:
            raise UnsafePickleError(f"refusing to call {describe(func)} (REDUCE)")

    def load_newobj(self) -> None:
        args = self.stack.pop()
        cls = self.stack.pop()
        if not self._is_stand_in_class(cls) or type(args) is not tuple:
            raise UnsafePickleError(f"refusing to create an object of {describe(cls)} (NEWOBJ)")
        self._charge(OBJECT_COST + 8 * len(args))
        self.append(cls.__new__(cls, *args))

    def load_newobj_ex(self) -> None:
        kwargs = self.stack.pop()
        args = self.stack.pop()
        cls = self.stack.pop()
        if not self._is_stand_in_class(cls) or type(args) is not tuple or type(kwargs) is not dict:
            raise UnsafePickleError(f"refusing to create an object of {describe(cls)} (NEWOBJ_EX)")
        self._charge(OBJECT_COST + 8 * (len(args) + len(kwargs)))
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
            raise UnsafePickleError(f"refusing BUILD (attribute write) on {describe(inst)}")


Unpickler.dispatch = build_dispatch(Unpickler)

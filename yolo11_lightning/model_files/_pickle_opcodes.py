"""The opcodes of the restricted unpickler that fill containers or read a length the file claims, and its
opcode table: which of ``pickle._Unpickler``'s opcodes are kept as they are (data only) and which are ours.

The rest of the unpickler (globals, calls, attribute writes, storages) is in ``unpickler``.
"""

from __future__ import annotations

import collections
import io
import pickle
import struct
from collections.abc import Callable
from typing import TYPE_CHECKING

from yolo11_lightning.model_files._pickle_values import MAX_MARK_DEPTH, UnsafePickleError, _describe

if TYPE_CHECKING:
    from yolo11_lightning.model_files._unpickler import Unpickler


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

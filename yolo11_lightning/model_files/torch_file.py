"""Opening a torch file a user passes in (weights, checkpoints, reference releases) behind one guard.

Every loader of the package goes through here: ``load`` for our own files (Lightning ``.ckpt``, exported
weights), ``load_reference`` for reference ``.pt`` releases (pickled model objects).

The guard, before anything is unpickled or allocated:

* the file must be a zip archive as ``torch.save`` writes it: every entry stored uncompressed (so no entry
  can claim more bytes than the file has), inside the file, one ``<prefix>/data.pkl`` of at most
  ``MAX_PICKLE_BYTES``, little-endian storages;
* its pickle is run through ``safe_pickle.Unpickler`` (see there for what it allows), with each storage's
  claimed size checked against its record.

``load`` then hands the same open file to torch's own ``weights_only=True`` loader (only after our check:
torch's loader by itself accepts any codec and trusts storage sizes); ``load_reference`` keeps the result of
our unpickler, whose storages it reads itself. Neither runs code from the file.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import struct
import zipfile
from collections.abc import Callable, Iterator
from typing import IO, Any, NoReturn

import torch

from yolo11_lightning.errors import UserInputError
from yolo11_lightning.model_files import safe_pickle

MAX_PICKLE_BYTES = 64 * 2**20  # the pickle of a file, not its tensors: a yolo11x release has 0.25 MB
_LEGACY_MAGIC = 0x1950A86A20F9469CFC6C  # first object of a pre-1.6 (non-zip) torch file


class CheckpointError(UserInputError):
    """A file or state dict that is not a readable (or not a safe) checkpoint; the message names the file."""


class ModelObjectsError(CheckpointError):
    """The file pickles model objects (a reference ``.pt``) where plain tensors and containers were expected."""


def load(source: str | os.PathLike | IO[bytes], map_location: Any = "cpu", label: str | None = None) -> Any:
    """A checked ``torch.load(source, weights_only=True)``; raises CheckpointError naming the file."""
    with _opened(source, label) as (f, name):
        archive = _Archive(f, name)
        try:
            archive.unpickle(model_classes=False, read_data=False)
        except safe_pickle.ModelClassError as e:
            error: CheckpointError = ModelObjectsError(
                f"{name}: holds pickled model objects (a reference .pt file?), not plain tensors ({e})"
            )
        else:
            f.seek(0)
            try:
                return torch.load(f, map_location=map_location, weights_only=True)
            except Exception as e:
                error = CheckpointError(f"{name}: not a readable torch checkpoint: {type(e).__name__}: {e}")
        _raise(error)


def check(source: str | os.PathLike | IO[bytes], label: str | None = None) -> None:
    """The checks of ``load`` without loading anything: raises CheckpointError naming the file.

    For readers that then map the file (``torch.load(path, mmap=True, weights_only=True)``) to read a few
    entries of a large checkpoint without holding its tensors in memory.
    """
    with _opened(source, label) as (f, name):
        try:
            _Archive(f, name).unpickle(model_classes=False, read_data=False)
        except safe_pickle.ModelClassError as e:
            _raise(
                ModelObjectsError(
                    f"{name}: holds pickled model objects (a reference .pt file?), not plain tensors ({e})"
                )
            )


def peek(source: str | os.PathLike | IO[bytes], label: str | None = None) -> Any:
    """What a file holds without its tensor data: the checks of ``load``, then the object with tensors as
    ``safe_pickle.TensorRef`` (shape and dtype) and model classes as ``StandIn`` trees. Reads only the pickle
    (a quarter MB for a yolo11x release): what a file is (its format, task) before anything loads it."""
    with _opened(source, label) as (f, name):
        return _Archive(f, name).unpickle(model_classes=True, read_data=False)


def load_reference(source: str | os.PathLike | IO[bytes], label: str | None = None) -> Any:
    """The object a reference ``.pt`` holds, model classes as ``safe_pickle.StandIn`` trees, tensors real."""
    with _opened(source, label) as (f, name):
        return _Archive(f, name).unpickle(model_classes=True, read_data=True)


def _raise(error: Exception) -> NoReturn:
    """Raise ``error`` outside the ``except`` block that made it: no chained context, and no frame holding
    the exception (a cycle that would keep the failed load's objects alive until the next GC)."""
    try:
        raise error
    finally:
        del error


@contextlib.contextmanager
def _opened(source: str | os.PathLike | IO[bytes], label: str | None) -> Iterator[tuple[IO[bytes], str]]:
    """(binary file, label) for an open file, or for a path opened (and closed) here."""
    if hasattr(source, "read"):
        yield source, label or str(getattr(source, "name", "<file>"))
        return
    path = os.fspath(source)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"checkpoint file not found: {path}")
    with open(path, "rb") as f:
        yield f, label or path


class _Archive:
    """The checked structure of a torch zip file: where the pickle and each storage record are."""

    def __init__(self, f: IO[bytes], label: str) -> None:
        self.f, self.label = f, label
        f.seek(0, os.SEEK_END)
        self.size = f.tell()
        f.seek(0)
        if not zipfile.is_zipfile(f):
            self._not_a_zip()
        f.seek(0)
        try:
            infos = zipfile.ZipFile(f).infolist()
        except (zipfile.BadZipFile, OSError, ValueError, EOFError) as e:
            raise self._corrupt(f"unreadable zip archive ({e})") from None
        for info in infos:
            if info.compress_type != zipfile.ZIP_STORED or info.flag_bits & 0x1:
                raise self._refused(
                    f"zip entry {info.filename!r} is compressed or encrypted (torch.save stores)"
                )
            if info.file_size != info.compress_size or info.header_offset + info.file_size > self.size:
                raise self._refused(
                    f"zip entry {info.filename!r} claims {info.file_size} bytes beyond the file's {self.size}"
                )
        self.entries = {info.filename: info for info in infos}
        pickles = [n for n in self.entries if n.endswith("/data.pkl") and n.count("/") == 1]
        if len(pickles) != 1:
            raise self._corrupt("zip archive without exactly one <name>/data.pkl: not written by torch.save")
        self.prefix = pickles[0][: -len("data.pkl")]
        order = self.entries.get(f"{self.prefix}byteorder")
        if order is not None and self._read(order, order.file_size) not in (b"little",):
            raise self._refused("big-endian storages are not supported")
        info = self.entries[pickles[0]]
        if info.file_size > MAX_PICKLE_BYTES:
            raise self._refused(f"its pickle is {info.file_size} bytes, more than {MAX_PICKLE_BYTES}")
        self.pickle = bytes(self._read(info, info.file_size))

    def unpickle(self, model_classes: bool, read_data: bool) -> Any:
        """Run the pickle through ``safe_pickle``; storages are read (``read_data``) or only size-checked."""
        return self._unpickle(self.pickle, self._records(read_data), model_classes)

    def _unpickle(self, data: bytes, records: safe_pickle.Records | None, model_classes: bool) -> Any:
        try:
            return safe_pickle.loads(data, records=records, model_classes=model_classes, label=self.label)
        except safe_pickle.ModelClassError:
            raise
        except safe_pickle.UnsafePickleError as e:
            error = self._refused(str(e))
        except (pickle.UnpicklingError, EOFError, MemoryError, OSError) as e:
            error = self._corrupt(f"{type(e).__name__}: {e}")
        _raise(error)

    def _records(self, read_data: bool) -> Callable[[str, int], bytearray | None]:
        def record(key: str, nbytes: int) -> bytearray | None:
            info = self.entries.get(f"{self.prefix}data/{key}")
            if info is None:
                raise safe_pickle.UnsafePickleError(f"storage {key!r} has no record in the archive")
            if nbytes > info.file_size:
                raise safe_pickle.UnsafePickleError(
                    f"storage {key!r} claims {nbytes} bytes, its record holds {info.file_size}"
                )
            return self._read(info, nbytes) if read_data else None

        return record

    def _read(self, info: zipfile.ZipInfo, nbytes: int) -> bytearray:
        """The first ``nbytes`` of a stored entry, read straight from the file (sizes checked in __init__)."""
        self.f.seek(info.header_offset)
        header = self.f.read(30)
        if len(header) != 30 or header[:4] != b"PK\x03\x04":
            raise self._corrupt(f"zip entry {info.filename!r} has no local header")
        name_len, extra_len = struct.unpack("<HH", header[26:30])
        start = info.header_offset + 30 + name_len + extra_len
        if start + nbytes > self.size:
            raise self._refused(f"zip entry {info.filename!r} reaches past the end of the file")
        self.f.seek(start)
        buffer = bytearray(nbytes)
        if self.f.readinto(buffer) != nbytes:
            raise self._corrupt(f"zip entry {info.filename!r} is truncated")
        return buffer

    def _not_a_zip(self) -> None:
        head = self.f.read(4)
        if head[:2] == b"PK":
            raise self._corrupt("zip archive without its central directory")
        if self.size > MAX_PICKLE_BYTES:
            raise self._corrupt("not a zip archive written by torch.save")
        self.f.seek(0)
        first = self._unpickle(self.f.read(), None, model_classes=True)
        if first == _LEGACY_MAGIC:
            raise self._corrupt(
                "legacy torch format (torch < 1.6): load and save it again with a current torch"
            )
        raise self._corrupt(
            f"a plain pickle of a {type(first).__name__}, not a zip archive written by torch.save"
        )

    def _refused(self, reason: str) -> CheckpointError:
        return CheckpointError(f"{self.label}: refused, nothing from the file was run: {reason}")

    def _corrupt(self, reason: str) -> CheckpointError:
        return CheckpointError(
            f"{self.label}: not a readable torch checkpoint (truncated or corrupt?): {reason}"
        )

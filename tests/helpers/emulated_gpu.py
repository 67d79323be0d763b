"""An accelerator that is not the CPU, on a machine without one: the ``emu`` device.

CPU tests cannot see the defects that only show on a GPU: a host tensor handed to an NCCL collective, a
CPU tensor mixed with device tensors, a ``.item()`` that stalls the host every step. This module gives
the tests a device with a GPU's rules, backed by the CPU:

* ``emu`` tensors (PyTorch's PrivateUse1 device, renamed) hold a CPU tensor and run every op on it. As on
  CUDA, an op that mixes them with CPU tensors fails ("Expected all tensors to be on the same device"),
  except the 0-dim CPU scalars CUDA accepts in element-wise ops and CPU index tensors.
* Host syncs are recorded as CUDA's sync debug mode sees them: reading a value (``item``, ``bool``,
  ``tolist``), a blocking copy between host and device, and ops whose output size depends on the data
  (``nonzero``, boolean masks, ``unique``, ``repeat_interleave`` without ``output_size``). ``host_syncs``
  is the log; ``sync_mode("error")`` makes each one raise instead, as ``torch.cuda.set_sync_debug_mode``.
* The process-group backend ``emu`` serves ``emu`` tensors only, as NCCL serves CUDA tensors: a CPU tensor
  in a collective fails with NCCL's "No backend type associated with device type cpu". It runs gloo
  underneath and records every collective it is asked for (``collectives``), DDP's gradient buckets
  included.
* ``EmuAccelerator``: the device for Lightning, ``Trainer(accelerator=EmuAccelerator(), strategy=
  EmuDDPStrategy())`` (Lightning's ``DDPStrategy`` with the ``emu`` backend).

Importing the module sets the device up (once per process; Lightning's DDP launcher re-runs the script
that imports it in every rank).
"""

from __future__ import annotations

import threading
import traceback
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from lightning.pytorch.accelerators import Accelerator
from lightning.pytorch.strategies import DDPStrategy
from torch.utils._python_dispatch import return_and_correct_aliasing
from torch.utils._pytree import tree_flatten, tree_map

DEVICE = "emu"
DEVICE_COUNT = 8

# Ops whose result size depends on the data: a GPU must copy a count to the host before it can go on.
_DATA_DEPENDENT = {
    "nonzero", "masked_select", "unique", "_unique", "_unique2", "unique_dim", "unique_consecutive",
    "equal", "is_nonzero", "_local_scalar_dense",
}  # fmt: skip
# Ops that may take CPU index tensors beside device tensors (CUDA moves the indices itself).
_INDEX_OPS = {"index", "index_put", "index_put_", "_index_put_impl_", "index_select", "gather", "take"}


class HostSyncError(RuntimeError):
    """A host sync on the emu device while ``sync_mode("error")`` is on."""


class _Log:
    """What the device and the process group saw, per process."""

    def __init__(self) -> None:
        self.mode = "count"  # "count": record; "error": raise on a host sync; "off": neither
        self.host_syncs: list[tuple[str, str]] = []  # (what, where)
        self.collectives: list[tuple[str, int, str]] = []  # (op, elements, where)
        self.lock = threading.Lock()


LOG = _Log()


def _site() -> str:
    """The innermost frame of this project or Lightning that led here (file:line function)."""
    frames = traceback.extract_stack()[:-2]
    keep = [f for f in frames if "yolo11_lightning" in f.filename or "/lightning/" in f.filename]
    keep = [f for f in keep if "emulated_gpu" not in f.filename]
    if not keep:
        keep = [f for f in frames if "emulated_gpu" not in f.filename] or frames
    frame = keep[-1]
    path = frame.filename
    for marker in ("site-packages/", "yolo11_lightning/"):
        if marker in path:
            path = (
                path.split(marker, 1)[1]
                if marker == "site-packages/"
                else "yolo11_lightning/" + path.split(marker, 1)[1]
            )
            break
    return f"{path}:{frame.lineno} {frame.name}"


def _host_sync(what: str) -> None:
    if LOG.mode == "off":
        return
    if LOG.mode == "error":
        raise HostSyncError(f"host sync on the emu device: {what} at {_site()}")
    with LOG.lock:
        LOG.host_syncs.append((what, _site()))


@contextmanager
def sync_mode(mode: str) -> Iterator[None]:
    """Record (``count``), raise on (``error``) or ignore (``off``) host syncs inside the block."""
    previous, LOG.mode = LOG.mode, mode
    try:
        yield
    finally:
        LOG.mode = previous


def _is_emu(device: Any) -> bool:
    return isinstance(device, torch.device) and device.type == DEVICE


class EmuTensor(torch.Tensor):
    """A tensor on the emu device; ``inner`` is the CPU tensor that holds its data."""

    inner: torch.Tensor

    @staticmethod
    def __new__(cls, inner: torch.Tensor, device: torch.device) -> EmuTensor:
        tensor = torch.Tensor._make_wrapper_subclass(
            cls, inner.shape, strides=inner.stride(), storage_offset=inner.storage_offset(),
            dtype=inner.dtype, layout=inner.layout, device=device, requires_grad=inner.requires_grad,
        )  # fmt: skip
        tensor.inner = inner
        return tensor

    def __repr__(self, *, tensor_contents: Any = None) -> str:
        return f"EmuTensor({self.inner!r}, device={self.device})"

    def tolist(self) -> Any:
        _host_sync("tolist")
        return self.inner.tolist()

    def cpu(self, memory_format: torch.memory_format = torch.preserve_format) -> torch.Tensor:
        # A tensor made under inference mode reaches no __torch_dispatch__ for this copy (PyTorch's own kernel
        # would return another emu tensor); CUDA returns a host tensor.
        _host_sync("copy to the host")
        return self.inner.clone(memory_format=memory_format)

    def numpy(self, *, force: bool = False) -> Any:
        raise TypeError(f"can't convert {self.device} device type tensor to numpy. Use Tensor.cpu() to copy the "
                        "tensor to host memory first.")  # fmt: skip

    def __deepcopy__(self, memo: dict) -> torch.Tensor:
        copy: torch.Tensor = EmuTensor(self.inner.clone(), self.device)
        if getattr(self, "_is_param", False):  # a module's parameter stays one (nn.Module.deepcopy, .to())
            copy = torch.nn.Parameter(copy, requires_grad=self.requires_grad)
        else:
            copy.requires_grad_(self.requires_grad)
        memo[id(self)] = copy
        return copy

    def __reduce_ex__(self, protocol: int) -> Any:
        # torch.save (checkpoints) writes the data as a CPU tensor, as it would map a GPU one on load.
        return self.inner.__reduce_ex__(protocol)

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__
        flat, _ = tree_flatten((args, kwargs))
        emu = [t for t in flat if isinstance(t, EmuTensor)]
        device = emu[0].device
        host = [t for t in flat if isinstance(t, torch.Tensor) and not isinstance(t, EmuTensor)]
        _check_devices(func, name, device, emu, host, kwargs)
        _count_syncs(func, name, device, args, kwargs)

        def unwrap(x: Any) -> Any:
            if isinstance(x, EmuTensor):
                return x.inner
            if _is_emu(x):
                return torch.device("cpu")
            return x

        out = func(*tree_map(unwrap, args), **tree_map(unwrap, kwargs))
        if name in ("_to_copy",) and kwargs.get("device") is not None and not _is_emu(kwargs["device"]):
            return out  # to the host: a plain CPU tensor

        def wrap(x: Any) -> Any:
            return EmuTensor(x, device) if isinstance(x, torch.Tensor) and not isinstance(x, EmuTensor) else x

        # Views, in-place and out= ops: their results alias their inputs as PyTorch's own kernels' would. The
        # wrappers are made outside inference mode (the data inside may be inference tensors): autograd's view
        # tracking then accepts a view of a parameter taken in inference mode, as it does for a CUDA tensor.
        with torch.inference_mode(False):
            wrapped = tree_map(wrap, out)
        return return_and_correct_aliasing(func, args, kwargs, wrapped)


def _check_devices(func: Any, name: str, device: torch.device, emu: list, host: list, kwargs: dict) -> None:
    """CUDA's rule: every tensor argument on one device, but 0-dim CPU scalars in element-wise ops."""
    others = {t.device for t in emu if t.device != device}
    if others:
        raise RuntimeError(f"Expected all tensors to be on the same device, but found at least two devices, "
                           f"{device} and {others.pop()}! ({func})")  # fmt: skip
    if not host or name in ("copy_", "_to_copy", "_copy_from", "set_"):
        return
    pointwise = torch.Tag.pointwise in func.tags or name.startswith("_foreach") or name in ("where", "lerp_")
    for t in host:
        if t.dim() == 0 and pointwise:
            continue
        if name in _INDEX_OPS and not t.is_floating_point():
            continue
        raise RuntimeError(
            f"Expected all tensors to be on the same device, but found at least two devices, {device} and "
            f"{t.device}! ({func} got a {tuple(t.shape)} CPU tensor)"
        )


def _count_syncs(func: Any, name: str, device: torch.device, args: tuple, kwargs: dict) -> None:
    """Record what CUDA's sync debug mode would flag for this op."""
    if name in _DATA_DEPENDENT:
        _host_sync(name)
    elif name == "repeat_interleave" and kwargs.get("output_size") is None and len(args) > 1:
        if isinstance(args[1], torch.Tensor):
            _host_sync("repeat_interleave without output_size")
    elif name in ("index", "index_put", "index_put_", "_index_put_impl_"):
        indices = args[1] if len(args) > 1 else []
        if any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in indices or []):
            _host_sync(f"{name} with a boolean mask")
    elif name == "_to_copy":
        target = kwargs.get("device")
        if target is not None and not _is_emu(target) and not kwargs.get("non_blocking", False):
            _host_sync("copy to the host")
    elif name == "copy_":
        dst, src = args[0], args[1]
        blocking = not (args[2] if len(args) > 2 else kwargs.get("non_blocking", False))
        crosses = isinstance(dst, EmuTensor) != isinstance(src, EmuTensor)
        if crosses and blocking:
            _host_sync("copy to the host" if isinstance(src, EmuTensor) else "blocking copy to the device")


_LIB: torch.library.Library | None = None


def _factory(size: Any, dtype: Any = None, layout: Any = None, device: Any = None, pin_memory: Any = None,
             memory_format: Any = None) -> EmuTensor:  # fmt: skip
    inner = torch.empty(size, dtype=dtype, memory_format=memory_format or torch.contiguous_format)
    return EmuTensor(inner, torch.device(device) if device is not None else torch.device(DEVICE, 0))


def _factory_strided(size: Any, stride: Any, dtype: Any = None, layout: Any = None, device: Any = None,
                     pin_memory: Any = None) -> EmuTensor:  # fmt: skip
    inner = torch.empty_strided(size, stride, dtype=dtype)
    return EmuTensor(inner, torch.device(device) if device is not None else torch.device(DEVICE, 0))


def _copy_from(source: torch.Tensor, destination: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
    """The copy PyTorch makes below the Python layer (``torch.tensor(data, device=...)``)."""
    if not non_blocking:
        _host_sync(
            "blocking copy to the device" if isinstance(destination, EmuTensor) else "copy to the host"
        )
    src = source.inner if isinstance(source, EmuTensor) else source
    dst = destination.inner if isinstance(destination, EmuTensor) else destination
    dst.copy_(src)
    return destination


class _Event:
    """``torch.emu.Event``: work on the emu device is done when it returns, so an event is always complete."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def record(self, stream: Any = None) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True


class _DeviceModule:
    """``torch.emu``: what PyTorch and Lightning ask of a device module."""

    Event = _Event
    _current = 0

    def is_initialized(self) -> bool:
        return True

    def is_available(self) -> bool:
        return True

    def current_device(self) -> int:
        return self._current

    def set_device(self, device: Any) -> None:
        self._current = torch.device(device).index or 0 if not isinstance(device, int) else device

    def device_count(self) -> int:
        return DEVICE_COUNT

    def synchronize(self, device: Any = None) -> None:
        pass

    def _is_in_bad_fork(self) -> bool:
        return False

    def manual_seed_all(self, seed: int) -> None:
        pass

    def manual_seed(self, seed: int) -> None:
        pass

    def get_rng_state(self, device: Any = None) -> torch.Tensor:
        return torch.zeros(1, dtype=torch.uint8)

    def set_rng_state(self, state: Any, device: Any = None) -> None:
        pass

    def get_amp_supported_dtype(self) -> list[torch.dtype]:
        return [torch.bfloat16, torch.float16]


# ------------------------------------------------------------------------------------ process group
def _inner(tensors: list, op: str) -> list[torch.Tensor]:
    out = []
    for t in tensors:
        if not isinstance(t, EmuTensor):
            # NCCL's own words (Lightning #18803): a host tensor has no backend in a device-only group.
            raise RuntimeError(f"No backend type associated with device type {t.device.type} ({op})")
        out.append(t.inner)
    return out


class _Done(dist._Work):
    """A finished collective whose result is the emu tensors it was given (gloo's would be their CPU data,
    and DDP reads its buckets back from the result)."""

    def __init__(self, result: list) -> None:
        super().__init__()
        self._result = result

    def wait(self, timeout: Any = None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True

    def is_success(self) -> bool:
        return True

    def result(self) -> list:
        return self._result

    def get_future(self) -> torch.futures.Future:
        future: torch.futures.Future = torch.futures.Future()
        future.set_result(self._result)
        return future


class EmuProcessGroup(dist.ProcessGroup):
    """Collectives over emu tensors only (as NCCL over CUDA tensors), run by gloo on their CPU data."""

    def __init__(self, store: Any, rank: int, size: int, timeout: timedelta) -> None:
        super().__init__(rank, size)
        prefixed = dist.PrefixStore("emu_gloo", store)
        self.gloo = dist.ProcessGroupGloo(prefixed, rank, size, timeout)

    @staticmethod
    def _record(op: str, tensors: list) -> None:
        with LOG.lock:
            LOG.collectives.append((op, sum(int(t.numel()) for t in tensors), _site()))

    def allreduce(self, tensors: list, opts: Any) -> Any:
        inner = _inner(tensors, "allreduce")
        self._record("allreduce", tensors)
        self.gloo.allreduce(inner, opts).wait()
        return _Done(tensors)

    def allreduce_coalesced(self, tensors: list, opts: Any) -> Any:
        inner = _inner(tensors, "allreduce_coalesced")
        self._record("allreduce_coalesced", tensors)
        self.gloo.allreduce_coalesced(inner, opts).wait()
        return _Done(tensors)

    def broadcast(self, tensors: list, opts: Any) -> Any:
        inner = _inner(tensors, "broadcast")
        self._record("broadcast", tensors)
        self.gloo.broadcast(inner, opts).wait()
        return _Done(tensors)

    def allgather(self, outputs: list, inputs: list, opts: Any) -> Any:
        inner = _inner(inputs, "allgather")
        outer = [_inner(o, "allgather") for o in outputs]
        self._record("allgather", inputs)
        self.gloo.allgather(outer, inner, opts).wait()
        return _Done(outputs)

    def _allgather_base(self, output: Any, input: Any, opts: Any) -> Any:
        (out,) = _inner([output], "all_gather_into_tensor")
        (inp,) = _inner([input], "all_gather_into_tensor")
        self._record("allgather", [input])
        self.gloo._allgather_base(out, inp, opts).wait()
        return _Done([output])

    def barrier(self, opts: Any) -> Any:
        self._record("barrier", [])
        self.gloo.barrier(opts).wait()
        return _Done([])

    def getBackendName(self) -> str:
        return DEVICE

    @property
    def _device_types(self) -> list[torch.device]:
        # Object collectives (broadcast_object_list, ...) then use the device, as they use CUDA under NCCL.
        return [torch.device(DEVICE)]

    def _get_backend(self, device: Any) -> Any:
        # init_process_group(device_id=...) asks the device's backend whether it splits (NCCL does); this does not.
        return self.gloo if torch.device(device).type == "cpu" else _NoSplitting()


class _NoSplitting:
    supports_splitting = False


class EmuAccelerator(Accelerator):
    """Lightning's accelerator for the emu device (every rank's device is ``emu:0``)."""

    def setup_device(self, device: torch.device) -> None:
        if device.type != DEVICE:
            raise RuntimeError(f"EmuAccelerator got device {device}")

    def get_device_stats(self, device: Any) -> dict[str, Any]:
        return {}

    def teardown(self) -> None:
        pass

    @staticmethod
    def parse_devices(devices: Any) -> int:
        return int(devices) if devices != "auto" else 1

    @staticmethod
    def get_parallel_devices(devices: Any) -> list[torch.device]:
        # Each rank sees its own device as emu:0, as a process with CUDA_VISIBLE_DEVICES set to one GPU does
        # (PyTorch's autograd engine sizes its per-device queues for one PrivateUse1 device).
        count = int(devices) if not isinstance(devices, list) else len(devices)
        return [torch.device(DEVICE, 0)] * count

    @staticmethod
    def auto_device_count() -> int:
        return 1

    @staticmethod
    def is_available() -> bool:
        return True

    @staticmethod
    def name() -> str:
        return DEVICE

    @classmethod
    def register_accelerators(cls, accelerator_registry: Any) -> None:
        pass


class EmuDDPStrategy(DDPStrategy):
    """Lightning's DDP on the emu device, with the ``emu`` process-group backend.

    The one difference: DDP gets no ``device_ids`` (Lightning passes them for any non-CPU device, and then
    opens a CUDA stream around the wrap), as for a CPU module.
    """

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("process_group_backend", DEVICE)
        super().__init__(**kwargs)

    def determine_ddp_device_ids(self) -> None:
        return None


def collective_counts(start: int = 0) -> Counter[str]:
    """Collectives recorded since index ``start``, by op."""
    return Counter(op for op, _, _ in LOG.collectives[start:])


def setup() -> None:
    """Register the emu device, its factory kernels and its process-group backend (idempotent)."""
    global _LIB
    if _LIB is not None:
        return
    from torch.utils.backend_registration import _setup_privateuseone_for_python_backend

    _setup_privateuseone_for_python_backend(DEVICE, backend_module=_DeviceModule())
    _LIB = torch.library.Library("aten", "IMPL")
    _LIB.impl("empty.memory_format", _factory, "PrivateUse1")
    _LIB.impl("empty_strided", _factory_strided, "PrivateUse1")
    _LIB.impl("_copy_from", _copy_from, "PrivateUse1")
    dist.Backend.register_backend(
        DEVICE,
        lambda store, rank, size, timeout: EmuProcessGroup(store, rank, size, timeout),
        devices=[DEVICE],
    )


setup()

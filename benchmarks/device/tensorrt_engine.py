"""TensorRT for the device script: ONNX files of a checkpoint, an engine built from each, scored and timed on
a GPU.

``gpu.py``'s ``tensorrt`` section calls ``work_tensorrt``: the checkpoint of its ``ddp 16-mixed`` fit is
exported to ONNX (``onnx``: fp32; ``onnx-fp16``: float16 weights, built with TensorRT's FP16 flag where the
installed TensorRT has one) at the fit's image size, each file is parsed by TensorRT's ONNX parser and built
into an engine (batch 1 to ``max_batch``), the engine is validated on the fit's synthetic val split by the
checkpoint's validator (``Trainer.validate`` of a ``YOLO11Module`` whose network is ``TensorRTModel``; square
letterbox at the export size, as ``export --check-data``), and its latency at batch 1 is timed on the GPU
(engine only, CUDA-synchronised).

The runtime stays here, not in ``model_files``: an engine is built for one GPU and one TensorRT version, needs
CUDA to open, and cannot be tested where the suite runs (no GPU; TensorRT's libraries are not on PyPI as
wheels). Without tensorrt the section is a row naming why; ``onnx_for_tensorrt`` (the files an engine is built
from) runs on a CPU and is what the suite checks.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

from yolo11_lightning.export.formats import FORMATS, export_file, output_path
from yolo11_lightning.model_files.exported_model import ExportedModel
from yolo11_lightning.model_files.onnx_metadata import read_metadata
from yolo11_lightning.nn.yolo11 import YOLO11

__all__ = ["PRECISIONS", "TensorRTModel", "build_engine", "onnx_for_tensorrt", "work_tensorrt"]

PRECISIONS = {"fp32": "onnx", "fp16": "onnx-fp16"}  # engine precision -> the export format it is built from


def onnx_for_tensorrt(model: YOLO11, folder: Path, size: int) -> dict[str, Path]:
    """The ONNX files the engines are built from: per precision of ``PRECISIONS``, the checkpoint exported at
    a fixed ``size`` x ``size`` with a free batch axis and its metadata."""
    files = {}
    for precision, name in PRECISIONS.items():
        fmt = FORMATS[name]
        files[precision] = export_file(fmt, model, output_path(fmt, folder / "model.pt"), (size, size))
    return files


def build_engine(onnx_path: Path, fp16: bool, max_batch: int) -> tuple[bytes, str]:
    """A serialized TensorRT engine of ``onnx_path`` for batches 1 to ``max_batch``; a note on its precision.

    Raises RuntimeError with the parser's errors for a graph TensorRT does not take."""
    import tensorrt as trt

    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(0)  # explicit batch: the only mode of TensorRT 10 and later
    parser = trt.OnnxParser(network, logger)
    if not parser.parse(onnx_path.read_bytes()):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise RuntimeError(f"{onnx_path}: TensorRT's ONNX parser refused it: {errors}")
    config = builder.create_builder_config()
    note = "fp32"
    if fp16:
        flag = getattr(trt.BuilderFlag, "FP16", None)
        if flag is not None:
            config.set_flag(flag)
            note = "fp16 (BuilderFlag.FP16)"
        else:
            note = "fp16 weights; kernels as the graph's types (no FP16 builder flag in this TensorRT)"
    images = network.get_input(0)
    _, channels, height, width = images.shape
    profile = builder.create_optimization_profile()
    profile.set_shape(images.name, (1, channels, height, width), (1, channels, height, width),
                      (max_batch, channels, height, width))  # fmt: skip
    config.add_optimization_profile(profile)
    blob = builder.build_serialized_network(network, config)
    if blob is None:
        raise RuntimeError(f"{onnx_path}: TensorRT built no engine (see its log above)")
    return bytes(blob), note


class TensorRTModel(ExportedModel):
    """A TensorRT engine as the network of validation: metadata from the ONNX file it was built from,
    inference on the current CUDA device. ``infer`` runs a CUDA batch without the copies ``forward`` makes."""

    runtime: ClassVar[str] = "TensorRT"
    _shared: ClassVar[tuple[str, ...]] = ("session", "_context")

    def __init__(self, engine: bytes, onnx_path: Path, num_classes: int | None, task: str | None) -> None:
        super().__init__()
        import onnx
        import tensorrt as trt

        self.path = Path(onnx_path)
        props = {p.key: p.value for p in onnx.load(str(onnx_path), load_external_data=False).metadata_props}
        info = read_metadata(self.path, props)
        runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
        self.__dict__["session"] = runtime.deserialize_cuda_engine(engine)
        self.__dict__["_context"] = self.session.create_execution_context()
        names = [self.session.get_tensor_name(i) for i in range(self.session.num_io_tensors)]
        is_input = [self.session.get_tensor_mode(n) == trt.TensorIOMode.INPUT for n in names]
        self._input = next(n for n, i in zip(names, is_input) if i)
        self._outputs = [n for n, i in zip(names, is_input) if not i]

        def dims(name: str) -> list[int | str]:
            return [d if d >= 0 else f"dim{j}" for j, d in enumerate(self.session.get_tensor_shape(name))]

        self._order = self._check(
            info, dims(self._input), [dims(n) for n in self._outputs], num_classes, task
        )

    def infer(self, images: torch.Tensor) -> list[torch.Tensor]:
        """The engine's outputs (the file's order) for a contiguous float32 CUDA batch."""
        context = self._context
        context.set_input_shape(self._input, tuple(images.shape))
        context.set_tensor_address(self._input, images.data_ptr())
        outs = []
        for name in self._outputs:
            out = torch.empty(
                tuple(context.get_tensor_shape(name)), dtype=torch.float32, device=images.device
            )
            context.set_tensor_address(name, out.data_ptr())
            outs.append(out)
        if not context.execute_async_v3(torch.cuda.current_stream().cuda_stream):
            raise RuntimeError(f"{self.path}: TensorRT engine failed to run a batch of {tuple(images.shape)}")
        return outs

    def _run(self, images: np.ndarray) -> list[np.ndarray]:
        outs = self.infer(torch.from_numpy(images).cuda())
        return [outs[i].cpu().numpy() for i in self._order]


def _validate(source: YOLO11, data: Any, engine: TensorRTModel | None = None) -> dict[str, float]:
    """The checkpoint's validator over ``data``'s val split on ``source`` or, given, its ``engine`` (a module
    set up for the ONNX file the engine was built from, as ``export --check-data`` sets one up, running the
    engine in its place)."""
    import lightning as L

    from yolo11_lightning.tasks import get_task
    from yolo11_lightning.training.module import YOLO11Module

    task = get_task(source.task)
    file = {} if engine is None else {"weights": str(engine.path)}
    module = YOLO11Module(scale=source.scale, num_classes=source.num_classes, class_names=data.class_names,
                          ema=False, log_images=0, task=source.task, **task.model_options(source),
                          **file)  # fmt: skip
    if engine is None:
        module.model.load_state_dict(source.state_dict())
    else:
        module.model = engine
    trainer = L.Trainer(accelerator="gpu", devices=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)  # fmt: skip
    (results,) = trainer.validate(module, datamodule=data, verbose=False)
    return {m: float(results[f"val/{m}"]) for m in task.reported_metrics}


def _latency_ms(run: Any, images: torch.Tensor, runs: int) -> float:
    """Median milliseconds of ``run(images)`` on the GPU after three warm-up calls, synchronised per call."""
    times = []
    with torch.inference_mode():
        for i in range(runs + 3):
            torch.cuda.synchronize()
            start = time.perf_counter()
            run(images)
            torch.cuda.synchronize()
            if i >= 3:
                times.append(time.perf_counter() - start)
    return 1000 * sorted(times)[len(times) // 2]


def work_tensorrt(spec: dict[str, Any]) -> dict[str, Any]:
    """Rows of (precision, engine MB, build s, ms at batch 1, metric, difference from the checkpoint) for the
    checkpoint under ``spec["root"]`` on the synthetic set of ``spec`` (the ``ddp 16-mixed`` fit's)."""
    import tensorrt as trt

    from yolo11_lightning.model_files.weights import load_model
    from yolo11_lightning.tasks import get_task
    from yolo11_lightning.training.datamodule import YOLODataModule

    found = sorted(Path(spec["root"]).rglob("last*.ckpt"), key=lambda p: p.stat().st_mtime_ns)
    if not found:
        raise FileNotFoundError(f"{spec['root']}: no last*.ckpt (the ddp 16-mixed fit's)")
    model = load_model(found[-1], task=None).eval()
    size = int(spec["size"])
    data = YOLODataModule("synthetic", batch_size=spec["batch"], image_size=size, num_workers=spec["workers"],
                          task=model.task, rect_val=False, synthetic_dir=spec["synthetic_dir"],
                          synthetic_train=spec["train"], synthetic_val=spec["val"],
                          synthetic_image_size=size)  # fmt: skip
    metric = get_task(model.task).checked_metrics[0]
    folder = Path(spec["workdir"])
    folder.mkdir(parents=True, exist_ok=True)
    reference = _validate(model, data)
    images = torch.rand(1, 3, size, size, device="cuda")
    eager = model.cuda()
    rows = [{"precision": "checkpoint (PyTorch eager fp32)", "metric": metric, "value": reference[metric],
             "difference": 0.0, "ms_b1": _latency_ms(eager, images, spec["runs"])}]  # fmt: skip
    model = model.cpu()
    for precision, onnx_path in onnx_for_tensorrt(model, folder, size).items():
        row: dict[str, Any] = {"precision": precision, "metric": metric}
        try:
            start = time.perf_counter()
            engine, row["note"] = build_engine(onnx_path, precision == "fp16", int(spec["batch"]))
            row["build_s"], row["engine_mb"] = time.perf_counter() - start, len(engine) / 1e6
            (folder / f"model_{precision}.engine").write_bytes(engine)
            runner = TensorRTModel(engine, onnx_path, model.num_classes, model.task)
            row["ms_b1"] = _latency_ms(runner.infer, images, spec["runs"])
            row["value"] = _validate(model, data, runner)[metric]
            row["difference"] = row["value"] - reference[metric]
        except (RuntimeError, ValueError) as e:  # a refused graph or a failed build: the row says so
            row["note"] = f"error: {str(e).splitlines()[0]}"
        rows.append(row)
    return {"rows": rows, "checkpoint": str(found[-1]), "size": size, "tensorrt": trt.__version__,
            "gpu": torch.cuda.get_device_name(), "pid": os.getpid()}  # fmt: skip

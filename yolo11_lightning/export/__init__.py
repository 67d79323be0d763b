"""Exported models: the formats, writing each, checking and scoring them against the checkpoint.

formats.py        the registry: each format's name, suffix, precision, extra and runtime; ``export_file``
onnx.py           ``export_onnx`` (fp32, fixed or dynamic size) and the ONNX Runtime comparison with the model
onnx_precision.py ``onnx-fp16`` (float16 weights) and ``onnx-int8`` (static QDQ quantization)
torchscript.py    ``torch.jit.trace`` with the metadata in the archive's config.txt
openvino.py       OpenVINO IR fp32 / fp16 / INT8 (NNCF) in a ``<stem>_openvino_model`` folder with metadata.yaml
executorch.py     ExecuTorch ``.pte`` (XNNPACK, fp32) with the metadata as the program's constant method
calibration.py    training-split images preprocessed as validation does, for INT8
tracing.py        what the writers share: the CPU copy traced, its outputs, the metadata, the decode's nodes
parity.py         a file's outputs through its runtime against PyTorch's
check.py          ``export --check-data``: both metrics on one dataset (imports Lightning)
command.py        ``yolo11-lightning export``
The runtimes that read the files back are in ``model_files`` (``exported_files.open_exported``).
"""

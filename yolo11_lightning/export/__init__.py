"""Exported models: ONNX files, their metadata, running them, and checking them.

onnx.py      ``export_onnx`` and the ONNX Runtime comparison with the model
metadata.py  the keys an ONNX file carries (the reference loader's and ours)
runtime.py   ``OnnxDetector``: an ONNX file in place of the model for validate, test and predict
check.py     ``export --check-data``: both mAPs on one dataset (imports Lightning)
command.py   ``yolo11-lightning export``
"""

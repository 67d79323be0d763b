#!/usr/bin/env bash
# The Python wheels a lent GPU machine lacks (it has no network), downloaded here into .whl/ (git-ignored),
# for benchmarks/device/gpu_run.sh to install there with pip --no-index. Run it right before the device call:
# it also writes .whl/COMMIT, the commit gpu.py reports (the device's copy of the tree has no .git).
#
#     bash benchmarks/device/gpu_wheels.sh
#
# What the machine lacks: pyproject.toml's dependencies against what the lent machine has (one H200, no
# network; python 3.12, torch 2.11+cu130, lightning, torchmetrics, torchvision, numpy, pyyaml,
# opencv-python-headless, onnx, onnxruntime, tensorboard, psutil, typing-extensions, pytest are installed):
#   jsonargparse[signatures]  LightningCLI's parser: jsonargparse, docstring-parser, typeshed-client
#                             (typeshed-client's one requirement, typing-extensions, is there);
#   faster-coco-eval          torchmetrics' mAP backend (compiled, cp312 manylinux; needs numpy, there).
# Not brought: wandb (a dependency, imported only when a config names WandbLogger; gpu.py's runs do not);
# opencv-python (opencv-python-headless there gives the same cv2). The versions are the ones the tests run with
# here. pip on this machine reads a local index, so the download works without the internet.
set -euo pipefail
cd "$(git -C "$(dirname "$0")" rev-parse --show-toplevel)"
WHEELS=(jsonargparse==4.53.0 docstring-parser==0.18.0 typeshed-client==2.15.0 faster-coco-eval==1.8.0)
PLATFORMS=(manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${PLATFORMS[@]/#/--platform=}" -d "$tmp" "${WHEELS[@]}"
mkdir -p .whl
rm -f .whl/*.whl  # one version of each: two would stop the install there
mv "$tmp"/*.whl .whl/
git describe --always --dirty >.whl/COMMIT
ls -l .whl
du -ch .whl/*.whl | tail -1

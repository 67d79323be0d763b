"""Test helpers around the reference package (AGPL, test oracle only) for the model tests.

Builds reference DetectionModels from their yaml (random init, no download), makes their BN statistics
non-trivial, saves them the way released weights are saved, and runs code in a subprocess where the
reference package cannot be imported.
"""

from __future__ import annotations

import contextlib
import copy
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from unittest import mock

os.environ["YOLO_OFFLINE"] = "1"  # before any import of the reference package

import pytest
import torch
from torch import nn

REPO_ROOT = Path(__file__).resolve().parents[2]


def reference_model(scale: str = "n", nc: int = 80, seed: int = 0, device: str = "cpu") -> nn.Module:
    """A reference YOLO11 DetectionModel with random weights and perturbed BN/class-bias values.

    ``device="meta"`` builds shapes only (instant; for counting parameters). The reference's head bias
    init reads stride values, which meta tensors do not have, so it is skipped there.
    """
    tasks = pytest.importorskip("ultralytics.nn.tasks")
    torch.manual_seed(seed)
    skip_bias = device == "meta"
    with (
        torch.device(device),
        mock.patch.object(tasks.Detect, "bias_init", lambda self: None)
        if skip_bias
        else contextlib.nullcontext(),
    ):
        model = tasks.DetectionModel(f"yolo11{scale}.yaml", nc=nc, verbose=False)
    if device != "meta":
        perturb(model, seed)
    return model


# Our task -> the reference's model class and its yaml's suffix (yolo11<scale><suffix>.yaml).
REFERENCE_MODELS = {
    "detect": ("DetectionModel", ""),
    "segment": ("SegmentationModel", "-seg"),
    "pose": ("PoseModel", "-pose"),
    "obb": ("OBBModel", "-obb"),
    "classify": ("ClassificationModel", "-cls"),
}


def reference_task_model(
    task: str, scale: str = "n", nc: int = 80, seed: int = 0, device: str = "cpu", **kwargs
) -> nn.Module:
    """A reference model of ``task`` from its yaml (random init, no download), BN and class biases perturbed;
    ``kwargs`` go to the model class (``data_kpt_shape`` for pose). ``device="meta"``: shapes only."""
    tasks = pytest.importorskip("ultralytics.nn.tasks")
    class_name, suffix = REFERENCE_MODELS[task]
    torch.manual_seed(seed)
    with (
        torch.device(device),
        mock.patch.object(tasks.Detect, "bias_init", lambda self: None)
        if device == "meta"
        else contextlib.nullcontext(),
    ):
        model = getattr(tasks, class_name)(f"yolo11{scale}{suffix}.yaml", nc=nc, verbose=False, **kwargs)
    if device != "meta":
        perturb(model, seed)
    return model


@torch.no_grad()
def perturb(model: nn.Module, seed: int = 0) -> None:
    """Give every BN non-trivial statistics and affine terms, and the class outputs spread-out biases,
    so a wrong eps, a missed BN or a mixed-up channel shows in the outputs."""
    g = torch.Generator().manual_seed(seed + 1)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            n = m.num_features
            m.running_mean.copy_(torch.randn(n, generator=g) * 0.2)
            m.running_var.copy_(torch.rand(n, generator=g) * 1.5 + 0.5)
            m.weight.copy_(torch.rand(n, generator=g) + 0.5)
            m.bias.copy_(torch.randn(n, generator=g) * 0.2)
    for name, m in model.named_modules():
        # Final 1x1 convs of the class branch: biases near 0 make sigmoid scores informative.
        if isinstance(m, nn.Conv2d) and m.bias is not None and ".cv3." in f".{name}.":
            m.bias.copy_(torch.randn(m.bias.shape, generator=g))


def save_like_release(model: nn.Module, path: Path, names: dict[int, str] | None = None) -> Path:
    """torch.save the way released weights are: the pickled model in fp16 under 'model', plus metadata."""
    model = copy.deepcopy(model).half()
    if names is not None:
        model.names = names
    ckpt = {
        "date": "2024-09-30T00:00:00",
        "version": "8.3.0",
        "license": "AGPL-3.0 License (https://ultralytics.com/license)",
        "docs": "https://docs.ultralytics.com",
        "epoch": -1,
        "best_fitness": None,
        "model": model,
        "ema": None,
        "updates": None,
        "optimizer": None,
        "train_args": {"task": "detect", "imgsz": 640, "epochs": 600, "batch": 128, "mosaic": 1.0},
        "train_metrics": {"metrics/mAP50-95(B)": 0.395, "fitness": 0.41},
    }
    torch.save(ckpt, path)
    return path


def reference_eval(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Eval output (B, 4+nc, A) of the reference model after the fp16 round trip a release goes through."""
    ref = copy.deepcopy(model).half().float().eval()
    with torch.no_grad():
        return ref(x)[0]


# Prepended to code run by run_without_reference: makes `import ultralytics` fail and checks it does.
_BLOCKER = textwrap.dedent(
    """
    import importlib.abc, sys
    class _BlockReference(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "ultralytics" or name.startswith("ultralytics."):
                raise ImportError(f"{name} is blocked in this test")
            return None
    sys.meta_path.insert(0, _BlockReference())
    try:
        import ultralytics  # noqa: F401
    except ImportError:
        pass
    else:
        raise SystemExit("the reference package is still importable")
    """
)


def run_without_reference(code: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter where the reference package cannot be imported.

    The code ends by checking that nothing under ``ultralytics`` got into sys.modules.
    """
    tail = (
        "\nassert not [m for m in sys.modules if m.split('.')[0] == 'ultralytics'], 'reference imported'\n"
        "print('REFERENCE-BLOCKED-OK')\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(
        [sys.executable, "-c", _BLOCKER + textwrap.dedent(code) + tail],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=REPO_ROOT,
    )


@torch.no_grad()
def image_driven(model: torch.nn.Module, images: torch.Tensor) -> None:
    """Make a random reference model's scores depend on the image (in place).

    Random deep nets wash the input out (their outputs barely change between images). BatchNorm statistics
    taken from ``images`` keep every layer's signal at unit scale; then each class logit is standardised over
    ``images`` to mean -3, std 2, so a few detections per image score high and the rest spread below.
    """
    norms = [m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    for m in norms:
        m.momentum = 1.0  # one train-mode pass sets the running statistics to these images'
    model.train()(images)
    for m in norms:
        m.momentum = 0.03
        m.running_var.clamp_(min=0.1)  # no near-zero variances: folded convs stay well conditioned
    head, logits = model.model[-1], {}
    hooks = [
        seq[-1].register_forward_hook(lambda _m, _i, out, k=k: logits.__setitem__(k, out))
        for k, seq in enumerate(head.cv3)
    ]
    model.eval()(images)
    for hook in hooks:
        hook.remove()
    for k, seq in enumerate(head.cv3):
        conv, out = seq[-1], logits[k]
        gain = 2.0 / out.std((0, 2, 3))
        conv.weight.mul_(gain.view(-1, 1, 1, 1))
        conv.bias.copy_((conv.bias - out.mean((0, 2, 3))) * gain - 3.0)
    for seq in head.cv2:  # favour short distances: boxes of a few cells, mostly inside the image
        seq[-1].bias.view(4, -1).sub_(2.0 * torch.arange(seq[-1].bias.numel() // 4))

"""The YOLO11 detector: sizes, output contract, initialisation, fusion, head reset, info command."""

from __future__ import annotations

import copy
import math
import os
import subprocess
import sys

os.environ.setdefault("YOLO_OFFLINE", "1")  # before any import of the reference package

import pytest
import torch
from model_oracle import perturb, reference_model
from torch import nn

from yolo11_lightning import YOLO11
from yolo11_lightning.nn import head as head_module
from yolo11_lightning.nn.head import Detect

# Exact parameter counts of the reference at nc=80 (docs/reference.md).
PARAMS_NC80 = {"n": 2_624_080, "s": 9_458_752, "m": 20_114_688, "l": 25_372_160, "x": 56_966_176}
# Published GFLOPs at 640 (docs/reference.md).
PUBLISHED_GFLOPS = {"n": 6.5, "s": 21.5, "m": 68.0, "l": 86.9, "x": 194.9}


def n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def num_anchors(h: int, w: int) -> int:
    return sum((h // s) * (w // s) for s in (8, 16, 32))


@pytest.mark.parametrize("scale", list(PARAMS_NC80))
def test_parameter_counts_nc80(scale):
    with torch.device("meta"):  # shapes only: instant even for x
        assert n_params(YOLO11(scale)) == PARAMS_NC80[scale]


@pytest.mark.parametrize("scale", list(PARAMS_NC80))
def test_parameter_counts_nc3_match_reference(scale):
    ref = reference_model(scale, nc=3, device="meta")
    with torch.device("meta"):
        ours = YOLO11(scale, num_classes=3)
    assert n_params(ours) == n_params(ref)
    # Same layout, so the same state-dict shapes key by key (our keys are a prefix rename).
    ref_shapes = [tuple(v.shape) for v in ref.state_dict().values()]
    assert [tuple(v.shape) for v in ours.state_dict().values()] == ref_shapes


@pytest.fixture(scope="module")
def model_n():
    torch.manual_seed(0)
    return YOLO11("n")


@pytest.mark.parametrize(("h", "w"), [(320, 320), (640, 640), (480, 640)])
def test_output_shapes_train_and_eval(model_n, h, w):
    x = torch.rand(1, 3, h, w)
    with torch.no_grad():
        maps = model_n.train()(x)
        assert [tuple(m.shape) for m in maps] == [(1, 64 + 80, h // s, w // s) for s in (8, 16, 32)]
        out = model_n.eval()(x)
    assert out.shape == (1, 4 + 80, num_anchors(h, w))
    scores = out[:, 4:]
    assert torch.all((scores >= 0) & (scores <= 1))
    # Box centres stay near their anchors, i.e. inside the image (plus at most 16 strides of spread).
    assert out[:, 0].min() > -16 * 32 and out[:, 0].max() < w + 16 * 32
    assert out[:, 2:4].min() >= 0  # widths/heights are sums of non-negative distances


@pytest.mark.parametrize("shape", [(1, 3, 100, 64), (1, 3, 64, 48), (1, 3, 0, 64)])
def test_input_size_not_multiple_of_32_is_refused(model_n, shape):
    with pytest.raises(ValueError, match="multiples of 32"):
        model_n(torch.rand(shape))


def test_input_layout_is_checked(model_n):
    with pytest.raises(ValueError, match=r"\(B, 3, H, W\)"):
        model_n(torch.rand(3, 64, 64))
    with pytest.raises(ValueError, match=r"\(B, 3, H, W\)"):
        model_n(torch.rand(1, 1, 64, 64))
    with pytest.raises(ValueError, match="unknown YOLO11 scale 'q'"):
        YOLO11("q")
    with pytest.raises(ValueError, match="num_classes"):
        YOLO11("n", num_classes=0)


def test_public_attributes(model_n):
    assert model_n.strides == (8, 16, 32)
    assert model_n.reg_max == 16
    assert model_n.num_classes == 80 and model_n.scale == "n" and model_n.names is None
    assert isinstance(model_n.head, Detect)
    assert YOLO11("n", 2, names=["cat", "dog"]).names == ["cat", "dog"]
    with pytest.raises(ValueError, match="2 class names for 3 classes"):
        YOLO11("n", 3, names=["cat", "dog"])


def test_reference_initialisation():
    nc = 7
    model = YOLO11("n", num_classes=nc)
    bns = [m for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
    assert bns and all(m.eps == 1e-3 and m.momentum == 0.03 for m in bns)
    head = model.head
    for box, cls, s in zip(head.cv2, head.cv3, model.strides):
        assert torch.all(box[-1].bias == 1.0)
        expected = math.log(5 / nc / (640 / s) ** 2)
        torch.testing.assert_close(cls[-1].bias, torch.full((nc,), expected))
    dfl = head.dfl.conv.weight
    assert torch.equal(dfl.flatten(), torch.arange(16.0)) and not dfl.requires_grad


def test_decode_puts_boxes_in_input_pixels_level_by_level():
    """Hand-made maps whose box distributions are one-hot: distances (l, t, r, b) = (1, 2, 3, 4) bins."""
    head = YOLO11("n", num_classes=2).head.eval()
    h, w = 64, 96
    maps = []
    for s in head.strides:
        m = torch.zeros(1, 64 + 2, h // s, w // s)
        for side, bins in enumerate((1, 2, 3, 4)):
            m[:, side * 16 + bins] = 50.0  # softmax ~ one-hot
        m[:, 64] = 0.0  # class 0 logit -> 0.5
        m[:, 65] = 20.0
        maps.append(m)
    out = head.decode(maps)
    assert out.shape == (1, 6, num_anchors(h, w))
    # First anchor of P4: after the 8x12 P3 cells; row 1, col 2 of P4 is 1*6 + 2 further on.
    a = (h // 8) * (w // 8) + 1 * (w // 16) + 2
    cx, cy, s = (2 + 0.5) * 16, (1 + 0.5) * 16, 16
    x1, y1, x2, y2 = cx - 1 * s, cy - 2 * s, cx + 3 * s, cy + 4 * s
    expected = torch.tensor([(x1 + x2) / 2, (y1 + y2) / 2, x2 - x1, y2 - y1, 0.5, 1.0])
    torch.testing.assert_close(out[0, :, a], expected, atol=1e-4, rtol=0)


def test_anchors_are_cached_per_shape(monkeypatch):
    calls = []
    real = head_module.make_anchors

    def counting(*args, **kwargs):
        calls.append(args[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(head_module, "make_anchors", counting)
    model = YOLO11("n").eval()
    with torch.no_grad():
        model(torch.rand(1, 3, 64, 64))
        model(torch.rand(2, 3, 64, 64))  # batch size does not matter
        assert len(calls) == 1
        model(torch.rand(1, 3, 64, 96))
    assert len(calls) == 2 and calls[1][0] == (8, 12)


def test_fuse_keeps_outputs():
    torch.manual_seed(1)
    model = YOLO11("n", num_classes=5)
    perturb(model, seed=1)
    model.eval()
    x = torch.rand(2, 3, 96, 64)
    synced = nn.SyncBatchNorm.convert_sync_batchnorm(copy.deepcopy(model))  # as DDP with SyncBN has it
    with torch.no_grad():
        before = model(x)
        assert model.fuse() is model
        after = model(x)
        torch.testing.assert_close(synced.fuse()(x), after)
    for m in (model, synced):
        assert not any(isinstance(b, nn.modules.batchnorm._BatchNorm) for b in m.modules())
    assert before[:, 4:].std() > 0.05  # non-trivial scores
    # Scores within 1e-4; boxes within 1e-4 of the image size (fp32 rounding on values up to ~500 px).
    torch.testing.assert_close(after[:, 4:], before[:, 4:], atol=1e-4, rtol=0)
    torch.testing.assert_close(after[:, :4] / 96, before[:, :4] / 96, atol=1e-4, rtol=0)
    # In float64 the folding is exact up to rounding.
    model64 = YOLO11("n", num_classes=5).double()
    perturb(model64, seed=2)
    unfused = copy.deepcopy(model64).eval()
    x64 = x.double()
    with torch.no_grad():
        torch.testing.assert_close(model64.eval().fuse()(x64), unfused(x64), atol=1e-9, rtol=1e-9)


def test_reset_head_for_fine_tuning():
    torch.manual_seed(0)
    model = YOLO11("n")
    box_before = {k: v.clone() for k, v in model.head.cv2.state_dict().items()}
    dw_before = model.head.cv3[0][0][0].conv.weight.clone()
    assert model.reset_head(3, names=["a", "b", "c"]) is model
    assert model.num_classes == 3 and model.names == ["a", "b", "c"]
    assert n_params(model) == n_params(YOLO11("n", 3))
    for k, v in model.head.cv2.state_dict().items():
        assert torch.equal(v, box_before[k])  # the box branch is untouched
    assert torch.equal(model.head.cv3[0][0][0].conv.weight, dw_before)  # same-shape layers keep weights
    for cls, s in zip(model.head.cv3, model.strides):
        torch.testing.assert_close(cls[-1].bias, torch.full((3,), math.log(5 / 3 / (640 / s) ** 2)))
    with torch.no_grad():
        assert model.eval()(torch.rand(1, 3, 64, 64)).shape == (1, 7, num_anchors(64, 64))
        assert model.train()(torch.rand(1, 3, 64, 64))[0].shape[1] == 64 + 3


def test_backward_reaches_every_trainable_parameter():
    model = YOLO11("n", num_classes=4).train()
    maps = model(torch.rand(2, 3, 64, 64))
    sum(m.float().square().mean() for m in maps).backward()
    frozen = {"head.dfl.conv.weight"}
    for name, p in model.named_parameters():
        if name in frozen:
            assert p.grad is None
        else:
            assert p.grad is not None and torch.isfinite(p.grad).all(), name


def test_info_prints_a_table(capsys):
    from yolo11_lightning.cli.main import main

    assert main(["info"]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line.startswith("yolo11")}
    assert list(rows) == [f"yolo11{s}" for s in PARAMS_NC80]
    for scale, params in PARAMS_NC80.items():
        _, layers, n, gflops, _ = rows[f"yolo11{scale}"]
        assert int(n.replace(",", "")) == params
        assert float(gflops) == PUBLISHED_GFLOPS[scale]
        with torch.device("meta"):
            assert int(layers) == sum(1 for m in YOLO11(scale).modules() if not m._modules)
    assert "2 x multiply-adds" in out


def test_anchors_cached_in_inference_mode_are_remade_for_autograd() -> None:
    """Validation (inference mode) then an eval forward with gradients at the same size (ONNX export traces
    so): the cached anchors must not be inference tensors there."""
    model = YOLO11(scale="n", num_classes=2).eval()
    x = torch.rand(1, 3, 32, 32)
    with torch.inference_mode():
        model(x)
    model(x).sum().backward()  # raised "Inference tensors cannot be saved for backward"
    assert next(model.parameters()).grad is not None


def test_building_a_detector_imports_torch_and_nothing_heavy(tmp_path) -> None:
    """``YOLO11("n", 80)`` in a fresh interpreter loads only ``nn/`` and ``ops/`` of the package: no OpenCV,
    matplotlib, torchmetrics or Lightning (the network is plain PyTorch)."""
    code = (
        "import sys\nimport yolo11_lightning\nmodel = yolo11_lightning.YOLO11('n', 80)\n"
        "heavy = sorted({m.split('.')[0] for m in sys.modules} & {'cv2', 'matplotlib', 'torchmetrics', 'lightning'})\n"
        "parts = sorted({m.split('.')[1] for m in sys.modules if m.startswith('yolo11_lightning.')})\n"
        "print(heavy, parts, model.task)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["[]", "['nn',", "'ops']", "detect"]

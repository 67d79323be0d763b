"""YOLO11-seg: sizes against the reference, output contract, reference-file parity without the reference
package, the task kept through our files, wrong-task and crafted files refused, the info command."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from unittest import mock

os.environ.setdefault("YOLO_OFFLINE", "1")  # before any import of the reference package

import pytest
import torch
from model_oracle import perturb, run_without_reference, save_like_release
from pickle_ops import (
    EMPTY_DICT,
    EMPTY_TUPLE,
    NEWOBJ,
    SETITEM,
    glob,
    in_dict,
    tensor_pickle,
    text,
    torch_zip,
)

from yolo11_lightning import YOLO11
from yolo11_lightning.model_files.reference import CheckpointError
from yolo11_lightning.model_files.weights import (
    WeightsMismatchError,
    load_model,
    load_pretrained,
    save_weights,
)
from yolo11_lightning.tasks import create_model
from yolo11_lightning.tasks.segment.head import Segment, SegmentOutput

# Exact parameter counts of the reference YOLO11-seg at nc=80 (docs/reference.md).
SEG_PARAMS_NC80 = {"n": 2_876_848, "s": 10_113_248, "m": 22_420_896, "l": 27_678_368, "x": 62_142_656}
SEG_KEYS = {"n": 561, "s": 561, "m": 711, "l": 1077, "x": 1077}  # reference state-dict entries
INPUT_SHAPE = (2, 3, 64, 96)


def n_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def num_anchors(h: int, w: int) -> int:
    return sum((h // s) * (w // s) for s in (8, 16, 32))


def reference_seg_model(
    scale: str = "n", nc: int = 80, seed: int = 0, device: str = "cpu"
) -> torch.nn.Module:
    """A reference SegmentationModel from its yaml (random init, no download); BN and class biases perturbed."""
    tasks = pytest.importorskip("ultralytics.nn.tasks")
    torch.manual_seed(seed)
    if device == "meta":  # the reference's bias init reads stride values, which meta tensors lack
        with torch.device("meta"), mock.patch.object(tasks.Detect, "bias_init", lambda self: None):
            return tasks.SegmentationModel(f"yolo11{scale}-seg.yaml", nc=nc, verbose=False)
    model = tasks.SegmentationModel(f"yolo11{scale}-seg.yaml", nc=nc, verbose=False)
    perturb(model, seed)
    return model


@pytest.mark.parametrize("scale", list(SEG_PARAMS_NC80))
def test_parameter_counts_match_reference(scale: str) -> None:
    with torch.device("meta"):
        ours80, ours3 = create_model(scale, task="segment"), create_model(scale, 3, task="segment")
    assert n_params(ours80) == SEG_PARAMS_NC80[scale]
    for ours, nc in ((ours80, 80), (ours3, 3)):
        ref = reference_seg_model(scale, nc, device="meta")
        assert n_params(ours) == n_params(ref)
        # Same layout and order, so the same state-dict shapes entry by entry (our keys are a prefix rename).
        assert [tuple(v.shape) for v in ours.state_dict().values()] == [
            tuple(v.shape) for v in ref.state_dict().values()
        ]
        assert len(ours.state_dict()) == SEG_KEYS[scale]


@pytest.fixture(scope="module")
def seg_n() -> YOLO11:
    torch.manual_seed(0)
    return create_model("n", 5, task="segment")


def test_output_contract(seg_n: YOLO11) -> None:
    h, w = INPUT_SHAPE[2:]
    x = torch.rand(INPUT_SHAPE)
    assert seg_n.task == "segment" and isinstance(seg_n.head, Segment) and YOLO11("n").task == "detect"
    with torch.no_grad():
        out = seg_n.train()(x)
        assert isinstance(out, SegmentOutput)
        assert [tuple(m.shape) for m in out.maps] == [(2, 64 + 5, h // s, w // s) for s in (8, 16, 32)]
        assert out.coefficients.shape == (2, 32, num_anchors(h, w))
        assert out.protos.shape == (2, 32, h // 4, w // 4)
        preds, protos = seg_n.eval()(x)
        raw = seg_n.train_outputs(x)  # the raw outputs in eval mode (BN on running statistics)
    assert preds.shape == (2, 4 + 5 + 32, num_anchors(h, w)) and protos.shape == (2, 32, h // 4, w // 4)
    # The detection part is exactly what Detect decodes, followed by the raw coefficients.
    torch.testing.assert_close(preds[:, : 4 + 5], seg_n.head.decode(raw.maps))
    torch.testing.assert_close(preds[:, 9:], raw.coefficients)
    torch.testing.assert_close(protos, raw.protos)
    with pytest.raises(ValueError, match="unknown YOLO11 task 'depth'"):
        create_model("n", task="depth")


def test_fuse_and_reset_head_keep_the_masks(seg_n: YOLO11) -> None:
    model = copy.deepcopy(seg_n)
    perturb(model, seed=4)
    x = torch.rand(1, 3, 64, 64)
    with torch.no_grad():
        before = model.eval()(x)
        fused = copy.deepcopy(model).fuse()
        after = fused(x)
    assert not any(isinstance(m, torch.nn.BatchNorm2d) for m in fused.head.modules())  # proto and cv4 too
    torch.testing.assert_close(
        after[0][:, 4:], before[0][:, 4:], atol=1e-4, rtol=1e-4
    )  # scores, coefficients
    torch.testing.assert_close(after[1], before[1], atol=1e-4, rtol=1e-4)  # protos
    proto_before = model.head.proto.cv1.conv.weight.clone()
    model.reset_head(2)
    assert torch.equal(model.head.proto.cv1.conv.weight, proto_before)
    with torch.no_grad():
        assert model(x)[0].shape == (1, 4 + 2 + 32, num_anchors(64, 64))


def _save_seg_release(model: torch.nn.Module, path: Path, names: dict[int, str]) -> Path:
    save_like_release(model, path, names)
    return path


_LOAD_AND_RUN = """
import json, torch
from yolo11_lightning import YOLO11
from yolo11_lightning.model_files.weights import load_model
from yolo11_lightning.tasks import create_model
results = {}
for name in NAMES:
    model = load_model(f"{name}.pt").eval()
    with torch.no_grad():
        preds, protos = model(torch.load(f"{name}.x.pt"))
    torch.save((preds, protos), f"{name}.ours.pt")
    results[name] = dict(scale=model.scale, nc=model.num_classes, task=model.task, names=model.names)
json.dump(results, open("results.json", "w"))
"""


def test_reference_checkpoint_parity_without_reference_package(tmp_path: Path) -> None:
    """Reference yolo11n-seg (80 classes) and yolo11s-seg (7) files, read and run where the reference
    package cannot be imported: predictions and protos within 1e-3 of the reference's (fp16 weights)."""
    pytest.importorskip("ultralytics")
    cases = {"n": ("n", 80), "s": ("s", 7)}
    expected = {}
    for name, (scale, nc) in cases.items():
        ref = reference_seg_model(scale, nc, seed=nc)
        _save_seg_release(ref, tmp_path / f"{name}.pt", {i: f"class_{i}" for i in range(nc)})
        x = torch.rand(INPUT_SHAPE, generator=torch.Generator().manual_seed(nc))
        torch.save(x, tmp_path / f"{name}.x.pt")
        with torch.no_grad():
            out = copy.deepcopy(ref).half().float().eval()(x)  # the fp16 round trip a release goes through
        expected[name] = (out[0], out[1][2])
    proc = run_without_reference(
        f"import os\nos.chdir({str(tmp_path)!r})\nNAMES = {list(cases)!r}\n" + _LOAD_AND_RUN
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "REFERENCE-BLOCKED-OK" in proc.stdout
    info = json.loads((tmp_path / "results.json").read_text())
    for name, (scale, nc) in cases.items():
        assert info[name] == dict(scale=scale, nc=nc, task="segment", names=[f"class_{i}" for i in range(nc)])
        preds, protos = torch.load(tmp_path / f"{name}.ours.pt")
        ref_preds, ref_protos = expected[name]
        assert preds.shape == ref_preds.shape == (2, 4 + nc + 32, num_anchors(*INPUT_SHAPE[2:]))
        assert protos.shape == ref_protos.shape == (2, 32, 16, 24)
        assert (preds[:, :4] - ref_preds[:, :4]).abs().max() <= 1e-3  # boxes, pixels
        assert (preds[:, 4:] - ref_preds[:, 4:]).abs().max() <= 1e-3  # scores and mask coefficients
        assert (protos - ref_protos).abs().max() <= 1e-3
        assert ref_preds[:, 4 + nc :].std() > 0.05 and ref_protos.std() > 0.05  # non-trivial values


def test_weights_file_keeps_the_task(tmp_path: Path, seg_n: YOLO11) -> None:
    save_weights(seg_n, tmp_path / "seg.pth")
    save_weights(YOLO11("n", 5), tmp_path / "det.pth")
    assert "task" not in torch.load(tmp_path / "det.pth", weights_only=True)  # detection files as before
    loaded = load_model(tmp_path / "seg.pth")
    assert loaded.task == "segment" and loaded.num_classes == 5
    x = torch.rand(1, 3, 64, 64)
    with torch.no_grad():
        for a, b in zip(loaded(x), seg_n.eval()(x)):
            torch.testing.assert_close(a, b)
    assert load_model(tmp_path / "seg.pth", task=None).task == "segment"
    with pytest.raises(ValueError, match=r"seg\.pth: holds a segmentation model .*not a detection model"):
        load_model(
            tmp_path / "seg.pth", task="detect"
        )  # callers that handle detection only get a clear error


def test_pretrained_seg_weights_and_wrong_task(tmp_path: Path) -> None:
    pytest.importorskip("ultralytics")
    seg_file = _save_seg_release(reference_seg_model("n", 80, seed=1), tmp_path / "yolo11n-seg.pt", {0: "a"})
    model = create_model("n", 3, task="segment")
    loaded, skipped = load_pretrained(model, seg_file)  # another class count: all but the class branch
    assert skipped and all(k.startswith("head.cv3.") for k in skipped)
    reference = load_model(seg_file).state_dict()
    for key in ("head.proto.upsample.weight", "head.cv4.2.2.bias", "layers.0.conv.weight"):
        torch.testing.assert_close(model.state_dict()[key], reference[key])
    tasks = pytest.importorskip("ultralytics.nn.tasks")
    det_file = save_like_release(
        tasks.DetectionModel("yolo11n.yaml", nc=80, verbose=False), tmp_path / "det.pt"
    )
    with pytest.raises(
        WeightsMismatchError,
        match=r"det\.pt.*holds a detection model .*DetectionModel.*not a segmentation model",
    ):
        load_pretrained(create_model("n", 80, task="segment"), det_file)
    with pytest.warns(UserWarning, match=r"loaded 499 of 561 tensors .*holds a detection model"):
        loaded, _ = load_pretrained(create_model("n", 80, task="segment"), det_file, strict=False)
    assert loaded > 400  # backbone and detection branches; proto and coefficient branch keep their init


def _seg_stand_in(state: bytes) -> bytes:
    """``{"model": SegmentationModel.__new__() with BUILD state}``: the shape of a pickled reference model."""
    return in_dict(glob("ultralytics.nn.tasks", "SegmentationModel") + EMPTY_TUPLE + NEWOBJ + state + b"b")


def test_crafted_seg_files_are_refused(tmp_path: Path) -> None:
    """Crafted files dressed as a reference SegmentationModel: refused by every loader, naming the file."""
    tensor = tensor_pickle(2**40, (2**40,))  # claims 4 TB from a 16-byte record
    tensor = tensor[len(in_dict(b"")) - 2 : -2]  # the bare tensor opcodes, out of their {"model": ...}
    params = EMPTY_DICT + text("_modules") + EMPTY_DICT + SETITEM + text("_parameters") + EMPTY_DICT
    marker = tmp_path / "MARKER"
    command = glob("posix", "system") + text(f"touch {marker}") + b"\x85R"
    files = {
        "seg_storage_claim.pt": (
            torch_zip(_seg_stand_in(params + text("w") + tensor + SETITEM + SETITEM), {"0": b"\0" * 16}),
            "storage '0' claims 4398046511104 bytes",
        ),
        "seg_runs_command.pt": (
            torch_zip(_seg_stand_in(EMPTY_DICT + text("hook") + command + SETITEM)),
            "refusing to load global 'posix.system'",
        ),
    }
    loaders = {
        "load_model": load_model,
        "load_pretrained": lambda p: load_pretrained(create_model("n", 3, task="segment"), p),
    }
    for name, (data, pattern) in files.items():
        (tmp_path / name).write_bytes(data)
        for loader, call in loaders.items():
            with pytest.raises((CheckpointError, WeightsMismatchError), match=rf"{name}.*{pattern}"):
                call(tmp_path / name)
            assert not marker.exists(), loader


def test_info_shows_the_task(capsys: pytest.CaptureFixture[str]) -> None:
    from yolo11_lightning.cli.main import main

    assert main(["info", "--task", "segment", "--scales", "n,x"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("YOLO11 instance segmentation models (task segment), 80 classes")
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line.startswith("yolo11")}
    assert list(rows) == ["yolo11n-seg", "yolo11x-seg"]
    for scale in ("n", "x"):
        assert int(rows[f"yolo11{scale}-seg"][2].replace(",", "")) == SEG_PARAMS_NC80[scale]
    # GFLOPs as the reference counts them for its own model (fused, 640): n-seg 9.7.
    torch_utils = pytest.importorskip("ultralytics.utils.torch_utils")
    ref = reference_seg_model("n", 80).fuse()
    assert float(rows["yolo11n-seg"][3]) == round(torch_utils.get_flops(ref, 640), 1)
    assert main(["info", "--scales", "n"]) == 0
    assert "(task detect)" in capsys.readouterr().out.splitlines()[0]


def test_own_seg_weights_into_a_detector(tmp_path: Path, seg_n: YOLO11) -> None:
    """Our own weights file of another task: refused when strict, its fitting layers loaded when not."""
    save_weights(seg_n, tmp_path / "seg.pth")
    with pytest.raises(
        WeightsMismatchError, match=r"seg\.pth: holds a segmentation model .*not a detection model"
    ):
        load_pretrained(YOLO11("n", 5), tmp_path / "seg.pth")
    detector = YOLO11("n", 5)
    said: list[str] = []
    loaded, skipped = load_pretrained(detector, tmp_path / "seg.pth", strict=False, info=said.append)
    assert len(said) == 1 and "(a segmentation model)" in said[0]
    assert loaded == len(detector.state_dict()) and not skipped  # a detector is a seg model minus the masks
    torch.testing.assert_close(
        detector.state_dict()["head.cv3.0.2.bias"], seg_n.state_dict()["head.cv3.0.2.bias"]
    )


def test_train_output_feeds_the_segmentation_loss() -> None:
    """End to end: the model's train output, the documented targets and masks, a backward to every weight."""
    from yolo11_lightning.tasks.segment.loss import SegmentationLoss

    torch.manual_seed(0)
    model = create_model("n", 3, task="segment").train()
    targets = torch.tensor(
        [[0, 1, 0.5, 0.5, 0.5, 0.4], [0, 2, 0.3, 0.3, 0.2, 0.2], [1, 0, 0.6, 0.4, 0.3, 0.5]]
    )
    masks = torch.zeros(2, 16, 16, dtype=torch.uint8)
    masks[0, 4:12, 4:12], masks[0, 4:7, 3:6], masks[1, 3:11, 7:12] = 1, 2, 1
    loss, items = SegmentationLoss(3)(model(torch.rand(2, 3, 64, 64)), targets, masks)
    loss.backward()
    assert items.shape == (4,) and (items > 0).all()
    for name, p in model.named_parameters():
        assert (p.grad is None) == (name == "head.dfl.conv.weight"), name
    assert (
        model.head.proto.cv3.conv.weight.grad.abs().sum() > 0
        and model.head.cv4[0][2].weight.grad.abs().sum() > 0
    )

"""Fine-tuning start: weights from another class count load everything but the class head; another scale or
task is refused with a message that says what the file holds, unless ``weights_strict`` is off."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from yolo11_lightning import YOLO11, YOLO11Module
from yolo11_lightning.model_files.weights import load_model, save_weights
from yolo11_lightning.training.pretrained import WeightsMismatchError, load_pretrained


def test_weights_from_80_classes_into_3(tmp_path: Path) -> None:
    torch.manual_seed(0)
    source = YOLO11("n", 80)
    with torch.no_grad():
        for p in source.parameters():
            p.add_(torch.randn_like(p) * 0.01)  # distinguishable from a fresh initialisation
    path = tmp_path / "coco80.pth"
    save_weights(source, path)

    module = YOLO11Module(scale="n", num_classes=3, class_names=["a", "b", "c"], weights=str(path))
    ours, theirs = module.model.state_dict(), source.state_dict()
    assert module.model.num_classes == 3
    for key, value in ours.items():
        if key.startswith("head.cv3"):  # class branch: its width follows the class count
            continue
        torch.testing.assert_close(value, theirs[key], msg=key)
    # The last class conv cannot be copied (80 -> 3 outputs): it keeps the reference bias init.
    final_bias = ours["head.cv3.0.2.bias"]
    assert final_bias.shape == (3,) and torch.allclose(final_bias, final_bias[0].expand(3))


def _saved(tmp_path: Path, scale: str, num_classes: int = 80) -> Path:
    path = tmp_path / f"{scale}{num_classes}.pth"
    save_weights(YOLO11(scale, num_classes), path)
    return path


def test_weights_of_another_scale_are_refused(tmp_path: Path) -> None:
    path = _saved(tmp_path, "s")
    # s and n share only the BatchNorm counters, box-branch biases and the DFL weight: 85 of 499 tensors.
    with pytest.raises(
        WeightsMismatchError,
        match=r"s80\.pth: loaded \d+ of 499 tensors into YOLO11-n; the file holds YOLO11-s weights, 80 classes, "
        r"the model is YOLO11-n \(use --model.scale s\); shape mismatches outside the class head: "
        r"layers\.0\.conv\.weight \(32, 3, 3, 3\) vs \(16, 3, 3, 3\).*--model\.weights_strict false",
    ):
        YOLO11Module(scale="n", num_classes=80, weights=str(path))


def test_weights_strict_false_loads_what_fits(tmp_path: Path) -> None:
    source = YOLO11("s", 80)
    with torch.no_grad():
        for p in source.parameters():
            p.add_(1.0)
    path = tmp_path / "s80.pth"
    save_weights(source, path)
    model = YOLO11("n", 3)
    fresh = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.warns(
        UserWarning, match=r"s80\.pth: loaded \d+ of 499 tensors into YOLO11-n.*YOLO11-s"
    ) as seen:
        loaded, skipped = load_pretrained(model, path, strict=False)
    theirs = source.state_dict()
    fits = [k for k, v in fresh.items() if theirs[k].shape == v.shape]
    assert loaded == len(fits) and 0 < loaded < len(fresh) and len(skipped) == len(fresh) - loaded
    for key, value in model.state_dict().items():
        torch.testing.assert_close(value, theirs[key] if key in fits else fresh[key], msg=key)
    assert f"loaded {loaded} of {len(fresh)} tensors" in str(seen[0].message)


def test_module_passes_weights_strict(tmp_path: Path) -> None:
    with pytest.warns(UserWarning, match="weights_strict off"):
        module = YOLO11Module(
            scale="n", num_classes=3, weights=str(_saved(tmp_path, "s")), weights_strict=False
        )
    assert module.hparams.weights_strict is False and module.model.scale == "n"


def test_reference_file_right_scale_other_classes_loads(tmp_path: Path) -> None:
    pytest.importorskip("ultralytics")
    from model_oracle import reference_model, save_like_release

    path = save_like_release(reference_model("n", 80, seed=1), tmp_path / "yolo11n.pt")
    model = YOLO11("n", 3)
    loaded, skipped = load_pretrained(model, path)
    assert skipped and all(k.startswith("head.cv3.") for k in skipped)
    assert loaded == len(model.state_dict()) - len(skipped)
    reference = load_model(path).state_dict()
    for key in ("layers.0.conv.weight", "layers.10.m.0.attn.qkv.conv.weight", "head.cv2.2.2.bias"):
        torch.testing.assert_close(model.state_dict()[key], reference[key])


def test_reference_file_of_another_scale_is_refused(tmp_path: Path) -> None:
    pytest.importorskip("ultralytics")
    from model_oracle import reference_model, save_like_release

    path = save_like_release(reference_model("s", 80), tmp_path / "yolo11s.pt")
    with pytest.raises(
        WeightsMismatchError, match=r"yolo11s\.pt: loaded \d+ of 499 .*holds YOLO11-s weights"
    ):
        load_pretrained(YOLO11("n", 80), path)


@pytest.mark.parametrize(("model_class", "yaml", "task"), [
    ("SegmentationModel", "yolo11n-seg.yaml", "segmentation"),
    ("ClassificationModel", "yolo11n-cls.yaml", "classification"),
])  # fmt: skip
def test_reference_file_of_another_task_is_refused(
    tmp_path: Path, model_class: str, yaml: str, task: str
) -> None:
    tasks = pytest.importorskip("ultralytics.nn.tasks")
    from model_oracle import save_like_release

    path = save_like_release(getattr(tasks, model_class)(yaml, nc=80, verbose=False), tmp_path / "other.pt")
    with pytest.raises(
        WeightsMismatchError, match=rf"other\.pt.*holds a {task} model .*{model_class}.*not a detection"
    ):
        load_pretrained(YOLO11("n", 80), path)
    # For people who know: the backbone layers that fit are loaded, layer by layer.
    model = YOLO11("n", 80)
    loaded, _ = load_pretrained(model, path, strict=False)
    assert loaded > 100

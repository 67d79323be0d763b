"""notebooks/quickstart.ipynb runs top to bottom (tiny settings from QUICKSTART_* variables) and shows images."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import cv2
import numpy as np
import pytest

from yolo11_lightning.model_files.weights import save_weights

REPO = Path(__file__).resolve().parents[2]
NOTEBOOK = REPO / "notebooks" / "quickstart.ipynb"

TINY = {
    "QUICKSTART_IMAGE_SIZE": "64",
    "QUICKSTART_EPOCHS": "1",
    "QUICKSTART_BATCH_SIZE": "4",
    "QUICKSTART_WORKERS": "0",
    "QUICKSTART_TRAIN_IMAGES": "8",
    "QUICKSTART_VAL_IMAGES": "4",
    "QUICKSTART_LIMIT_BATCHES": "2",
}


def _tagged(notebook, tag: str):
    cells = [c for c in notebook.cells if tag in c.get("metadata", {}).get("tags", [])]
    assert len(cells) == 1, f"expected one cell tagged {tag!r}"
    return cells[0]


def test_quickstart_notebook_runs_and_shows_predictions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    from yolo11_lightning import YOLO11

    # "Pretrained" weights with 80 classes: the fine-tuning cell must re-initialise the class head for 3.
    pretrained = tmp_path / "pretrained80.pth"
    save_weights(YOLO11("n", 80), pretrained)
    workdir = tmp_path / "work"
    for key, value in {**TINY, "QUICKSTART_DIR": str(workdir), "QUICKSTART_WEIGHTS": str(pretrained)}.items():
        monkeypatch.setenv(key, value)  # the kernel inherits this process's environment
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # two shared cores: no thread oversubscription

    notebook = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(
        notebook, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute()  # raises CellExecutionError naming the cell on any error

    outputs = _tagged(notebook, "predictions").outputs
    pngs = [o["data"]["image/png"] for o in outputs if "image/png" in o.get("data", {})]
    assert len(pngs) == 1, "the prediction cell shows no image"
    grid = cv2.imdecode(np.frombuffer(base64.b64decode(pngs[0]), np.uint8), cv2.IMREAD_COLOR)
    assert grid is not None and grid.shape == (64, 4 * 64, 3)  # 4 validation images of 64 px in a row
    assert (workdir / "predictions" / "predictions.json").is_file()

    finetune_text = "".join(o.get("text", "") for o in _tagged(notebook, "finetune").outputs)
    assert "fine-tuned YOLO11n from" in finetune_text, finetune_text[-2000:]
    assert (workdir / "notebook.ckpt").is_file() and (workdir / "yolo11n_shapes.onnx").is_file()

    # The segmentation section: box and mask mAP printed, masks drawn, RLE in the COCO results.
    segment = _tagged(notebook, "segment").outputs
    text = "".join(o.get("text", "") for o in segment)
    assert "val/mask_mAP50-95" in text and "val/fitness" in text, text[-2000:]
    pngs = [o["data"]["image/png"] for o in segment if "image/png" in o.get("data", {})]
    assert len(pngs) == 1, "the segmentation cell shows no image"
    assert (workdir / "segment").is_dir() and list((workdir / "segment").rglob("best.ckpt"))
    results = json.loads((workdir / "seg_predictions" / "predictions.json").read_text())
    assert all("counts" in r["segmentation"] for r in results)

"""The task is set once (issue 28): ``--model.task``, a model config, a checkpoint or a weights file names it and
the data follows; or the dataset's files say it and the model follows. Contradictions, and a command on a split
the dataset lacks, are one line on stderr (``errors.UserInputError``), the same error in Python.

Cheap: 64 px synthetic polygons, a couple of steps, every CLI run in this process (the CLI's ``main``; the one-line
error of a real subprocess, exit code and no traceback, is tests/unit/cli/test_user_errors.py's).
"""

from __future__ import annotations

import csv
from pathlib import Path

import lightning as L
import pytest
import torch
import yaml
from cli_runs import REPO

from yolo11_lightning.cli.lightning_cli import run_lightning_cli
from yolo11_lightning.cli.main import main
from yolo11_lightning.data.sources.config import MissingSplitError
from yolo11_lightning.errors import UserInputError
from yolo11_lightning.model_files.weights import file_task, save_weights
from yolo11_lightning.tasks import create_model
from yolo11_lightning.tasks.resolution import TaskClaim, TaskError, resolve_task
from yolo11_lightning.training.datamodule import YOLODataModule
from yolo11_lightning.training.module import YOLO11Module

SMALL = [
    "--data.image_size", "64", "--data.batch_size", "2", "--data.num_workers", "0", "--data.pin_memory", "false",
    "--trainer.accelerator", "cpu", "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary",
    "false", "--trainer.num_sanity_val_steps", "0", "--model.log_images", "0",
]  # fmt: skip
FIT = ["--trainer.max_epochs", "1", "--trainer.limit_train_batches", "2", "--trainer.limit_val_batches", "1",
       "--trainer.log_every_n_steps", "1", "--model.optimizer", "SGD"]  # fmt: skip


@pytest.fixture(scope="module")
def polygons(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """8 train / 4 val images of polygon rows (YOLO-seg), no test split; beside it ``pose.yaml`` (kpt_shape)."""
    from yolo11_lightning.synthetic.shapes import make_synthetic_dataset

    path = make_synthetic_dataset(
        tmp_path_factory.mktemp("polygons"), num_train=8, num_val=4, image_size=64, task="segment"
    )
    pose = yaml.safe_load(path.read_text())
    pose["kpt_shape"] = [17, 3]
    (path.parent / "pose.yaml").write_text(yaml.safe_dump(pose))
    return path


@pytest.fixture(scope="module")
def seg_checkpoint(polygons: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``fit --model.task segment`` on the polygons, nothing else about the task; its ``last.ckpt``."""
    root = tmp_path_factory.mktemp("seg_fit")
    args = ["fit", "--model.task", "segment", "--data.dataset", str(polygons), *SMALL, *FIT,
            "--trainer.default_root_dir", str(root)]  # fmt: skip
    assert main(args) == 0
    (last,) = root.rglob("last.ckpt")
    return last


def one_line_error(args: list[str], capfd: pytest.CaptureFixture[str]) -> str:
    """The error line of the refused command ``args``: exit code 2, ``error: ...`` last on stderr (an exception
    would reach the test instead)."""
    capfd.readouterr()
    code = main(args)
    err = capfd.readouterr().err
    assert code == 2, err[-3000:]
    last = [line for line in err.splitlines() if line.strip()][-1]
    assert last.startswith("error: "), err[-3000:]
    return last.removeprefix("error: ")


# -- named once, the data follows -------------------------------------------------------------------------
def test_fit_model_task_segment_trains_on_segmentation_data(seg_checkpoint: Path) -> None:
    checkpoint = torch.load(seg_checkpoint, map_location="cpu", weights_only=True)
    assert checkpoint["hyper_parameters"]["task"] == "segment"
    assert checkpoint["datamodule_hyper_parameters"]["task"] == "segment"  # resolved, never None
    run = seg_checkpoint.parents[1]
    assert "task: segment" in (run / "config.yaml").read_text()
    logged = list(csv.DictReader((run / "metrics.csv").open()))
    assert any(row.get("train/seg_loss") for row in logged), "no mask loss: the batches were not segmentation"
    assert any(row.get("val/mask_mAP50-95") for row in logged)


def test_model_config_seg_with_polygons_and_no_data_task(polygons: Path, tmp_path: Path) -> None:
    config = REPO / "configs" / "model" / "yolo11n-seg.yaml"
    args = ["fit", "--config", str(config), "--data.dataset", str(polygons), *SMALL, "--trainer.max_steps", "1",
            "--trainer.limit_val_batches", "0", "--trainer.default_root_dir",
            str(tmp_path), "--model.optimizer", "SGD"]  # fmt: skip
    cli = run_lightning_cli(args)
    assert cli.model.task.name == "segment" and cli.datamodule.task == "segment"
    assert cli.trainer.global_step == 1
    batch = next(iter(cli.datamodule.val_dataloader()))
    assert "masks" in batch and "mask_overlap" in batch


def test_validate_takes_the_task_from_the_checkpoint(
    seg_checkpoint: Path, polygons: Path, tmp_path: Path
) -> None:
    args = ["validate", "--ckpt_path", str(seg_checkpoint), "--data.dataset", str(polygons), *SMALL,
            "--trainer.limit_val_batches", "1", "--trainer.default_root_dir",
            str(tmp_path)]  # fmt: skip
    cli = run_lightning_cli(args)
    assert cli.model.task.name == "segment" and cli.datamodule.task == "segment"
    assert "val/mask_mAP50-95" in cli.trainer.callback_metrics


def test_weights_file_names_the_task(polygons: Path, tmp_path: Path) -> None:
    weights = save_weights(create_model("n", 3, task="segment"), tmp_path / "seg.pth")
    assert file_task(weights) == "segment" and file_task(tmp_path / "missing.pth") is None
    module = YOLO11Module(weights=str(weights), num_classes=3)
    assert module.task.name == "segment" and module.hparams.task == "segment"
    # A named task wins: fine-tuning a detector from a segmentation file loads what fits, as before.
    detector = YOLO11Module(weights=str(weights), num_classes=3, task="detect", weights_strict=False)
    assert detector.task.name == "detect"

    args = ["validate", "--model.weights", str(weights), "--data.dataset", str(polygons), *SMALL,
            "--trainer.limit_val_batches", "1", "--trainer.default_root_dir",
            str(tmp_path)]  # fmt: skip
    cli = run_lightning_cli(args)
    assert cli.model.task.name == "segment" and cli.datamodule.task == "segment"
    assert "val/mask_mAP50-95" in cli.trainer.callback_metrics


def test_file_task_of_a_reference_state_dict(tmp_path: Path) -> None:
    """A reference-format state dict (``model.<i>.*`` keys): the Segment head's prototypes make it segmentation."""
    for task in ("detect", "segment"):
        ours = create_model("n", 2, task=task).state_dict()
        state = {
            (f"model.23.{k[5:]}" if k.startswith("head.") else f"model.{k[7:]}"): v for k, v in ours.items()
        }
        torch.save(state, tmp_path / f"{task}.pt")
        assert file_task(tmp_path / f"{task}.pt") == task


def test_reference_files_name_their_task(tmp_path: Path) -> None:
    """Release-format files (the reference's pickled model classes, read by our restricted unpickler)."""
    pytest.importorskip("ultralytics")
    from model_oracle import save_like_release
    from ultralytics.nn.tasks import PoseModel, SegmentationModel

    seg = save_like_release(SegmentationModel("yolo11n-seg.yaml", nc=3, verbose=False), tmp_path / "seg.pt")
    pose = save_like_release(PoseModel("yolo11n-pose.yaml", nc=1, verbose=False), tmp_path / "pose.pt")
    assert (file_task(seg), file_task(pose)) == ("segment", "pose")
    assert YOLO11Module(weights=str(seg), num_classes=3).task.name == "segment"
    assert YOLO11Module(weights=str(pose), num_classes=1).task.name == "pose"


# -- contradictions: one line, both sources -----------------------------------------------------------------
@pytest.mark.parametrize(
    ("options", "expected"),
    [
        (["--model.task", "detect", "--data.dataset", "{pose}"],
         r"model.task='detect' (--model.task) but data.dataset='{pose}' is a keypoint (pose) dataset"),
        (["--model.task", "segment", "--data.task", "detect", "--data.dataset", "{polygons}"],
         "model.task='segment' (--model.task) but data.task='detect' (--data.task)"),
    ],
    ids=["model-task-vs-pose-dataset", "model-task-vs-data-task"],
)  # fmt: skip
def test_contradictions_are_one_line(
    polygons: Path, tmp_path: Path, options: list[str], expected: str, capfd: pytest.CaptureFixture[str]
) -> None:
    where = {"pose": str(polygons.parent / "pose.yaml"), "polygons": str(polygons)}
    args = ["fit", *(o.format(**where) for o in options), *SMALL, "--trainer.default_root_dir", str(tmp_path)]
    line = one_line_error(args, capfd)
    assert line.startswith(expected.format(**where)), line
    assert not list(tmp_path.rglob("*.ckpt"))


def test_the_rule() -> None:
    seg, det = TaskClaim("segment", "a"), TaskClaim("detect", "b")
    pose = TaskClaim("pose", "data.dataset='p.yaml' is a keypoint (pose) dataset")
    assert resolve_task([]) == "detect" and resolve_task([], weights=seg) == "segment"
    assert resolve_task([det], weights=seg) == "detect"  # fine-tuning from another task's file
    assert resolve_task([seg, seg]) == "segment"
    with pytest.raises(TaskError, match=r"^a but b: "):
        resolve_task([seg, det])
    with pytest.raises(TaskError, match=r"^b but data.dataset='p.yaml' is a keypoint \(pose\) dataset"):
        resolve_task([det], dataset=pose)
    assert resolve_task([], dataset=pose) == "pose"
    depth = TaskClaim("depth", "a.pt holds a depth model")  # a task this package does not train is refused
    with pytest.raises(
        TaskError, match=r"a.pt holds a depth model: the depth task is not supported yet \(supported: detect"
    ):
        resolve_task([], weights=depth)
    assert issubclass(TaskError, UserInputError) and issubclass(TaskError, ValueError)


def test_an_image_folder_is_a_classification_dataset(tmp_path: Path) -> None:
    import cv2
    import numpy as np

    for name in ("cat", "dog"):
        (tmp_path / "train" / name).mkdir(parents=True)
        cv2.imwrite(str(tmp_path / "train" / name / "a.png"), np.zeros((8, 8, 3), np.uint8))
    data = YOLODataModule(dataset=str(tmp_path))
    assert (data.task, data.class_names) == ("classify", ["cat", "dog"])
    with pytest.raises(
        TaskError, match=r"data.task='detect' but data.dataset=.* is a classification dataset"
    ):
        YOLODataModule(dataset=str(tmp_path), task="detect")


# -- the data follows the model in Python --------------------------------------------------------------------
class BatchKeys(L.Callback):
    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.keys = set(batch)


def test_datamodule_without_task_follows_the_model(polygons: Path, tmp_path: Path) -> None:
    standalone = YOLODataModule(dataset=str(polygons), image_size=64, batch_size=2, num_workers=0)
    assert standalone.task is None and standalone.hparams.task is None
    standalone.setup("validate")  # no trainer: the dataset says nothing, so detection
    assert standalone.task == "detect" and "masks" not in next(iter(standalone.val_dataloader()))

    data = YOLODataModule(dataset=str(polygons), image_size=64, batch_size=2, num_workers=0, pin_memory=False)
    module = YOLO11Module(
        task="segment", num_classes=data.num_classes, optimizer="SGD", ema=False, log_images=0
    )
    probe = BatchKeys()
    trainer = L.Trainer(accelerator="cpu", max_steps=1, limit_val_batches=0, logger=False, callbacks=[probe],
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        default_root_dir=str(tmp_path))  # fmt: skip
    trainer.fit(module, datamodule=data)
    assert {"masks", "mask_overlap"} <= probe.keys
    assert data.task == "segment" and data.hparams.task == "segment"

    wrong = YOLODataModule(dataset=str(polygons), image_size=64, batch_size=2, num_workers=0, task="detect")
    with pytest.raises(TaskError, match=r"data.task='detect' but model.task='segment'"):
        L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False).validate(
            module, datamodule=wrong
        )


# -- a command on a split the dataset does not have -----------------------------------------------------------
def test_test_without_a_test_split(polygons: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    args = ["test", "--data.dataset", str(polygons), *SMALL, "--trainer.default_root_dir", str(tmp_path)]
    line = one_line_error(args, capfd)
    assert line == (
        f"{polygons} has no `test` split (defined: train, val); use `validate` to evaluate on val, or add "
        "`test:` to the yaml"
    )
    data = YOLODataModule(dataset=str(polygons), image_size=64, batch_size=2, num_workers=0)
    trainer = L.Trainer(
        accelerator="cpu", logger=False, enable_progress_bar=False, default_root_dir=str(tmp_path)
    )
    with pytest.raises(MissingSplitError) as raised:
        trainer.test(YOLO11Module(num_classes=data.num_classes, log_images=0), datamodule=data)
    assert str(raised.value) == line

    no_val = yaml.safe_load(polygons.read_text())
    no_val["test"] = no_val.pop("val")
    (polygons.parent / "no_val.yaml").write_text(yaml.safe_dump(no_val))
    data = YOLODataModule(dataset=str(polygons.parent / "no_val.yaml"))
    with pytest.raises(
        MissingSplitError, match=r"has no `val` split \(defined: train, test\); use `test` to"
    ):
        data.check_splits("validate")
    with pytest.raises(MissingSplitError, match="fit validates on it after each epoch"):
        data.check_splits("fit")
    data.check_splits("predict")  # predict reads test, else val (no error: a prediction is not a score)

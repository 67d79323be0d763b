"""The GPU presets as ``--print_config`` resolves them: loaders that feed the GPUs, the DDP options they choose.

A trainer preset carries ``data:`` keys too (LightningCLI merges every ``--config``, later files win); the
docs (docs/training.md) stack model, data, then trainer, so the preset's loader settings win over a data file's.
"""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml
from lightning.pytorch.utilities.rank_zero import rank_zero_only

from yolo11_lightning.cli.lightning_cli import run_lightning_cli
from yolo11_lightning.training.callbacks.machine import MachineSettings

REPO = Path(__file__).resolve().parents[3]
BF16_HOOK = "torch.distributed.algorithms.ddp_comm_hooks.default_hooks.bf16_compress_hook"


def resolved(args: list[str], capsys: pytest.CaptureFixture) -> dict:
    with pytest.raises(SystemExit) as exit_info:
        run_lightning_cli(["fit", *args, "--print_config"])
    out = capsys.readouterr().out
    assert exit_info.value.code in (0, None), out[-2000:]
    return yaml.safe_load(out)


@pytest.mark.parametrize("data", ["coco", "synthetic"])
@pytest.mark.parametrize("preset", ["gpu", "ddp_8gpu", "multinode"])
def test_gpu_presets_size_the_loaders_from_the_cores(
    preset: str, data: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.chdir(REPO)
    config = resolved(
        ["--config", "configs/model/yolo11s.yaml", "--config", f"configs/data/{data}.yaml",
         "--config", f"configs/trainer/{preset}.yaml"],
        capsys,
    )  # fmt: skip
    loaders = {k: config["data"][k] for k in ("num_workers", "pin_memory", "persistent_workers")}
    assert loaders == {"num_workers": "auto", "pin_memory": True, "persistent_workers": True}
    assert config["trainer"]["benchmark"] is True
    if preset != "gpu":  # DDP: no copy of rank 0's BatchNorm statistics before every forward
        strategy = config["trainer"]["strategy"]["init_args"]
        assert strategy["broadcast_buffers"] is False and strategy["ddp_comm_hook"] is None


def test_ethernet_adds_bf16_compression_and_keeps_the_multinode_strategy(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.chdir(REPO)
    stacked = ["--config", "configs/model/yolo11s.yaml", "--config", "configs/data/coco.yaml",
               "--config", "configs/trainer/multinode.yaml"]  # fmt: skip
    plain = resolved(stacked, capsys)["trainer"]["strategy"]
    compressed = resolved([*stacked, "--config", "trainer/ethernet"], capsys)["trainer"]["strategy"]
    assert compressed["class_path"] == plain["class_path"] == "lightning.pytorch.strategies.DDPStrategy"
    assert compressed["init_args"] == {**plain["init_args"], "ddp_comm_hook": BF16_HOOK}
    assert plain["init_args"]["timeout"] and plain["init_args"]["broadcast_buffers"] is False


@pytest.mark.parametrize(("preset", "per_gpu"), [("ddp_8gpu", 16), ("multinode", 16)])
def test_ddp_presets_give_each_gpu_16_images_over_a_data_files_batch(
    preset: str, per_gpu: int, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """The GLOBAL batch of a data file (coco.yaml: 64) would leave 8 or 4 images per GPU: the preset, stacked
    after it, sets the global batch for its GPUs."""
    monkeypatch.chdir(REPO)
    config = resolved(
        ["--config", "configs/model/yolo11s.yaml", "--config", "configs/data/coco.yaml",
         "--config", f"configs/trainer/{preset}.yaml"],
        capsys,
    )  # fmt: skip
    world = config["trainer"]["devices"] * config["trainer"]["num_nodes"]
    assert config["data"]["batch_size"] == per_gpu * world


def _gpu_fit_trainer(batch: int, devices: int, nodes: int = 1, device: str = "cuda") -> SimpleNamespace:
    """What ``MachineSettings.setup`` reads of a Trainer on ``devices`` x ``nodes`` GPUs (no GPU needed)."""
    return SimpleNamespace(
        strategy=SimpleNamespace(
            root_device=torch.device(device, 0) if device == "cuda" else torch.device(device)
        ),
        datamodule=SimpleNamespace(batch_size=batch, num_workers=0),
        num_devices=devices,
        num_nodes=nodes,
    )


def _said(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "per GPU" in r.getMessage()]


def test_a_gpu_run_below_8_images_per_gpu_says_so_once_naming_the_option(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``fit --trainer.devices 8`` with the default global batch 16: 2 images per GPU, one line on rank 0."""
    settings = MachineSettings(cpu_threads=None)
    with caplog.at_level(logging.INFO):
        settings.setup(_gpu_fit_trainer(16, 8), None, "fit")
    assert len(_said(caplog)) == 1, caplog.text
    line = _said(caplog)[0]
    assert "2 image(s) per GPU" in line and "data.batch_size=16" in line and "--data.batch_size 128" in line
    caplog.clear()
    with caplog.at_level(logging.INFO):
        settings.setup(_gpu_fit_trainer(16, 8), None, "validate")  # validation batches do not train
        settings.setup(_gpu_fit_trainer(64, 8), None, "fit")  # 8 per GPU
        settings.setup(_gpu_fit_trainer(256, 8, nodes=2), None, "fit")  # multinode.yaml: 16 per GPU
        settings.setup(_gpu_fit_trainer(16, 2, device="meta"), None, "fit")  # not a GPU
    assert _said(caplog) == [], caplog.text


def test_the_few_images_line_is_rank_zeros_only(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(rank_zero_only, "rank", 3)
    with caplog.at_level(logging.INFO):
        MachineSettings(cpu_threads=None).setup(_gpu_fit_trainer(16, 8), None, "fit")
    assert _said(caplog) == [], caplog.text

"""The GPU presets as ``--print_config`` resolves them: loaders that feed the GPUs, the DDP options they choose.

A trainer preset carries ``data:`` keys too (LightningCLI merges every ``--config``, later files win); the
docs (docs/training.md) stack model, data, then trainer, so the preset's loader settings win over a data file's.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from yolo11_lightning.training.lightning_cli import run_lightning_cli

REPO = Path(__file__).resolve().parents[1]
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

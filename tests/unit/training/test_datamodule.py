"""YOLODataModule: global batch split over devices, class names at init, sampler state in checkpoints."""

from __future__ import annotations

import os
from types import SimpleNamespace

import lightning as L
import numpy as np
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from yolo11_lightning.data.sampling.sampler import ElasticDistributedSampler, ShardedEvalSampler, epoch_order
from yolo11_lightning.training.datamodule import YOLODataModule

os.environ.setdefault("WANDB_MODE", "offline")


def make_dm(folder, **kwargs) -> YOLODataModule:
    options = {
        "dataset": "synthetic",
        "synthetic_dir": str(folder),
        "synthetic_train": 16,
        "synthetic_val": 6,
        "synthetic_image_size": 64,
        "image_size": 64,
        "batch_size": 8,
        "num_workers": 0,
        "pin_memory": False,
    }
    return YOLODataModule(**{**options, **kwargs})


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    folder = tmp_path_factory.mktemp("synthetic")
    make_dm(folder).prepare_data()
    return folder


def test_global_batch_8_on_2_devices_is_4_per_device_and_3_devices_is_an_error(synthetic):
    dm = make_dm(synthetic)
    dm.trainer = SimpleNamespace(world_size=2, global_rank=1, num_devices=2)
    dm.setup("fit")
    assert dm.per_device_batch_size == 4
    loader = dm.train_dataloader()
    assert loader.batch_size == 4 and isinstance(loader.sampler, ElasticDistributedSampler)
    assert loader.sampler.num_replicas == 2 and loader.sampler.rank == 1
    batch = next(iter(loader))
    assert batch["images"].shape == (4, 3, 64, 64) and batch["images"].dtype == torch.uint8
    val = dm.val_dataloader()
    assert isinstance(val.sampler, ShardedEvalSampler) and len(val.sampler) == 3  # 6 images over 2 ranks

    dm3 = make_dm(synthetic)
    dm3.trainer = SimpleNamespace(world_size=3, global_rank=0, num_devices=3)
    with pytest.raises(ValueError, match=r"batch_size=8 is the GLOBAL batch.*world size 3"):
        dm3.setup("fit")


def test_class_names_are_known_right_after_init(synthetic):
    dm = make_dm(synthetic, synthetic_classes=3)
    assert dm.num_classes == 3 and dm.class_names == ["rectangle", "ellipse", "triangle"]
    from_yaml = YOLODataModule(dataset=str(synthetic / "data.yaml"))
    assert from_yaml.class_names == dm.class_names
    with pytest.raises(ValueError, match="multiple of 32"):
        make_dm(synthetic, image_size=100)


def test_state_dict_round_trip_restores_the_position_before_the_sampler_exists(synthetic):
    dm = make_dm(synthetic)
    dm.setup("fit")
    sampler = dm.train_dataloader().sampler
    sampler.set_epoch(3)
    sampler.set_consumed_samples(8)
    state = dm.state_dict()
    assert state == {"train_sampler": {"epoch": 3, "consumed_samples": 8, "seed": 0, "num_samples": 16}}

    resumed = make_dm(synthetic)
    resumed.load_state_dict(state)  # Lightning restores the datamodule before creating loaders
    assert resumed.state_dict() == state
    resumed.trainer = SimpleNamespace(world_size=2, global_rank=0, num_devices=2)
    resumed.setup("fit")
    loader = resumed.train_dataloader()
    assert loader.sampler.state_dict() == state["train_sampler"]
    # Rank 0 of 2 takes positions 8, 10, 12, 14 of epoch 3's order: one per-device batch of 4.
    (batch,) = list(loader)
    expected = ElasticDistributedSampler(range(16), 8, seed=0)
    expected.set_epoch(3)
    assert batch["indices"].tolist() == [i for _, i in expected][8::2]
    # Loading into an existing sampler also survives the loader being created again.
    resumed.load_state_dict(state)
    assert resumed.train_dataloader().sampler.state_dict() == state["train_sampler"]


def test_close_mosaic_epoch_reaches_the_train_dataset(synthetic):
    dm = make_dm(synthetic)
    dm.set_close_mosaic_epoch(5)
    dm.setup("fit")
    assert dm.datasets["train"].mosaic_until_epoch == 5 and dm.datasets["val"].mosaic_until_epoch is None
    dm.set_close_mosaic_epoch(2)
    assert dm.datasets["train"].mosaic_until_epoch == 2


def test_mosaic_partners_modes_reach_the_dataset(synthetic):
    """Default ``recent``: the global batch and 3 earlier ones; ``dataset``: any image; ``batch``: the batch."""
    from yolo11_lightning.data.sampling.partner_pools import pool_positions
    from yolo11_lightning.data.sampling.sampler import epoch_order

    dm = make_dm(synthetic)
    dm.setup("fit")
    recent = dm.datasets["train"]
    assert dm.mosaic_partners == "recent" and recent.partner_batches == 4
    assert recent.decode_cache_size == (24 + 2) * 8  # 0 workers, 8 images per batch
    order = epoch_order(16, 0, 1, 8)  # 16 images, global batch 8: 2 global batches, one pool
    for position, index in enumerate(order.tolist()):
        expected = order[pool_positions(position, 8, 1, 4, 2)]
        assert sorted(recent.partner_pool(1, index).tolist()) == sorted(expected.tolist())

    anywhere = make_dm(synthetic, mosaic_partners="dataset")
    anywhere.setup("fit")
    train = anywhere.datasets["train"]
    assert train.partner_pool(1, 3) is None  # any index
    picked = {p for i in range(16) for p in train._picker(1, i)(np.random.default_rng(i), 3)}
    assert len(picked) > 8, "partners from the whole set reach more than one batch's 8 images"

    batched = make_dm(synthetic, mosaic_partners="batch")
    batched.setup("fit")
    first = set(order[:8].tolist())  # epoch 1's first global batch
    for index in first:
        assert set(batched.datasets["train"].partner_pool(1, index).tolist()) <= first
    with pytest.raises(
        ValueError, match=r"mosaic_partners must be one of \('recent', 'dataset', 'batch'\), got 'rank'"
    ):
        make_dm(synthetic, mosaic_partners="rank")


@pytest.mark.parametrize(
    ("close_mosaic", "max_epochs", "expected"), [(3, 10, 7), (20, 10, 0), (0, 10, None), (3, -1, None)]
)
def test_close_mosaic_is_resolved_from_max_epochs_in_setup(synthetic, close_mosaic, max_epochs, expected):
    dm = make_dm(synthetic, close_mosaic=close_mosaic)
    dm.trainer = SimpleNamespace(max_epochs=max_epochs)  # no strategy: a single process
    dm.setup("fit")
    assert dm.datasets["train"].mosaic_until_epoch == expected
    assert dm.datasets["val"].mosaic_until_epoch is None


class IndexRecorder(L.LightningModule):
    """A one-parameter model that records which dataset indices each step trained on."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))
        self.seen: list[int] = []

    def training_step(self, batch, batch_idx):
        assert isinstance(self.trainer.train_dataloader.sampler, ElasticDistributedSampler)
        self.seen += batch["indices"].tolist()
        return (self.w - batch["images"].float().mean()).pow(2)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)


QUIET_CPU_TRAINER = {
    "accelerator": "cpu",
    "logger": False,
    "enable_progress_bar": False,
    "enable_model_summary": False,
}


def test_lightning_mid_epoch_checkpoint_resumes_with_the_rest_of_the_epoch(synthetic, tmp_path):
    first = IndexRecorder()
    saver = ModelCheckpoint(tmp_path, every_n_train_steps=1, save_top_k=-1)  # saves in on_train_batch_end
    trainer = L.Trainer(max_steps=1, callbacks=[saver], **QUIET_CPU_TRAINER)
    trainer.fit(first, datamodule=make_dm(synthetic, num_workers=2))
    (ckpt,) = tmp_path.glob("*.ckpt")
    state = torch.load(ckpt, weights_only=True)["YOLODataModule"]["train_sampler"]
    assert state == {"epoch": 0, "consumed_samples": 8, "seed": 0, "num_samples": 16}, "one global batch of 8"

    second = IndexRecorder()
    # Workers start (and draw indices) before Lightning calls set_epoch: the restored position must hold.
    resumed = L.Trainer(max_epochs=2, enable_checkpointing=False, **QUIET_CPU_TRAINER)
    resumed.fit(second, datamodule=make_dm(synthetic, num_workers=2), ckpt_path=ckpt)
    epoch0 = first.seen + second.seen[:8]
    assert sorted(epoch0) == list(range(16)), "the resumed epoch skipped or repeated samples"
    assert sorted(second.seen[8:]) == list(range(16)) and second.seen[8:] != epoch0


def test_lightning_end_of_epoch_checkpoint_resumes_with_the_next_epochs_order(synthetic, tmp_path):
    first = IndexRecorder()
    L.Trainer(max_epochs=1, callbacks=[ModelCheckpoint(tmp_path)], **QUIET_CPU_TRAINER).fit(
        first, datamodule=make_dm(synthetic, num_workers=2)
    )
    (ckpt,) = tmp_path.glob("*.ckpt")
    second = IndexRecorder()
    L.Trainer(max_epochs=2, enable_checkpointing=False, **QUIET_CPU_TRAINER).fit(
        second, datamodule=make_dm(synthetic, num_workers=2), ckpt_path=ckpt
    )
    assert first.seen == epoch_order(16, 0, 0, 8).tolist()
    assert second.seen == epoch_order(16, 0, 1, 8).tolist(), "epoch 1 must follow its own (seed, epoch) order"


def test_every_init_argument_is_a_cli_option(synthetic):
    jsonargparse = pytest.importorskip("jsonargparse")
    parser = jsonargparse.ArgumentParser()
    parser.add_class_arguments(YOLODataModule, "data")
    cfg = parser.parse_args(
        [
            "--data.dataset=synthetic",
            f"--data.synthetic_dir={synthetic}",
            "--data.batch_size=32",
            "--data.mosaic=0.5",
        ]
    )
    instantiate = getattr(parser, "instantiate", None) or parser.instantiate_classes  # renamed in 4.49
    dm = instantiate(cfg).data
    assert dm.batch_size == 32 and dm.aug.mosaic == 0.5 and dm.num_classes == 3


def test_eval_stages_use_letterboxed_splits(synthetic):
    dm = make_dm(synthetic)
    dm.setup("predict")  # no test split in the synthetic dataset: predict reads val
    batch = next(iter(dm.predict_dataloader()))
    assert batch["images"].shape == (6, 3, 64, 64)  # the 6 val images, per-device batch 8
    assert not torch.isnan(batch["scales"]).any()
    with pytest.raises(ValueError, match=r"has no `test` split \(defined: train, val\); use `validate`"):
        dm.setup("test")


def test_cache_images_gives_the_same_batches(synthetic):
    plain, cached = make_dm(synthetic), make_dm(synthetic, cache_images=True)
    for dm in (plain, cached):
        dm.setup("fit")
    assert cached.datasets["train"].image_cache is not None and plain.datasets["train"].image_cache is None
    for name in ("train_dataloader", "val_dataloader"):
        a, b = next(iter(getattr(plain, name)())), next(iter(getattr(cached, name)()))
        assert torch.equal(a["images"], b["images"]) and torch.equal(a["targets"], b["targets"])


def test_rect_validation_batches_same_with_0_and_2_workers_and_a_cache(tmp_path):
    """Rectangular validation: the same images, pixels and shapes per batch whatever the worker count, and
    from the RAM image cache (sized by the evaluation resize, which rounds the short side up)."""
    from validation_oracle import write_dataset

    yaml = write_dataset(tmp_path / "non_square")
    batches = []
    for workers, cache in ((0, False), (2, False), (0, True)):
        dm = YOLODataModule(
            dataset=str(yaml), batch_size=4, image_size=64, num_workers=workers, pin_memory=False,
            cache_images=cache,
        )  # fmt: skip
        dm.setup("validate")
        batches.append(list(dm.val_dataloader()))
    assert len(batches[0]) == 3 and len({tuple(b["images"].shape[-2:]) for b in batches[0]}) == 3
    for other in batches[1:]:
        for a, b in zip(batches[0], other, strict=True):
            assert a["paths"] == b["paths"]
            torch.testing.assert_close(a["images"], b["images"], rtol=0, atol=0)
            torch.testing.assert_close(a["targets"], b["targets"], rtol=0, atol=0)

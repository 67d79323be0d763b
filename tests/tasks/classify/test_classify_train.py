"""Classification training: the loss scale (the reference's mean cross-entropy), top-1/top-5 against the oracle's
validator, and the CLI: a 2-rank fit cut mid-epoch and resumed on 1 rank, exactly (``cli_runs``)."""

from __future__ import annotations

import csv
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from cli_runs import check_resume_two_ranks_to_one, fit_args, fit_here, load
from torch import nn

from yolo11_lightning.tasks import create_model, get_task
from yolo11_lightning.tasks.classify.loss import ClassificationLoss
from yolo11_lightning.tasks.classify.metric import ClassificationAccuracy
from yolo11_lightning.training.callbacks.recipe import LoopRecipe

CLASSIFY = ["--model.task", "classify"]


def _frozen_model(nc: int = 5) -> nn.Module:
    torch.manual_seed(0)
    model = create_model("n", nc, task="classify").train()
    for m in model.modules():  # batch statistics of a half batch are not the whole batch's: frozen
        if isinstance(m, nn.BatchNorm2d):
            m.eval()
    return model


def _gradients(model: nn.Module) -> torch.Tensor:
    grads = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    model.zero_grad(set_to_none=True)
    return grads


@pytest.mark.parametrize("world", [1, 2])
def test_gradient_equals_the_reference_mean_cross_entropy_on_any_world_size(world: int) -> None:
    """Each of ``world`` ranks holds its share of 6 images; its loss (normaliser summed over ranks) times
    ``LoopRecipe.loss_scale`` (the classify task's factor: 1, not the batch), then DDP's mean of the ranks'
    gradients: the reference's gradient of ``v8ClassificationLoss`` on the whole batch in one process."""
    from ultralytics.utils.loss import v8ClassificationLoss

    model = _frozen_model()
    images = torch.rand(6, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    labels = torch.tensor([0, 4, 2, 2, 1, 3])
    v8ClassificationLoss()(model(images), {"cls": labels})[0].backward()
    expected = _gradients(model)

    shares = [slice(r * 6 // world, (r + 1) * 6 // world) for r in range(world)]
    with torch.no_grad():  # what the step exchange sums over ranks: [images, sum of cross-entropies]
        ce = nn.functional.cross_entropy(model(images), labels, reduction="none")
        summed = torch.stack([torch.tensor(6.0), ce.sum()])
    trainer = SimpleNamespace(world_size=world, accumulate_grad_batches=1)
    total = torch.zeros_like(expected)
    for share in shares:
        loss, items = ClassificationLoss(sum_over_ranks=lambda local: summed)(
            model(images[share]), labels[share]
        )
        scale = LoopRecipe().loss_scale(trainer, len(labels[share]), get_task("classify"))
        (loss * scale).backward()
        total += _gradients(model)
        assert items.item() == pytest.approx(ce.mean().item(), rel=1e-6)
    torch.testing.assert_close(total / world, expected, rtol=1e-5, atol=1e-7)
    # Detection's factor stays the global batch.
    assert LoopRecipe().loss_scale(trainer, 3, get_task("detect")) == 3 * world * world


def _predictions(n: int, nc: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, nc, generator=g)
    labels = torch.where(
        torch.rand(n, generator=g) < 0.4, logits.argmax(1), torch.randint(nc, (n,), generator=g)
    )
    return logits.softmax(1), labels


@pytest.mark.parametrize("nc", [3, 10])
def test_top1_top5_equal_the_oracle_validator_and_torchmetrics(nc: int) -> None:
    from torchmetrics.classification import MulticlassAccuracy
    from ultralytics.utils.metrics import ClassifyMetrics

    probs, labels = _predictions(37, nc, seed=nc)
    ours = ClassificationAccuracy()
    for chunk in range(0, 37, 8):
        ours.update(
            probs[chunk : chunk + 8], labels[chunk : chunk + 8], torch.arange(chunk, min(chunk + 8, 37))
        )
    got = ours.compute()
    oracle = ClassifyMetrics()  # what ClassificationValidator does with its top-min(5, nc) predictions
    oracle.process([labels.int()], [probs.argsort(1, descending=True)[:, : min(5, nc)].int()])
    assert got["top1"].item() == pytest.approx(oracle.top1, abs=1e-7)
    assert got["top5"].item() == pytest.approx(oracle.top5, abs=1e-7)
    assert got["fitness"].item() == pytest.approx(oracle.fitness, abs=1e-7)
    assert 0 < oracle.top1 < oracle.top5 <= 1
    for k in (1, 5):
        tm = MulticlassAccuracy(nc, top_k=min(k, nc), average="micro")(probs, labels).item()
        assert got[f"top{k}"].item() == pytest.approx(tm, abs=1e-7)
    ce = nn.functional.nll_loss(probs.log(), labels).item()
    assert got["loss"].item() == pytest.approx(ce, rel=1e-6)


def test_distributed_accuracy_equals_single_process_with_unpadded_shards() -> None:
    """Rank 0 holds 19 images, rank 1 holds 18: the gathered states give the single-process values (the gather
    is torchmetrics' ``_sync_dist`` with the collective replaced by its result, as in test_segment_module)."""
    probs, labels = _predictions(37, 7, seed=0)
    single = ClassificationAccuracy()
    single.update(probs, labels, torch.arange(37))
    expected = single.compute()
    rank0, rank1 = ClassificationAccuracy(), ClassificationAccuracy()
    order = torch.randperm(37, generator=torch.Generator().manual_seed(2))  # a rank's shard is not contiguous
    for metric, part in ((rank0, order[:19]), (rank1, order[19:])):
        metric.update(probs[part], labels[part], part)
    sent: list[torch.Tensor] = []
    rank1._sync_dist(lambda t, group=None: sent.append(t) or [t])
    rank0._sync_dist(lambda t, group=None: [t, sent.pop(0)])
    gathered = rank0.compute()
    for key in ("top1", "top5", "fitness", "loss"):
        assert gathered[key] == expected[key], key


# -- the CLI: 2 ranks, resume on 1 ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cls_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """16 train / 7 val images of 64 px (the tiny run's sizes), 3 classes, as an ImageFolder root."""
    from yolo11_lightning.synthetic.classes import make_classes_dataset

    root = tmp_path_factory.mktemp("tiny_classify")
    make_classes_dataset(root, num_train=16, num_val=7, image_size=64, num_classes=3)
    return root


@pytest.fixture(scope="module")
def cls_uninterrupted(cls_dataset: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("cls_uninterrupted")
    fit_here(fit_args(cls_dataset, root, "rec", "--ckpt_path", "last", *CLASSIFY))
    return root


def test_classify_resume_two_ranks_to_one_is_exact(
    cls_dataset: Path, cls_uninterrupted: Path, tmp_path: Path
) -> None:
    """The tiny run on the ImageFolder root (the task from the folder and from ``--model.task``): 2 gloo ranks
    cut mid-epoch (the shards of 7 validation images unpadded, 4 and 3), resumed on 1: the uninterrupted run's
    final state."""
    final = check_resume_two_ranks_to_one(cls_dataset, cls_uninterrupted, tmp_path, *CLASSIFY)
    assert final["hyper_parameters"]["task"] == "classify"
    assert final["hyper_parameters"]["class_names"] == ["ellipse", "rectangle", "triangle"]  # sorted folders
    # Epoch 0 was validated on the 2 ranks (shards of 4 and 3 images): the 1-rank run's numbers.
    two = _validations(next(p for p in tmp_path.rglob("metrics.csv") if "version_0" in str(p)))
    one = _validations(next(cls_uninterrupted.rglob("metrics.csv")))
    assert two[0]["val/top1"] == one[0]["val/top1"] and two[0]["val/top5"] == one[0]["val/top5"]
    assert two[0]["val/loss"] == pytest.approx(one[0]["val/loss"], rel=1e-5)


def _validations(metrics_csv: Path) -> dict[int, dict[str, float]]:
    rows = [r for r in csv.DictReader(metrics_csv.open()) if r.get("val/top1")]
    return {int(r["epoch"]): {k: float(v) for k, v in r.items() if k.startswith("val/") and v} for r in rows}


def test_classify_best_checkpoint_follows_top1_top5_fitness(cls_uninterrupted: Path) -> None:
    (best,) = cls_uninterrupted.rglob("best.ckpt")
    states = load(best)["callbacks"]
    (key,) = [k for k in states if k.startswith("BestCheckpoint")]
    assert "'monitor': 'val/fitness'" in key, key
    (metrics_csv,) = cls_uninterrupted.rglob("metrics.csv")
    rows = [r for r in csv.DictReader(metrics_csv.open()) if r.get("val/fitness")]
    assert len(rows) == 2
    for r in rows:
        top1, top5 = float(r["val/top1"]), float(r["val/top5"])
        assert float(r["val/fitness"]) == pytest.approx((top1 + top5) / 2, abs=1e-6)
        assert top5 == 1.0  # 3 classes: the label is always among the top 5
        assert float(r["val/loss"]) > 0 and float(r["train/cls_loss"] or 1) > 0
    assert float(states[key]["best_model_score"]) == pytest.approx(max(float(r["val/fitness"]) for r in rows))


def test_kept_evaluation_gives_the_confusion_matrix_and_summary_rows() -> None:
    """With ``keep_evaluation`` (result pictures, closing summary) the metric keeps labels and top-1 classes; the
    task turns them into images per class and the ``[predicted, true]`` confusion matrix, drawn and tabled by the
    detection tasks' code."""
    from yolo11_lightning.plots.evaluation import confusion_matrix_image
    from yolo11_lightning.training.callbacks.closing_summary import class_rows

    probs, labels = _predictions(37, 4, seed=3)
    metric = ClassificationAccuracy()
    metric.keep_evaluation = True
    metric.update(probs, labels, torch.arange(37))
    top1 = metric.compute()["top1"].item()
    names = ["a", "b", "c", "d"]
    results = get_task("classify").class_results(metric.evaluation, names)
    expected = torch.zeros(5, 5, dtype=torch.int64)
    expected.index_put_((probs.argmax(1), labels), torch.ones(37, dtype=torch.int64), accumulate=True)
    assert (results.confusion == expected.numpy()).all() and results.num_images == 37
    assert results.confusion.trace() == round(top1 * 37)
    rows = class_rows(results)
    assert [r["class"] for r in rows] == ["all", *names] and rows[0]["images"] == 37
    # The table in the task's terms: top-1 and top-5 accuracy overall and per class (its images' share).
    assert rows[0]["top1_acc"] == pytest.approx(top1) and rows[0]["top5_acc"] == pytest.approx(1.0)
    for c, row in enumerate(rows[1:]):
        own = labels == c
        assert row["top1_acc"] == pytest.approx(float((probs.argmax(1)[own] == c).float().mean()))
    assert confusion_matrix_image(results.confusion, names, normalize=True).ndim == 3

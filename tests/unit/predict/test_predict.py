"""``yolo11-lightning predict --source``: folders with a bad file, videos, options, errors, CLI routing."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch

from yolo11_lightning import YOLO11
from yolo11_lightning.cli.main import main as cli_main
from yolo11_lightning.data.augment.transforms import letterbox
from yolo11_lightning.data.images.io import read_image
from yolo11_lightning.model_files.weights import load_model, save_weights
from yolo11_lightning.ops.postprocess import letterbox_to_original, non_max_suppression
from yolo11_lightning.predict.sources import SkippedSourceWarning

# An untrained detector scores everything near its class prior (~1e-3 at 64 px); a low threshold still yields
# boxes, so drawing, NMS and the json all have work to do.
CONF = "0.0005"


@pytest.fixture(scope="module")
def weights(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("predict_weights") / "tiny.pth"
    save_weights(YOLO11("n", 3, names=["rectangle", "ellipse", "triangle"]), path)
    return path


def _images(tiny_dataset: Path, count: int) -> list[Path]:
    return sorted((tiny_dataset.parent / "images" / "val").glob("*.png"))[:count]


def _run(*args: str) -> int:
    return cli_main(["predict", *args, "--device", "cpu", "--image-size", "64"])


def test_folder_with_a_corrupt_image(tiny_dataset: Path, weights: Path, tmp_path: Path, capsys) -> None:
    source = tmp_path / "in"
    source.mkdir()
    good = [Path(shutil.copy(p, source)) for p in _images(tiny_dataset, 3)]
    (source / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 definitely not a JPEG")
    (source / "notes.txt").write_text("not an image: ignored, not reported")
    out = tmp_path / "out"
    with pytest.warns(SkippedSourceWarning, match=r"broken\.jpg: skipped"):
        code = _run("--ckpt_path", str(weights), "--source", str(source), "--out", str(out), "--conf", CONF,
                    "--batch-size", "2")  # fmt: skip
    assert code == 2  # the others are written, but an input failed
    assert "broken.jpg: truncated JPEG" in capsys.readouterr().err  # with the reason
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [*(p.name for p in good), "predictions.json", "predictions.jsonl"]
    )
    results = json.loads((out / "predictions.json").read_text())
    assert results, "no detection at all: the test threshold is too high"
    for path in good:
        original, drawn = read_image(str(path)), read_image(str(out / path.name))
        assert drawn.shape == original.shape
        rows = [r for r in results if r["file_name"] == path.name]
        assert rows and not np.array_equal(drawn, original)  # boxes were drawn
        h, w = original.shape[:2]
        for r in rows:
            x, y, bw, bh = r["bbox"]
            assert 0 <= x <= x + bw <= w and 0 <= y <= y + bh <= h
            assert r["category_name"] == ["rectangle", "ellipse", "triangle"][r["category_id"]]
            assert r["score"] >= float(CONF)
    assert {r["file_name"] for r in results} <= {p.name for p in good}
    assert len({r["image_id"] for r in results}) == len(good)


def test_options_reach_the_postprocessing(tiny_dataset: Path, weights: Path, tmp_path: Path) -> None:
    """The json equals letterbox -> model -> NMS(conf, iou, max_det) -> original pixels, done by hand."""
    image_path = _images(tiny_dataset, 1)[0]
    out = tmp_path / "out"
    assert _run("--ckpt_path", str(weights), "--source", str(image_path), "--out", str(out), "--conf", CONF,
                "--iou", "0.5", "--max-det", "3", "--no-save") == 0  # fmt: skip
    results = json.loads((out / "predictions.json").read_text())
    assert sorted(p.name for p in out.iterdir()) == ["predictions.json", "predictions.jsonl"]  # --no-save

    model = load_model(weights)
    rgb = read_image(str(image_path))
    boxed, scale, pad = letterbox(rgb, 64, scaleup=True)
    x = torch.from_numpy(boxed.transpose(2, 0, 1).copy())[None].float() / 255
    with torch.no_grad():
        (det,) = non_max_suppression(
            model(x), conf_threshold=float(CONF), iou_threshold=0.5, max_detections=3
        )
    det[:, :4] = letterbox_to_original(det[:, :4], scale, torch.tensor(pad, dtype=torch.float32),
                                       torch.tensor(rgb.shape[:2]))  # fmt: skip
    assert len(results) == len(det) == 3
    for row, (x1, y1, x2, y2, score, cls) in zip(results, det.tolist()):
        assert row["category_id"] == int(cls) and row["score"] == pytest.approx(score, abs=1e-5)
        assert row["bbox"] == pytest.approx([x1, y1, x2 - x1, y2 - y1], abs=2e-3)


def test_video_frames_in_order(tiny_dataset: Path, weights: Path, tmp_path: Path) -> None:
    video = tmp_path / "clip.mp4"
    frames = [cv2.resize(read_image(str(p)), (96, 64)) for p in _images(tiny_dataset, 5)]
    writer = cv2.VideoWriter(str(video), cv2.VideoWriter_fourcc(*"mp4v"), 10.0, (96, 64))
    if not writer.isOpened():
        pytest.skip("this OpenCV build cannot write mp4v video")
    for frame in frames:
        writer.write(cv2.cvtColor(frame, cv2.COLOR_RGB2BGR))
    writer.release()
    out = tmp_path / "out"
    # Two workers and batches of 2: the video still comes out whole and in order.
    assert _run("--ckpt_path", str(weights), "--source", str(video), "--out", str(out), "--conf", CONF,
                "--batch-size", "2", "--num-workers", "2") == 0  # fmt: skip
    capture = cv2.VideoCapture(str(out / "clip.mp4"))
    size = (capture.get(cv2.CAP_PROP_FRAME_WIDTH), capture.get(cv2.CAP_PROP_FRAME_HEIGHT))
    count = 0
    while capture.read()[0]:
        count += 1
    capture.release()
    assert size == (96, 64) and count == len(frames)
    results = json.loads((out / "predictions.json").read_text())
    assert {r["frame"] for r in results} == set(range(len(frames)))
    assert all(r["file_name"] == "clip.mp4" for r in results)


def test_clear_errors(tiny_dataset: Path, weights: Path, tmp_path: Path, capsys) -> None:
    image = str(_images(tiny_dataset, 1)[0])
    assert (
        _run("--ckpt_path", str(weights), "--source", str(tmp_path / "nowhere"), "--out", str(tmp_path)) == 1
    )
    assert "source not found" in capsys.readouterr().err
    assert _run("--ckpt_path", str(tmp_path / "none.ckpt"), "--source", image, "--out", str(tmp_path)) == 1
    assert "none.ckpt" in capsys.readouterr().err
    (tmp_path / "table.csv").write_text("a,b\n")
    assert (
        _run("--ckpt_path", str(weights), "--source", str(tmp_path / "table.csv"), "--out", str(tmp_path))
        == 1
    )
    assert "table.csv: not an image or video" in capsys.readouterr().err
    shutil.copy(image, tmp_path / "in_place.png")
    assert _run("--ckpt_path", str(weights), "--source", str(tmp_path), "--out", str(tmp_path)) == 1
    assert "would overwrite the input" in capsys.readouterr().err
    bad = tmp_path / "all_bad"
    bad.mkdir()
    (bad / "a.png").write_bytes(b"\x89PNG\r\n\x1a\n truncated")
    with pytest.warns(SkippedSourceWarning, match=r"a\.png"):
        assert _run("--ckpt_path", str(weights), "--source", str(bad), "--out", str(tmp_path / "o")) == 1
    assert "no input could be read" in capsys.readouterr().err


def test_predict_routing(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    """With --source (or only --help): the utility; otherwise LightningCLI's predict, untouched."""
    import yolo11_lightning.cli.lightning_cli as training_cli

    seen: list[list[str]] = []
    monkeypatch.setattr(training_cli, "run_lightning_cli", lambda args: seen.append(list(args)))
    assert cli_main(["predict", "--config", "c.yaml", "--ckpt_path", "x.ckpt"]) == 0
    assert seen == [["predict", "--config", "c.yaml", "--ckpt_path", "x.ckpt"]]
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["predict", "--help"])
    assert exit_info.value.code == 0
    help_text = capsys.readouterr().out
    assert "--source" in help_text and "LightningCLI" in help_text
    cli_main(["--help"])
    assert "predict --source" in capsys.readouterr().out


def _write_video(path: Path, frames: list[np.ndarray], fourcc: str) -> None:
    height, width = frames[0].shape[:2]
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*fourcc), 10.0, (width, height))
    if not writer.isOpened():
        pytest.skip(f"this OpenCV build cannot write {fourcc} video")
    for frame in frames:
        writer.write(cv2.cvtColor(frame, cv2.COLOR_RGB2BGR))
    writer.release()


def _frame_count(path: Path) -> int:
    capture, count = cv2.VideoCapture(str(path)), 0
    while capture.read()[0]:
        count += 1
    capture.release()
    return count


def test_colliding_names_digit_names_and_a_truncated_video(
    tiny_dataset: Path, weights: Path, tmp_path: Path, capsys
) -> None:
    """One folder: 1.png and 001.png (one number), 5.png, a.jpg and a.ppm (both -> a.jpg), a.mp4 and a.avi
    (both -> a.mp4; a.avi truncated), 7.avi (a digit-named video). Two workers, batches of 2."""
    source = tmp_path / "in"
    source.mkdir()
    images = [read_image(str(p)) for p in _images(tiny_dataset, 7)]
    for name, image in zip(["1.png", "001.png", "5.png", "a.jpg", "a.ppm"], images):
        cv2.imwrite(str(source / name), cv2.cvtColor(image, cv2.COLOR_RGB2BGR))
    frames = [cv2.resize(image, (96, 64)) for image in images]
    _write_video(source / "a.mp4", frames[:4], "mp4v")
    _write_video(source / "7.avi", frames[:3], "MJPG")
    _write_video(tmp_path / "full.avi", frames + frames[:3], "MJPG")  # 10 frames
    data = (tmp_path / "full.avi").read_bytes()
    (source / "a.avi").write_bytes(data[: len(data) * 6 // 10])
    read = _frame_count(source / "a.avi")
    assert 0 < read < 10, "truncating the AVI did not cut frames"
    out = tmp_path / "out"
    # Read in worker processes: the failure reaches the summary through the batches.
    code = _run("--ckpt_path", str(weights), "--source", str(source), "--out", str(out), "--conf", CONF,
                "--batch-size", "2", "--num-workers", "2")  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"a.avi: video ended after {read} of 10 frames (truncated or corrupt)" in err
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["1.png", "001.png", "5.png", "a_jpg.jpg", "a_ppm.jpg", "a_mp4.mp4", "a_avi.mp4", "7.mp4",
         "predictions.json", "predictions.jsonl"]
    )  # fmt: skip
    assert (_frame_count(out / "a_avi.mp4"), _frame_count(out / "a_mp4.mp4"), _frame_count(out / "7.mp4")) == (
        read, 4, 3,
    )  # fmt: skip
    results = json.loads((out / "predictions.json").read_text())
    lines = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    assert sorted(map(json.dumps, lines)) == sorted(map(json.dumps, results))  # the same rows, as they came
    ids: dict[tuple[str, int], set[int]] = {}
    for r in results:
        ids.setdefault((r["file_name"], r.get("frame", -1)), set()).add(r["image_id"])
    expected = {("1.png", -1), ("001.png", -1), ("5.png", -1), ("a.jpg", -1), ("a.ppm", -1)}
    expected |= {("a.mp4", f) for f in range(4)} | {("7.avi", f) for f in range(3)}
    expected |= {("a.avi", f) for f in range(read)}
    assert set(ids) == expected
    assert all(len(v) == 1 for v in ids.values())  # one id per file and frame ...
    assert len({next(iter(v)) for v in ids.values()}) == len(ids)  # ... and no id shared
    assert ids[("5.png", -1)] == {5}  # a number only one file has is kept (COCO file names)


def test_results_written_so_far_survive_a_crash_and_a_failing_writer(
    tiny_dataset: Path, weights: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import yolo11_lightning.predict.command as predict_module
    import yolo11_lightning.predict.writer as writer_module  # where the annotated copies are saved
    from yolo11_lightning.training.module import YOLO11Module

    source = tmp_path / "in"
    source.mkdir()
    paths = [Path(shutil.copy(p, source)) for p in _images(tiny_dataset, 4)]
    real_save = writer_module.save_rgb

    def full_disk_for_the_second(path: str, image) -> None:
        if Path(path).name == paths[1].name:
            raise OSError(28, "No space left on device", path)
        real_save(path, image)

    monkeypatch.setattr(writer_module, "save_rgb", full_disk_for_the_second)
    out = tmp_path / "out"
    with pytest.warns(SkippedSourceWarning, match=rf"{paths[1].name}: cannot write the annotated copy"):
        code = _run("--ckpt_path", str(weights), "--source", str(source), "--out", str(out), "--conf", CONF)
    assert code == 2
    results = json.loads((out / "predictions.json").read_text())
    assert {r["file_name"] for r in results} == {p.name for p in paths}  # the json lost nothing
    assert not (out / paths[1].name).exists() and (out / paths[2].name).exists()

    monkeypatch.setattr(writer_module, "save_rgb", real_save)
    real_step = YOLO11Module.predict_step

    def crash_at_the_third_batch(self, batch, batch_idx):
        if batch_idx == 2:
            raise RuntimeError("injected crash")
        return real_step(self, batch, batch_idx)

    monkeypatch.setattr(YOLO11Module, "predict_step", crash_at_the_third_batch)
    crashed = tmp_path / "crashed"
    with pytest.raises(RuntimeError, match="injected crash"):
        predict_module.predict(weights, source, crashed, conf=float(CONF), image_size=64, device="cpu",
                               progress_bar=False)  # fmt: skip
    assert not (crashed / "predictions.json").exists()
    kept = [json.loads(line) for line in (crashed / "predictions.jsonl").read_text().splitlines()]
    assert {r["file_name"] for r in kept} == {paths[0].name, paths[1].name}


def _lightning_checkpoint(path: Path, image_size: int | None) -> Path:
    """A checkpoint laid out as Lightning writes one for ``YOLO11Module`` + ``YOLODataModule`` (what
    ``test_export.test_export_and_predict_default_to_the_trained_size`` reads from a real one)."""
    torch.manual_seed(0)
    model = YOLO11("n", 3, names=["rectangle", "ellipse", "triangle"])
    checkpoint = {
        "state_dict": {f"model.{k}": v for k, v in model.state_dict().items()},
        "hyper_parameters": {"scale": "n", "num_classes": 3, "class_names": model.names, "task": "detect"},
    }
    if image_size is not None:
        checkpoint["datamodule_hyper_parameters"] = {"image_size": image_size, "batch_size": 4}
    torch.save(checkpoint, path)
    return path


def test_predict_runs_at_the_trained_size_unless_told(tiny_dataset: Path, tmp_path: Path, capsys) -> None:
    """The 128-px quickstart model predicted at 640 px covered its images in boxes: without --image-size,
    predict takes the size the checkpoint was trained at and says so; --image-size still wins."""
    ckpt = _lightning_checkpoint(tmp_path / "best.ckpt", image_size=96)
    image = str(_images(tiny_dataset, 1)[0])

    def detections(*size: str) -> tuple[list[dict], str]:
        out = tmp_path / f"out{len(size)}{'_'.join(size)}"
        args = ["predict", "--ckpt_path", str(ckpt), "--source", image, "--out", str(out), "--conf", CONF]
        assert cli_main([*args, "--device", "cpu", "--no-save", *size]) == 0
        return json.loads((out / "predictions.json").read_text()), capsys.readouterr().out

    trained, said = detections()
    assert "image size 96: the size the model was trained at (--image-size to change)" in said
    told, said = detections("--image-size", "96")
    assert "image size 96 (--image-size)" in said
    assert trained == told and trained  # the same input size gives the same boxes
    other, said = detections("--image-size", "64")
    assert "image size 64 (--image-size)" in said and other != trained

    _lightning_checkpoint(ckpt, image_size=None)  # trained without the datamodule: the file cannot say
    _, said = detections("--image-size", "640")
    assert "image size 640 (--image-size)" in said
    from yolo11_lightning.model_files.image_size import choose_image_size, file_image_size

    assert file_image_size(ckpt) is None
    assert choose_image_size(None, None) == (
        640, "image size 640: the model file does not record its training size (--image-size to change)"
    )  # fmt: skip


def test_trained_size_from_each_kind_of_file(tmp_path: Path) -> None:
    """Weights files carry the size (older ones without it still load); reference files' ``train_args``;
    values that are no usable size are ignored rather than trusted."""
    from yolo11_lightning.model_files.image_size import file_image_size

    model = YOLO11("n", 3)
    assert file_image_size(save_weights(model, tmp_path / "sized.pth", image_size=320)) == 320
    old = save_weights(model, tmp_path / "old.pth")  # as written before the size was recorded
    assert file_image_size(old) is None and load_model(old).num_classes == 3
    cases = [(320, 320), ([256, 320], 320), (100, None), (True, None), ("640", None), (-64, None)]
    for imgsz, expected in cases:
        torch.save({"model": None, "ema": None, "train_args": {"imgsz": imgsz}}, tmp_path / "ref.pt")
        assert file_image_size(tmp_path / "ref.pt") == expected, imgsz
    (tmp_path / "junk.ckpt").write_bytes(b"not a torch file")
    assert file_image_size(tmp_path / "junk.ckpt") is None
    assert file_image_size(tmp_path / "missing.ckpt") is None

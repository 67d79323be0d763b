"""Decompression bombs: images whose headers claim more pixels than the limit are refused from the header, before
any decode, on every path (probe, label scan and cache, Dataset reads, ``check-data``, ``predict``).

Each bomb is a small file: a real small image with its header's width and height patched, or (PNG, TIFF) a valid,
fully decodable black image deflated as a stream (30000 x 30000 PNG: 110 KB, 2.7 GB once decoded). The CLI tests
measure the peak RSS of the command in a child process and compare it with the same data without the bombs.
"""

from __future__ import annotations

import json
import shutil
import struct
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest
from cli_runs import run, tail
from data_files import (
    bmp_claiming,
    jpeg_claiming,
    pattern,
    png_bomb,
    tiff_bomb,
    tiff_bytes,
    webp_claiming,
    write_image,
    write_labels,
    write_yaml,
)

from yolo11_lightning.data.dataset import BoxDataset
from yolo11_lightning.data.images import io as image_io
from yolo11_lightning.data.images.headers import header_image_size
from yolo11_lightning.data.images.io import image_size, probe_image, read_image, read_image_retrying
from yolo11_lightning.data.images.limits import DEFAULT_MAX_IMAGE_PIXELS, ImageReadError, ImageTooLargeError
from yolo11_lightning.data.sources import yolo as yolo_source
from yolo11_lightning.data.sources.config import load_dataset_config
from yolo11_lightning.data.sources.split import load_split
from yolo11_lightning.structures.records import ImageRecord
from yolo11_lightning.synthetic.shapes import make_synthetic_coco

MB = 1 << 20
# Peak RSS a run with bombs may exceed the same run without them by (one decoded bomb: >= 537 MB).
RSS_MARGIN = 300 * MB


def gif_claiming(width: int, height: int) -> bytes:
    data = bytearray(cv2.imencode(".gif", pattern(16, 16))[1].tobytes())
    data[6:10] = struct.pack("<HH", width, height)  # the logical screen
    return bytes(data)


# name -> (file name, bytes, claimed "WxH"): every format the header reader knows, each above the default limit.
BOMBS: dict[str, tuple[str, object, str]] = {
    "png": ("bomb_png.png", lambda: png_bomb(30000, 30000), "30000x30000"),  # decodable: 2.7 GB of RGB
    "tiff": ("bomb_tiff.tif", lambda: tiff_bomb(14000, 14000), "14000x14000"),  # decodable, deflate
    "tiff_be_short": ("bomb_tiff_be.tif", lambda: tiff_bytes(65535, 30000, ">", 3), "65535x30000"),
    "bigtiff": ("bomb_bigtiff.tif", lambda: tiff_bytes(30000, 30000, "<", 16, bigtiff=True), "30000x30000"),
    "jpeg": ("bomb_jpeg.jpg", lambda: jpeg_claiming(30000, 30000), "30000x30000"),
    "webp_vp8": ("bomb_vp8.webp", lambda: webp_claiming(16383, 16383, "VP8 "), "16383x16383"),
    "webp_vp8l": ("bomb_vp8l.webp", lambda: webp_claiming(16384, 16384, "VP8L"), "16384x16384"),
    "webp_vp8x": ("bomb_vp8x.webp", lambda: webp_claiming(20000, 20000, "VP8X"), "20000x20000"),
    "bmp": ("bomb_bmp.bmp", lambda: bmp_claiming(30000, -30000), "30000x30000"),  # top-down rows
    "pgm": ("bomb_pgm.pgm", lambda: b"P5\n# made by hand\n30000 30000\n255\n" + bytes(64), "30000x30000"),
    "gif": ("bomb_gif.gif", lambda: gif_claiming(30000, 30000), "30000x30000"),
}


@pytest.fixture(scope="module")
def bombs() -> dict[str, bytes]:
    return {name: make() for name, (_, make, _) in BOMBS.items()}


@pytest.fixture()
def no_bomb_decoded(bombs: dict[str, bytes], monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if OpenCV is ever asked to decode one of the bombs."""
    real, contents = cv2.imdecode, set(bombs.values())

    def guarded(buf, flags):
        assert bytes(buf) not in contents, "a bomb reached cv2.imdecode"
        return real(buf, flags)

    monkeypatch.setattr(image_io.cv2, "imdecode", guarded)


def _write_bombs(folder: Path, bombs: dict[str, bytes], names: list[str]) -> dict[str, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name in names:
        paths[name] = folder / BOMBS[name][0]
        paths[name].write_bytes(bombs[name])
    return paths


# --------------------------------------------------------------------------------------------- header sizes
@pytest.mark.parametrize(
    ("ext", "params", "gray"),
    [
        (".png", [], False), (".jpg", [], False), (".tif", [], False), (".bmp", [], False), (".gif", [], False),
        (".webp", [cv2.IMWRITE_WEBP_QUALITY, 80], False), (".webp", [cv2.IMWRITE_WEBP_QUALITY, 101], False),
        (".ppm", [], False), (".pgm", [], True), (".pgm", [cv2.IMWRITE_PXM_BINARY, 0], True), (".pbm", [], True),
        (".pam", [], False),
    ],
)  # fmt: skip
def test_header_size_matches_the_decoded_size(
    tmp_path: Path, ext: str, params: list[int], gray: bool
) -> None:
    image = pattern(30, 50)
    image = image[:, :, 0] if gray else cv2.cvtColor(image, cv2.COLOR_RGB2BGR)
    path = tmp_path / f"a{ext}"
    assert cv2.imwrite(str(path), image, params)
    assert (
        header_image_size(str(path)) == (30, 50) == probe_image(str(path)) == read_image(str(path)).shape[:2]
    )


@pytest.mark.parametrize("order", ["<", ">"])
@pytest.mark.parametrize(("bigtiff", "size_type"), [(False, 3), (False, 4), (True, 3), (True, 4), (True, 16)])
def test_tiff_header_in_both_byte_orders_and_value_types(
    tmp_path: Path, bigtiff: bool, order: str, size_type: int
) -> None:
    import zlib

    path = tmp_path / "a.tif"
    path.write_bytes(tiff_bytes(50, 30, order, size_type, bigtiff, strip=zlib.compress(bytes(50 * 30))))
    assert header_image_size(str(path)) == (30, 50) == read_image(str(path)).shape[:2]
    path.write_bytes(tiff_bytes(40000, 30000, order, size_type, bigtiff))
    assert header_image_size(str(path)) == (30000, 40000)


def test_bmp_core_header_and_top_down_rows(tmp_path: Path) -> None:
    image = pattern(30, 50)
    data = bytearray(cv2.imencode(".bmp", image)[1].tobytes())  # bottom-up rows, 152 bytes each (padded)
    start, stride = int.from_bytes(data[10:14], "little"), 152
    rows = [data[start + i * stride : start + (i + 1) * stride] for i in range(30)]
    data[start:] = b"".join(reversed(rows))
    data[22:26] = struct.pack("<i", -30)  # negative height: the same image, rows stored top-down
    path = tmp_path / "a.bmp"
    path.write_bytes(bytes(data))
    assert header_image_size(str(path)) == (30, 50)
    np.testing.assert_array_equal(read_image(str(path)), image[:, :, ::-1])
    # OS/2 BITMAPCOREHEADER: 12 bytes, uint16 width and height.
    path.write_bytes(b"BM" + bytes(12) + struct.pack("<IHHHH", 12, 40000, 30000, 1, 24))
    assert header_image_size(str(path)) == (30000, 40000)


def test_unparsed_headers_fall_back_to_the_decoder(tmp_path: Path) -> None:
    path = tmp_path / "a.hdr"  # Radiance HDR: a format whose header we do not read
    assert cv2.imwrite(str(path), pattern(30, 50).astype(np.float32) / 255)
    assert header_image_size(str(path)) is None
    assert read_image(str(path)).shape[:2] == (30, 50)
    # ... and its decoded size is still held to the limit.
    with pytest.raises(ImageTooLargeError, match="50x30 = 1500 pixels exceeds the limit of 1000 pixels"):
        read_image(str(path), max_pixels=1000)
    with pytest.raises(ImageTooLargeError):
        probe_image(str(path), max_pixels=1000)
    # A size we do not parse and OpenCV's own limit (2^30 pixels) refuses: an error naming the file, not cv2.error.
    path.write_bytes(b"#?RADIANCE\nFORMAT=32-bit_rle_rgbe\n\n-Y 60000 +X 60000\n" + bytes(64))
    with pytest.raises(ImageReadError, match="OpenCV's limit"):
        read_image(str(path))
    for broken in (
        b"\x89PNG\r\n\x1a\n" + bytes(8),
        b"II*\x00\xff\xff\xff\xff",
        b"RIFF\0\0\0\0WEBPVP8 ",
        b"P6\n",
    ):
        path.write_bytes(broken)  # malformed headers: no size, and the decoder's own error
        assert header_image_size(str(path)) is None
        with pytest.raises(ImageReadError, match=r"not a readable image|corrupt"):
            read_image(str(path))


# --------------------------------------------------------------------------------------------- refusal
@pytest.mark.parametrize("name", list(BOMBS))
def test_bomb_refused_from_its_header(
    tmp_path: Path, bombs: dict[str, bytes], no_bomb_decoded: None, name: str
) -> None:
    path = _write_bombs(tmp_path, bombs, [name])[name]
    claimed = BOMBS[name][2]
    width, height = (int(v) for v in claimed.split("x"))
    reason = f"{claimed} = {width * height} pixels exceeds the limit of {DEFAULT_MAX_IMAGE_PIXELS} pixels"
    for read in (probe_image, image_size, read_image, lambda p: read_image(p, 640), read_image_retrying):
        with pytest.raises(ImageTooLargeError) as err:
            read(str(path))
        assert str(err.value).startswith(f"{path}: {reason} (--data.max_image_pixels")
        assert (err.value.width, err.value.height) == (width, height)


def test_too_large_is_not_retried(tmp_path: Path, bombs: dict[str, bytes], monkeypatch) -> None:
    path = _write_bombs(tmp_path, bombs, ["jpeg"])["jpeg"]
    monkeypatch.setattr(image_io.time, "sleep", lambda s: pytest.fail("a refusal for size was retried"))
    with pytest.raises(ImageTooLargeError):
        read_image_retrying(str(path), attempts=3)


def test_limit_is_configurable(tmp_path: Path) -> None:
    path = write_image(tmp_path / "a.png", pattern(30, 50))  # 1500 pixels
    with pytest.raises(ImageTooLargeError, match="50x30 = 1500 pixels exceeds the limit of 1499 pixels"):
        probe_image(str(path), max_pixels=1499)
    assert probe_image(str(path), max_pixels=1500) == (30, 50)  # at the limit: accepted
    for no_limit in (None, 0):
        assert read_image(str(path), max_pixels=no_limit).shape == (30, 50, 3)
    with pytest.raises(ValueError, match="max_image_pixels must be >= 0"):
        read_image(str(path), max_pixels=-1)
    jpeg = tmp_path / "big.jpg"
    jpeg.write_bytes(jpeg_claiming(30000, 30000))
    with pytest.raises(ImageTooLargeError, match="exceeds the limit of 899999999 pixels"):
        probe_image(str(jpeg), max_pixels=899_999_999)  # one pixel short


# --------------------------------------------------------------------------------------------- datasets
DATASET_BOMBS = [n for n in BOMBS if n != "gif"]  # a folder split lists image extensions; .gif is not one


def _dataset(root: Path, bombs: dict[str, bytes] | None, normal: int = 6) -> Path:
    """A YOLO dataset of ``normal`` train and 2 val images (48 x 64), plus every bomb in train and the PNG
    bomb in val (as ``bomb_val.png``) when ``bombs`` is given."""
    for i in range(normal + 2):
        split, name = ("train", f"t{i}") if i < normal else ("val", f"v{i}")
        write_image(root / "images" / split / f"{name}.jpg", pattern(48, 64, i))
        write_labels(root / "labels" / split / f"{name}.txt", ["0 0.5 0.5 0.25 0.25"])
    if bombs is not None:
        _write_bombs(root / "images" / "train", bombs, DATASET_BOMBS)
        (root / "images" / "val" / "bomb_val.png").write_bytes(bombs["png"])
    return write_yaml(root / "data.yaml", {"path": str(root), "train": "images/train", "val": "images/val",
                                           "names": ["thing"]})  # fmt: skip


def test_label_scan_drops_bombs_and_names_them(
    tmp_path: Path, bombs: dict[str, bytes], no_bomb_decoded: None
) -> None:
    config = load_dataset_config(_dataset(tmp_path, bombs))
    records, report = load_split(config, "train", verbose=False)
    assert sorted(Path(r.path).name for r in records) == [f"t{i}.jpg" for i in range(6)]
    assert report.num_skipped_images == report.num_too_large == len(DATASET_BOMBS)
    assert "above the pixel limit" in report.summary()
    for name in DATASET_BOMBS:
        file_name, _, claimed = BOMBS[name]
        (line,) = [w for w in report.warnings if file_name in w]
        assert f": {claimed} = " in line and "exceeds the limit" in line, line
    records, report = load_split(config, "val", verbose=False)
    assert (
        len(records) == 2 and report.num_too_large == 1 and "bomb_val.png: 30000x30000" in report.warnings[0]
    )
    # The cache remembers the refusals and does not let the bombs in.
    cached, report = load_split(config, "train", verbose=False)
    assert report.from_cache and len(cached) == 6 and report.num_too_large == len(DATASET_BOMBS)


def test_coco_json_drops_a_bomb(tmp_path: Path, bombs: dict[str, bytes], no_bomb_decoded: None) -> None:
    config = load_dataset_config(make_synthetic_coco(tmp_path, num_train=4, num_val=3, image_size=32))
    file_name = json.loads((tmp_path / "val.json").read_text())["images"][1]["file_name"]
    records, _ = load_split(config, "val", use_cache=False, verbose=False)
    bomb = next(Path(r.path) for r in records if r.path.endswith(file_name))
    bomb.write_bytes(bombs["png"])
    records, report = load_split(config, "val", use_cache=False, verbose=False)
    assert len(records) == 2 and report.num_too_large == 1
    assert f"{bomb}: 30000x30000 = 900000000 pixels exceeds the limit" in report.warnings[0]


def _sized_dataset(root: Path) -> Path:
    """Train images of 32 x 32, 48 x 48 and 64 x 64 pixels (1024, 2304, 4096), val one labelled 32 x 32."""
    for side in (32, 48, 64):
        write_image(root / "images" / "train" / f"s{side}.png", pattern(side, side, side))
    write_image(root / "images" / "val" / "v.png", pattern(32, 32))
    (root / "labels" / "val").mkdir(parents=True)  # a val split needs labels (``Task.check_split``)
    (root / "labels" / "val" / "v.txt").write_text("0 0.5 0.5 0.5 0.5\n")
    return write_yaml(root / "data.yaml", {"path": str(root), "train": "images/train", "val": "images/val",
                                           "names": ["thing"]})  # fmt: skip


def _names(records: list[ImageRecord]) -> list[str]:
    return sorted(Path(r.path).name for r in records)


def test_cache_follows_a_changed_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = load_dataset_config(_sized_dataset(tmp_path))
    records, report = load_split(config, "train", verbose=False, max_image_pixels=3000)
    assert _names(records) == ["s32.png", "s48.png"] and not report.from_cache and report.num_too_large == 1

    parses: list[str] = []
    original = yolo_source.check_images
    monkeypatch.setattr(
        yolo_source, "check_images", lambda paths, *a: parses.extend(paths) or original(paths, *a)
    )
    # A lower limit: the cache is used, and its records above the limit are refused from their stored sizes.
    records, report = load_split(config, "train", verbose=False, max_image_pixels=2000)
    assert report.from_cache and parses == [] and _names(records) == ["s32.png"]
    assert report.num_images == 1 and report.num_skipped_images == report.num_too_large == 2
    assert any("s48.png: 48x48 = 2304 pixels exceeds the limit of 2000 pixels" in w for w in report.warnings)
    # A higher limit: the cache refused an image for its size, so it is checked again.
    records, report = load_split(config, "train", verbose=False, max_image_pixels=0)
    assert not report.from_cache and len(parses) == 3 and _names(records) == ["s32.png", "s48.png", "s64.png"]
    # A cache built without a limit (or by an older version) serves any limit.
    records, report = load_split(config, "train", verbose=False)
    assert report.from_cache and len(records) == 3
    records, report = load_split(config, "train", verbose=False, max_image_pixels=1024)
    assert report.from_cache and len(parses) == 3 and _names(records) == ["s32.png"]


# --------------------------------------------------------------------------------------------- reading
def test_dataset_refuses_a_file_swapped_for_a_bomb(tmp_path: Path, bombs: dict[str, bytes]) -> None:
    config = load_dataset_config(_dataset(tmp_path, None))
    records, _ = load_split(config, "train", use_cache=False, verbose=False)
    swapped = Path(records[2].path)
    swapped.write_bytes(
        bombs["jpeg"]
    )  # the record still says 48 x 64: only the read-time check can refuse it

    evaluation = BoxDataset(records, image_size=64, augment=False, read_attempts=1)
    sample = evaluation[2]
    assert sample["missing"]
    ((path, reason),) = sample["unreadable"]
    assert path == str(swapped) and reason.startswith("30000x30000 = 900000000 pixels exceeds the limit")

    training = BoxDataset(records, image_size=64, augment=True, read_attempts=1, reduced_decode=True)
    sample = training[(0, 2)]  # substituted, as any unreadable training image
    assert sample["substitute"] not in (-1, 2) and sample["image"].shape == (3, 64, 64)
    assert (str(swapped), reason) in sample["unreadable"]


def test_dataset_checks_the_records_size_before_reading(tmp_path: Path) -> None:
    path = write_image(tmp_path / "a.png", pattern(30, 50))
    small = ImageRecord(str(path), 30, 50)
    huge = ImageRecord(str(tmp_path / "never_read.png"), 30000, 30000)  # no file: only the size can refuse it
    dataset = BoxDataset([small, huge], image_size=64, augment=False)
    assert not dataset[0]["missing"]
    assert "30000x30000 = 900000000 pixels exceeds" in dataset[1]["unreadable"][0][1]
    # The limit is the Dataset's: lower, the small image goes too; none, the file's absence is what fails.
    assert (
        "50x30 = 1500 pixels exceeds the limit of 1000"
        in BoxDataset([small], image_size=64, max_image_pixels=1000)[0]["unreadable"][0][1]
    )
    unlimited = BoxDataset([small, huge], image_size=64, max_image_pixels=0, read_attempts=1)
    assert "cannot read file" in unlimited[1]["unreadable"][0][1]


def test_datamodule_limit_reaches_the_scan_and_the_datasets(tmp_path: Path) -> None:
    from yolo11_lightning.training.datamodule import YOLODataModule

    yaml_path = _sized_dataset(tmp_path)
    data = YOLODataModule(str(yaml_path), batch_size=2, image_size=64, num_workers=0, max_image_pixels=2500)
    data.prepare_data()
    data.setup("fit")
    assert _names(data.datasets["train"].records) == ["s32.png", "s48.png"]
    assert data.datasets["train"].max_image_pixels == data.datasets["val"].max_image_pixels == 2500
    with pytest.raises(ValueError, match="max_image_pixels must be >= 0"):
        YOLODataModule(str(yaml_path), max_image_pixels=-5)


# --------------------------------------------------------------------------------------------- commands
# Runs a command's main() in a fresh interpreter under an address-space cap (so a bomb that got through fails
# to allocate instead of taking the machine down) and prints the process's peak RSS after each run.
MEASURED = """
import resource, sys
cap = int(sys.argv[1]) << 20
resource.setrlimit(resource.RLIMIT_AS, (cap, cap)) if cap else None
module, runs = sys.argv[2], [r.split("\\x1f") for r in sys.argv[3:]]
main = __import__(module, fromlist=["main"]).main
for argv in runs:
    code = main(argv)
    print(f"PEAK_RSS_KB {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss} EXIT {code}", file=sys.stderr)
"""


def run_measured(
    module: str, runs: list[list[str]], cwd: Path, cap_mb: int = 0
) -> tuple[list[int], list[int], str]:
    """(peak RSS in bytes after each run, exit codes, stderr) of ``module.main(argv)`` for each argv in turn."""
    proc = run(
        [sys.executable, "-c", MEASURED, str(cap_mb), module, *("\x1f".join(r) for r in runs)], cwd, 300
    )
    lines = [line.split() for line in proc.stderr.splitlines() if line.startswith("PEAK_RSS_KB")]
    assert proc.returncode == 0 and len(lines) == len(runs), tail(proc)
    return [int(w[1]) * 1024 for w in lines], [int(w[3]) for w in lines], proc.stdout + proc.stderr


def test_check_data_names_bombs_with_flat_memory(tmp_path: Path, bombs: dict[str, bytes]) -> None:
    clean, hostile = _dataset(tmp_path / "clean", None), _dataset(tmp_path / "hostile", bombs)
    common = ["check-data", "--no-images", "--no-cache"]
    (peak_without,), codes, _ = run_measured("yolo11_lightning.cli.main", [[*common, "--dataset", str(clean)]],
                                             tmp_path, cap_mb=4096)  # fmt: skip
    (peak_with,), codes2, out = run_measured("yolo11_lightning.cli.main", [[*common, "--dataset", str(hostile)]],
                                             tmp_path, cap_mb=4096)  # fmt: skip
    assert codes == codes2 == [0], out
    for name in DATASET_BOMBS:
        file_name, _, claimed = BOMBS[name]
        assert f"{file_name}: {claimed} = " in out, out
    assert "bomb_val.png: 30000x30000" in out and "train: 6 images" in out and "val: 2 images" in out
    assert peak_with <= peak_without + RSS_MARGIN, (peak_with / MB, peak_without / MB)

    # The option: a limit below the normal images' 48 x 64 = 3072 pixels refuses them too (val: no image left).
    (_,), codes, out = run_measured("yolo11_lightning.cli.main", [[*common, "--dataset", str(clean),
                                                              "--max_image_pixels", "3000"]], tmp_path)  # fmt: skip
    assert codes == [1] and "64x48 = 3072 pixels exceeds the limit of 3000 pixels" in out


def test_predict_skips_a_bomb_with_flat_memory(
    tiny_dataset: Path, bombs: dict[str, bytes], tmp_path: Path
) -> None:
    import torch

    from yolo11_lightning import YOLO11
    from yolo11_lightning.model_files.weights import save_weights

    torch.manual_seed(0)
    weights = tmp_path / "tiny.pth"
    save_weights(YOLO11("n", 3, names=["rectangle", "ellipse", "triangle"]), weights)
    clean, hostile = tmp_path / "clean", tmp_path / "hostile"
    for folder in (clean, hostile):
        folder.mkdir()
        for image in sorted((tiny_dataset.parent / "images" / "val").glob("*.png"))[:2]:
            shutil.copy(image, folder)
    bomb_paths = _write_bombs(hostile, bombs, ["png", "jpeg"])
    common = ["--ckpt_path", str(weights), "--device", "cpu", "--image-size", "64", "--no-save"]
    runs = [
        [*common, "--source", str(clean), "--out", str(tmp_path / "o1")],
        [*common, "--source", str(hostile), "--out", str(tmp_path / "o2")],
        [*common, "--source", str(clean), "--out", str(tmp_path / "o3"), "--max_image_pixels", "100"],
    ]
    (peak_without, peak_with, _), codes, out = run_measured(
        "yolo11_lightning.predict.command", runs, tmp_path
    )
    assert codes == [0, 2, 1], (
        out
    )  # the bombs failed, the rest was written; a limit of 100 pixels refuses all
    for path in bomb_paths.values():
        assert f"{path}: skipped (30000x30000 = 900000000 pixels exceeds the limit" in out  # the warning
        assert f"  {path}: 30000x30000 = 900000000 pixels exceeds" in out  # the summary
    assert "64x64 = 4096 pixels exceeds the limit of 100 pixels" in out
    assert peak_with <= peak_without + RSS_MARGIN, (peak_with / MB, peak_without / MB)

"""Reading reference checkpoints: parity with the reference model, safety, clear errors."""

from __future__ import annotations

import json
import os
import pickle

os.environ.setdefault("YOLO_OFFLINE", "1")  # before any import of the reference package

import pytest
import torch
from model_oracle import (
    reference_eval,
    reference_model,
    reference_task_model,
    run_without_reference,
    save_like_release,
)

from yolo11_lightning import YOLO11
from yolo11_lightning.model_files.reference import CheckpointError, rename_key
from yolo11_lightning.model_files.weights import load_model

# Non-square and small: cheap, and catches any H/W mix-up in the anchors.
INPUT_SHAPE = (2, 3, 64, 96)
REF_KEYS = {"n": 499, "s": 499, "m": 649, "l": 1015, "x": 1015}

_LOAD_AND_RUN = """
import json, torch
from yolo11_lightning import YOLO11
from yolo11_lightning.model_files.weights import load_model
results = {}
for name in NAMES:
    model = load_model(f"{name}.pt").eval()
    with torch.no_grad():
        out = model(torch.load(f"{name}.x.pt"))
    torch.save(out, f"{name}.ours.pt")
    dtypes = sorted({str(v.dtype) for v in model.state_dict().values()})
    results[name] = dict(scale=model.scale, nc=model.num_classes, names=model.names, dtypes=dtypes)
json.dump(results, open("results.json", "w"))
"""


def _parity_run(tmp_path, cases: dict[str, tuple[str, int]]) -> dict:
    """Save reference checkpoints, load and run them with ours in a reference-free subprocess."""
    import json

    expected = {}
    for name, (scale, nc) in cases.items():
        ref = reference_model(scale, nc, seed=len(name) + nc)
        names = {i: f"class_{i}" for i in range(nc)}
        save_like_release(ref, tmp_path / f"{name}.pt", names)
        x = torch.rand(INPUT_SHAPE, generator=torch.Generator().manual_seed(nc))
        torch.save(x, tmp_path / f"{name}.x.pt")
        expected[name] = (reference_eval(ref, x), len(ref.state_dict()))
    code = f"import os\nos.chdir({str(tmp_path)!r})\nNAMES = {list(cases)!r}\n" + _LOAD_AND_RUN
    proc = run_without_reference(code)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "REFERENCE-BLOCKED-OK" in proc.stdout
    info = json.loads((tmp_path / "results.json").read_text())
    out = {}
    for name, (scale, nc) in cases.items():
        ref_out, n_keys = expected[name]
        out[name] = dict(info[name], ref=ref_out, ours=torch.load(tmp_path / f"{name}.ours.pt"), keys=n_keys)
        assert out[name]["scale"] == scale and out[name]["nc"] == nc
    return out


@pytest.fixture(scope="module")
def small_parity(tmp_path_factory):
    pytest.importorskip("ultralytics")
    # s with 7 classes: the class count (and the nc-dependent head width) must be inferred.
    return _parity_run(tmp_path_factory.mktemp("parity"), {"n": ("n", 80), "s": ("s", 7)})


def _check_parity(run: dict, scale: str, nc: int) -> None:
    ours, ref = run["ours"], run["ref"]
    h, w = INPUT_SHAPE[2:]
    assert ours.shape == ref.shape == (INPUT_SHAPE[0], 4 + nc, sum((h // s) * (w // s) for s in (8, 16, 32)))
    assert run["dtypes"] == ["torch.float32", "torch.int64"]  # fp16 weights came back as fp32
    assert run["names"] == [f"class_{i}" for i in range(nc)]
    assert run["keys"] == REF_KEYS[scale]
    box_err = (ours[:, :4] - ref[:, :4]).abs().max().item()
    score_err = (ours[:, 4:] - ref[:, 4:]).abs().max().item()
    assert box_err <= 1e-3, f"boxes differ by {box_err} px"
    assert score_err <= 1e-4, f"scores differ by {score_err}"
    # The comparison means something only if the scores are spread out.
    assert ref[:, 4:].std() > 0.05


@pytest.mark.parametrize(("scale", "nc"), [("n", 80), ("s", 7)])
def test_reference_checkpoint_parity_without_reference_package(small_parity, scale, nc):
    _check_parity(small_parity[scale], scale, nc)


@pytest.mark.slow
@pytest.mark.parametrize("scale", ["m", "l", "x"])
def test_reference_checkpoint_parity_large_scales(tmp_path, scale):
    pytest.importorskip("ultralytics")
    _check_parity(_parity_run(tmp_path, {scale: (scale, 80)})[scale], scale, 80)


def test_plain_state_dict_and_ema_entry(tmp_path):
    ref = reference_model("n", 5, seed=3)
    x = torch.rand(1, 3, 64, 64)
    # A plain (fp32) reference state dict: outputs match without the fp16 round trip, train mode too.
    ours = load_model(ref.state_dict())
    assert (ours.scale, ours.num_classes, ours.names) == ("n", 5, None)
    ref.train(), ours.train()
    with torch.no_grad():
        for a, b in zip(ours(x), ref(x)):
            torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
        ref.eval(), ours.eval()
        torch.testing.assert_close(ours(x), ref(x)[0], atol=1e-3, rtol=1e-5)
    # Training checkpoints keep the weights under 'ema' with 'model' None; the reference reads ema first.
    torch.save({"model": None, "ema": ref.half()}, tmp_path / "last.pt")
    assert load_model(tmp_path / "last.pt").num_classes == 5


def test_restricted_reader_returns_exactly_what_torch_reads(tmp_path):
    """Our reader of a reference release (stand-ins, our own storage reads) against torch's unrestricted
    loader with the reference package importable: the same tensors, bit for bit, same dtypes."""
    from yolo11_lightning.model_files import torch_file
    from yolo11_lightning.model_files.reference import load_reference

    path = save_like_release(reference_model("n", 5, seed=2), tmp_path / "yolo11n.pt")
    state = load_reference(path).state
    expected = torch.load(path, map_location="cpu", weights_only=False)["model"].state_dict()
    assert state.keys() == expected.keys()
    for key, value in expected.items():
        assert state[key].dtype == value.dtype and torch.equal(state[key], value), key
    # The rest of the file (metadata, train args) comes back as plain data.
    whole = torch_file.load_reference(path)
    assert whole["train_args"]["imgsz"] == 640 and whole["version"] == "8.3.0"


def test_key_mapping_is_a_prefix_rename():
    assert rename_key("model.0.conv.weight") == "layers.0.conv.weight"
    assert rename_key("model.10.m.0.attn.qkv.conv.weight") == "layers.10.m.0.attn.qkv.conv.weight"
    assert rename_key("model.23.cv3.1.0.0.conv.weight") == "head.cv3.1.0.0.conv.weight"
    assert rename_key("model.23.dfl.conv.weight") == "head.dfl.conv.weight"
    with torch.device("meta"):
        for scale, n_keys in REF_KEYS.items():
            assert len(YOLO11(scale).state_dict()) == n_keys


class _RunsCommand:
    """Unpickling this would run a shell command that creates a marker file."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


class _Evaluates:
    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (eval, (f"open({self.marker!r}, 'w').close()",))


@pytest.mark.parametrize("payload", [_RunsCommand, _Evaluates])
@pytest.mark.parametrize("fmt", ["torch-zip", "raw-pickle"])
def test_file_that_would_run_code_is_refused(tmp_path, payload, fmt):
    marker = tmp_path / "MARKER"
    path = tmp_path / "evil.pt"
    # Hidden next to a real-looking entry, as an attacker would.
    ckpt = {"model": None, "ema": None, "train_args": {"imgsz": 640, "hook": payload(marker)}}
    if fmt == "torch-zip":
        torch.save(ckpt, path)
    else:
        path.write_bytes(pickle.dumps(ckpt, protocol=2))
    with pytest.raises(
        CheckpointError, match=r"evil\.pt.*refusing to load global '(posix\.system|builtins\.eval)'"
    ):
        load_model(path)
    assert not marker.exists()


def test_truncated_file_gets_clear_error(tmp_path):
    pytest.importorskip("ultralytics")
    path = save_like_release(reference_model("n"), tmp_path / "yolo11n.pt")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match=r"yolo11n\.pt: not a readable torch checkpoint \(truncated"):
        load_model(path)


def test_other_architectures_get_clear_errors(tmp_path):
    torchvision = pytest.importorskip("torchvision")
    torch.save(torchvision.models.resnet18().state_dict(), tmp_path / "resnet18.pt")
    with pytest.raises(CheckpointError, match=r"resnet18\.pt: not a reference YOLO state dict.*conv1"):
        load_model(tmp_path / "resnet18.pt")
    # Right key names and shapes but one: the error names that key as the file spells it.
    with torch.device("meta"):
        shapes = {k: v.shape for k, v in YOLO11("n").state_dict().items()}
    wrong = {
        ("model.23." + k[5:] if k.startswith("head.") else "model." + k[7:]): torch.zeros(v)
        for k, v in shapes.items()
    }
    wrong["model.4.cv2.conv.weight"] = torch.zeros(64, 96, 3, 3)
    with pytest.raises(CheckpointError, match=r"scale n: 'model\.4\.cv2\.conv\.weight' is \(64, 96, 3, 3\)"):
        load_model(wrong)
    del wrong["model.4.cv2.conv.weight"]
    with pytest.raises(CheckpointError, match=r"missing key 'model\.4\.cv2\.conv\.weight'"):
        load_model(wrong)
    with pytest.raises(CheckpointError, match=r"not a state dict: entry 'x' is a str"):
        load_model({"x": "y"})
    with pytest.raises(FileNotFoundError, match="model file not found"):
        load_model(tmp_path / "missing.pt")
    torch.save([1, 2, 3], tmp_path / "list.pt")
    with pytest.raises(CheckpointError, match=r"list\.pt: expected a dict"):
        load_model(tmp_path / "list.pt")


def test_other_yolo_family_model_is_rejected(tmp_path):
    tasks = pytest.importorskip("ultralytics.nn.tasks")
    v8 = tasks.DetectionModel("yolov8n.yaml", nc=80, verbose=False)
    save_like_release(v8, tmp_path / "yolov8n.pt")
    with pytest.raises(CheckpointError, match=r"yolov8n\.pt\['model'\].*not a YOLO11 detection checkpoint"):
        load_model(tmp_path / "yolov8n.pt")


def test_the_public_loader_opens_every_model_file_without_lightning(tmp_path) -> None:
    """``yolo11_lightning.load_model(path)``: a reference release file of every task, our weights file and a
    Lightning checkpoint, each back with its task, names and ``kpt_shape``, in a fresh interpreter where neither
    the reference package nor Lightning is imported."""
    from yolo11_lightning.model_files.weights import save_weights
    from yolo11_lightning.tasks import create_model

    expected = {}
    for task, nc, extra in (
        ("detect", 2, {}), ("segment", 2, {}), ("pose", 1, {"data_kpt_shape": (5, 2)}), ("obb", 3, {}),
        ("classify", 4, {}),
    ):  # fmt: skip
        ref = reference_task_model(task, "n", nc, seed=1, **extra)
        save_like_release(ref, tmp_path / f"{task}.pt", {i: f"{task}{i}" for i in range(nc)})
        kpt = list(extra.get("data_kpt_shape", ())) or None
        expected[f"{task}.pt"] = [task, nc, [f"{task}{i}" for i in range(nc)], kpt]
    ours = create_model("n", 2, ["a", "b"], task="pose", kpt_shape=(3, 3))
    save_weights(ours, tmp_path / "pose.pth")
    torch.save(
        {
            "hyper_parameters": {"scale": "n", "num_classes": 2, "task": "pose", "kpt_shape": [3, 3],
                                 "class_names": ["a", "b"]},
            "state_dict": {f"model.{k}": v for k, v in ours.state_dict().items()},
        },
        tmp_path / "best.ckpt",
    )  # fmt: skip
    expected["pose.pth"] = expected["best.ckpt"] = ["pose", 2, ["a", "b"], [3, 3]]
    proc = run_without_reference(
        f"import json, os, sys\nos.chdir({str(tmp_path)!r})\nfrom yolo11_lightning import load_model\n"
        f"found = {{}}\nfor name in {sorted(expected)!r}:\n"
        "    m = load_model(name)\n"
        "    found[name] = [m.task, m.num_classes, m.names, list(m.kpt_shape) if m.kpt_shape else None]\n"
        "assert not [k for k in sys.modules if k.split('.')[0] == 'lightning'], 'lightning imported'\n"
        "print(json.dumps(found))\n"
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.splitlines()[0]) == expected

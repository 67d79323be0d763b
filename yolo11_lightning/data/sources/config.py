"""Dataset yaml: where the images and labels of each split are, and the class names.

Format (the reference's, plus COCO json entries)::

    path: ../datasets/coco8      # root; relative to this yaml's folder; default: the yaml's folder
    train: images/train          # a folder of images, a .txt list of images, a COCO .json,
    val: [images/val, extra.txt] #   or a list of those; relative to `path`
    test:                        # optional
    names: [person, bicycle]     # or {0: person, 1: bicycle}; optional when a COCO json gives them

A keypoint (pose) dataset adds its keypoint keys, read and checked by ``label_options.LabelOptions``.

A COCO entry may also be a mapping that names the folder its ``file_name``s are relative to::

    val: {json: annotations/instances_val2017.json, images: val2017}

Without ``images`` the folder is found as described in ``sources.coco``. When ``names`` is absent
the class names are the categories of the (smallest) COCO json, sorted by category id. When its categories
declare ``keypoints`` (COCO keypoints json: K names, values x, y, visibility), the dataset is a keypoint dataset
of K keypoints of x, y, visibility without the key (a yaml shape that differs is refused), and without a flip
key the names give it when they pair ``left_<x>`` with ``right_<x>`` (``flip_from_names``). Those keys are
``label_options.LabelOptions``'s (``DatasetConfig.options``).
"""

from __future__ import annotations

import json
import mmap
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from yolo11_lightning.data.sources.label_options import LabelOptions
from yolo11_lightning.errors import UserInputError

SPLITS = ("train", "val", "test")


class DatasetError(UserInputError):
    """A dataset that cannot be used as configured; the message names the file, key or split (one line on the
    command line: ``errors.UserInputError``)."""


class MissingSplitError(DatasetError):
    """A command needs a split the dataset yaml does not define; the message names those it does (one line
    on the command line: ``errors.UserInputError``)."""


@dataclass
class DatasetConfig:
    """A parsed dataset yaml.

    Attributes:
        root: dataset root (``path`` resolved against the yaml's folder).
        splits: split name -> absolute entries (image folder, .txt image list or COCO .json).
        names: class names; index = class id.
        yaml_path: the yaml this came from (None when built in code).
        image_dirs: COCO json path -> folder its ``file_name``s are relative to (explicit ones only).
        options: what its instances carry beyond boxes and outlines (a keypoint dataset's keypoints and their
            flip), from the yaml or a COCO json's categories.
        outline_labels: the rows' outlines are the labels the task learns (oriented boxes; set for the task, not by
            the yaml): a row whose outline fails its checks is dropped instead of kept as its box (``checks``).
        shards: the shard folder (a url or a local folder, ``data.shards``) this dataset is read from, else None.
    """

    root: Path
    splits: dict[str, list[str]]
    names: list[str]
    yaml_path: Path | None = None
    image_dirs: dict[str, str] = field(default_factory=dict)
    options: LabelOptions = field(default_factory=LabelOptions)
    outline_labels: bool = False
    shards: str | None = None

    @property
    def num_classes(self) -> int:
        return len(self.names)

    @property
    def source(self) -> str:
        """How errors name this dataset: the shard folder, the yaml path, or the root for configs built in code."""
        return self.shards or str(self.yaml_path or self.root)

    def resolve(self, entry: str | os.PathLike) -> str:
        """Absolute path of a split entry (entries are relative to ``root``); a url as it is."""
        if "://" in str(entry):
            return str(entry)
        p = Path(os.path.expanduser(str(entry)))
        return str(p if p.is_absolute() else (self.root / p).resolve())


def _names_from(value: Any, where: str) -> list[str]:
    if isinstance(value, (list, tuple)):
        return [str(n) for n in value]
    if isinstance(value, dict):
        try:
            by_id = {int(k): str(v) for k, v in value.items()}
        except (TypeError, ValueError) as e:
            raise DatasetError(f"{where}: `names` keys must be integer class ids ({e})") from e
        if sorted(by_id) != list(range(len(by_id))):
            raise DatasetError(
                f"{where}: `names` ids must be 0..{len(by_id) - 1} without gaps, got {sorted(by_id)}"
            )
        return [by_id[i] for i in range(len(by_id))]
    raise DatasetError(
        f"{where}: `names` must be a list or a {{id: name}} mapping, got {type(value).__name__}"
    )


def read_categories(json_path: str | Path) -> list:
    """The ``categories`` list of a COCO json ([] without one; DatasetError naming the file when it cannot be
    read)."""
    try:
        with open(json_path, encoding="utf-8") as f:
            cats = json.load(f).get("categories", [])
    except (OSError, ValueError, AttributeError) as e:
        raise DatasetError(f"{json_path}: cannot read COCO `categories` ({type(e).__name__}: {e})") from e
    if not isinstance(cats, list):
        raise DatasetError(f"{json_path}: COCO `categories` must be a list, got {type(cats).__name__}")
    return cats


def coco_category_names(json_path: str | Path, categories: list | None = None) -> list[str]:
    """Category names of a COCO json (its ``categories`` when already read), ordered by category id (the
    contiguous class order)."""
    cats = read_categories(json_path) if categories is None else categories
    try:
        pairs = sorted((int(c["id"]), str(c["name"])) for c in cats)
    except (ValueError, TypeError, KeyError) as e:
        raise DatasetError(f"{json_path}: cannot read COCO `categories` ({type(e).__name__}: {e})") from e
    if not pairs:
        raise DatasetError(f"{json_path}: COCO json has no `categories`")
    return [name for _, name in pairs]


def category_keypoints(categories: list, json_path: str | Path) -> list[str] | None:
    """The keypoint names the categories of a COCO json declare (their ``keypoints`` lists, one list shared by
    every category that has one: a dataset has one list of keypoints), or None when none does."""
    lists = []
    for cat in categories:
        names = cat.get("keypoints") if isinstance(cat, dict) else None
        if names is None:
            continue
        if not (isinstance(names, list) and names and all(isinstance(n, str) for n in names)):
            raise DatasetError(
                f"{json_path}: category {cat.get('name')!r}: `keypoints` must be a non-empty list of keypoint names"
            )
        if lists and names != lists[0]:
            raise DatasetError(
                f"{json_path}: categories declare different `keypoints` ({lists[0]} and {names}); a dataset has one "
                "list of keypoints"
            )
        lists.append(names)
    return lists[0] if lists else None


def flip_from_names(names: list[str]) -> tuple[int, ...] | None:
    """The flip permutation of keypoint names: ``left_<x>`` and ``right_<x>`` swap (case aside), the others stay (COCO's
    17 names give the reference's coco-pose flip); None when no name is left or right, a left or right
    one has no partner, or names repeat."""
    index = {n.lower(): i for i, n in enumerate(names)}
    if len(index) != len(names):
        return None
    flip, paired = [], False
    for name in (n.lower() for n in names):
        side = next((s for s in ("left_", "right_") if name.startswith(s)), None)
        if side is None:
            flip.append(index[name])
            continue
        partner = index.get(("right_" if side == "left_" else "left_") + name[len(side) :])
        if partner is None:
            return None
        flip.append(partner)
        paired = True
    return tuple(flip) if paired else None


def _mentions_keypoints(json_path: str) -> bool:
    """Whether a json file holds the key ``"keypoints"`` anywhere (a byte search: a detection json of gigabytes is
    not parsed to learn that its categories declare no keypoints); True when the file cannot be searched."""
    try:
        with open(json_path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            return m.find(b'"keypoints"') >= 0
    except (OSError, ValueError):  # ValueError: an empty file (the parse reports it)
        return True


def load_dataset_config(path: str | Path) -> DatasetConfig:
    """Parse a dataset yaml; raises DatasetError naming the yaml file and the offending key."""
    yaml_path = Path(path).expanduser().resolve()
    try:
        with open(yaml_path, encoding="utf-8") as f:
            raw = yaml.safe_load(f)
    except OSError as e:
        raise DatasetError(f"{yaml_path}: cannot read dataset yaml ({e.strerror or e})") from e
    except yaml.YAMLError as e:
        raise DatasetError(f"{yaml_path}: invalid yaml ({e})") from e
    if not isinstance(raw, dict):
        raise DatasetError(f"{yaml_path}: expected a mapping with `path`, `train`, `val`, `names`")

    root = Path(os.path.expanduser(str(raw.get("path") or ".")))
    root = (root if root.is_absolute() else yaml_path.parent / root).resolve()
    if not root.is_dir():
        raise DatasetError(f"{yaml_path}: key `path`: dataset root {root} is not a folder")
    config = DatasetConfig(root=root, splits={}, names=[], yaml_path=yaml_path)

    for split in SPLITS:
        value = raw.get(split)
        if value in (None, "", []):
            continue
        items = value if isinstance(value, list) else [value]
        entries = []
        for item in items:
            if isinstance(item, dict):  # {json: ..., images: ...}
                if "json" not in item:
                    raise DatasetError(
                        f"{yaml_path}: key `{split}`: a mapping entry needs `json` (and `images`)"
                    )
                entry = config.resolve(item["json"])
                if item.get("images"):
                    config.image_dirs[entry] = config.resolve(item["images"])
            elif isinstance(item, (str, os.PathLike)):
                entry = config.resolve(item)
            else:
                raise DatasetError(f"{yaml_path}: key `{split}`: entry {item!r} is not a path")
            if not os.path.exists(entry):
                raise DatasetError(f"{yaml_path}: key `{split}`: {entry} does not exist")
            entries.append(entry)
        config.splits[split] = entries
    if not config.splits:
        raise DatasetError(f"{yaml_path}: no split defined (keys `train`, `val`, `test`)")

    jsons = [e for entries in config.splits.values() for e in entries if e.lower().endswith(".json")]
    smallest = min(jsons, key=os.path.getsize) if jsons else None  # the json whose categories are read
    categories = None
    if raw.get("names") is not None:
        config.names = _names_from(raw["names"], f"{yaml_path}: key `names`")
    else:
        if smallest is None:
            raise DatasetError(
                f"{yaml_path}: key `names` is missing (needed unless a COCO json gives categories)"
            )
        categories = read_categories(smallest)
        config.names = coco_category_names(smallest, categories)
    if not config.names:
        raise DatasetError(f"{yaml_path}: key `names` is empty")
    if "nc" in raw and raw["nc"] is not None and int(raw["nc"]) != len(config.names):
        raise DatasetError(
            f"{yaml_path}: key `nc` is {raw['nc']} but `names` has {len(config.names)} entries"
        )
    try:
        config.options = LabelOptions.from_yaml(raw, str(yaml_path))
    except ValueError as e:
        raise DatasetError(str(e)) from None
    if smallest is not None and not config.options.complete:
        if categories is None and _mentions_keypoints(smallest):
            categories = read_categories(smallest)
        names = category_keypoints(categories or [], smallest)
        if names is not None:
            try:
                config.options = config.options.with_keypoint_names(names, flip_from_names(names), smallest)
            except ValueError as e:
                raise DatasetError(f"{config.source}: {e}") from None
    return config

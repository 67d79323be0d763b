"""The options a dataset's labels are read with: the keypoints every instance of a pose dataset carries.

A dataset yaml declares them (``kpt_shape: [K, D]``: K keypoints of D = 2 (x, y) or 3 (x, y, visibility) values,
and optionally ``flip_idx``, the keypoint each one becomes in a mirrored image), or a COCO keypoints json's
categories do (K names of x, y, visibility; the flip from their ``left_``/``right_`` pairs). ``LabelOptions`` is
that declaration as one frozen record (``DatasetConfig.options``): the sources (``yolo``, ``coco``) hand it to
their row checks instead of a shape, and ask it how wide a row is and whether an instance's keypoints hold. The
task whose labels they are (``tasks.pose``) checks its model against it. This is the one data module that reads
those keys; nothing here imports a task.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from yolo11_lightning.data.sources.checks import CLIP_TOLERANCE

__all__ = ["LabelOptions"]

SHAPE_KEY, FLIP_KEY = "kpt_shape", "flip_idx"  # the dataset yaml's keys


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class LabelOptions:
    """What a dataset's instances carry beyond their boxes and outlines (nothing by default).

    Attributes:
        kpt_shape: (K, D) of a keypoint dataset (its rows carry K keypoints of D values), else None.
        flip_idx: (K,) the keypoint each one becomes in a mirrored image (a permutation), or None.
    """

    kpt_shape: tuple[int, int] | None = None
    flip_idx: tuple[int, ...] | None = None

    @classmethod
    def from_yaml(cls, raw: Mapping[str, Any], where: str) -> LabelOptions:
        """The options a dataset yaml's mapping sets; ValueError naming ``where`` and the key when one is bad."""
        shape, flip = raw.get(SHAPE_KEY), raw.get(FLIP_KEY)
        if shape is None:
            if flip is not None:
                raise ValueError(
                    f"{where}: key `{FLIP_KEY}` is set but `{SHAPE_KEY}` is not ({FLIP_KEY} is for keypoints)"
                )
            return cls()
        if not (isinstance(shape, (list, tuple)) and len(shape) == 2 and all(map(_is_int, shape))) or (
            shape[0] < 1 or shape[1] not in (2, 3)
        ):
            raise ValueError(
                f"{where}: key `{SHAPE_KEY}` must be [K, D]: K >= 1 keypoints of D = 2 (x, y) or 3 (x, y, "
                f"visibility) values, got {shape!r}"
            )
        k = int(shape[0])
        if flip is None:
            return cls((k, int(shape[1])))
        if not (
            isinstance(flip, (list, tuple)) and all(map(_is_int, flip)) and sorted(flip) == list(range(k))
        ):
            raise ValueError(
                f"{where}: key `{FLIP_KEY}` must be a permutation of 0..{k - 1} ({SHAPE_KEY} has {k} keypoints), "
                f"got {flip!r}"
            )
        return cls((k, int(shape[1])), tuple(int(i) for i in flip))

    def yaml_keys(self) -> dict[str, list[int]]:
        """The dataset yaml's keys that declare these options (``from_yaml`` reads them back); {} for none."""
        keys = {} if self.kpt_shape is None else {SHAPE_KEY: list(self.kpt_shape)}
        return keys | ({} if self.flip_idx is None else {FLIP_KEY: list(self.flip_idx)})

    @staticmethod
    def declared_by(raw: Mapping[str, Any]) -> str | None:
        """How a dataset yaml's mapping says it is a keypoint dataset (its keypoint key, unchecked), or None."""
        return None if raw.get(SHAPE_KEY) is None else f"its yaml sets {SHAPE_KEY}: {raw[SHAPE_KEY]}"

    def with_keypoint_names(
        self, names: Sequence[str], flip: tuple[int, ...] | None, where: str
    ) -> LabelOptions:
        """These options completed by the K keypoint names a COCO json's categories declare (D = 3: COCO keypoints
        are x, y, visibility) and the ``flip`` those names give; ValueError naming ``where`` when this record's
        shape differs."""
        shape = (len(names), 3)
        if self.kpt_shape is not None and self.kpt_shape != shape:
            raise ValueError(
                f"key `{SHAPE_KEY}` is {list(self.kpt_shape)} but the categories of {where} declare {len(names)} "
                f"keypoints of x, y, visibility: {SHAPE_KEY} {list(shape)}"
            )
        return replace(self, kpt_shape=shape, flip_idx=self.flip_idx if self.flip_idx is not None else flip)

    @property
    def num_keypoints(self) -> int:
        """K, the keypoints of each instance (0: the labels carry none)."""
        return self.kpt_shape[0] if self.kpt_shape is not None else 0

    @property
    def complete(self) -> bool:
        """Whether both the keypoints and their flip are known (nothing left for a COCO json to give)."""
        return self.kpt_shape is not None and self.flip_idx is not None

    def cache_value(self) -> list[int] | None:
        """What a label cache's key holds of these options (a cache of other keypoints is another cache)."""
        return None if self.kpt_shape is None else list(self.kpt_shape)

    def row_problem(self, n: int) -> str | None:
        """Why a YOLO row of ``n`` values is not a row of these keypoints (class, box, K·D values), or None."""
        k, d = self.kpt_shape or (0, 0)
        width = 5 + k * d
        if n == width:
            return None
        return (
            f"expected {width} values (class cx cy w h, then {k} keypoints of {d} values: the dataset's "
            f"{SHAPE_KEY} {list(self.kpt_shape or ())}), got {n}"
        )

    def check_points(self, values: Sequence[float] | np.ndarray) -> tuple[np.ndarray, str | None]:
        """Validate one instance's K keypoints of D values, given flat and normalised (``x y [visibility]`` each).

        Returns ``(points, None)`` with points (K, 3) float64 ``x, y, visibility``, or ``(points, reason)``. D = 3: a
        visibility outside 0, 1, 2 is refused; D = 2: the visibility is the reference's, 0 where x or y is negative,
        else 1. A labelled keypoint (visibility > 0) outside [-CLIP_TOLERANCE, 1 + CLIP_TOLERANCE] is refused; none
        is clipped, and unlabelled ones are kept as written. The values must be K·D finite numbers (the caller's
        checks)."""
        k, d = self.kpt_shape or (0, 0)
        raw = np.asarray(values, np.float64).reshape(k, d)
        if d == 3:
            bad = np.flatnonzero(~np.isin(raw[:, 2], (0.0, 1.0, 2.0)))
            if len(bad):
                return raw, f"keypoint {bad[0]} has visibility {raw[bad[0], 2]:g}, not 0, 1 or 2"
            points = raw
        else:  # the reference's visibility of an (x, y) keypoint: 0 where x or y is negative
            points = np.concatenate([raw, ((raw[:, :1] >= 0) & (raw[:, 1:2] >= 0)).astype(np.float64)], 1)
        labelled = points[:, 2] > 0
        xy = points[labelled, :2]
        outside = np.flatnonzero(((xy < -CLIP_TOLERANCE) | (xy > 1 + CLIP_TOLERANCE)).any(1))
        if len(outside):
            i = np.flatnonzero(labelled)[outside[0]]
            return points, f"keypoint {i} at ({points[i, 0]:g}, {points[i, 1]:g}) is outside the image [0, 1]"
        return points, None

    def annotation_points(self, values: Any, size: tuple[int, int]) -> tuple[np.ndarray | None, str | None]:
        """A COCO annotation's ``keypoints`` ``[x1, y1, v1, ...]`` in pixels -> ((K, 3) float64 x, y normalised to
        the (h, w) ``size`` frame and the visibility, None), or (None, reason): missing, not 3·K numbers, not
        finite, or refused by ``check_points``."""
        k = self.num_keypoints
        if values is None:
            return None, f"no `keypoints` (the dataset's {SHAPE_KEY} is {list(self.kpt_shape or ())})"
        if not isinstance(values, list) or not all(_is_number(v) for v in values):
            return None, "keypoints must be a list of numbers [x1, y1, v1, x2, y2, v2, ...]"
        if len(values) != 3 * k:
            return None, (
                f"keypoints has {len(values)} values, expected {3 * k} (x, y, visibility of each of the {k} "
                f"keypoints of the dataset's {SHAPE_KEY} {list(self.kpt_shape or ())})"
            )
        raw = np.asarray(values, np.float64).reshape(k, 3)
        if not np.isfinite(raw).all():
            return None, "keypoint value is not a finite number (NaN or inf)"
        raw[:, :2] /= np.array([size[1], size[0]], np.float64)
        points, why = self.check_points(raw)
        return (None, why) if why is not None else (points, None)

    def json_problem(self, declared: Sequence[str] | None) -> str | None:
        """Why a COCO json whose categories declare the keypoint names ``declared`` (None: none) cannot give these
        keypoints (COCO's are x, y, visibility), or None."""
        k, d = self.kpt_shape or (0, 0)
        if d == 3 and (declared is None or len(declared) == k):
            return None
        found = f"its categories declare {len(declared)}" if declared is not None else "COCO has"
        return (
            f"the dataset's {SHAPE_KEY} is {[k, d]} but {found} keypoints of x, y, visibility: {SHAPE_KEY} "
            f"[{len(declared) if declared is not None else k}, 3]"
        )


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)

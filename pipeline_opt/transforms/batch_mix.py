"""MixUp / CutMix on the batch, replayed: the draws and the mixed labels in the worker, the pixels on the device.

torchvision's reference recipe mixes batches in the loader's ``collate_fn``::

    mix = v2.RandomChoice([v2.CutMix(num_classes=N), v2.MixUp(num_classes=N)])
    collate_fn = lambda batch: mix(*default_collate(batch))

:func:`find_batch_mix` recognises that form (a function whose closure or globals hold one v2
``MixUp`` / ``CutMix`` / ``RandomChoice`` of them and ``default_collate``) and then *checks* it: the
user's function and the replay are run on the same small batch from the same seed, and must give
the same images, labels and torch RNG state, or the collate is refused with the difference. A
:class:`ReplayCollate` then packs the replay batch in the worker, makes the mix's draws exactly as
its ``forward`` does (RandomChoice's ``torch.multinomial``, the Beta draw, CutMix's box through the
transform's own ``make_params``), mixes the labels with the transform's own ``_mixup_label`` (the
original's labels, bit for bit) and appends the draw to every parameter row
(:data:`MIX_WIDTH` columns: kind, lambda, box). :func:`apply_batch_mix` mixes the images on the
device with the original's arithmetic (``roll(1, 0)``, ``mul_`` / ``add_``; the box copy).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torchvision.transforms.v2 as T2
from torch.utils.data import default_collate

from pipeline_opt._core import rng
from pipeline_opt.transforms.transform_info import UnsupportedTransform

__all__ = ["MIX_WIDTH", "BatchMix", "ReplayCollate", "apply_batch_mix", "find_batch_mix"]

MIX_WIDTH = 6  # kind (0 none, 1 MixUp, 2 CutMix), lambda, x1, y1, x2, y2
_KIND = {T2.MixUp: 1.0, T2.CutMix: 2.0}
_PROBE_BATCH, _PROBE_SIZE = 4, (3, 12, 10)


def _is_mix(obj: Any) -> bool:
    if type(obj) in _KIND:
        return True
    return type(obj) is T2.RandomChoice and all(type(t) in _KIND for t in obj.transforms)


class BatchMix:
    """One v2 ``MixUp`` / ``CutMix`` (or a ``RandomChoice`` of them) drawn the way its ``forward`` draws."""

    def __init__(self, transform: Any) -> None:
        if not _is_mix(transform):
            raise UnsupportedTransform(f"{type(transform).__name__} is not a v2 MixUp, CutMix or RandomChoice of them")
        for t in self._members(transform):
            missing = [a for a in ("_dist", "_mixup_label", "num_classes") if not hasattr(t, a)]
            if missing:
                raise UnsupportedTransform(f"{type(t).__name__} has no {', '.join(missing)} in this torchvision: its "
                                           "draws cannot be reproduced; the collate_fn stays as it is")
        self.transform = transform

    @staticmethod
    def _members(transform: Any) -> Sequence[Any]:
        return transform.transforms if type(transform) is T2.RandomChoice else (transform,)

    def draw(self, images_shape: Sequence[int]) -> tuple[Any, list[float]]:
        """``(the member drawn, its row)`` for a batch of ``images_shape`` ``(B, C, H, W)``, with the RNG calls
        the original makes (RandomChoice's pick first, then the member's ``make_params``)."""
        t = self.transform
        if type(t) is T2.RandomChoice:
            t = t.transforms[int(torch.multinomial(torch.tensor(t.p), 1))]
        shape_only = torch.empty((), dtype=torch.float32).expand(*images_shape)
        fn = getattr(t, "make_params", None) or t._get_params
        params = fn([shape_only])
        if type(t) is T2.MixUp:
            return t, [_KIND[T2.MixUp], float(params["lam"]), 0.0, 0.0, 0.0, 0.0]
        x1, y1, x2, y2 = params["box"]
        return t, [_KIND[T2.CutMix], float(params["lam_adjusted"]), float(x1), float(y1), float(x2), float(y2)]

    def mix_labels(self, member: Any, labels: torch.Tensor, row: Sequence[float]) -> torch.Tensor:
        """The labels the original returns: the drawn member's own ``_mixup_label``."""
        return member._mixup_label(labels, lam=float(row[1]))

    def __repr__(self) -> str:
        return f"BatchMix({self.transform!r})"


def apply_batch_mix(x: torch.Tensor, row: Sequence[float]) -> torch.Tensor:
    """Mix the batch ``x`` ``(B, C, H, W)`` as the drawn MixUp / CutMix does (the original's arithmetic)."""
    kind, lam = int(row[0]), float(row[1])
    if kind == 1:
        return x.roll(1, 0).mul_(1.0 - lam).add_(x.mul(lam))
    if kind == 2:
        x1, y1, x2, y2 = (int(v) for v in row[2:6])
        out = x.clone()
        out[..., y1:y2, x1:x2] = x.roll(1, 0)[..., y1:y2, x1:x2]
        return out
    return x


class ReplayCollate:
    """The replay's ``collate_fn`` with a batch mix: :func:`~.replay.replay_collate`, then the mix drawn on the
    batch's output shape, the labels mixed and the draw appended to every parameter row. Picklable."""

    def __init__(self, mix: BatchMix, collate: Callable[[Any], Any], output_size: tuple[int, int],
                 channels: int = 3) -> None:
        self.mix, self.collate, self.output_size, self.channels = mix, collate, tuple(output_size), int(channels)

    def __call__(self, batch: Sequence[Any]) -> Any:
        packed = self.collate(batch)
        shape = (len(batch), self.channels, *self.output_size)
        member, row = self.mix.draw(shape)
        labels = self.mix.mix_labels(member, packed.labels, row)
        extra = torch.tensor(row, dtype=packed.params.dtype).expand(len(batch), MIX_WIDTH)
        return packed._replace(params=torch.cat([packed.params, extra], dim=1), labels=labels)


def _candidates(fn: Any) -> list[Any]:
    code = getattr(fn, "__code__", None)
    if code is None:
        return []
    cells = []
    for cell in getattr(fn, "__closure__", None) or ():
        try:
            cells.append(cell.cell_contents)
        except ValueError:  # an empty cell
            continue
    names = getattr(fn, "__globals__", {})
    return cells + [names[n] for n in code.co_names if n in names]


def find_batch_mix(collate_fn: Any) -> tuple[BatchMix | None, str]:
    """``(BatchMix, "")`` where ``collate_fn`` is ``lambda batch: mix(*default_collate(batch))`` (checked by
    running both on a probe batch), else ``(None, why)``."""
    found = _candidates(collate_fn)
    mixes = [o for o in found if _is_mix(o)]
    name = getattr(collate_fn, "__qualname__", type(collate_fn).__name__)
    if len(mixes) != 1 or not any(o is default_collate for o in found):
        return None, (f"the loader has its own collate_fn ({name}), which the replay would skip; only "
                      "`lambda batch: mix(*default_collate(batch))` with a v2 MixUp / CutMix / RandomChoice of them "
                      "is replayed")
    try:
        mix = BatchMix(mixes[0])
    except UnsupportedTransform as e:
        return None, str(e)
    why = _probe(collate_fn, mix)
    return (None, why) if why else (mix, "")


def _probe(collate_fn: Any, mix: BatchMix) -> str:
    """Run the user's collate and the replay of it on one small batch from one seed (torch, Python and numpy
    RNGs, restored afterwards); '' when the outputs and every RNG's state agree."""
    classes = min(int(t.num_classes or 2) for t in BatchMix._members(mix.transform))
    gen = torch.Generator().manual_seed(0)
    batch = [(torch.rand(_PROBE_SIZE, generator=gen), i % classes) for i in range(_PROBE_BATCH)]
    saved = rng.states()
    try:
        rng.seed_all(1)
        try:
            want = collate_fn(batch)
        except Exception as e:  # the user's function on a plain (image, label) batch
            return f"the collate_fn failed on a probe batch of (image, label) pairs: {type(e).__name__}: {e}"
        want_states = rng.states()
        rng.seed_all(1)
        images, labels = default_collate(batch)
        member, row = mix.draw(tuple(images.shape))
        got = (apply_batch_mix(images, row), mix.mix_labels(member, labels, row))
        # torch's and Python's / numpy's: a collate that draws with `random` (e.g. mixes only some batches) differs
        same_state = rng.same_states(want_states, rng.states())
    finally:
        rng.restore(saved)
    if not (isinstance(want, (tuple, list)) and len(want) == 2):
        return f"the collate_fn returns {type(want).__name__}, not (images, labels): it is not replayed"
    if not same_state or not (torch.equal(want[0], got[0]) and torch.equal(want[1], got[1])):
        return ("the collate_fn does more than mix(*default_collate(batch)) (its output or its random draws differ "
                "from the replay's on a probe batch): it is not replayed")
    return ""

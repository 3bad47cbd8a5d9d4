"""Candidate configurations: what a trial changes, the first guess, and the neighbours to try next."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from torch.utils.data import DataLoader

from pipeline_opt._core.littles_law import MARGIN, workers_for
from pipeline_opt.loading.dataloader import loader_config

DECODES = ("pil", "draft", "nvjpeg")
DATA_BOUND_RATIO = 1.25  # a step this much longer than its own seconds waits for data


@dataclass(frozen=True)
class LoaderConfig:
    """One point of the search space. Hashable, so measured configurations can be looked up."""

    num_workers: int
    pin_memory: bool = False
    persistent_workers: bool = False
    prefetch_factor: int | None = None
    gpu_transforms: tuple[str, ...] = ()  # names of the transforms moved to the device loader
    decode: str = "pil"  # pil (the dataset's own loader) | draft (JPEG DCT scaling) | nvjpeg (on the GPU)
    shared_slots: bool = False  # image tensors through reused, page-locked shared-memory slots
    decode_thread: bool = False  # GPU decoding in a background thread (DeviceLoader(prepare_in_thread=True))

    def __post_init__(self) -> None:
        if not isinstance(self.num_workers, int) or self.num_workers < 0:
            raise ValueError(f"num_workers={self.num_workers!r} must be an integer >= 0")
        if self.decode not in DECODES:
            raise ValueError(f"decode={self.decode!r} must be one of {DECODES}")
        if self.num_workers == 0:  # settings that only exist with workers
            object.__setattr__(self, "persistent_workers", False)
            object.__setattr__(self, "prefetch_factor", None)
            object.__setattr__(self, "shared_slots", False)
        elif self.prefetch_factor is None:
            object.__setattr__(self, "prefetch_factor", 2)
        if self.decode != "nvjpeg":  # only a GPU decode blocks the loop it is called from
            object.__setattr__(self, "decode_thread", False)
        if self.shared_slots:  # the slots are page-locked by registration: pinned, without a pinning copy
            object.__setattr__(self, "pin_memory", True)

    @property
    def draft_decode(self) -> bool:
        return self.decode == "draft"

    def variant(self) -> tuple[tuple[str, ...], str]:
        """What the candidate changes in the dataset (configurations of one variant differ in loader flags only)."""
        return self.gpu_transforms, self.decode

    @classmethod
    def from_dict(cls, config: dict[str, Any]) -> LoaderConfig:
        """The inverse of :meth:`to_dict`."""
        return cls(num_workers=config["num_workers"], pin_memory=config["pin_memory"],
                   persistent_workers=config["persistent_workers"], prefetch_factor=config["prefetch_factor"],
                   gpu_transforms=tuple(config.get("gpu_transforms") or ()),
                   decode=config.get("decode") or ("draft" if config.get("draft_decode") else "pil"),
                   shared_slots=bool(config.get("shared_slots", False)),
                   decode_thread=bool(config.get("decode_thread", False)))

    @classmethod
    def of(cls, loader: DataLoader) -> LoaderConfig:
        """The configuration ``loader`` runs with."""
        cfg = loader_config(loader)
        return cls(num_workers=cfg["num_workers"], pin_memory=cfg["pin_memory"],
                   persistent_workers=cfg["persistent_workers"], prefetch_factor=cfg["prefetch_factor"])

    def with_(self, **changes: Any) -> LoaderConfig:
        """A copy with ``changes`` applied (worker-only settings normalised by ``__post_init__``)."""
        return replace(self, **changes)

    def loader_overrides(self) -> dict[str, Any]:
        """Keyword arguments for :func:`pipeline_opt.loading.dataloader.clone_loader`."""
        out: dict[str, Any] = {"num_workers": self.num_workers, "pin_memory": self.pin_memory}
        if self.num_workers > 0:
            out["persistent_workers"] = self.persistent_workers
            out["prefetch_factor"] = self.prefetch_factor
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"num_workers": self.num_workers, "pin_memory": self.pin_memory,
                "persistent_workers": self.persistent_workers, "prefetch_factor": self.prefetch_factor,
                "gpu_transforms": list(self.gpu_transforms), "decode": self.decode,
                "draft_decode": self.draft_decode, "shared_slots": self.shared_slots,
                "decode_thread": self.decode_thread}

    def label(self) -> str:
        parts = [f"workers={self.num_workers}"]
        if self.num_workers:
            parts.append(f"prefetch={self.prefetch_factor}")
            if self.persistent_workers:
                parts.append("persistent")
        if self.shared_slots:
            parts.append("shared-slots")
        elif self.pin_memory:
            parts.append("pinned")
        if self.gpu_transforms:
            parts.append("gpu:" + "+".join(self.gpu_transforms))
        if self.decode != "pil":
            parts.append(f"{self.decode}-in-thread" if self.decode_thread else self.decode)
        return " ".join(parts)


def littles_law_workers(batch_s: float, step_s: float, margin: float = MARGIN) -> int:
    """Workers needed so that batches arrive as fast as the step consumes them (:func:`~pipeline_opt._core.
    littles_law.workers_for`, the profile's formula too): ``ceil(batch_s / step_s)`` plus 25%, at least one."""
    return workers_for(batch_s, step_s, margin)


def epoch_workers(workers: int, batches_per_epoch: int | None) -> int:
    """The fewest workers that make an epoch of ``batches_per_epoch`` in as many rounds as ``workers`` do.

    The DataLoader hands an epoch's batches to its workers in turn and starts every epoch anew,
    so a data-bound epoch lasts ``ceil(batches / workers)`` rounds of one batch's latency: 16
    batches take two rounds with 8 workers and with 14 alike (a round of 14, then one of 2), one
    round with 16. Workers beyond the fewest for those rounds add processes, not speed."""
    if workers < 1 or not batches_per_epoch or batches_per_epoch < 1:
        return workers
    rounds = math.ceil(batches_per_epoch / workers)
    return min(workers, math.ceil(batches_per_epoch / rounds))


SHORT_EPOCH_ROUNDS = 4  # a worker restarted every epoch after this few batches is mostly start-up


def short_epoch(workers: int, batches_per_epoch: int | None) -> bool:
    """Whether ``workers`` restarted at every epoch would each make at most ``SHORT_EPOCH_ROUNDS``
    batches before the next restart: their start-up (a process, the dataset, imports) is then a large
    share of the epoch, and persistent workers, which start once, are the first thing to try."""
    return workers >= 1 and bool(batches_per_epoch) and batches_per_epoch <= SHORT_EPOCH_ROUNDS * workers


EPOCH_HOOKS = ("set_epoch",)  # dataset methods a training loop calls between epochs


def stale_dataset_hazard(dataset: Any) -> str | None:
    """Why persistent workers could change the samples of ``dataset``, or None.

    Persistent workers keep the copy of the dataset they started with: a dataset the training loop
    changes between epochs (``dataset.set_epoch(epoch)``: curriculum, resampling, augmentation
    schedules) would go on serving its first epoch's state. The tuner cannot see what such a
    method changes, so it leaves ``persistent_workers`` as given for such a dataset, and says so."""
    seen = 0
    while dataset is not None and seen < 8:  # through Subset / wrapper datasets
        for hook in EPOCH_HOOKS:
            if callable(getattr(type(dataset), hook, None)):
                return (f"{type(dataset).__name__}.{hook}() exists: persistent workers would keep the dataset "
                        "they started with and miss what it changes between epochs; set persistent_workers=True "
                        f"yourself if {hook} changes nothing the workers read")
        dataset, seen = getattr(dataset, "dataset", None), seen + 1
    return None


def persistent_for_short_epochs(guess: LoaderConfig, batches_per_epoch: int | None) -> tuple[LoaderConfig, str]:
    """``guess`` with persistent workers when its workers would restart after a few batches each
    (:func:`short_epoch`), and the clause that says so; else unchanged."""
    if guess.persistent_workers or not short_epoch(guess.num_workers, batches_per_epoch):
        return guess, ""
    per_worker = -(-batches_per_epoch // guess.num_workers)
    return guess.with_(persistent_workers=True), (f", persistent since {batches_per_epoch} batches an epoch make "
                                                  f"at most {per_worker} per worker between restarts")


def workers_to_keep_up(m: Any, num_workers: int) -> int | None:
    """Little's law from a measured configuration that is still data-bound, else None.

    ``m`` (a :class:`pipeline_opt.tune.measure.Measurement`) gives the step time it reached with
    ``num_workers`` workers and the step's own seconds (``compute_s``); each worker then makes a
    batch in about ``step_s * num_workers`` seconds, and :func:`littles_law_workers` says how many
    keep a ``compute_s`` step fed. None when the step is within ``DATA_BOUND_RATIO`` of its own
    seconds (not data-bound) or either number is missing."""
    compute = float(getattr(m, "compute_s", 0.0) or 0.0)
    step = float(getattr(m, "step_s", 0.0) or 0.0)
    if num_workers < 1 or compute <= 0 or not math.isfinite(step) or step <= DATA_BOUND_RATIO * compute:
        return None
    return littles_law_workers(step * num_workers, compute)


def worker_neighbours(current: int, cap: int, *, need: int | None = None,
                      batches_per_epoch: int | None = None) -> list[int]:
    """Local-search moves around ``current``: Little's law's count when it asks for more (``need``,
    capped: a data-bound pipeline climbs to what it needs in one move, not by doublings), then
    doubling, halving, and steps of a quarter (at least 1).

    With ``batches_per_epoch`` each move becomes the fewest workers making an epoch in as many
    rounds (:func:`epoch_workers`), and moves equal to ``current`` in rounds are dropped: they
    measure the same speed."""
    step = max(1, current // 4)
    moves = [min(cap, max(current + 1, 2 * current)), max(1, current // 2), current + step, current - step]
    if need is not None and need > current:
        moves.insert(0, min(cap, need))
    here = epoch_workers(current, batches_per_epoch) if current >= 1 else current
    out: list[int] = []
    for w in moves:
        if batches_per_epoch and w >= 1:
            w = epoch_workers(w, batches_per_epoch)
            if w == here:
                continue
        if 1 <= w <= cap and w != current and w not in out:
            out.append(w)
    return out



"""Rebuild a DataLoader with changed settings, keeping everything that decides *what* it yields.

:func:`clone_loader` is how the profiler installs its proxies and how the tuner tries candidates:
the clone has the same dataset, sampler / batch_sampler, collate_fn, drop_last, generator (state
copied, so iterating the clone never advances the user's generator), timeout,
multiprocessing_context, worker_init_fn, pin_memory_device and in_order, and the same class
(ultralytics' ``InfiniteDataLoader`` is rebuilt as itself). Only the overrides change.
"""

from __future__ import annotations

import copy
import inspect
from typing import Any

import torch
from torch.utils.data import BatchSampler, DataLoader, RandomSampler, Sampler

TUNABLE = ("num_workers", "pin_memory", "persistent_workers", "prefetch_factor")
_OVERRIDABLE = set(TUNABLE) | {"dataset", "collate_fn", "worker_init_fn", "multiprocessing_context", "timeout"}


def _copy_generator(gen: torch.Generator | None) -> torch.Generator | None:
    if gen is None:
        return None
    new = torch.Generator(device=gen.device)
    new.set_state(gen.get_state())
    return new


def _copy_sampler(sampler: Any, generator_map: dict[int, torch.Generator | None]) -> Any:
    """A sampler that yields the same sequence without sharing RNG state with the original."""
    gen = getattr(sampler, "generator", None)
    if isinstance(sampler, RandomSampler):
        return RandomSampler(sampler.data_source, replacement=sampler.replacement,
                             num_samples=sampler._num_samples, generator=_mapped(gen, generator_map))
    if isinstance(sampler, BatchSampler):
        return BatchSampler(_copy_sampler(sampler.sampler, generator_map), sampler.batch_size, sampler.drop_last)
    inner = getattr(sampler, "sampler", None)
    copied_inner = _copy_sampler(inner, generator_map) if inner is not None else None
    if isinstance(gen, torch.Generator) or copied_inner is not inner:
        # a wrapper (e.g. the persistent-epoch sampler) may hold a generator and an inner sampler
        # with one of its own: both are copied, or iterating the copy would advance the original
        clone = copy.copy(sampler)
        if isinstance(gen, torch.Generator):
            clone.generator = _mapped(gen, generator_map)
        if copied_inner is not inner:
            clone.sampler = copied_inner
        return clone
    return sampler  # stateless (SequentialSampler, DistributedSampler, user samplers)


def _mapped(gen: torch.Generator | None, generator_map: dict[int, torch.Generator | None]) -> torch.Generator | None:
    if gen is None:
        return None
    key = id(gen)
    if key not in generator_map:
        generator_map[key] = _copy_generator(gen)
    return generator_map[key]


class _PersistentEpochSampler(Sampler):
    """Keeps a persistent-worker clone's epoch order equal to its non-persistent original's.

    A DataLoader draws its workers' base seed from ``loader.generator`` (or the global RNG) each
    time it builds an iterator, just before the sampler draws its permutation. A persistent
    iterator is built once and reused, so from the second epoch on the sampler would draw from an
    RNG one step behind the original's. This wrapper makes that one draw itself at the start of
    every epoch after the first, so both loaders see the same RNG sequence.
    """

    def __init__(self, sampler: Any, generator: torch.Generator | None) -> None:
        self.sampler = sampler
        self.generator = generator
        self._epochs_started = 0

    def __len__(self) -> int:
        return len(self.sampler)

    def __iter__(self):
        if self._epochs_started > 0:
            torch.empty((), dtype=torch.int64).random_(generator=self.generator)
        self._epochs_started += 1
        yield from self.sampler


def _is_infinite(loader: DataLoader) -> bool:
    return type(loader).__name__ == "InfiniteDataLoader" and hasattr(loader.batch_sampler, "sampler") \
        and type(loader.batch_sampler).__name__ == "_RepeatSampler"


def _user_batch_sampler(loader: DataLoader) -> Any:
    bs = loader.batch_sampler
    return bs.sampler if _is_infinite(loader) else bs


def loader_config(loader: DataLoader) -> dict[str, Any]:
    """The tunable settings of ``loader`` plus its batch size, as a plain dict."""
    if not isinstance(loader, DataLoader):
        inner = getattr(loader, "loader", None)
        if isinstance(inner, DataLoader):
            return loader_config(inner)
        raise TypeError(f"expected a torch.utils.data.DataLoader, got {type(loader).__name__}")
    batch_size = loader.batch_size
    if batch_size is None:
        batch_size = getattr(_user_batch_sampler(loader), "batch_size", None)
    return {
        "num_workers": int(loader.num_workers),
        "pin_memory": bool(loader.pin_memory),
        "persistent_workers": bool(loader.persistent_workers),
        "prefetch_factor": loader.prefetch_factor if loader.num_workers > 0 else None,
        "batch_size": batch_size,
    }


def clone_loader(loader: DataLoader, **overrides: Any) -> DataLoader:
    """Return a new loader of the same class yielding the same samples in the same order.

    ``overrides`` may set num_workers, pin_memory, persistent_workers, prefetch_factor, dataset,
    collate_fn, worker_init_fn, multiprocessing_context and timeout. Settings that only make sense
    with workers are normalised (persistent_workers / prefetch_factor are dropped for 0 workers, and
    prefetch_factor defaults to 2 when workers are added to a 0-worker loader).
    """
    if not isinstance(loader, DataLoader):
        raise TypeError(
            f"clone_loader needs a torch.utils.data.DataLoader, got {type(loader).__name__}; "
            "pass the DataLoader itself (for a DeviceLoader, its .loader)"
        )
    unknown = set(overrides) - _OVERRIDABLE
    if unknown:
        raise ValueError(f"clone_loader cannot override {sorted(unknown)}; allowed: {sorted(_OVERRIDABLE)}")
    nw = overrides.get("num_workers", loader.num_workers)
    if not isinstance(nw, int) or nw < 0:
        raise ValueError(f"num_workers={nw!r} must be an integer >= 0")

    generator_map: dict[int, torch.Generator | None] = {}
    kwargs: dict[str, Any] = {
        "dataset": overrides.get("dataset", loader.dataset),
        "collate_fn": overrides.get("collate_fn", loader.collate_fn),
        "num_workers": nw,
        "pin_memory": overrides.get("pin_memory", loader.pin_memory),
        "timeout": overrides.get("timeout", loader.timeout),
        "worker_init_fn": overrides.get("worker_init_fn", loader.worker_init_fn),
        "multiprocessing_context": overrides.get("multiprocessing_context", loader.multiprocessing_context),
        "generator": _mapped(loader.generator, generator_map),
    }
    if loader._dataset_kind == 1:  # IterableDataset: batching is done by the loader, no sampler
        kwargs["batch_size"] = loader.batch_size
        kwargs["drop_last"] = loader.drop_last
    elif loader.batch_size is not None and isinstance(_user_batch_sampler(loader), BatchSampler) \
            and type(_user_batch_sampler(loader)) is BatchSampler:
        kwargs["batch_size"] = loader.batch_size
        kwargs["drop_last"] = loader.drop_last
        kwargs["sampler"] = _copy_sampler(loader.sampler, generator_map)
    elif loader.batch_size is None and loader.batch_sampler is None:
        kwargs["batch_size"] = None
        kwargs["sampler"] = _copy_sampler(loader.sampler, generator_map)
    else:
        kwargs["batch_sampler"] = _copy_sampler(_user_batch_sampler(loader), generator_map)

    if nw > 0:
        kwargs["persistent_workers"] = overrides.get("persistent_workers", loader.persistent_workers)
        originally_persistent = loader.persistent_workers and loader.num_workers > 0
        if kwargs["persistent_workers"] and not originally_persistent and not _is_infinite(loader):
            for key in ("sampler", "batch_sampler"):
                if key in kwargs:
                    kwargs[key] = _PersistentEpochSampler(kwargs[key], kwargs["generator"])
        pf = overrides.get("prefetch_factor", loader.prefetch_factor if loader.num_workers > 0 else None)
        kwargs["prefetch_factor"] = 2 if pf is None else pf
        if not isinstance(kwargs["prefetch_factor"], int) or kwargs["prefetch_factor"] < 1:
            raise ValueError(f"prefetch_factor={kwargs['prefetch_factor']!r} must be an integer >= 1")
    else:
        kwargs["multiprocessing_context"] = None
    params = inspect.signature(DataLoader.__init__).parameters
    if "pin_memory_device" in params and getattr(loader, "pin_memory_device", ""):
        kwargs["pin_memory_device"] = loader.pin_memory_device
    if "in_order" in params and hasattr(loader, "in_order"):
        kwargs["in_order"] = loader.in_order
    return type(loader)(**kwargs)

"""The one adapter to torch's DataLoader: clone it with new settings, walk wrappers, stop its workers.

* :func:`clone_loader` is how the profiler installs its proxies and how the tuner tries candidates:
  the clone has the same dataset, sampler / batch_sampler, collate_fn, drop_last, generator (state
  copied, so iterating the clone never advances the user's generator), timeout,
  multiprocessing_context, worker_init_fn, pin_memory_device and in_order, and the same class (a
  framework's DataLoader subclass is rebuilt as itself). Only the overrides change.
* :func:`loaders_under` walks wrappers that keep their loader in ``.loader`` (a ``DeviceLoader``);
  :func:`num_workers_of`, :func:`persistent_of`, :func:`batches_per_epoch`, :func:`continuous` read
  the innermost loader.
* :func:`shutdown_iterator` / :func:`release_workers` stop worker processes now instead of at garbage
  collection, persistent ones included.

Every touch of torch's private DataLoader attributes is in this module: a persistent loader keeps its
iterator in :data:`PERSISTENT_ITERATOR`, an iterator stops its workers with :data:`SHUTDOWN` (both
private in torch; a test checks them against the installed version). A framework whose DataLoader
subclass works otherwise (one iterator kept over a repeating batch sampler) describes it once as a
:class:`LoaderKind` (:func:`register_loader_kind`), so that nothing else here or elsewhere names it.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, RandomSampler, Sampler

from pipeline_opt._core.log import get_logger

__all__ = ["PERSISTENT_ITERATOR", "SHUTDOWN", "TUNABLE", "LoaderKind", "batches_per_epoch", "clone_loader",
           "continuous", "first_batch", "innermost", "kind_of", "loader_config", "loaders_under", "num_workers_of",
           "persistent_of", "register_loader_kind", "release_workers", "shutdown_iterator"]

PERSISTENT_ITERATOR = "_iterator"  # torch: where a persistent_workers loader keeps its iterator
SHUTDOWN = "_shutdown_workers"  # torch: a multi-process iterator's method that joins its workers
_MAX_WRAPPERS = 4  # wrappers (.loader) followed down to the DataLoader

log = get_logger("loading.dataloader")


@dataclass(frozen=True)
class LoaderKind:
    """A framework's DataLoader subclass that keeps one iterator over a repeating batch sampler.

    ``matches(loader)`` recognises it; ``user_batch_sampler(loader)`` is the batch sampler the user
    gave under the repeating one (what a clone is built from); ``iterator_attr`` is where it keeps
    its iterator (shut down and set to None to release its workers: the next iteration starts new
    ones). Its epochs run on without a restart (:func:`continuous`), so its workers never refill.
    """

    name: str
    matches: Callable[[DataLoader], bool]
    user_batch_sampler: Callable[[DataLoader], Any]
    iterator_attr: str


_KINDS: list[LoaderKind] = []


def register_loader_kind(kind: LoaderKind) -> LoaderKind:
    """Add ``kind`` (once: a second kind of the same name is refused)."""
    if any(k.name == kind.name for k in _KINDS):
        if kind in _KINDS:
            return kind
        raise ValueError(f"a loader kind named {kind.name!r} is registered already")
    _KINDS.append(kind)
    return kind


def kind_of(loader: Any) -> LoaderKind | None:
    """The registered :class:`LoaderKind` of ``loader``, or None for a plain DataLoader."""
    if not isinstance(loader, DataLoader):
        return None
    return next((k for k in _KINDS if k.matches(loader)), None)

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


def _user_batch_sampler(loader: DataLoader) -> Any:
    kind = kind_of(loader)
    return loader.batch_sampler if kind is None else kind.user_batch_sampler(loader)


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
    if isinstance(loader.dataset, IterableDataset):  # batching is done by the loader, no sampler
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
        if kwargs["persistent_workers"] and not originally_persistent and kind_of(loader) is None:
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


# ------------------------------------------------------------------------------ wrappers and workers

def loaders_under(loader: Any) -> list[Any]:
    """``[loader, loader.loader, ...]``: a wrapper (``DeviceLoader``) keeps what it wraps in ``.loader``."""
    out = []
    while loader is not None and len(out) < _MAX_WRAPPERS:
        out.append(loader)
        loader = getattr(loader, "loader", None)
    return out


def innermost(loader: Any) -> Any:
    """The loader at the bottom of :func:`loaders_under` (the DataLoader under a wrapper)."""
    return loaders_under(loader)[-1]


def num_workers_of(loader: Any) -> int:
    """``num_workers`` of the innermost DataLoader under ``loader``."""
    return int(getattr(innermost(loader), "num_workers", 0) or 0)


def persistent_of(loader: Any) -> bool:
    """Whether the innermost DataLoader under ``loader`` keeps its workers between epochs."""
    return bool(getattr(innermost(loader), "persistent_workers", False))


def batches_per_epoch(loader: Any) -> int | None:
    """Batches one epoch of ``loader`` yields (``len``), None when it has no length."""
    for dl in loaders_under(loader):
        try:
            n = len(dl)
        except TypeError:
            continue
        return int(n) if n > 0 else None
    return None


def continuous(loader: Any) -> bool:
    """Whether ``loader``'s epochs run on without a restart (a registered :class:`LoaderKind`: one
    iterator over a repeating sampler), so its workers never refill their queues between epochs."""
    return kind_of(innermost(loader)) is not None


def shutdown_iterator(iterator: Any) -> None:
    """Stop the workers behind ``iterator`` (a DataLoader iterator; a generator or other iterator with a
    ``close()`` over one, e.g. a device loader's, is closed first)."""
    if iterator is None:
        return
    close = getattr(iterator, "close", None)
    if callable(close):
        close()
    shutdown = getattr(iterator, SHUTDOWN, None)
    if callable(shutdown):
        try:
            shutdown()
        except RuntimeError as exc:
            # torch's SIGCHLD handler raises this while the join waits, for a worker that had died
            # (the caller already failed on it); the workers left are reaped with the iterator
            if "DataLoader worker" not in str(exc):
                raise
            log.debug("shutting the workers down: %s", exc)


def _held_iterators(loader: Any) -> Iterator[tuple[Any, str]]:
    """``(holder, attribute)`` of every iterator kept on a loader of the chain (persistent workers)."""
    for dl in loaders_under(loader):
        kind = kind_of(dl)
        for attr in (PERSISTENT_ITERATOR,) + ((kind.iterator_attr,) if kind is not None else ()):
            if getattr(dl, attr, None) is not None:
                yield dl, attr


def first_batch(loader: Any) -> Any:
    """The first batch of ``loader``; its workers (if any) are stopped afterwards. A loader without
    batches raises a ``ValueError`` saying so; the loader's own errors come through as raised."""
    iterator = iter(loader)
    try:
        return next(iterator)
    except StopIteration:
        raise ValueError("the loader yields no batches (empty dataset or sampler)") from None
    finally:
        release_workers(loader, iterator)


def release_workers(loader: Any, iterator: Iterator | None = None) -> None:
    """Stop every worker process behind ``iterator`` and ``loader`` now: the iterator's, and those of
    the iterators the loaders under ``loader`` keep (persistent workers; a :class:`LoaderKind`'s own),
    which are set to None so that a later iteration starts new workers instead of reusing stopped ones."""
    stopped: set[int] = set()
    if iterator is not None:
        shutdown_iterator(iterator)
        stopped.add(id(iterator))
    for holder, attr in list(_held_iterators(loader)):
        held = getattr(holder, attr)
        setattr(holder, attr, None)
        if id(held) not in stopped:
            shutdown_iterator(held)
            stopped.add(id(held))

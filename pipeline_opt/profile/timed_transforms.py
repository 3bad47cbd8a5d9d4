"""Per-transform timing: wrap the callables of a dataset's transform pipeline, and undo it.

A dataset's pipeline is found on its ``transform`` / ``transforms`` attributes (and on wrapped
datasets reached through ``.dataset`` / ``.datasets``, e.g. ``Subset``, ``ConcatDataset``):

* an object with a ``.transforms`` *list* (torchvision ``Compose`` v1/v2, ultralytics ``Compose``):
  every leaf callable is wrapped in place; nested composes are entered, not timed as one block, so
  the per-transform seconds do not double count;
* a plain list / tuple of callables;
* a wrapper with a ``.transform`` attribute (torchvision ``StandardTransform``): entered;
* a single callable (a function or a transform object): timed under its own name.

Each leaf is named by its class name (functions by ``__name__``); repeated names get ``#2``, ``#3``.
Instrumentation runs inside the process that fetches samples (a DataLoader worker owns a copy of the
dataset), so the user's objects are only touched when the main process plays the worker
(``num_workers=0``); :func:`restore` undoes those patches.
"""

from __future__ import annotations

import functools
import time
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

_MAX_DEPTH = 4


@dataclass(frozen=True)
class Patch:
    """One attribute replaced on a user object; :func:`restore` puts ``original`` back."""

    holder: Any
    attr: str
    original: Any


class TimedTransform:
    """Calls ``inner`` and reports its wall time to ``report(name, t0_ns, t1_ns)``.

    Attribute reads and writes are forwarded to the wrapped transform, so code that tweaks a
    transform in place (``compose.transforms[0].p = 0``) keeps working.
    """

    def __init__(self, inner: Callable, name: str, report: Callable[[str, int, int], None]) -> None:
        object.__setattr__(self, "_inner", inner)
        object.__setattr__(self, "_name", name)
        object.__setattr__(self, "_report", report)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        t0 = time.time_ns()
        try:
            return self._inner(*args, **kwargs)
        finally:
            self._report(self._name, t0, time.time_ns())

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("_inner", "_name", "_report"):
            raise AttributeError(name)
        return getattr(object.__getattribute__(self, "_inner"), name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._inner, name, value)

    def __reduce__(self) -> tuple:
        # A pickled copy is the plain transform: timing belongs to the process that installed it.
        return (_identity, (self._inner,))

    def __repr__(self) -> str:
        return f"Timed({self._inner!r})"


def _identity(value: Any) -> Any:
    return value


def transform_name(fn: Any) -> str:
    """The display name of a transform: its class name, or ``__name__`` for functions."""
    if isinstance(fn, TimedTransform):
        return fn._name
    if isinstance(fn, functools.partial):
        return getattr(fn.func, "__name__", "partial")
    if isinstance(fn, (types.FunctionType, types.BuiltinFunctionType, types.MethodType)):
        return fn.__name__
    return type(fn).__name__


def _is_transform_list(value: Any) -> bool:
    return isinstance(value, (list, tuple)) and len(value) > 0 and all(callable(v) for v in value)


class _Instrumenter:
    def __init__(self, report: Callable[[str, int, int], None]) -> None:
        self.report = report
        self.patches: list[Patch] = []
        self._seen: set[int] = set()
        self._names: dict[str, int] = {}

    def _unique(self, fn: Any) -> str:
        base = transform_name(fn)
        n = self._names.get(base, 0) + 1
        self._names[base] = n
        return base if n == 1 else f"{base}#{n}"

    def _wrap_list(self, items: Any, depth: int) -> list:
        out = []
        for item in items:
            nested = getattr(item, "transforms", None)
            if depth < _MAX_DEPTH and isinstance(nested, (list, tuple)) and _is_transform_list(nested):
                self._compose(item, depth + 1)
                out.append(item)
            elif isinstance(item, TimedTransform):
                out.append(item)
            else:
                out.append(TimedTransform(item, self._unique(item), self.report))
        return out

    def _compose(self, compose: Any, depth: int) -> None:
        if id(compose) in self._seen:
            return
        self._seen.add(id(compose))
        original = compose.transforms
        try:
            compose.transforms = type(original)(self._wrap_list(original, depth))
        except (AttributeError, TypeError):  # read-only or typed container: leave it untimed
            return
        self.patches.append(Patch(compose, "transforms", original))

    def value(self, holder: Any, attr: str, depth: int) -> None:
        value = getattr(holder, attr, None)
        if value is None or isinstance(value, TimedTransform) or id(value) in self._seen:
            return
        nested = getattr(value, "transforms", None)
        if isinstance(nested, (list, tuple)) and _is_transform_list(nested):
            self._compose(value, depth)
        elif _is_transform_list(value):
            self._seen.add(id(value))
            if self._set(holder, attr, type(value)(self._wrap_list(value, depth))):
                self.patches.append(Patch(holder, attr, value))
        elif getattr(value, "transform", None) is not None and depth < _MAX_DEPTH:
            self._seen.add(id(value))
            self.value(value, "transform", depth + 1)
        elif callable(value) and not isinstance(value, type):
            self._seen.add(id(value))
            if self._set(holder, attr, TimedTransform(value, self._unique(value), self.report)):
                self.patches.append(Patch(holder, attr, value))

    @staticmethod
    def _set(holder: Any, attr: str, value: Any) -> bool:
        try:
            setattr(holder, attr, value)
        except (AttributeError, TypeError):
            return False
        return True

    def dataset(self, dataset: Any, depth: int = 0) -> None:
        if dataset is None or depth > _MAX_DEPTH or id(dataset) in self._seen:
            return
        self._seen.add(id(dataset))
        for attr in ("transform", "transforms"):
            self.value(dataset, attr, depth)
        self.dataset(getattr(dataset, "dataset", None), depth + 1)
        for inner in getattr(dataset, "datasets", None) or ():
            self.dataset(inner, depth + 1)


def instrument(dataset: Any, report: Callable[[str, int, int], None]) -> list[Patch]:
    """Wrap every transform reachable from ``dataset``; returns the patches for :func:`restore`."""
    inst = _Instrumenter(report)
    inst.dataset(dataset)
    return inst.patches


def restore(patches: list[Patch]) -> None:
    """Undo :func:`instrument` (in reverse order)."""
    for patch in reversed(patches):
        try:
            setattr(patch.holder, patch.attr, patch.original)
        except (AttributeError, TypeError):
            pass

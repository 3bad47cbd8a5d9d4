"""Renderers by name: a result renders itself without importing the layer that draws it.

:class:`~pipeline_opt.profile.report.ProfileReport` and :class:`~pipeline_opt.tune.result.TuneResult`
live below :mod:`pipeline_opt.report`, which draws their tables and HTML pages; the report package
registers its renderers here when it is imported (``import pipeline_opt`` imports it), and a result's
``table()`` / ``save()`` call :func:`render`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["register_renderer", "render"]

_RENDERERS: dict[str, Callable[[Any], str]] = {}


def register_renderer(name: str, fn: Callable[[Any], str]) -> None:
    """Draw ``name`` (e.g. ``"profile_html"``) with ``fn(obj) -> str`` from now on."""
    if not callable(fn):
        raise TypeError(f"renderer {name!r} must be callable, got {type(fn).__name__}")
    _RENDERERS[name] = fn


def render(name: str, obj: Any) -> str:
    """``obj`` drawn by the renderer registered as ``name``."""
    fn = _RENDERERS.get(name)
    if fn is None:
        raise LookupError(f"no renderer {name!r} is registered; import pipeline_opt.report (import pipeline_opt "
                          "does) before rendering a report")
    return fn(obj)

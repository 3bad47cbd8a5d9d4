"""Walk an ultralytics transform tree (Compose lists, mix transforms' ``pre_transform``, profiler wrappers)."""

from __future__ import annotations

from typing import Any

_MAX_DEPTH = 6


def unwrap(obj: Any) -> Any:
    """The transform under a profiler wrapper (``TimedTransform`` keeps it in ``_inner``)."""
    for _ in range(_MAX_DEPTH):
        inner = getattr(obj, "_inner", None) if type(obj).__name__ == "TimedTransform" else None
        if inner is None:
            return obj
        obj = inner
    return obj


def iter_transforms(root: Any) -> list[Any]:
    """Every transform object reachable from ``root`` (Compose lists, ``pre_transform``), each once."""
    leaves: list[Any] = []
    seen: set[int] = set()

    def visit(node: Any, depth: int) -> None:
        node = unwrap(node)
        if node is None or id(node) in seen or depth > _MAX_DEPTH:
            return
        seen.add(id(node))
        children = getattr(node, "transforms", None)
        if isinstance(children, list):
            for child in children:
                visit(child, depth + 1)
        else:
            leaves.append(node)
        pre = getattr(node, "pre_transform", None)
        if pre is not None:
            visit(pre, depth + 1)

    visit(root, 0)
    return leaves

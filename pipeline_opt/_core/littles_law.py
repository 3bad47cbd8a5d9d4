"""Little's law for a DataLoader: the workers that keep a training step fed. One formula for the
profile's advice and the tuner's guesses, so the same run never reads two worker counts."""

from __future__ import annotations

import math

__all__ = ["MARGIN", "workers_for"]

MARGIN = 0.25  # spare workers, as a share of the need (at least one): jitter, and workers sharing cores


def workers_for(batch_s: float, step_s: float, margin: float = MARGIN) -> int:
    """Workers needed so that batches arrive as fast as the step consumes them.

    Each worker delivers one batch every ``batch_s`` seconds (its CPU time per batch); the step takes
    ``step_s``; so ``ceil(batch_s / step_s)`` workers keep the queue non-empty, plus ``margin`` of
    that (at least one). ``batch_s <= 0`` (nothing measured) gives 1.
    """
    if step_s < 0 or batch_s != batch_s or step_s != step_s:
        raise ValueError(f"batch_s={batch_s!r} and step_s={step_s!r} must be numbers, step_s >= 0")
    if batch_s <= 0:
        return 1
    need = math.ceil(batch_s / max(step_s, 1e-4))
    return int(need + max(1, math.ceil(margin * need)))

"""The three random number generators a data pipeline draws from: torch's, Python's ``random`` and numpy's.

Seeded, read, compared and restored together, so that a check of "the same draws" covers every one
a transform may use (torchvision draws with torch, timm with ``random`` and numpy).
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch

__all__ = ["restore", "same_states", "seed_all", "states"]


def seed_all(seed: int) -> None:
    """Seed torch, ``random`` and numpy with ``seed``."""
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed % 2**32)


def states() -> tuple[Any, Any, Any]:
    """The three generators' states: ``(torch, random, numpy)``."""
    return torch.get_rng_state(), random.getstate(), np.random.get_state()


def same_states(a: tuple[Any, Any, Any], b: tuple[Any, Any, Any]) -> bool:
    """Whether two :func:`states` are the same."""
    return (torch.equal(a[0], b[0]) and a[1] == b[1] and a[2][0] == b[2][0]
            and bool(np.array_equal(a[2][1], b[2][1])) and tuple(a[2][2:]) == tuple(b[2][2:]))


def restore(saved: tuple[Any, Any, Any]) -> None:
    """Put the three generators back to :func:`states`' ``saved``."""
    torch.set_rng_state(saved[0])
    random.setstate(saved[1])
    np.random.set_state(saved[2])

"""Datasets and a tiny model for tests/tune. Worker-side code is at module level (fork and spawn)."""

from __future__ import annotations

import hashlib
import time

import torch
from torch.utils.data import Dataset, get_worker_info


def image(index: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(index)
    return torch.randint(0, 256, (3, 8, 8), dtype=torch.uint8, generator=g)


class SlowIO(Dataset):
    """Each sample waits ``latency_s`` (a network / disk read) and costs almost no CPU."""

    def __init__(self, n: int = 384, latency_s: float = 0.006) -> None:
        self.n, self.latency_s = n, latency_s

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int):
        time.sleep(self.latency_s)
        return image(index), index


class CPUBound(Dataset):
    """Each sample burns about ``cpu_s`` of CPU in pure Python."""

    def __init__(self, n: int = 192, cpu_s: float = 0.002) -> None:
        self.n, self.cpu_s = n, cpu_s

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int):
        end = time.thread_time() + self.cpu_s
        x = 0
        while time.thread_time() < end:
            x += 1
        return image(index), index


class Fast(Dataset):
    def __init__(self, n: int = 64) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int):
        return image(index), index


class FailsWithManyWorkers(SlowIO):
    """Raises inside any worker of a loader with ``>= limit`` workers (a candidate that breaks)."""

    def __init__(self, limit: int = 3, n: int = 256, latency_s: float = 0.004) -> None:
        super().__init__(n, latency_s)
        self.limit = limit

    def __getitem__(self, index: int):
        info = get_worker_info()
        if info is not None and info.num_workers >= self.limit:
            raise RuntimeError(f"this pipeline cannot run with {info.num_workers} workers")
        return super().__getitem__(index)


def tiny_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU(),
                               torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(4, 2))


def digest(loader) -> list[tuple[int, str]]:
    """(index, sha1 of the image bytes) of every sample, in the order the loader yields them."""
    out = []
    for images, indices in loader:
        out += [(int(i), hashlib.sha1(img.contiguous().numpy().tobytes()).hexdigest())
                for img, i in zip(images, indices)]
    return out


def model_state(model: torch.nn.Module) -> dict:
    return {"params": {n: p.detach().clone() for n, p in model.named_parameters()},
            "grads": {n: None if p.grad is None else p.grad.clone() for n, p in model.named_parameters()},
            "buffers": {n: b.clone() for n, b in model.named_buffers()},
            "modes": {n: m.training for n, m in model.named_modules()}}


def same_state(a: dict, b: dict) -> bool:
    def eq(x, y):
        return x is y if x is None or y is None else torch.equal(x, y)
    return (all(eq(a["params"][k], b["params"][k]) for k in a["params"])
            and all(eq(a["grads"][k], b["grads"][k]) for k in a["grads"])
            and all(eq(a["buffers"][k], b["buffers"][k]) for k in a["buffers"]) and a["modes"] == b["modes"])


def slow_worker_start(_worker_id: int) -> None:
    """A ``worker_init_fn`` whose worker start-up costs 0.3 s (imports, opening a database ...)."""
    time.sleep(0.3)

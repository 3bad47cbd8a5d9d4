"""Faulty datasets, a tiny model and process/resource probes for tests/reliability.

Everything that runs in a DataLoader worker is defined at module level so it pickles under the
spawn start method as well as fork.
"""

from __future__ import annotations

import hashlib
import os
import signal
import time
from pathlib import Path

import psutil
import torch
from torch.utils.data import Dataset, get_worker_info

N_SAMPLES = 40
BATCH = 4


def sample(index: int) -> torch.Tensor:
    """The deterministic uint8 3x16x16 image of ``index``."""
    g = torch.Generator().manual_seed(1000 + index)
    return torch.randint(0, 256, (3, 16, 16), dtype=torch.uint8, generator=g)


class Indexed(Dataset):
    """Healthy dataset: (image, index) pairs, so every sample can be traced back to its index."""

    def __init__(self, n: int = N_SAMPLES) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int):
        return sample(index), index


class RaisesAt(Indexed):
    """Raises at ``bad_index``; the message deliberately does not contain the index."""

    def __init__(self, bad_index: int, n: int = N_SAMPLES) -> None:
        super().__init__(n)
        self.bad_index = bad_index

    def __getitem__(self, index: int):
        if index == self.bad_index:
            raise ValueError("corrupt JPEG header")
        return super().__getitem__(index)


class _OnceInWorker(Indexed):
    """Base for faults that happen once, in a DataLoader worker process only (never the main process)."""

    def __init__(self, at_index: int, marker: str | Path, n: int = N_SAMPLES) -> None:
        super().__init__(n)
        self.at_index = at_index
        self.marker = str(marker)

    def _fire(self, index: int) -> bool:
        if index != self.at_index or get_worker_info() is None:
            return False
        try:
            fd = os.open(self.marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return False
        os.close(fd)
        return True


class KillsWorkerOnce(_OnceInWorker):
    """The first worker that reaches ``at_index`` SIGKILLs itself (an OOM-killer stand-in)."""

    def __getitem__(self, index: int):
        if self._fire(index):
            os.kill(os.getpid(), signal.SIGKILL)
        return super().__getitem__(index)


class HangsOnce(_OnceInWorker):
    """The first worker that reaches ``at_index`` blocks for ``seconds`` (a stuck network read)."""

    def __init__(self, at_index: int, marker: str | Path, seconds: float = 600.0, n: int = N_SAMPLES) -> None:
        super().__init__(at_index, marker, n)
        self.seconds = seconds

    def __getitem__(self, index: int):
        if self._fire(index):
            time.sleep(self.seconds)
        return super().__getitem__(index)


class HangsAlways(Indexed):
    """Blocks for ``seconds`` at ``at_index`` wherever it runs."""

    def __init__(self, at_index: int, seconds: float = 600.0, n: int = N_SAMPLES) -> None:
        super().__init__(n)
        self.at_index = at_index
        self.seconds = seconds

    def __getitem__(self, index: int):
        if index == self.at_index:
            time.sleep(self.seconds)
        return super().__getitem__(index)


class Strings(Dataset):
    """Yields strings: a batch the default step cannot handle."""

    def __len__(self) -> int:
        return N_SAMPLES

    def __getitem__(self, index: int) -> str:
        return f"sample-{index}"


class Empty(Dataset):
    def __len__(self) -> int:
        return 0

    def __getitem__(self, index: int):
        raise IndexError(index)


def tiny_model() -> torch.nn.Module:
    """Conv + BatchNorm (buffers) + Linear; deterministic weights."""
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU(),
                               torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(4, 3))


def batch_digest(batch) -> list[tuple[int, str]]:
    """(index, sha1 of the image bytes) for every sample of an (images, indices) batch."""
    images, indices = batch
    return [(int(i), hashlib.sha1(img.contiguous().numpy().tobytes()).hexdigest())
            for img, i in zip(images, indices)]


def epoch_digest(loader) -> list[tuple[int, str]]:
    out: list[tuple[int, str]] = []
    for batch in loader:
        out.extend(batch_digest(batch))
    return out


def live_children() -> set[int]:
    """Pids of live descendants, ignoring multiprocessing's resource tracker."""
    out = set()
    for child in psutil.Process().children(recursive=True):
        try:
            if child.status() == psutil.STATUS_ZOMBIE or "resource_tracker" in " ".join(child.cmdline()):
                continue
        except psutil.NoSuchProcess:
            continue
        out.add(child.pid)
    return out


def wait_for_no_children(before: set[int], timeout_s: float = 10.0) -> set[int]:
    """Children beyond ``before`` still alive after ``timeout_s`` (workers get a moment to exit)."""
    deadline = time.monotonic() + timeout_s
    while True:
        extra = live_children() - before
        if not extra or time.monotonic() > deadline:
            return extra
        time.sleep(0.1)


def shm_entries() -> set[str]:
    try:
        return set(os.listdir("/dev/shm"))
    except OSError:
        return set()


def error_chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and every exception it was raised from (``__cause__`` / ``__context__``)."""
    chain, seen = [], set()
    while exc is not None and id(exc) not in seen:
        chain.append(exc)
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return chain

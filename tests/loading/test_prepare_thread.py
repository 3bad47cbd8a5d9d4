"""DeviceLoader(prepare_in_thread=True): same batches in the same order, the next batch prepared while
the step runs, errors raised in order, no thread or worker left behind."""

from __future__ import annotations

import gc
import threading

import psutil
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from pipeline_opt.loading.device_loader import DeviceLoader
from pipeline_opt.loading.prepare_thread import PreparingThread
from pipeline_opt.transforms.gpu import Normalize, ToFloat


class Images(Dataset):
    def __init__(self, n: int = 24) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        return torch.full((3, 8, 8), i, dtype=torch.uint8), i


def _preparing_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("pipeline_opt-prepare") and t.is_alive()]


@pytest.mark.parametrize("workers", [0, 2])
def test_the_same_batches_in_the_same_order_as_without_the_thread(workers):
    def make():
        return DataLoader(Images(), batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(5),
                          num_workers=workers)

    tf = torch.nn.Sequential(ToFloat(), Normalize([0.5] * 3, [0.25] * 3))
    plain = DeviceLoader(make(), device="cpu", transform=tf)
    threaded = DeviceLoader(make(), device="cpu", transform=tf, prepare_in_thread=True)
    for _ in range(2):  # a fresh thread and loader iterator each epoch
        ref = [(img.clone(), lab.clone()) for img, lab in plain]
        got = [(img.clone(), lab.clone()) for img, lab in threaded]
        assert len(got) == len(ref) == 6
        assert all(torch.equal(a, c) and torch.equal(b, d) for (a, b), (c, d) in zip(got, ref))
    assert _preparing_threads() == []
    assert "prepare_in_thread=True" in repr(threaded)


def test_the_next_batch_is_prepared_while_the_step_runs():
    # step i waits until batch i + 1 has been prepared, and batch i + 1 is prepared only once step i
    # has begun: both must be under way at the same time. A loader that prepares in the training
    # loop (before or after the step) fails one of the two waits.
    n = 6
    step_started = [threading.Event() for _ in range(n)]
    prepared = [threading.Event() for _ in range(n)]

    def batch_transform(batch):
        index = int(batch[1][0]) // 4
        if index > 0 and not step_started[index - 1].wait(timeout=10):
            raise TimeoutError(f"batch {index} was prepared before step {index - 1} began")
        prepared[index].set()
        return batch

    loader = DataLoader(Images(), batch_size=4)
    seen = []
    for _images, labels in DeviceLoader(loader, device="cpu", batch_transform=batch_transform,
                                        prepare_in_thread=True):
        index = int(labels[0]) // 4
        step_started[index].set()
        if index + 1 < n:
            assert prepared[index + 1].wait(timeout=10), f"batch {index + 1} was not prepared during step {index}"
        seen.append(index)
    assert seen == list(range(n))


def test_an_error_comes_after_the_batches_before_it_and_the_thread_ends():
    def batch_transform(batch):
        if int(batch[1][0]) == 12:
            raise RuntimeError("corrupt JPEG in batch 3")
        return batch

    dl = DeviceLoader(DataLoader(Images(), batch_size=4), device="cpu", batch_transform=batch_transform,
                      prepare_in_thread=True)
    seen = []
    with pytest.raises(RuntimeError, match="corrupt JPEG in batch 3"):
        for _images, labels in dl:
            seen.append(int(labels[0]))
    assert seen == [0, 4, 8]
    assert _preparing_threads() == []


def test_an_abandoned_pass_stops_its_thread_and_workers():
    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}
    dl = DeviceLoader(DataLoader(Images(n=64), batch_size=4, num_workers=2), device="cpu", prepare_in_thread=True)
    it = iter(dl)
    next(it)
    assert len(_preparing_threads()) == 1
    it.close()
    del it
    gc.collect()
    assert _preparing_threads() == []
    psutil.wait_procs([p for p in me.children(recursive=True) if p.pid not in before], timeout=10)
    assert {p.pid for p in me.children(recursive=True) if p.is_running()
            and p.status() != psutil.STATUS_ZOMBIE} - before == set()
    assert sum(b[0].shape[0] for b in dl) == 64  # a full pass after the abandoned one


def test_bad_arguments_are_named():
    loader = DataLoader(Images(), batch_size=4)
    with pytest.raises(ValueError, match="prepare_in_thread=True and reuse_buffers=True"):
        DeviceLoader(loader, device="cpu", prepare_in_thread=True, reuse_buffers=True)
    with pytest.raises(ValueError, match="ahead=0"):
        PreparingThread(iter(loader), lambda b: b, torch.device("cpu"), ahead=0)


@pytest.mark.cuda
def test_cuda_batches_prepared_in_the_thread_match_and_stay_valid_under_a_busy_step():
    loader = DataLoader(Images(n=32), batch_size=4, pin_memory=True, num_workers=2)
    tf = torch.nn.Sequential(ToFloat(), Normalize([0.5] * 3, [0.25] * 3))
    ref = [img for img, _ in DeviceLoader(loader, device="cpu", transform=tf)]
    heavy = torch.randn(2048, 2048, device="cuda")
    got = []
    for img, labels in DeviceLoader(loader, device="cuda", transform=tf, prepare_in_thread=True):
        assert img.is_cuda and labels.is_cuda
        for _ in range(5):  # keep the consumer stream busy while the thread prepares the next batch
            heavy = (heavy @ heavy).tanh_()
        got.append(img * 1)
    torch.cuda.synchronize()
    assert len(got) == len(ref) and all(torch.equal(g.cpu(), r) for g, r in zip(got, ref))

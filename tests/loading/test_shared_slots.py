"""Shared slots: the same batches as the ordinary path, slots reused, released safely, never blocking."""

from __future__ import annotations

import os

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from pipeline_opt.loading import DeviceLoader
from pipeline_opt.loading.shared_slots import (
    HEADER_BYTES,
    SlotCollate,
    SlotPool,
    SlotReceiver,
    SlotRef,
    slot_header,
    slot_loader,
    slot_pool_of,
)
from pipeline_opt.tune.measure import live_children


class Images(Dataset):
    """Distinct images (the value encodes the index) and labels."""

    def __init__(self, n: int = 36, size: int = 8) -> None:
        self.n, self.size = n, size

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        img = torch.arange(3 * self.size * self.size, dtype=torch.int32).reshape(3, self.size, self.size)
        return ((img + 7 * i) % 251).to(torch.uint8), i


class DictImages(Images):
    """Samples shaped like ultralytics' (dict with img, cls, bboxes, batch_idx, im_file)."""

    def __getitem__(self, i: int):
        img, _ = super().__getitem__(i)
        k = 1 + i % 3
        return {"img": img, "cls": torch.full((k, 1), float(i % 5)), "bboxes": torch.rand(k, 4),
                "batch_idx": torch.zeros(k), "im_file": f"im{i}.jpg", "ori_shape": (self.size, self.size)}


def _assert_same(got: list, want: list) -> None:
    assert len(got) == len(want)
    for a, b in zip(got, want):
        if isinstance(b, dict):
            assert list(a) == list(b)
            for k in b:
                if isinstance(b[k], torch.Tensor):
                    assert torch.equal(a[k], b[k]), k
                else:
                    assert a[k] == b[k], k
        else:
            assert len(a) == len(b)
            for x, y in zip(a, b):
                assert torch.equal(x, y)


def _loader(**kw) -> DataLoader:
    kw.setdefault("batch_size", 4)
    kw.setdefault("num_workers", 2)
    return DataLoader(kw.pop("dataset", None) or Images(), **kw)


@pytest.mark.parametrize("persistent", [False, True])
def test_device_loader_with_slots_yields_the_ordinary_batches(persistent):
    plain = _loader(shuffle=True, generator=torch.Generator().manual_seed(3), persistent_workers=persistent)
    want = [list(b) for b in _loader(shuffle=True, generator=torch.Generator().manual_seed(3))]
    before = live_children()
    dl = DeviceLoader(plain, device="cpu", reuse_buffers=True)
    assert dl.reuses_buffers and dl.loader is not plain and not dl.loader.pin_memory
    first = [list(b) for b in dl]
    _assert_same(first, want)
    second = [list(b) for b in dl]  # a second epoch: new order from the same generator stream
    assert len(second) == len(want)
    stats = dl.slot_stats()
    assert stats.slotted == 2 * len(want) and stats.total == 2 * len(want)  # every batch through a slot
    # a slot's first batch travels as tensors (the receiver learns the slot), later ones by reference
    first_sends = 2 * 4 * (1 if persistent else 2)  # at most one per slot of each worker (per incarnation)
    assert stats.by_ref >= stats.slotted - first_sends and stats.by_ref > 0
    assert stats.fetch_s > 0 and stats.collate_s > 0  # the workers' own timing
    dl.close()
    del dl, first, second
    assert live_children() - before == set(), "worker processes left behind"


def test_slot_tensors_are_views_into_reused_storages():
    s = slot_loader(_loader(dataset=Images(n=40)))
    receiver = SlotReceiver(slot_pool_of(s))
    storages = set()
    for img, _ in s:
        slots = receiver.find((img,))
        assert len(slots) == 1 and img.storage_offset() * img.element_size() >= HEADER_BYTES
        storages.add(img.untyped_storage().data_ptr())
        receiver.release(slots)
    # 10 batches from 2 workers went through at most prefetch + 2 = 4 slots per worker
    assert len(storages) <= 2 * 4
    assert slot_pool_of(s).stats().slotted == 10
    receiver.close()


def test_unreleased_slots_fall_back_and_stay_correct():
    """Iterated without releasing (no DeviceLoader), a worker never overwrites a slot: it falls back."""
    s = slot_loader(_loader(dataset=Images(n=60)))
    got = [list(b) for b in s]  # every batch kept: overwriting any slot would corrupt one
    _assert_same(got, [list(b) for b in _loader(dataset=Images(n=60))])
    stats = slot_pool_of(s).stats()
    assert stats.slotted == 2 * 4 and stats.all_busy == 15 - 8


def test_ultralytics_collate_stacks_into_the_slot():
    ultralytics = pytest.importorskip("ultralytics.data.dataset")
    collate = ultralytics.YOLODataset.collate_fn
    ds = DictImages(n=24)
    want = list(_loader(dataset=ds, collate_fn=collate))
    torch.manual_seed(0)
    dl = DeviceLoader(_loader(dataset=ds, collate_fn=collate), device="cpu", reuse_buffers=True)
    got = list(dl)
    for a, b in zip(got, want):  # bboxes are random per call; everything else must match
        a.pop("bboxes"), b.pop("bboxes")
    _assert_same(got, want)
    assert dl.slot_stats().slotted == len(want)


def test_tuple_batch_of_a_custom_collate_is_copied_in():
    def collate(samples):
        return torch.stack([s[0] for s in samples]), torch.tensor([s[1] for s in samples])

    want = [list(b) for b in _loader(collate_fn=collate)]
    dl = DeviceLoader(_loader(collate_fn=collate), device="cpu", reuse_buffers=True)
    _assert_same([list(b) for b in dl], want)
    assert dl.slot_stats().slotted == len(want)


def test_two_live_iterators_of_one_loader_do_not_share_slots():
    s = slot_loader(_loader(dataset=Images(n=48)))
    want = [list(b) for b in _loader(dataset=Images(n=48))]
    a, b = iter(s), iter(s)
    got_a, got_b = [list(x) for x in a], [list(x) for x in b]
    _assert_same(got_a, want)
    _assert_same(got_b, want)
    assert slot_pool_of(s).stats().unsupported > 0  # the second set of workers used the ordinary path


def test_spawned_workers_use_the_slots():
    dl = DeviceLoader(_loader(multiprocessing_context="spawn", dataset=Images(n=16)), device="cpu",
                      reuse_buffers=True)
    _assert_same([list(b) for b in dl], [list(b) for b in _loader(dataset=Images(n=16), num_workers=0)])
    assert dl.slot_stats().slotted == 4


def test_pool_claim_release_and_tickets():
    pool = SlotPool(num_workers=2, slots_per_worker=2)
    assert pool.claim(1, ticket=11, start=0) == 2
    assert pool.claim(1, ticket=12, start=0) == 3
    assert pool.claim(1, ticket=13, start=0) is None  # both of worker 1's slots are held: no wait
    assert not pool.release(2, ticket=99)  # a stale ticket frees nothing
    assert pool.release(2, ticket=11)
    assert pool.claim(1, ticket=14, start=1) == 2
    assert not pool.release(17, ticket=14)  # out of range
    # a live process already owns worker 0: a second one must not take its slots
    assert pool.take_over(0, os.getpid())
    assert not pool.take_over(0, os.getppid())
    assert pool.take_over(0, os.getpid())  # the owner itself may re-take (and resets its flags)


def test_ordinary_tensors_have_no_slot_header():
    assert slot_header(torch.zeros(100, dtype=torch.uint8)[70:]) is None
    assert slot_header(torch.zeros(3)) is None


def test_bad_input_names_the_fix():
    with pytest.raises(ValueError, match="num_workers"):
        slot_loader(_loader(num_workers=0))
    with pytest.raises(TypeError, match="DataLoader"):
        DeviceLoader([[torch.zeros(2)]], device="cpu", reuse_buffers=True)
    with pytest.raises(ValueError, match="already"):
        slot_loader(slot_loader(_loader()))
    with pytest.raises(ValueError, match="slots_per_worker"):
        SlotPool(1, 0)
    with pytest.raises(TypeError, match="callable"):
        SlotCollate(None, SlotPool(1, 1))


def test_no_workers_means_nothing_to_reuse():
    dl = DeviceLoader(_loader(num_workers=0), device="cpu", reuse_buffers=True)
    assert not dl.reuses_buffers and dl.slot_stats() is None
    _assert_same([list(b) for b in dl], [list(b) for b in _loader(num_workers=0)])


@pytest.mark.cuda
def test_cuda_slots_are_page_locked_and_batches_match():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    want = [list(b) for b in _loader(dataset=Images(n=64, size=64))]
    dl = DeviceLoader(_loader(dataset=Images(n=64, size=64)), device="cuda", reuse_buffers=True)
    for _ in range(2):
        got = [[t.cpu() for t in b] for b in dl]
        assert all(t.is_cuda for t in next(iter(dl)))
        _assert_same(got, want)
    assert dl._receiver._registered and not dl._receiver.register_failed
    stats = dl.slot_stats()
    assert stats.slotted >= 2 * len(want)


def test_receive_thread_yields_batches_with_their_slots_and_releases_on_close():
    from pipeline_opt.loading.shared_slots import ReceiveThread

    s = slot_loader(_loader(dataset=Images(n=40)))
    receiver = SlotReceiver(slot_pool_of(s))
    want = [list(b) for b in _loader(dataset=Images(n=40))]
    rx = ReceiveThread(iter(s), receiver, depth=2)
    got = []
    for raw, slots in rx:
        assert len({(index, ticket) for _, index, ticket in slots}) == 1  # image (and labels) in one slot
        got.append([t.clone() for t in raw])
        receiver.release(slots)
    _assert_same(got, want)
    timing = receiver.receive_stats()
    assert timing.batches == len(want) and timing.cpu_s > 0
    assert timing.cpu_s <= timing.wait_s + timing.work_s + 0.01  # its own CPU is a part of its wall time
    with pytest.raises(StopIteration):
        next(rx)
    rx.close()
    rx = ReceiveThread(iter(s), receiver, depth=2)
    next(rx)  # abandoned with batches queued: close() stops the thread and frees their slots
    rx.close()
    assert not rx._thread.is_alive()
    # batches dropped in flight keep their flags; the next workers take their slots over afresh
    before = slot_pool_of(s).stats().slotted
    dl = DeviceLoader(s, device="cpu", reuse_buffers=True)
    _assert_same([list(b) for b in dl], want)
    assert slot_pool_of(s).stats().slotted - before == len(want)


def test_receive_thread_raises_the_loaders_error():
    from pipeline_opt.loading.shared_slots import ReceiveThread

    class Bad(Images):
        def __getitem__(self, i):
            raise KeyError(f"sample {i} is broken")

    s = slot_loader(_loader(dataset=Bad()))
    rx = ReceiveThread(iter(s), SlotReceiver(slot_pool_of(s)))
    with pytest.raises(KeyError, match="broken"):
        next(rx)
    rx.close()


def _has_tensor(batch) -> bool:
    if isinstance(batch, torch.Tensor):
        return True
    if isinstance(batch, dict):
        return any(_has_tensor(v) for v in batch.values())
    if isinstance(batch, (list, tuple)):
        return any(_has_tensor(v) for v in batch)
    return False


@pytest.mark.parametrize("dataset", [Images(n=48), DictImages(n=48)], ids=["tuple", "dict"])
def test_known_slots_send_references_only(dataset):
    """Once the receiver holds a slot, its batches carry no tensor at all (nothing to hand a
    descriptor over for): image, labels, boxes all come back from the slot, equal to the ordinary ones."""
    kw = {}
    if isinstance(dataset, DictImages):
        kw["collate_fn"] = pytest.importorskip("ultralytics.data.dataset").YOLODataset.collate_fn
    s = slot_loader(_loader(dataset=dataset, persistent_workers=True, **kw))
    receiver = slot_pool_of(s).receiver()
    want = list(_loader(dataset=dataset, **kw))
    for _ in range(2):
        by_ref = 0
        got = []
        for raw in s:
            by_ref += not _has_tensor(raw)
            batch, slots = receiver.receive(raw)
            assert not any(isinstance(v, SlotRef) for v in (batch.values() if isinstance(batch, dict) else batch))
            got.append({k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in batch.items()}
                       if isinstance(batch, dict) else [t.clone() for t in batch])
            receiver.release(slots)
        if isinstance(dataset, DictImages):  # bboxes are random per call: compare their shapes
            assert [a["bboxes"].shape for a in got] == [b["bboxes"].shape for b in want]
            _assert_same([{k: v for k, v in a.items() if k != "bboxes"} for a in got],
                         [{k: v for k, v in b.items() if k != "bboxes"} for b in want])
        else:
            _assert_same(got, [list(b) for b in want])
        assert by_ref >= len(want) - 2 * 4  # all but each slot's first batch
    assert slot_pool_of(s).stats().by_ref >= 2 * len(want) - 2 * 4
    receiver.close()


def test_a_tensor_too_big_for_the_slot_reserve_travels_the_ordinary_way():
    class BigLabels(Images):
        def __getitem__(self, i):
            img, _ = super().__getitem__(i)
            return img, torch.full((40_000,), float(i))  # 4 x 160 KB per batch > the 256 KB reserve

    dl = DeviceLoader(_loader(dataset=BigLabels(n=40)), device="cpu", reuse_buffers=True)
    want = [list(b) for b in _loader(dataset=BigLabels(n=40))]
    for _ in range(2):
        _assert_same([list(b) for b in dl], want)
    assert dl.slot_stats().by_ref > 0


def test_a_reference_the_receiver_does_not_hold_raises():
    pool = SlotPool(1, 1)
    receiver = pool.receiver()
    with pytest.raises(RuntimeError, match="does not hold"):
        receiver.receive({"img": SlotRef(12345, 0, 1, HEADER_BYTES, (2,), torch.uint8)})
    assert pool.receiver() is receiver


def test_a_reference_to_an_overwritten_slot_raises():
    s = slot_loader(_loader(dataset=Images(n=8)))
    receiver = slot_pool_of(s).receiver()
    img, _ = next(iter(s))
    batch, slots = receiver.receive((img, 0))
    (t, index, ticket), = slots
    storage_id = int(_header_of(t)[3])
    with pytest.raises(RuntimeError, match="overwritten"):
        receiver.receive((SlotRef(storage_id, index, ticket + 1, HEADER_BYTES, tuple(img.shape), img.dtype),))
    receiver.release(slots)
    receiver.close()


def _header_of(t):
    from pipeline_opt.loading.shared_slots import _header

    return _header(t.untyped_storage())


def test_two_device_loaders_over_one_slot_loader_share_its_receiver():
    s = slot_loader(_loader(dataset=Images(n=32), persistent_workers=True))
    a = DeviceLoader(s, device="cpu", reuse_buffers=True)
    b = DeviceLoader(s, device="cpu", reuse_buffers=True)
    assert a._receiver is b._receiver
    want = [list(x) for x in _loader(dataset=Images(n=32))]
    for dl in (a, b, a):
        _assert_same([list(x) for x in dl], want)
    assert slot_pool_of(s).stats().by_ref > 0
    a.close()


def test_batches_dropped_by_an_abandoned_epoch_give_their_slots_back():
    """A persistent loader's iterator drops the batches in flight when iterated anew (its reset
    drains them): their slots were never received, so no release would ever come for them."""
    dl = DeviceLoader(_loader(dataset=Images(n=96), persistent_workers=True, prefetch_factor=2), device="cpu",
                      reuse_buffers=True)
    want = [list(b) for b in _loader(dataset=Images(n=96))]
    for _ in range(4):  # each abandoned epoch drops ~prefetch_factor batches per worker
        for i, _batch in enumerate(dl):
            if i == 2:
                break
    before = dl.slot_stats()
    _assert_same([list(b) for b in dl], want)
    after = dl.slot_stats()
    assert after.all_busy - before.all_busy <= 2, after  # the slots came back: the full epoch used them
    assert after.slotted - before.slotted >= len(want) - 2
    dl.close()


@pytest.mark.cuda
def test_cuda_abandoned_epochs_of_a_persistent_loader_stay_correct():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    base = _loader(dataset=Images(n=96, size=32), persistent_workers=True, prefetch_factor=2)
    want = [list(b) for b in _loader(dataset=Images(n=96, size=32))]
    dl = DeviceLoader(base, device="cuda", reuse_buffers=True)
    held = []
    for _ in range(3):
        it = iter(dl)  # kept alive: its receiving thread must not keep taking from the reset iterator
        held.append([t.cpu() for t in next(it)])
    _assert_same(held, want[:1] * 3)
    before = dl.slot_stats()
    _assert_same([[t.cpu() for t in b] for b in dl], want)
    after = dl.slot_stats()
    assert after.slotted - before.slotted >= len(want) - 2 and after.by_ref > 0
    dl.close()


def test_profiling_a_slot_loader_profiles_its_slots_through_a_pool_of_its_own():
    from pipeline_opt.profile.install import install_worker_profiling

    dl = DeviceLoader(_loader(dataset=Images(n=96)), device="cpu", reuse_buffers=True)
    before = live_children()
    profiled, collector = install_worker_profiling(dl)
    assert isinstance(profiled, DeviceLoader) and profiled.reuses_buffers
    pool = slot_pool_of(profiled.loader)  # found under the profiler's collate wrapper
    assert pool is not None and pool is not slot_pool_of(dl.loader)
    assert (pool.num_workers, pool.slots_per_worker) == (slot_pool_of(dl.loader).num_workers,
                                                         slot_pool_of(dl.loader).slots_per_worker)
    want = [list(x) for x in _loader(dataset=Images(n=96))]
    _assert_same([list(x) for x in profiled], want)
    stats = pool.stats()
    assert stats.slotted == len(want) and stats.by_ref > 0  # the profiled workers reused their slots
    assert slot_pool_of(dl.loader).stats().total == 0  # and never touched the original's
    workers = collector.stats()
    assert sum(w.samples for w in workers) == 96 and sum(w.batches for w in workers) == len(want)
    profiled.close()
    collector.close()
    dl.close()
    assert live_children() - before == set(), "worker processes left behind"


def test_a_slot_loader_under_a_collate_wrapper_is_not_slotted_twice():
    class Wrapped:
        def __init__(self, collate_fn):
            self.collate_fn = collate_fn

        def __call__(self, samples):
            return self.collate_fn(samples)

    s = slot_loader(_loader())
    from pipeline_opt.loading.dataloader import clone_loader

    wrapped = clone_loader(s, collate_fn=Wrapped(s.collate_fn))
    assert slot_pool_of(wrapped) is slot_pool_of(s)
    with pytest.raises(ValueError, match="already delivers through shared slots"):
        slot_loader(wrapped)

"""The DataLoader adapter: clone_loader keeps what a loader yields and changes only the tuned settings;
workers are released now, persistent ones and a framework's loader kind included."""

import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, SequentialSampler, TensorDataset

from pipeline_opt.loading.dataloader import (
    PERSISTENT_ITERATOR,
    SHUTDOWN,
    clone_loader,
    continuous,
    kind_of,
    loader_config,
    loaders_under,
    release_workers,
)
from pipeline_opt.loading.device_loader import DeviceLoader
from pipeline_opt.tune.measure import live_children


def _dataset(n=64):
    return TensorDataset(torch.arange(n), torch.arange(n) * 2)


def _indices(loader):
    return [b[0].tolist() for b in loader]


def test_shuffled_clone_yields_same_order_and_leaves_user_generator_alone():
    ds = _dataset()
    g = torch.Generator().manual_seed(7)
    user = DataLoader(ds, batch_size=8, shuffle=True, generator=g)
    state_before = g.get_state().clone()
    clone = clone_loader(user, num_workers=2, prefetch_factor=3)
    cloned_order = _indices(clone)
    assert torch.equal(g.get_state(), state_before), "iterating the clone advanced the user's generator"
    assert _indices(user) == cloned_order
    assert clone.num_workers == 2 and clone.prefetch_factor == 3


def test_settings_normalised_and_reported():
    user = DataLoader(_dataset(), batch_size=5, drop_last=True, num_workers=2, persistent_workers=True)
    zero = clone_loader(user, num_workers=0)
    assert loader_config(zero) == {"num_workers": 0, "pin_memory": False, "persistent_workers": False,
                                   "prefetch_factor": None, "batch_size": 5}
    assert zero.drop_last and len(zero) == len(user) == 64 // 5
    assert _indices(zero) == _indices(user)


def test_custom_batch_sampler_collate_and_worker_init_are_kept():
    ds = _dataset(30)
    bs = BatchSampler(SequentialSampler(ds), batch_size=4, drop_last=False)

    def collate(items):
        return torch.stack([i[0] for i in items]), "tag"

    user = DataLoader(ds, batch_sampler=bs, collate_fn=collate)
    clone = clone_loader(user, num_workers=0)
    assert clone.collate_fn is collate
    assert [b[0].tolist() for b in clone] == [b[0].tolist() for b in user]
    assert all(b[1] == "tag" for b in clone)


class _Stream(IterableDataset):
    def __iter__(self):
        return iter(range(10))


def test_iterable_dataset_clone():
    user = DataLoader(_Stream(), batch_size=3)
    clone = clone_loader(user, num_workers=0)
    assert [b.tolist() for b in clone] == [b.tolist() for b in user]


def test_infinite_dataloader_is_rebuilt_as_itself():
    build = pytest.importorskip("ultralytics.data.build")
    user = build.InfiniteDataLoader(_dataset(32), batch_size=8, shuffle=False, num_workers=0)
    clone = clone_loader(user, num_workers=1, prefetch_factor=4)
    assert type(clone) is build.InfiniteDataLoader
    assert loader_config(clone)["prefetch_factor"] == 4
    assert [b[0].tolist() for b in clone] == [b[0].tolist() for b in user]
    assert kind_of(clone) is not None and continuous(clone) and not continuous(DataLoader(_dataset()))
    assert clone.iterator is not None
    release_workers(clone)
    assert clone.iterator is None and _wait_no_children()
    assert [b[0].tolist() for b in clone] == [b[0].tolist() for b in user]  # new workers start
    release_workers(clone)
    user.close()


def _wait_no_children(timeout_s: float = 10.0) -> bool:
    import time

    deadline = time.monotonic() + timeout_s
    while live_children():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_torchs_private_names_the_adapter_uses_exist_in_this_torch():
    loader = DataLoader(_dataset(16), batch_size=4, num_workers=1, persistent_workers=True)
    assert hasattr(loader, PERSISTENT_ITERATOR) and getattr(loader, PERSISTENT_ITERATOR) is None
    first = _indices(loader)
    held = getattr(loader, PERSISTENT_ITERATOR)
    assert held is not None and callable(getattr(held, SHUTDOWN))
    release_workers(loader)
    assert getattr(loader, PERSISTENT_ITERATOR) is None and _wait_no_children()
    assert _indices(loader) == first  # iterating again starts new workers
    release_workers(loader)
    assert _wait_no_children()


def test_release_walks_wrappers_and_stops_a_running_iterator():
    inner = DataLoader(_dataset(64), batch_size=4, num_workers=2)
    wrapped = DeviceLoader(inner, device="cpu")
    assert loaders_under(wrapped) == [wrapped, inner]
    it = iter(inner)
    next(it)
    assert live_children()
    release_workers(wrapped, it)
    assert _wait_no_children()


def test_bad_overrides_name_the_value():
    user = DataLoader(_dataset(), batch_size=4)
    with pytest.raises(ValueError, match="num_workers=-1"):
        clone_loader(user, num_workers=-1)
    with pytest.raises(ValueError, match="batch_size"):
        clone_loader(user, batch_size=3)
    with pytest.raises(TypeError, match="list"):
        clone_loader([1, 2, 3])


def test_iterating_a_clone_of_a_persistent_clone_leaves_the_persistent_clones_order_alone():
    # autotune profiles a clone of the loader it hands back; the copy once shared the inner
    # RandomSampler's generator with it, so the user's first epoch came out in another order
    def make():
        return DataLoader(_dataset(), batch_size=5, shuffle=True, generator=torch.Generator().manual_seed(3))

    expected = [b[1].tolist() for b in make()]
    persistent = clone_loader(make(), num_workers=2, persistent_workers=True)
    copy_of_it = clone_loader(persistent)
    next(iter(copy_of_it))
    assert [b[1].tolist() for b in persistent] == expected

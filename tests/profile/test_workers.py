"""The worker side in one process: transform wrapping, proxies, the file channel, the collector."""

import pickle

import pytest
import torch
from torch.utils.data import DataLoader, Dataset
from torchvision import transforms as T

from pipeline_opt.profile import timed_transforms, workers
from pipeline_opt.profile.collector import WorkerCollector, parse_worker_file
from pipeline_opt.profile.install import install_worker_profiling


def _double(x):
    return x * 2


class Plus:
    def __init__(self, k):
        self.k = k

    def __call__(self, x):
        return x + self.k


class _DS(Dataset):
    def __init__(self, transform=None, transforms=None):
        self.transform = transform
        self.transforms = transforms

    def __len__(self):
        return 8

    def __getitem__(self, i):
        x = torch.tensor(float(i))
        if self.transform is not None:
            x = self.transform(x)
        for t in self.transforms or ():
            x = t(x)
        return x


def test_instrument_wraps_leaves_of_nested_composes_and_restores():
    inner = T.Compose([Plus(1), _double])
    compose = T.Compose([inner, Plus(2), T.Lambda(_double)])
    ds = _DS(transform=compose, transforms=[Plus(3)])
    originals = (list(compose.transforms), list(inner.transforms), ds.transforms)
    seen = []
    patches = timed_transforms.instrument(ds, lambda name, t0, t1: seen.append(name))
    assert ds[1].item() == ((1 + 1) * 2 + 2) * 2 + 3
    assert seen == ["Plus", "_double", "Plus#2", "Lambda", "Plus#3"]
    assert compose.transforms[0] is inner  # nested compose entered, not timed as a block
    timed_transforms.restore(patches)
    assert (compose.transforms, inner.transforms, ds.transforms) == originals
    assert ds.transforms is originals[2]


def test_timed_transform_forwards_attributes_and_pickles_to_the_plain_transform():
    plus = Plus(1)
    timed = timed_transforms.TimedTransform(plus, "Plus", lambda *a: None)
    timed.k = 5
    assert plus.k == 5 and timed.k == 5 and timed(torch.tensor(1.0)).item() == 6
    back = pickle.loads(pickle.dumps(timed))
    assert type(back) is Plus and back.k == 5


def test_single_callable_transform_is_timed_under_its_name():
    ds = _DS(transform=Plus(1))
    seen = []
    patches = timed_transforms.instrument(ds, lambda name, t0, t1: seen.append(name))
    ds[0]
    assert seen == ["Plus"] and isinstance(ds.transform, timed_transforms.TimedTransform)
    timed_transforms.restore(patches)
    assert type(ds.transform) is Plus


def test_main_process_recording_reaches_the_collector_and_user_dataset_is_restored():
    compose = T.Compose([Plus(1), _double])
    ds = _DS(transform=compose)
    loader = DataLoader(ds, batch_size=4)
    profiled, collector = install_worker_profiling(loader)
    assert loader.dataset is ds and profiled.dataset is not ds
    assert [b.tolist() for b in profiled] == [b.tolist() for b in loader]
    (stats,) = collector.stats()
    assert stats.worker_id == -1 and stats.samples == 8 and stats.batches == 2
    assert set(stats.transform_s) == {"Plus", "_double"} and all(v > 0 for v in stats.transform_s.values())
    assert isinstance(compose.transforms[0], timed_transforms.TimedTransform)  # patched while profiling
    collector.close()
    assert type(compose.transforms[0]) is Plus and not collector.directory.exists()
    assert collector.stats()[0].samples == 8  # the last reading survives close()


def test_parse_tolerates_a_line_cut_by_a_dying_worker(tmp_path):
    sink = workers.Sink(str(tmp_path))
    rec = workers.Recorder(sink, worker_id=-1)
    rec.sample(3, 0, 1000, 0)
    rec.collate(1000, 1500, 0, 1)
    rec.sample(4, 2000, 3000, 0)
    rec.flush()
    with open(rec.path, "a") as fh:
        fh.write('{"worker_id": 0, "pid": 1, "sam')  # killed mid-write
    record = parse_worker_file(rec.path)
    assert record.samples == 2 and record.batches == 1
    assert [s[0] for s in record.spans] == ["sample", "collate", "sample"]
    (batch,) = record.batch_records()
    assert batch.first_index == 3 and batch.size == 1
    assert parse_worker_file(tmp_path / "missing.jsonl") is None


def test_failure_is_annotated_with_the_index():
    class Bad(_DS):
        def __getitem__(self, i):
            raise KeyError("nope")

    with WorkerCollector() as collector:
        proxy = workers.profiled_dataset(Bad(), collector.sink)
        with pytest.raises(workers.DataPipelineError, match=r"dataset\[5\] raised KeyError") as info:
            proxy[5]
        errors = collector.errors()
    assert errors and "dataset[5] raised KeyError in the main process" in errors[0]
    assert isinstance(info.value.__cause__, KeyError)  # the original exception and traceback are kept

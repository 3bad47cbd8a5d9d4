"""po.profile end to end on CPU: workers, transforms, the merged trace, the diagnosis, robustness."""

import json
import os
import time

import psutil
import pytest
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, get_worker_info
from torchvision import datasets as tv_datasets
from torchvision import transforms as T

import pipeline_opt as po
from pipeline_opt.datasets import make_image_folder
from pipeline_opt.profile.report import BOTTLENECKS


class Burn(Dataset):
    """CPU-heavy samples (a busy loop of ``ms`` per sample)."""

    def __init__(self, n=64, ms=15.0):
        self.n, self.ms = n, ms

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        end = time.perf_counter() + self.ms / 1e3
        while time.perf_counter() < end:
            pass
        return torch.full((3, 8, 8), float(i)), i


class Ready(Dataset):
    """Trivial samples, as dicts."""

    def __len__(self):
        return 64

    def __getitem__(self, i):
        return {"img": torch.full((3, 32, 32), 0.5), "label": i}


class Stream(IterableDataset):
    def __init__(self, n=40):
        self.n = n

    def __iter__(self):
        info = get_worker_info()
        wid, nw = (0, 1) if info is None else (info.id, info.num_workers)
        for i in range(wid, self.n, nw):
            yield torch.full((3, 8, 8), float(i))


class Crash(Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        if i == 13:
            raise ValueError("corrupt sample")
        return torch.zeros(3, 8, 8)


def tiny_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.AdaptiveAvgPool2d(1),
                               torch.nn.Flatten(), torch.nn.Linear(4, 2))


def heavy_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Conv2d(3 if i == 0 else 32, 32, 3, padding=1),
                                                     torch.nn.ReLU()) for i in range(3)])


def _state(model):
    return {k: v.clone() for k, v in model.state_dict().items()}


def _children():
    return {p.pid for p in psutil.Process().children(recursive=True)}


def _new_live_children(before, timeout=10.0):
    """Children started since ``before`` that are still alive after ``timeout`` (ignoring e.g. the
    multiprocessing resource tracker that an earlier spawn test may have started)."""
    deadline = time.monotonic() + timeout
    while True:
        alive = []
        for p in psutil.Process().children(recursive=True):
            try:
                if p.pid not in before and p.status() != psutil.STATUS_ZOMBIE:
                    alive.append(p)
            except psutil.NoSuchProcess:
                pass
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.1)


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    # Two intra-op threads on a busy 2-core CI machine spin for ~100 ms per tiny op; one is stable.
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def jpeg_folder(tmp_path_factory):
    return make_image_folder(n_images=48, size=(320, 240), num_classes=2, root=tmp_path_factory.mktemp("jpeg"))


def test_jpeg_folder_two_workers_transforms_trace_and_model_untouched(jpeg_folder, tmp_path):
    compose = T.Compose([T.Resize((64, 64)), T.ToTensor(), T.Normalize([0.5] * 3, [0.25] * 3)])
    ds = tv_datasets.ImageFolder(str(jpeg_folder), transform=compose)
    loader = DataLoader(ds, batch_size=4, num_workers=2)
    user_transforms = list(compose.transforms)
    model = tiny_model()
    before, rng = _state(model), torch.random.get_rng_state()

    report = po.profile(loader, model, steps=5, warmup=2, tensorboard_dir=tmp_path / "tb")

    # the user's objects are as they were
    assert loader.dataset is ds and compose.transforms == user_transforms
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())
    assert torch.equal(torch.random.get_rng_state(), rng)
    # one entry per worker, transforms keyed by name
    assert len(report.workers) == 2
    assert len({w.pid for w in report.workers}) == 2 and os.getpid() not in {w.pid for w in report.workers}
    for w in report.workers:
        assert set(w.transform_s) == {"Resize", "ToTensor", "Normalize"}
        assert w.samples >= 4 and w.mean_sample_s > sum(w.transform_s.values()) > 0
        assert w.rss_bytes > 0 and w.cpu_percent > 0
    assert sum(w.batches for w in report.workers) >= 2 * 2 + 5  # prefetched + measured, incl. exit flushes
    assert len(report.steps) == 5 and report.throughput > 0 and report.batch_size == 4
    assert report.bottleneck in BOTTLENECKS and report.evidence
    assert report.limit_throughput and report.efficiency
    assert report.loader_config["start_method"] in ("fork", "spawn", "forkserver")
    assert any(op.name.startswith("aten::") for op in report.top_cpu_ops)
    assert list((tmp_path / "tb").iterdir()), "no TensorBoard trace written"

    # one timeline: valid JSON, >= 3 processes, worker spans inside the main process's range
    trace = json.loads(json.dumps(report.trace()))
    events = trace["traceEvents"]
    main_pid = os.getpid()
    pids = {e["pid"] for e in events if isinstance(e.get("pid"), int)}
    assert {main_pid, *(w.pid for w in report.workers)} <= pids
    main_x = [e for e in events if e.get("pid") == main_pid and e.get("ph") == "X"]
    lo, hi = min(e["ts"] for e in main_x), max(e["ts"] + e["dur"] for e in main_x)
    worker_x = [e for e in events if e.get("pid") in {w.pid for w in report.workers} and e.get("ph") == "X"]
    assert {"sample", "collate", "Resize", "ToTensor", "Normalize"} <= {e["name"] for e in worker_x}
    assert all(lo <= e["ts"] and e["ts"] + e["dur"] <= hi for e in worker_x)
    flows = [e for e in events if e.get("cat") == "batch"]
    assert len(flows) >= 2 * 5 and {e["ph"] for e in flows} == {"s", "f"}
    aten = [e for e in events if e.get("cat") == "cpu_op"]
    assert aten and all(lo <= e["ts"] <= hi for e in aten), "torch.profiler events not on the shared clock"


def test_cpu_heavy_samples_on_the_main_process_are_diagnosed_data():
    loader = DataLoader(Burn(n=32, ms=15.0), batch_size=4)  # num_workers=0: the main process plays the worker
    report = po.profile(loader, tiny_model(), steps=4, warmup=1, limit=False)
    assert report.bottleneck == "data", report.evidence
    assert report.data_wait_frac > 0.5
    (worker,) = report.workers
    assert worker.worker_id == -1 and worker.pid == os.getpid()
    assert worker.mean_sample_s >= 0.015 * 0.9
    assert report.recommendations[0].startswith("raise num_workers from 0 to")
    assert report.gpu_idle_frac is None and report.limit_throughput is None


def test_trivial_samples_with_a_heavy_model_are_diagnosed_compute_with_dict_batches():
    report = po.profile(DataLoader(Ready(), batch_size=8), heavy_model(), steps=3, warmup=1, limit=False)
    assert report.bottleneck == "compute", report.evidence
    assert report.data_wait_frac < 0.1
    assert any("channels_last" in r for r in report.recommendations)


def test_tuple_batches_with_a_custom_step_and_device_loader_wrapper():
    class Wrapper:  # anything with .loader / .device / .transform is treated as a DeviceLoader
        def __init__(self, loader):
            self.loader, self.device, self.transform = loader, torch.device("cpu"), None

        def __iter__(self):
            return iter(self.loader)

        def __len__(self):
            return len(self.loader)

    seen = []

    def step(model, batch):
        images, labels = batch
        seen.append(labels.tolist())
        model(images).sum().backward()

    user = DataLoader(Burn(n=16, ms=0.5), batch_size=4)
    wrapper = Wrapper(user)
    report = po.profile(wrapper, tiny_model(), step_fn=step, steps=3, warmup=1)
    assert wrapper.loader is user
    assert seen[:4] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15]]
    assert report.loader_config["wrapper"] == "Wrapper" and len(report.steps) == 3


def test_iterable_dataset_with_two_workers_and_epoch_restarts():
    loader = DataLoader(Stream(n=24), batch_size=4, num_workers=2, persistent_workers=True)
    report = po.profile(loader, tiny_model(), steps=6, warmup=1, limit=False)  # 6 batches per epoch
    assert len(report.steps) == 6
    assert {w.worker_id for w in report.workers} == {0, 1}
    assert len({w.pid for w in report.workers}) == 2  # persistent: the same two processes across epochs
    assert sum(w.samples for w in report.workers) >= 4 * (4 + 6)


def test_spawn_start_method():
    # one epoch only (spawning workers is slow on a busy machine): skip 2*2 prefetched + 2 measured < 16
    loader = DataLoader(Burn(n=64, ms=1.0), batch_size=4, num_workers=2, multiprocessing_context="spawn")
    report = po.profile(loader, tiny_model(), steps=2, warmup=1, limit=False)
    assert report.loader_config["start_method"] == "spawn"
    assert len(report.workers) == 2 and all(w.samples > 0 for w in report.workers)


def test_crashing_worker_names_the_index_and_leaves_no_processes():
    model = tiny_model()
    before = _state(model)
    loader = DataLoader(Crash(), batch_size=4, num_workers=2)
    before_children = _children()
    with pytest.raises(ValueError, match=r"dataset\[13\] raised ValueError in DataLoader worker 1"):
        po.profile(loader, model, steps=20, warmup=1)
    assert _new_live_children(before_children) == []
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_bad_arguments_are_rejected_with_the_fix():
    loader = DataLoader(Ready(), batch_size=4)
    with pytest.raises(ValueError, match="steps=0"):
        po.profile(loader, tiny_model(), steps=0)
    with pytest.raises(TypeError, match="DataLoader"):
        po.profile([torch.zeros(1, 3, 8, 8)], tiny_model())
    with pytest.raises(TypeError, match="nn.Module"):
        po.profile(loader, lambda x: x)


class DieAt13(Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        if i == 13:
            os._exit(3)  # a worker killed outright: no exception, no exit handlers
        return torch.zeros(3, 8, 8)


@pytest.mark.timeout(120)
def test_dead_worker_does_not_hang_or_lose_the_other_workers_data():
    from pipeline_opt.profile import install_worker_profiling

    loader = DataLoader(DieAt13(), batch_size=4, num_workers=2)
    profiled, collector = install_worker_profiling(loader)
    with pytest.raises(RuntimeError, match="exited unexpectedly"):
        for _ in profiled:
            pass
    del profiled
    stats = {w.worker_id: w for w in collector.stats()}
    collector.close()
    assert stats[0].batches >= 2 and stats[0].samples >= 8  # worker 0 made batches 0, 2, ...


def test_device_loader_is_rewrapped_with_its_settings():
    seen = []
    dl = po.DeviceLoader(DataLoader(Burn(n=16, ms=0.1), batch_size=4), device="cpu",
                         transform=lambda x: seen.append(x.shape) or x * 2)
    report = po.profile(dl, tiny_model(), steps=2, warmup=1, limit=False)
    assert report.loader_config["wrapper"] == "DeviceLoader"
    assert len(seen) >= 3 and seen[0][0] == 4  # the user's transform ran on the profiled clone's batches
    assert report.workers[0].samples >= 12


def test_traced_steps_follow_the_untraced_measured_window():
    loader = DataLoader(Burn(n=64, ms=0.5), batch_size=4)  # 16 batches: 1 skipped + 6 measured + 1 warm-up + 2 traced
    report = po.profile(loader, tiny_model(), steps=6, warmup=1, limit=False, trace_steps=2)
    assert len(report.steps) == 6 and report.traced_steps == 2
    assert report.top_cpu_ops, "the traced steps give the op table"
    events = report.trace()["traceEvents"]
    main_pid = os.getpid()
    ours = {e["args"]["step"]: e["ts"] for e in events
            if e.get("pid") == main_pid and e.get("name") == "data_wait" and e.get("cat") == "step"}
    traced = sorted(e["ts"] for e in events
                    if e.get("pid") == main_pid and e.get("name") == "data_wait" and e.get("cat") == "user_annotation")
    last_measured = max(s.index for s in report.steps)
    assert [s.index for s in report.steps] == list(range(1, 7))
    assert len(traced) == 2, "torch.profiler recorded other steps than the traced ones"
    assert traced[0] >= ours[last_measured + 2] - 1000.0  # after the window and the profiler's warm-up step


def test_trace_steps_shrink_to_stay_in_the_epoch_of_the_window():
    loader = DataLoader(Burn(n=40, ms=0.2), batch_size=4)  # 10 batches: 1 skipped + 6 measured + 1 warm-up
    report = po.profile(loader, tiny_model(), steps=6, warmup=1, limit=False)
    assert len(report.steps) == 6 and report.traced_steps == 2


def test_trace_steps_zero_times_every_step_without_torch_profiler():
    loader = DataLoader(Burn(n=64, ms=0.5), batch_size=4)
    report = po.profile(loader, tiny_model(), steps=4, warmup=1, limit=False, trace_steps=0)
    assert len(report.steps) == 4 and report.throughput > 0
    assert report.traced_steps == 0 and report.top_cpu_ops == () and report.sync_frac == 0.0
    assert not any(e.get("cat") == "cpu_op" for e in report.trace()["traceEvents"])
    with pytest.raises(ValueError, match="trace_steps=-1"):
        po.profile(loader, tiny_model(), steps=4, trace_steps=-1)
    with pytest.raises(ValueError, match="trace_steps=True"):
        po.profile_loop(loader, steps=4, trace_steps=True)


def test_the_device_is_drained_at_both_ends_of_the_trace_before_torch_profiler_stops(monkeypatch):
    """A GPU-bound loop runs the host ahead of the device: unless the queue is drained when the trace
    starts and before the last traced step ends it, queued kernels fall outside the trace and read
    as GPU idle time (seen on the H200 as 37% idle on a step at 99% of its limit)."""
    from pipeline_opt.profile.main_profiler import StepProfiler

    calls = []
    monkeypatch.setattr(StepProfiler, "_sync", lambda self: calls.append(("sync", self.index)))
    real_step = torch.profiler.profile.step
    monkeypatch.setattr(torch.profiler.profile, "step", lambda self: (calls.append(("prof.step", None)),
                                                                      real_step(self))[1])
    prof = StepProfiler("cpu", skip=1, steps=2, trace_steps=2)  # steps 0 | 1 2 | warm-up 3 | traced 4 5
    prof.start()
    prof.new_epoch()
    for _ in range(prof.total):
        prof.before_data()
        prof.after_data(torch.zeros(2, 1))
        prof.before_step()
        prof.after_step()
    assert prof.done and prof.trace_start == 4 and prof.total == 6
    syncs = [i for kind, i in calls if kind == "sync"]
    assert 1 in syncs and 4 in syncs, "the window and the trace each start on a drained device"
    last_sync = max(k for k, c in enumerate(calls) if c == ("sync", 5))
    last_prof_step = max(k for k, c in enumerate(calls) if c[0] == "prof.step")
    assert last_sync < last_prof_step, "the device must be drained before prof.step() ends the trace"
    assert prof.result().traced_steps == 2


class Planes(Dataset):
    """1 MiB float32 images (3 x 256 x 341), with their index."""

    def __len__(self):
        return 32

    def __getitem__(self, i):
        return torch.full((3, 256, 341), float(i)), i


def _stack_collate(samples):
    """A custom collate as many projects write it: torch.stack into ordinary memory."""
    return torch.stack([s[0] for s in samples]), torch.tensor([s[1] for s in samples])


def test_a_collate_that_stacks_into_ordinary_memory_is_measured_and_named():
    """torch.stack in a worker leaves the batch outside shared memory (copied again to be sent);
    default_collate allocates it there. The report tells the two apart."""
    custom = po.profile(DataLoader(Planes(), batch_size=8, num_workers=1, collate_fn=_stack_collate), tiny_model(),
                        steps=3, warmup=1, limit=False)
    plain = po.profile(DataLoader(Planes(), batch_size=8, num_workers=1), tiny_model(), steps=3, warmup=1, limit=False)
    mib = 8 * 3 * 256 * 341 * 4 / (1 << 20)  # 8.0 MiB of images per batch (+ the labels' few bytes)
    assert any(f"holds {mib:.0f} MiB of tensors outside shared memory" in e for e in custom.evidence)
    assert not any("outside shared memory" in e for e in plain.evidence)


def _slow_decode(batch):
    time.sleep(0.02)  # a decode that blocks its caller, as nvJPEG's does
    return batch


def test_a_preparing_threads_decode_shows_on_its_own_track_overlapping_the_steps():
    from pipeline_opt.loading import DeviceLoader
    from pipeline_opt.profile.trace import PREPARE_TID

    def slow_step(model, batch):
        time.sleep(0.02)
        return model(batch[0].float().flatten(1)[:, :3 * 8 * 8]).sum()

    loader = DeviceLoader(DataLoader(Burn(n=64, ms=0.1), batch_size=4), device="cpu", batch_transform=_slow_decode,
                          prepare_in_thread=True)
    model = torch.nn.Linear(3 * 8 * 8, 2)
    report = po.profile(loader, model, step_fn=slow_step, steps=6, warmup=1, limit=False, trace_steps=0)
    events = report.trace()["traceEvents"]
    main_pid = os.getpid()
    prepared = [(e["ts"], e["ts"] + e["dur"]) for e in events
                if e.get("tid") == PREPARE_TID and e.get("pid") == main_pid and e.get("name") == "prepare batch"]
    steps = [(e["ts"], e["ts"] + e["dur"]) for e in events
             if e.get("pid") == main_pid and e.get("name") == "compute" and e.get("cat") == "step"]
    assert len(prepared) >= 7 and steps
    overlapping = [p for p in prepared if any(a < p[1] and p[0] < b for a, b in steps)]
    assert len(overlapping) >= len(steps) // 2, "the decode of the next batch did not run during the steps"
    names = [e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("tid") == PREPARE_TID
             and e.get("name") == "thread_name"]
    assert names == ["DeviceLoader preparing thread"]


def test_the_training_threads_wait_for_a_core_reaches_the_report(monkeypatch):
    # the kernel's counters are faked, so that the wait is known exactly
    from pipeline_opt.profile import main_profiler

    readings = iter([(1.0, 0.25), (2.0, 0.40)])  # the window's start and end: 0.15 s waited over it
    monkeypatch.setattr(main_profiler, "thread_sched", lambda: next(readings))
    report = po.profile(DataLoader(Ready(), batch_size=8), tiny_model(), steps=3, warmup=1, limit=False,
                        trace_steps=0)
    assert report.main_runqueue_s == pytest.approx(0.15 / 3)
    assert report.to_dict()["main_runqueue_s"] == pytest.approx(0.05)
    assert any("waited 50.0 ms per step for a free core" in e for e in report.evidence)


def test_an_unmeasurable_wait_for_a_core_is_none(monkeypatch):
    from pipeline_opt.profile import main_profiler

    monkeypatch.setattr(main_profiler, "thread_sched", lambda: None)
    report = po.profile(DataLoader(Ready(), batch_size=8), tiny_model(), steps=3, warmup=1, limit=False)
    assert report.main_runqueue_s is None and not any("free core" in e for e in report.evidence)
    assert report.main_thread_cpu_s is None


def test_the_training_threads_own_cpu_is_its_part_of_the_process(monkeypatch):
    """The training thread's run time over the window, per step; a second thread of the process burning
    CPU during the window counts in main_cpu_s but not in the thread's own share."""
    import threading

    stop = threading.Event()

    def burn():
        while not stop.is_set():
            sum(range(2000))

    spinner = threading.Thread(target=burn, daemon=True)

    class Busy(Ready):
        def __getitem__(self, i):
            if not spinner.is_alive():
                spinner.start()
            return super().__getitem__(i)

    try:
        report = po.profile(DataLoader(Busy(), batch_size=8), tiny_model(), steps=8, warmup=1, limit=False,
                            trace_steps=0)
    finally:
        stop.set()
        spinner.join()
    assert report.main_thread_cpu_s is not None and report.main_thread_cpu_s > 0
    assert report.to_dict()["main_thread_cpu_s"] == pytest.approx(report.main_thread_cpu_s)
    assert report.main_thread_cpu_s < report.main_cpu_s  # the spinner's CPU is the process's, not the thread's

"""Memory per step and the measured batch-size advice (a fake allocator on CPU; CUDA behind the marker)."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from pipeline_opt.profile.batch_size import max_batch_size, resize_batch
from pipeline_opt.profile.memory import MemoryMeter, summarise

MiB = 1 << 20


class FakeMemory:
    """An allocator whose step peak is ``fixed + per_sample * n``; past ``capacity`` the step runs out."""

    def __init__(self, fixed=1000 * MiB, per_sample=10 * MiB, total=4000 * MiB, capacity=None):
        self.fixed, self.per_sample, self.total_bytes = fixed, per_sample, total
        self.capacity = total if capacity is None else capacity
        self.peak = 0
        self.released = 0

    def reset_peak(self):
        self.peak = 0

    def release(self):
        self.released += 1

    def peaks(self):
        return self.peak, self.peak

    def total(self):
        return self.total_bytes

    def step(self, model, batch):
        n = batch[0].shape[0]
        need = self.fixed + self.per_sample * n
        if need > self.capacity:
            raise RuntimeError(f"CUDA out of memory. Tried to allocate {need} bytes")
        self.peak = max(self.peak, need)
        model(batch[0]).sum().backward()


def _loader(batch=32, samples=64):
    data = TensorDataset(torch.randn(samples, 8), torch.zeros(samples, dtype=torch.long))
    return DataLoader(data, batch_size=batch)


def test_the_line_through_measured_peaks_predicts_and_real_steps_verify():
    fake, model = FakeMemory(), torch.nn.Linear(8, 2)
    before = [p.detach().clone() for p in model.parameters()]
    advice = max_batch_size(_loader(), model, fake.step, backend=fake, margin=0.1, time_steps=2)
    # 0.9 * 4000 MiB = 3600 MiB: (3600 - 1000) / 10 = 260 samples; 267 (3% up) is over the budget
    assert advice.batch_sizes == (16, 32, 64) and advice.predicted == 260 and advice.verified == 260
    assert advice.probes == ((260, 3600 * MiB), (267, 3670 * MiB)) and advice.note == ""
    assert advice.bytes_per_sample == pytest.approx(10 * MiB) and advice.fixed_bytes == pytest.approx(1000 * MiB)
    assert set(advice.throughput) == {32, 260} and advice.gain is not None
    summary = advice.summary()
    assert "the line predicted 260; real steps: 260 fits (3.5 GiB), 267 over budget (3.6 GiB); verified 260" in summary
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))  # restored bitwise
    assert all(p.grad is None for p in model.parameters())
    assert fake.released >= len(advice.batch_sizes) + len(advice.probes)  # the cache released before each size


def test_a_prediction_that_runs_out_of_memory_bisects_to_a_smaller_verified_size():
    fake = FakeMemory(capacity=3400 * MiB)  # the real limit (240) sits below the line's (fragmentation, say)
    advice = max_batch_size(_loader(), torch.nn.Linear(8, 2), fake.step, backend=fake, time_steps=0)
    # 260 runs out: bisection between the largest fit (64) and it, until 235 fits and 241 does not
    assert advice.predicted == 260 and [n for n, _ in advice.probes] == [260, 162, 211, 235, 247, 241]
    assert advice.out_of_memory == (260, 247, 241) and advice.verified == 235
    assert advice.verified_peak_bytes == 1000 * MiB + 235 * 10 * MiB
    assert "260 out of memory, 162 fits" in advice.summary()


def test_the_current_batch_is_the_fallback_when_nothing_larger_keeps_the_margin():
    fake = FakeMemory(fixed=2950 * MiB, per_sample=20 * MiB)  # 32 peaks at 3590 MiB, 33 at 3610 (budget 3600)
    advice = max_batch_size(_loader(), torch.nn.Linear(8, 2), fake.step, backend=fake, time_steps=0)
    assert advice.verified == 32 and advice.probes == ((33, 3610 * MiB),)
    assert "the current batch is the fallback" in advice.note and advice.note in advice.summary()


GiB = 1 << 30
SEGMENT = 2 * GiB


class CachingMemory:
    """A caching allocator like PyTorch's: a step needs ``3 GiB + 30 MiB * n + 10 KiB * n**2`` (the memory
    per sample grows with the batch), reserved in 2 GiB segments; freed segments stay cached (reserved)
    until :meth:`release`, and resetting the peak sets it to what is reserved now, cache included. A
    step that needs more than ``total`` runs out of memory after reserving all of it."""

    def __init__(self, total=80 * GiB, releases=True):
        self.total_bytes, self.releases = total, releases
        self.reserved = self.max_reserved = 0

    @staticmethod
    def need(n):
        return 3 * GiB + 30 * MiB * n + 10 * 1024 * n * n

    @classmethod
    def own_peak(cls, n):
        """The reserved peak of a step at ``n`` from an empty cache."""
        return -(-cls.need(n) // SEGMENT) * SEGMENT

    def reset_peak(self):
        self.max_reserved = self.reserved

    def peaks(self):
        return self.max_reserved, self.max_reserved

    def total(self):
        return self.total_bytes

    def release(self):
        if self.releases:
            self.reserved = 0

    def step(self, model, batch):
        n = batch[0].shape[0]
        if self.need(n) > self.total_bytes:
            self.reserved = self.max_reserved = self.total_bytes  # what it got before running out stays cached
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
        self.reserved = max(self.reserved, self.own_peak(n))
        self.max_reserved = max(self.max_reserved, self.reserved)
        model(batch[0]).sum().backward()
        with torch.no_grad():  # an optimizer step: the model changes unless restored
            for p in model.parameters():
                p -= 0.1 * p.grad


def test_a_line_that_overshoots_is_corrected_by_real_steps_within_the_probe_cap():
    fake, model = CachingMemory(), torch.nn.Linear(8, 2)
    before = [p.detach().clone() for p in model.parameters()]
    budget = 0.9 * fake.total_bytes
    true_best = max(n for n in range(1, 4000) if CachingMemory.own_peak(n) <= budget)
    advice = max_batch_size(_loader(128, samples=128), model, fake.step, backend=fake, time_steps=0)
    assert advice.batch_sizes == (64, 128, 256) and advice.predicted > true_best  # the line overshoots...
    assert advice.probes[0] == (advice.predicted, None)  # ...into an out-of-memory
    assert advice.probes[1][0] == (256 + advice.predicted) // 2  # bisection from the largest fit
    assert 1 < len(advice.probes) <= 6 and advice.note == ""
    assert advice.verified is not None and advice.verified <= true_best  # never above what fits
    assert advice.verified >= true_best - max(1, int(0.03 * advice.verified))  # within the stop tolerance
    assert advice.verified_peak_bytes == CachingMemory.own_peak(advice.verified) <= budget
    # every probe after the out-of-memory read its own peak, not the cache the out-of-memory left
    assert all(peak == CachingMemory.own_peak(n) for n, peak in advice.probes if peak is not None)
    assert f"verified {advice.verified:,}" in advice.summary()
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))  # restored bitwise
    assert all(p.grad is None for p in model.parameters())


def test_equal_peaks_at_two_sizes_give_a_line_no_flatter_than_a_samples_own_bytes():
    from pipeline_opt.profile.batch_size import _fit

    # one allocator segment holds both sizes: the least-squares slope is 0, a line that fits any batch
    assert _fit({64: 7 * GiB, 128: 7 * GiB}, min_slope=600_000.0)[0] == 600_000.0
    assert _fit({64: 7 * GiB, 128: 8 * GiB}, min_slope=600_000.0)[0] == pytest.approx(GiB / 64)


def test_a_cache_left_by_a_larger_step_does_not_inflate_the_next_measurement():
    from pipeline_opt.profile.batch_size import peak_bytes

    model, cpu = torch.nn.Linear(8, 2), torch.device("cpu")
    for releases, small_peak in ((True, CachingMemory.own_peak(64)), (False, CachingMemory.own_peak(1024))):
        fake = CachingMemory(releases=releases)
        assert peak_bytes(fake.step, model, (torch.ones(1024, 8),), cpu, fake) == CachingMemory.own_peak(1024)
        assert peak_bytes(fake.step, model, (torch.ones(64, 8),), cpu, fake) == small_peak
    # an out-of-memory leaves all of the device cached; the next size still reads its own peak
    fake = CachingMemory()
    assert peak_bytes(fake.step, model, (torch.ones(4096, 8),), cpu, fake) is None
    assert all(p.grad is None for p in model.parameters())  # gradients dropped after the out-of-memory
    assert peak_bytes(fake.step, model, (torch.ones(64, 8),), cpu, fake) == CachingMemory.own_peak(64)


def test_cpu_says_not_measured_and_odd_batches_need_make_batch():
    advice = max_batch_size(_loader(), torch.nn.Linear(8, 2))
    assert not advice.measured and "not measured on cpu" in advice.summary()
    assert resize_batch((torch.arange(4), torch.arange(4)), 6)[0].tolist() == [0, 1, 2, 3, 0, 1]
    with pytest.raises(TypeError, match="make_batch="):
        resize_batch({"img": torch.zeros(4, 3), "bboxes": torch.zeros(7, 4)}, 8)
    with pytest.raises(ValueError, match="margin=1.5"):
        max_batch_size(_loader(), torch.nn.Linear(8, 2), margin=1.5)


def test_per_step_peaks_name_spikes_headroom_and_fragmentation():
    stats = summarise([100, 100, 100, 150, 100], [120, 120, 120, 300, 120], total=1000)
    assert stats.measured and stats.steady_peak_bytes == 100 and stats.spikes == (3,)
    assert stats.headroom_bytes == 700 and stats.fragmentation_bytes == 150
    lines = stats.lines()
    assert "memory spikes: 1 step(s)" in lines[1] and "fragmentation" in lines[2]
    assert MemoryMeter("cpu").stats().lines() == ["memory: not measured on cpu (CUDA devices only)"]


@pytest.mark.cuda
def test_cuda_peaks_grow_with_the_batch_and_the_prediction_runs():
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 10)).cuda()
    data = TensorDataset(torch.randn(256, 1024), torch.zeros(256, dtype=torch.long))
    advice = max_batch_size(DataLoader(data, batch_size=64), model, margin=0.5, time_steps=2)
    assert advice.measured and advice.peak_reserved_bytes[0] <= advice.peak_reserved_bytes[-1]
    assert advice.verified is not None and advice.verified_peak_bytes <= advice.budget_bytes
    assert len(advice.probes) <= 6 and advice.verified not in advice.out_of_memory
    meter = MemoryMeter("cuda")
    meter.begin()
    x = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
    meter.end()
    del x
    assert meter.stats().max_peak_bytes >= 64 << 20


def _profile(device="cpu"):
    import pipeline_opt as po

    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(8, 2)).to(device)
    return po.profile(_loader(8), model, steps=3, warmup=1, limit=False, trace_steps=2, device=device)


def test_every_profile_has_a_memory_section_that_says_when_nothing_was_measured():
    from pipeline_opt.report.html import render_profile_html

    report = _profile()
    assert report.memory is not None and not report.memory.measured
    assert "memory: not measured on cpu (CUDA devices only)" in report.table()
    d = report.to_dict()
    assert d["memory"]["measured"] is False
    assert "<h2>Memory</h2><p>not measured on cpu (CUDA devices only).</p>" in render_profile_html(d)


def test_the_html_draws_each_steps_peak_and_names_the_allocating_ops():
    from pipeline_opt.report.html import _memory_section

    stats = summarise([1 << 30, 1 << 30, 3 << 29], [2 << 30, 2 << 30, 2 << 30], total=80 << 30)
    html = _memory_section({"memory": {**stats.to_dict(), "top_alloc_ops": [["aten::empty", 1 << 30]]}})
    assert "peak memory per step" in html and "<svg" in html and "aten::empty" in html
    assert "78.00 GiB of 80.0 GiB stay free" in html
    assert "Spikes (steps above the steady peak): 2" in html


@pytest.mark.cuda
def test_a_cuda_profile_measures_each_steps_peak():
    report = _profile("cuda")
    mem = report.memory
    assert mem.measured and len(mem.peak_allocated_bytes) == 3 and mem.max_peak_bytes > 0
    assert 0 < mem.headroom_bytes < mem.device_total_bytes and "memory: peak" in report.table()


def test_a_detection_batch_is_resized_with_each_samples_boxes_renumbered():
    batch = {"img": torch.arange(3).view(3, 1, 1, 1).expand(3, 3, 2, 2).clone(),
             "batch_idx": torch.tensor([0.0, 0.0, 2.0]), "cls": torch.tensor([[5.0], [6.0], [7.0]]),
             "bboxes": torch.arange(12.0).view(3, 4), "im_file": ["a", "b", "c"], "ori_shape": [(1, 1)] * 3}
    out = resize_batch(batch, 5)  # samples 0 1 2 0 1: sample 1 has no box
    assert out["img"][:, 0, 0, 0].tolist() == [0, 1, 2, 0, 1]
    assert out["batch_idx"].tolist() == [0.0, 0.0, 2.0, 3.0, 3.0] and out["batch_idx"].dtype == torch.float32
    assert out["cls"].flatten().tolist() == [5.0, 6.0, 7.0, 5.0, 6.0]
    assert torch.equal(out["bboxes"][3:], batch["bboxes"][:2]) and out["im_file"] == ["a", "b", "c", "a", "b"]
    smaller = resize_batch(batch, 2)
    assert smaller["batch_idx"].tolist() == [0.0, 0.0] and smaller["img"].shape[0] == 2


def test_a_resized_ultralytics_batch_trains_through_the_yolo_step(tmp_path):
    pytest.importorskip("ultralytics")
    from pipeline_opt.datasets import make_yolo_dataset
    from pipeline_opt.integrations.ultralytics import build_yolo_pipeline

    data = make_yolo_dataset(n_train=8, n_val=2, size=(96, 64), root=tmp_path / "yolo", workers=1)
    pipe = build_yolo_pipeline(data, imgsz=32, batch=4, workers=0, device="cpu")
    try:
        batch = next(iter(pipe.loader))
        bigger = resize_batch(batch, 6)
        assert bigger["img"].shape[0] == 6 and int(bigger["batch_idx"].max()) <= 5
        loss = pipe.step_fn(pipe.model, bigger)
        assert loss is None or torch.isfinite(torch.as_tensor(loss)).all()
    finally:
        pipe.close()

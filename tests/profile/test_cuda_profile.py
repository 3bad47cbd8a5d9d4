"""The GPU path of the profiler (run on a CUDA machine: pytest tests/profile -m cuda -s)."""

import os
import statistics
import time

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

import pipeline_opt as po
from pipeline_opt._core.log import get_logger

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

log = get_logger("tests.cuda")


class Images(Dataset):
    """uint8 images with an optional CPU cost per sample (busy loop of ``ms``)."""

    def __init__(self, n=512, size=64, ms=0.0):
        self.n, self.size, self.ms = n, size, ms

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        end = time.perf_counter() + self.ms / 1e3
        while time.perf_counter() < end:
            pass
        return torch.full((3, self.size, self.size), i % 255, dtype=torch.uint8), i


def convnet(width=64, depth=4):
    torch.manual_seed(0)
    layers = [torch.nn.Conv2d(3, width, 3, padding=1), torch.nn.ReLU()]
    for _ in range(depth - 1):
        layers += [torch.nn.Conv2d(width, width, 3, padding=1), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers).cuda()


def test_gpu_report_has_cuda_numbers_on_one_clock(tmp_path):
    model = convnet()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    loader = DataLoader(Images(), batch_size=32, num_workers=2, pin_memory=True)
    report = po.profile(loader, model, steps=10, warmup=3, tensorboard_dir=tmp_path / "tb")
    assert report.device.startswith("cuda")
    assert report.gpu_idle_frac is not None and 0.0 <= report.gpu_idle_frac <= 1.0
    assert report.top_cuda_ops and report.top_cuda_ops[0].self_cuda_s > 0
    assert all(s.compute_s > 0 and s.step_s > 0 for s in report.steps)
    assert report.limit_throughput and 0 < report.efficiency
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    events = report.trace()["traceEvents"]
    main = [e for e in events if e.get("pid") == os.getpid() and e.get("ph") == "X"]
    lo, hi = min(e["ts"] for e in main), max(e["ts"] + e["dur"] for e in main)
    kernels = [e for e in events if e.get("cat") == "kernel"]
    assert kernels and all(lo <= e["ts"] <= hi for e in kernels), "CUDA kernels are not on the shared clock"
    report.save(tmp_path / "out")
    log.warning("GPU profile: %s", report.table())


def test_heavy_model_on_gpu_is_compute_bound():
    model = convnet(width=256, depth=8)
    loader = DataLoader(Images(n=256, size=128), batch_size=64, num_workers=4, pin_memory=True,
                        persistent_workers=True)
    report = po.profile(loader, model, steps=10, warmup=3)
    assert report.bottleneck == "compute", report.evidence


def test_cpu_heavy_samples_on_gpu_are_data_bound():
    loader = DataLoader(Images(n=512, ms=5.0), batch_size=32, num_workers=2, pin_memory=True)
    report = po.profile(loader, convnet(width=16, depth=2), steps=8, warmup=2)
    assert report.bottleneck == "data", report.evidence
    assert report.gpu_idle_frac > 0.5
    assert any(r.startswith("raise num_workers from 2 to") for r in report.recommendations)


def test_in_loop_profiler_on_gpu():
    model = convnet(width=32, depth=2)
    # one epoch of 10 batches: 3 skipped, 5 measured, the profiler's warm-up step, 1 traced
    loader = DataLoader(Images(n=320), batch_size=32, num_workers=2, pin_memory=True)
    with po.profile_loop(loader, model=model, steps=5, warmup=2) as prof:
        for images, _ in prof:
            x = images.cuda(non_blocking=True).float() / 255
            model(x).mean().backward()
            prof.step()
        report = prof.report()
    assert report.gpu_idle_frac is not None and len(report.steps) == 5
    assert all(s.compute_s > 0 for s in report.steps)


def test_worker_profiling_overhead_is_small():
    """Interleaved A/B windows; the issue's target is within 5% (asserted generously: noise)."""
    model = convnet(width=64, depth=4)
    loader = DataLoader(Images(n=2048, ms=1.0), batch_size=64, num_workers=4, pin_memory=True,
                        persistent_workers=True)
    on, off = [], []
    for _ in range(3):
        off.append(po.profile(loader, model, steps=15, warmup=3, worker_profiling=False, limit=False).throughput)
        on.append(po.profile(loader, model, steps=15, warmup=3, worker_profiling=True, limit=False).throughput)
    ratio = statistics.median(on) / statistics.median(off)
    log.warning("worker profiling overhead: on %s off %s -> ratio %.3f", on, off, ratio)
    assert ratio > 0.8


def test_short_trace_still_gives_gpu_idle_and_kernels():
    model = convnet(width=32, depth=2)
    loader = DataLoader(Images(n=1024), batch_size=32, num_workers=2, pin_memory=True)
    report = po.profile(loader, model, steps=12, warmup=2, trace_steps=4, limit=False)
    assert len(report.steps) == 12 and report.traced_steps == 4
    assert report.gpu_idle_frac is not None and 0.0 <= report.gpu_idle_frac <= 1.0
    assert report.top_cuda_ops and report.top_cuda_ops[0].self_cuda_s > 0
    untraced = po.profile(loader, model, steps=6, warmup=2, trace_steps=0, limit=False)
    assert untraced.gpu_idle_frac is None and untraced.top_cuda_ops == ()
    assert all(s.compute_s > 0 for s in untraced.steps)

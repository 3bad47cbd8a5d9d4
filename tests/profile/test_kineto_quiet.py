"""A CPU profile leaves stderr free of Kineto's device-count error."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import pipeline_opt as po

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the error is Kineto's on machines without CUDA")


def _tiny():
    data = TensorDataset(torch.rand(32, 3, 8, 8), torch.zeros(32))
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 2, 3), torch.nn.Flatten(), torch.nn.LazyLinear(1))
    model(torch.rand(1, 3, 8, 8))
    return DataLoader(data, batch_size=4), model


def test_a_cpu_profile_prints_no_kineto_error(capfd):
    loader, model = _tiny()
    report = po.profile(loader, model, steps=3, warmup=1, limit=False, trace_steps=2)
    assert report.traced_steps == 2, "torch.profiler did run"
    err = capfd.readouterr().err
    assert "gpuGetDeviceCount" not in err, err


def test_a_fresh_process_prints_no_kineto_line_and_a_user_level_is_kept():
    # a fresh interpreter: Kineto reads its level once, at the process's first profiler
    code = ("import torch; from torch.utils.data import DataLoader, TensorDataset; import pipeline_opt as po; "
            "m = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(12, 1)); "
            "po.profile(DataLoader(TensorDataset(torch.rand(16, 3, 2, 2)), batch_size=4), m, steps=2, warmup=0, "
            "limit=False, trace_steps=1); import os; print(os.environ['KINETO_LOG_LEVEL'])")
    env = {k: v for k, v in os.environ.items() if k != "KINETO_LOG_LEVEL"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "gpuGetDeviceCount" not in out.stderr and "profiler_start" not in out.stderr, out.stderr
    kept = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**env, "KINETO_LOG_LEVEL": "4"})
    assert kept.returncode == 0 and kept.stdout.strip() == "4", kept.stderr

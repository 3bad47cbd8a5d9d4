"""The in-loop profiler and the PERF_BENCH=1 switch."""

import json
import os
import subprocess
import sys
import textwrap
import time

import torch
from torch.utils.data import DataLoader, Dataset

import pipeline_opt as po


class Slow(Dataset):
    def __len__(self):
        return 12

    def __getitem__(self, i):
        time.sleep(0.004)
        return torch.full((3, 8, 8), float(i)), i


def test_loop_profiler_measures_the_users_loop_over_epochs():
    loader = DataLoader(Slow(), batch_size=4)  # 3 batches per epoch
    model = torch.nn.Linear(8, 2)
    seen = []
    with po.profile_loop(loader, model=model, steps=4, warmup=1) as prof:
        assert len(prof) == 3
        for _epoch in range(3):
            for images, labels in prof:
                model(images).sum().backward()
                seen.append(labels[0].item())
                prof.step()
        report = prof.report()
    assert seen == [0, 4, 8] * 3  # the same batches as the loader, epoch after epoch
    assert len(report.steps) == 4 and [s.index for s in report.steps] == [1, 2, 3, 4]
    assert report.limit_throughput is None and report.throughput > 0
    (worker,) = report.workers
    assert worker.worker_id == -1 and worker.samples >= 12
    assert report.data_wait_frac > 0 and all(s.data_wait_s >= 0.004 * 4 * 0.9 for s in report.steps)


def test_step_is_implied_by_asking_for_the_next_batch():
    prof = po.profile_loop(DataLoader(Slow(), batch_size=4), steps=2, warmup=0)
    batches = [b for b in prof]
    report = prof.report()
    prof.close()
    assert len(batches) == 3 and len(report.steps) == 2


def test_perf_bench_saves_the_report_and_exits_zero(tmp_path):
    script = tmp_path / "train.py"
    out = tmp_path / "bench"
    script.write_text(textwrap.dedent(f"""
        import torch
        from torch.utils.data import DataLoader, TensorDataset
        import pipeline_opt as po

        torch.set_num_threads(1)
        loader = DataLoader(TensorDataset(torch.randn(32, 3, 8, 8)), batch_size=4)
        model = torch.nn.Conv2d(3, 2, 3)
        prof = po.profile_loop(loader, model=model, steps=3, warmup=1, output_dir={str(out)!r})
        for epoch in range(100):
            for (x,) in prof:
                model(x).sum().backward()
                prof.step()
        print("TRAINING FINISHED")
    """))
    env = dict(os.environ, PERF_BENCH="1")
    proc = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "TRAINING FINISHED" not in proc.stdout
    assert str(out) in proc.stderr and "PERF_BENCH=1" in proc.stderr
    saved = json.loads((out / "report.json").read_text())
    assert len(saved["steps"]) == 3
    assert json.loads((out / "trace.json").read_text())["traceEvents"]

"""The in-loop profiler and the PERF_BENCH=1 switch."""

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, TensorDataset

import pipeline_opt as po
from pipeline_opt.profile.install import loop_skip_steps


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


class Tiny(Dataset):
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return torch.full((3, 8, 8), i % 255, dtype=torch.uint8), i


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("n_batches", [7, 8, 12])  # exactly warmup + steps, one more, room for the pre-fill
def test_one_epoch_loop_measures_all_steps(num_workers, n_batches):
    """The GPU test's shape: one epoch, 2 workers pre-filling 4 batches, warmup=2, steps=5."""
    model = torch.nn.Conv2d(3, 2, 3)
    loader = DataLoader(Tiny(4 * n_batches), batch_size=4, num_workers=num_workers)
    seen = 0
    with po.profile_loop(loader, model=model, steps=5, warmup=2) as prof:
        for images, _ in prof:
            model(images.float() / 255).mean().backward()
            seen += 1
            prof.step()
        report = prof.report()
    assert seen == n_batches
    assert len(report.steps) == 5
    first = report.steps[0].index
    assert [s.index for s in report.steps] == list(range(first, first + 5)) and first + 5 <= n_batches
    # the pre-fill skip, shortened to leave room for the window, the profiler's warm-up step and one
    # traced step (never below warmup)
    assert first == (max(2, min(4, n_batches - 7)) if num_workers else 2)
    room = n_batches - first - 5 - 1  # the traced steps follow the window and the warm-up step
    assert report.traced_steps == (min(10, room) if room >= 1 else 0)


def test_loop_skip_steps_shortens_only_the_prefill_part():
    config = {"num_workers": 2, "prefetch_factor": 2}
    assert loop_skip_steps(2, 5, config, None) == 4  # no len(): the full pre-fill skip
    assert loop_skip_steps(2, 5, config, 20) == 4
    assert loop_skip_steps(2, 5, config, 8) == 3
    assert loop_skip_steps(2, 5, config, 7) == 2
    assert loop_skip_steps(2, 5, config, 3) == 2  # never below warmup, even if the window crosses epochs
    assert loop_skip_steps(6, 5, config, 8) == 6
    assert loop_skip_steps(2, 5, config, 9, trace_steps=10) == 2  # room for warm-up + one traced step
    assert loop_skip_steps(2, 5, config, 11, trace_steps=10) == 4


def test_a_loop_shorter_than_the_window_warns_and_reports_what_it_measured(caplog):
    prof = po.profile_loop(DataLoader(Tiny(12), batch_size=4), steps=5, warmup=1)  # 3 batches
    with caplog.at_level("WARNING", logger="pipeline_opt"):
        for _ in prof:
            prof.step()
        report = prof.report()
    prof.close()
    assert [s.index for s in report.steps] == [1, 2]
    assert "ended after 2 of the 5 measured steps" in caplog.text


def test_output_dir_gets_the_report_once_the_window_is_measured(tmp_path, monkeypatch):
    monkeypatch.delenv("PERF_BENCH", raising=False)
    out = tmp_path / "loop_report"
    with po.profile_loop(DataLoader(Tiny(40), batch_size=4), steps=3, warmup=1, output_dir=out) as prof:
        for _ in prof:
            prof.step()
        # 10 batches: the window (skipped, measured and traced steps) is done before the loop ends, and
        # the report was written then, without PERF_BENCH and before close()
        saved = json.loads((out / "report.json").read_text())
    assert len(saved["steps"]) == 3 and (out / "report.html").exists()


def test_output_dir_gets_the_partial_report_when_the_loop_ends_first(tmp_path, monkeypatch):
    monkeypatch.delenv("PERF_BENCH", raising=False)
    out = tmp_path / "partial"
    prof = po.profile_loop(DataLoader(Tiny(12), batch_size=4), steps=5, warmup=1, output_dir=out)  # 3 batches
    for _ in prof:
        prof.step()
    assert not out.exists()
    prof.close()
    assert len(json.loads((out / "report.json").read_text())["steps"]) == 2


def test_bad_steps_raise():
    with pytest.raises(ValueError, match="steps=0"):
        po.profile_loop(DataLoader(Tiny(4)), steps=0)


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


def test_perf_bench_completion_is_an_exception_a_script_may_catch(tmp_path, monkeypatch):
    monkeypatch.setenv("PERF_BENCH", "1")
    model = torch.nn.Conv2d(3, 2, 3)
    loader = DataLoader(TensorDataset(torch.randn(32, 3, 8, 8)), batch_size=4)
    prof = po.profile_loop(loader, model=model, steps=2, warmup=0, output_dir=tmp_path)
    with pytest.raises(po.PerfBenchComplete) as done:
        for (x,) in prof:
            model(x).sum().backward()
            prof.step()
    assert done.value.code == 0 and done.value.report_dir == tmp_path and isinstance(done.value, SystemExit)
    assert (tmp_path / "report.json").is_file()


def test_a_loop_over_a_preparing_thread_gets_its_track_in_the_trace():
    from pipeline_opt.loading import DeviceLoader
    from pipeline_opt.profile.trace import PREPARE_TID

    loader = DeviceLoader(DataLoader(Slow(), batch_size=4), device="cpu", prepare_in_thread=True)
    model = torch.nn.Linear(8, 2)
    with po.profile_loop(loader, model=model, steps=4, warmup=1) as prof:
        for _epoch in range(2):
            for images, _labels in prof:
                model(images).sum().backward()
                prof.step()
        report = prof.report()
    spans = [e for e in report.trace()["traceEvents"] if e.get("tid") == PREPARE_TID and e.get("cat") == "prepare"]
    assert {e["name"] for e in spans} == {"next batch", "prepare batch"}

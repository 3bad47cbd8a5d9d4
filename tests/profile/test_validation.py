"""Validation interference: the training steps after a validation pass against the steady ones."""

from __future__ import annotations

import time

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

import pipeline_opt as po
from pipeline_opt.profile.validation import ValidationPass, ValidationRecorder, analyse


def _pass(after_step, seconds=1.0, cpu=1.0, hotspots=(("non_max_suppression (ops.py)", 0.6),)):
    return ValidationPass(after_step=after_step, seconds=seconds, cpu_seconds=cpu, hotspots=hotspots)


def test_the_slowed_steps_after_each_pass_are_named_with_the_hotspot_and_a_measured_interval():
    steady = [(0.12, 0.0)] * 20
    after = [(0.30, 0.01), (0.25, 0.0), (0.13, 0.0)]  # 2 steps slowed, the third steady
    steps = steady + after + steady + after + steady
    r = analyse(steps, [_pass(20), _pass(43)], warmup_steps=2, steps_per_epoch=20)
    assert r.slowed_steps == 2 and r.steady_step_s == pytest.approx(0.12)
    assert r.slowdown == pytest.approx(0.275 / 0.12)
    assert r.extra_s_per_pass == pytest.approx(0.18 + 0.13)
    assert "the 2 steps after validation took 2.3x the steady step (120 ms, the median of 54 training steps away " \
        "from validation)" in r.summary
    assert "non_max_suppression" in r.hotspot and "non_max_suppression" in r.summary
    # (1.0 s + 0.31 s) per 2.4 s epoch: 35%; every 11 epochs keeps it under 5%
    assert any("validating every 11 epochs" in line for line in r.recommendations)
    assert any("separate process" in line for line in r.recommendations)  # CPU-bound pass
    assert not any("persistent_workers" in line for line in r.recommendations)  # not a data wait


def test_no_slowdown_says_so_and_a_data_wait_points_at_the_workers():
    steps = [(0.1, 0.0)] * 10 + [(0.1, 0.0)] * 10
    quiet = analyse(steps, [_pass(10, seconds=0.05, cpu=0.01, hotspots=())], warmup_steps=1)
    assert quiet.slowed_steps == 0 and quiet.slowdown == 1.0 and quiet.hotspot is None
    assert "steady pace" in quiet.summary and quiet.recommendations == ()
    waiting = analyse([(0.1, 0.0)] * 10 + [(0.6, 0.5)] + [(0.1, 0.0)] * 5, [_pass(10, cpu=0.1)], warmup_steps=1)
    assert waiting.slowed_steps == 1
    assert any("persistent_workers=True" in line for line in waiting.recommendations)


def test_nothing_to_say_before_a_pass_has_steps_after_it():
    rec = ValidationRecorder(profile_cpu=False)
    for _ in range(5):
        rec.step_end()
    rec.validation_start()
    rec.step_end()  # inside the pass: not a training step
    rec.validation_end()
    assert len(rec.steps) == 4 and rec.analyse() is None


class _Tiny(Dataset):
    def __len__(self):
        return 40

    def __getitem__(self, i):
        return torch.full((3, 8, 8), float(i)), i % 2


def _slow_start(_worker_id):
    time.sleep(0.4)  # a dataset whose workers take a while to start (opening files, building caches)


def _validation_burn(seconds):
    end, x = time.perf_counter() + seconds, 0
    while time.perf_counter() < end:
        for i in range(1000):
            x += i * i
    return x


def test_profile_loop_measures_a_cpu_burning_validation_and_the_workers_it_restarts():
    loader = DataLoader(_Tiny(), batch_size=4, num_workers=1, persistent_workers=False, worker_init_fn=_slow_start)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(192, 2))
    with po.profile_loop(loader, model=model, steps=5, warmup=1, worker_profiling=False, trace_steps=0) as prof:
        for _epoch in range(3):
            for images, labels in prof:
                torch.nn.functional.cross_entropy(model(images), labels).backward()
                time.sleep(0.02)
                prof.step()
            with prof.validation():
                _validation_burn(0.3)
        r = prof.validation_report()
        report = prof.report()
    assert r is not None and len(r.passes) == 3
    assert all(p.seconds >= 0.3 for p in r.passes) and "_validation_burn" in r.hotspot
    assert r.slowed_steps >= 1 and r.after_data_s[0] >= 0.3  # the workers start again for the next epoch
    assert any("persistent_workers=True" in line for line in r.recommendations)
    assert report.validation == r and "validation: the" in report.table()
    assert report.to_dict()["validation"]["slowed_steps"] == r.slowed_steps


def test_a_pass_far_longer_than_an_epoch_gets_subset_advice_not_a_78_epoch_interval():
    steady = [(0.01, 0.0)] * 10  # 10 steps of 10 ms: a 0.1 s epoch; each pass 3.9 s
    r = analyse(steady + steady + steady, [_pass(10, seconds=3.9, hotspots=()), _pass(20, seconds=3.9, hotspots=())],
                warmup_steps=1, steps_per_epoch=10)
    (line,) = [x for x in r.recommendations if "validat" in x]
    assert "39.0x an epoch's training time" in line and "subset" in line and "about 1/780 of it" in line, line
    assert "validating every 780" not in line and "every 20 epochs still costs 66%" in line, line


def test_waiting_builtins_are_not_named_as_the_validation_hotspot():
    poll = ("<method 'poll' of 'select.poll' objects>", 2.0)
    r = analyse([(0.1, 0.0)] * 10 + [(0.3, 0.0)] + [(0.1, 0.0)] * 5,
                [_pass(10, hotspots=(poll, ("nms (ops.py)", 0.3)))], warmup_steps=1)
    assert r.hotspot is not None and "nms" in r.hotspot and "poll" not in r.hotspot

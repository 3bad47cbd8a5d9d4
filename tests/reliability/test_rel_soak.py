"""Soak: many consecutive tuning trials leave no file descriptors, processes, /dev/shm entries or memory behind."""

from __future__ import annotations

import gc
import time

import psutil
import pytest
from rel_fixtures import BATCH, Indexed, live_children, shm_entries, tiny_model, wait_for_no_children
from torch.utils.data import DataLoader

import pipeline_opt as po

MIN_TRIALS = 40
SOAK_S = 40
RSS_GROWTH_BYTES = 64 * 2**20
FD_SLACK = 4


def _tune_once(model):
    loader = DataLoader(Indexed(n=32), batch_size=BATCH, num_workers=0)
    result = po.autotune(loader, model, time_budget_s=2)
    n = len(result.trials)
    for _ in result.loader:  # use the tuned loader like training would, then drop it
        pass
    del result, loader
    return n


@pytest.mark.timeout(90)
def test_soak_of_tuning_trials_leaks_nothing():
    model = tiny_model()
    me = psutil.Process()
    _tune_once(model)  # warm-up: imports, allocator pools, profiler start-up
    gc.collect()
    children, shm = live_children(), shm_entries()
    fds, rss = me.num_fds(), me.memory_info().rss
    trials, calls, t0 = 0, 0, time.monotonic()
    while trials < MIN_TRIALS and time.monotonic() - t0 < SOAK_S:
        trials += _tune_once(model)
        calls += 1
    gc.collect()
    assert trials >= MIN_TRIALS or calls >= 5, f"only {trials} trials in {calls} autotune calls"
    assert not wait_for_no_children(children), "worker processes accumulate across trials"
    assert me.num_fds() <= fds + FD_SLACK, f"open fds grew from {fds} to {me.num_fds()} over {trials} trials"
    assert not (shm_entries() - shm), f"/dev/shm entries accumulate: {sorted(shm_entries() - shm)}"
    growth = me.memory_info().rss - rss
    assert growth < RSS_GROWTH_BYTES, f"RSS grew by {growth / 2**20:.1f} MiB over {trials} trials"

"""Resource limits: /dev/shm too small or RAM short -> those candidates are skipped with the reason,
and the tuner returns a safe, working configuration."""

from __future__ import annotations

import importlib
import re
from types import SimpleNamespace

import pytest
from rel_fixtures import BATCH, Indexed, epoch_digest, tiny_model
from torch.utils.data import DataLoader

import pipeline_opt as po

budget = importlib.import_module("pipeline_opt.tune.budget")


def _budget_text(result) -> str:
    """Everything the result says about skipped candidates and limits."""
    parts = list(result.not_tried) + [t.reason for t in result.trials if t.status != "ok"]
    return " | ".join(parts) + " | " + " | ".join(str(v) for v in result.to_dict().values())


def _check_safe(result, loader, max_workers):
    assert result.config["num_workers"] <= max_workers
    assert all(t.config["num_workers"] <= max_workers for t in result.trials if t.status == "ok"), result.trials
    assert sorted(i for i, _ in epoch_digest(result.loader)) == list(range(len(loader.dataset)))


@pytest.mark.timeout(90)
def test_tiny_dev_shm_skips_worker_candidates(monkeypatch, no_orphans):
    monkeypatch.setattr(budget, "shm_free_bytes", lambda path="/dev/shm": 1024)  # 1 KiB free
    loader = DataLoader(Indexed(), batch_size=BATCH, num_workers=0)
    result = po.autotune(loader, tiny_model(), time_budget_s=6)
    _check_safe(result, loader, max_workers=0)
    assert re.search(r"/dev/shm|shm", _budget_text(result)), "the /dev/shm limit is not reported"


@pytest.mark.timeout(90)
def test_ram_budget_caps_workers_with_the_reason(monkeypatch, no_orphans):
    monkeypatch.setattr(budget, "affinity_cpus", lambda: 8)  # CPUs are not the limit ...
    fake = SimpleNamespace(virtual_memory=lambda: SimpleNamespace(available=300 * 2**20))
    monkeypatch.setattr(budget, "psutil", fake)  # ... 300 MiB of RAM is: one worker at most
    loader = DataLoader(Indexed(), batch_size=BATCH, num_workers=0)
    result = po.autotune(loader, tiny_model(), time_budget_s=6)
    _check_safe(result, loader, max_workers=1)
    assert re.search(r"\bram\b|RAM|memory", _budget_text(result)), "the RAM limit is not reported"

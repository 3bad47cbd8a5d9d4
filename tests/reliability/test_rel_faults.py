"""Faults inside the user's data pipeline and training step: clear errors, rollback, nothing left behind."""

from __future__ import annotations

import re
import time
import traceback

import pytest
import torch
from rel_fixtures import (
    BATCH,
    HangsAlways,
    HangsOnce,
    Indexed,
    KillsWorkerOnce,
    RaisesAt,
    epoch_digest,
    error_chain,
    tiny_model,
)
from torch.utils.data import DataLoader

import pipeline_opt as po

PROFILE = {"steps": 4, "warmup": 1}
BUDGET_S = 8


def _assert_names_index_and_cause(exc: BaseException, index: int) -> None:
    chain = error_chain(exc)
    text = " | ".join(str(e) for e in chain)
    assert re.search(rf"\b{index}\b", str(exc)), f"the error does not name index {index}: {exc}"
    assert any("corrupt JPEG header" in str(e) for e in chain[1:]) or "corrupt JPEG header" in str(exc), text
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    assert "corrupt JPEG header" in tb  # the original traceback is kept for the user


@pytest.mark.timeout(60)
@pytest.mark.parametrize("num_workers", [0, 1])
def test_profile_names_the_failing_index(num_workers, no_orphans):
    loader = DataLoader(RaisesAt(13), batch_size=BATCH, num_workers=num_workers)
    with pytest.raises(Exception) as info:
        po.profile(loader, tiny_model(), **PROFILE)
    _assert_names_index_and_cause(info.value, 13)


@pytest.mark.timeout(90)
def test_autotune_names_the_failing_index_and_the_trial(no_orphans):
    loader = DataLoader(RaisesAt(13), batch_size=BATCH, num_workers=0)
    with pytest.raises(Exception) as info:
        po.autotune(loader, tiny_model(), time_budget_s=BUDGET_S)
    _assert_names_index_and_cause(info.value, 13)
    assert re.search(r"trial|baseline", str(info.value), re.IGNORECASE), f"no trial named in: {info.value}"


@pytest.mark.timeout(120)
def test_worker_sigkilled_during_a_trial_is_rolled_back(tmp_path, no_orphans):
    loader = DataLoader(KillsWorkerOnce(9, tmp_path / "killed"), batch_size=BATCH, num_workers=0)
    t0 = time.monotonic()
    result = po.autotune(loader, tiny_model(), time_budget_s=BUDGET_S)
    assert time.monotonic() - t0 < 100
    assert (tmp_path / "killed").exists(), "no trial used workers, so the fault was never exercised"
    failed = [t for t in result.trials if t.status == "failed"]
    assert failed, f"the trial whose worker was killed is not marked failed: {result.trials}"
    assert any(re.search(r"kill|signal|died|exited", t.reason, re.IGNORECASE) for t in failed), failed
    assert result.config not in [t.config for t in failed]  # rolled back to a configuration that worked
    assert sorted(i for i, _ in epoch_digest(result.loader)) == list(range(len(loader.dataset)))


@pytest.mark.timeout(120)
def test_hung_worker_in_a_trial_is_bounded_and_rolled_back(tmp_path, no_orphans):
    loader = DataLoader(HangsOnce(9, tmp_path / "hung", seconds=600), batch_size=BATCH, num_workers=0)
    t0 = time.monotonic()
    result = po.autotune(loader, tiny_model(), time_budget_s=BUDGET_S)
    assert time.monotonic() - t0 < 100, "a hung __getitem__ was not bounded by a timeout"
    assert (tmp_path / "hung").exists(), "no trial used workers, so the fault was never exercised"
    failed = [t for t in result.trials if t.status == "failed"]
    assert failed and any(re.search(r"timeout|timed out|hung|stuck", t.reason, re.IGNORECASE) for t in failed), \
        result.trials


@pytest.mark.timeout(60)
def test_hung_getitem_under_profile_hits_the_loader_timeout(no_orphans):
    loader = DataLoader(HangsAlways(5, seconds=600), batch_size=BATCH, num_workers=1, timeout=3)
    t0 = time.monotonic()
    with pytest.raises(Exception) as info:
        po.profile(loader, tiny_model(), **PROFILE)
    assert time.monotonic() - t0 < 45
    assert re.search(r"timeout|timed out", " | ".join(map(str, error_chain(info.value))), re.IGNORECASE)


class InterruptAfter:
    """A step_fn that trains normally, then raises KeyboardInterrupt on call ``n`` (Ctrl-C)."""

    def __init__(self, n: int) -> None:
        self.n, self.calls = n, 0

    def __call__(self, model, batch):
        self.calls += 1
        if self.calls >= self.n:
            raise KeyboardInterrupt
        images = batch[0].float() / 255
        loss = model(images).float().mean()
        loss.backward()
        return loss.detach()


@pytest.mark.timeout(90)
@pytest.mark.parametrize("after_calls", [3, 25])
def test_keyboard_interrupt_during_autotune(after_calls, no_orphans, no_shm_leak):
    loader = DataLoader(Indexed(), batch_size=BATCH, num_workers=0)
    model = tiny_model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    expected = epoch_digest(loader)
    step = InterruptAfter(after_calls)
    t0 = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        po.autotune(loader, model, step_fn=step, time_budget_s=60)
    assert time.monotonic() - t0 < 30, "Ctrl-C did not return control promptly"
    assert step.calls == after_calls, "autotune kept stepping after the interrupt"
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items()), "model changed"
    assert all(p.grad is None for p in model.parameters())
    assert epoch_digest(loader) == expected, "the user's loader no longer iterates as before"

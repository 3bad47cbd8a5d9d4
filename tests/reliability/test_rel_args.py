"""Bad input to po.profile / po.autotune: a ValueError / TypeError that names the value and the fix."""

from __future__ import annotations

import re

import pytest
import torch
from rel_fixtures import BATCH, Empty, Indexed, Strings, error_chain, tiny_model
from torch.utils.data import DataLoader

import pipeline_opt as po

PROFILE = {"steps": 3, "warmup": 1}


def _loader(ds=None, **kw):
    return DataLoader(Indexed() if ds is None else ds, batch_size=BATCH, **kw)


def _run(fn_name, loader, model, **kw):
    if fn_name == "profile":
        return po.profile(loader, model, **PROFILE, **kw)
    return po.autotune(loader, model, time_budget_s=5, **kw)


BOTH = pytest.mark.parametrize("fn_name", ["profile", "autotune"])


@BOTH
@pytest.mark.parametrize("bad", [42, "data/train", None])
def test_not_a_loader(fn_name, bad):
    with pytest.raises(TypeError) as info:
        _run(fn_name, bad, tiny_model())
    msg = str(info.value)
    assert type(bad).__name__ in msg and "DataLoader" in msg, msg


@BOTH
def test_not_a_model(fn_name):
    with pytest.raises(TypeError, match=r"(?i)module"):
        _run(fn_name, _loader(), lambda x: x)


@pytest.mark.parametrize("kwargs, name", [({"steps": 0}, "steps"), ({"steps": -3}, "steps"),
                                          ({"warmup": -1}, "warmup")])
def test_profile_bad_counts(kwargs, name):
    args = {**PROFILE, **kwargs}
    with pytest.raises(ValueError) as info:
        po.profile(_loader(), tiny_model(), **args)
    assert name in str(info.value) and str(kwargs[name]) in str(info.value), str(info.value)


@pytest.mark.parametrize("budget", [-1, 0, float("nan")])
def test_autotune_bad_time_budget(budget):
    with pytest.raises(ValueError) as info:
        po.autotune(_loader(), tiny_model(), time_budget_s=budget)
    assert "time_budget_s" in str(info.value) and str(budget) in str(info.value), str(info.value)


@BOTH
def test_model_on_another_device_than_requested(fn_name):
    model = tiny_model().to("meta")
    with pytest.raises(ValueError) as info:
        _run(fn_name, _loader(), model, device="cpu")
    assert "meta" in str(info.value) and re.search(r"device", str(info.value)), str(info.value)


@BOTH
def test_unavailable_cuda_device(fn_name):
    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    with pytest.raises(ValueError, match="CUDA"):
        _run(fn_name, _loader(), tiny_model(), device="cuda")


def _exploding_step(model, batch):
    raise RuntimeError("loss is NaN at step 1")


@BOTH
def test_step_fn_that_raises(fn_name):
    with pytest.raises(Exception) as info:
        _run(fn_name, _loader(), tiny_model(), step_fn=_exploding_step)
    chain = error_chain(info.value)
    assert any(isinstance(e, RuntimeError) and "loss is NaN" in str(e) for e in chain), chain
    assert info.value is chain[0] and ("step_fn" in str(info.value) or isinstance(info.value, RuntimeError))


@BOTH
def test_batch_the_default_step_cannot_handle(fn_name):
    with pytest.raises(TypeError) as info:
        _run(fn_name, _loader(Strings()), tiny_model())
    assert "step_fn" in str(info.value), str(info.value)  # the fix: pass a step_fn


@BOTH
def test_empty_dataset(fn_name):
    with pytest.raises(ValueError) as info:
        _run(fn_name, _loader(Empty()), tiny_model())
    assert re.search(r"(?i)empty|no batch|0 batch|no samples|0 samples", str(info.value)), str(info.value)


@BOTH
def test_step_fn_not_callable(fn_name):
    with pytest.raises(TypeError, match="step_fn"):
        _run(fn_name, _loader(), tiny_model(), step_fn="train_step")

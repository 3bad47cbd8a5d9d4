"""After profile / autotune the model, the RNGs and the user's loader are exactly as they were;
the tuned loader yields exactly the original samples in the original order."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from rel_fixtures import BATCH, Indexed, epoch_digest, tiny_model
from torch.utils.data import DataLoader

import pipeline_opt as po
from pipeline_opt.loading.dataloader import clone_loader, loader_config


def _prepared_model():
    model = tiny_model()
    model(torch.rand(2, 3, 16, 16)).sum().backward()  # grads and BN running stats the user has
    model[1].eval()  # a mixed train/eval model
    model[5].weight.grad = None  # some grads None, some not
    return model


def _snapshot(model):
    return {
        "params": {n: p.detach().clone() for n, p in model.named_parameters()},
        "grads": {n: None if p.grad is None else p.grad.clone() for n, p in model.named_parameters()},
        "buffers": {n: b.clone() for n, b in model.named_buffers()},
        "modes": {n: m.training for n, m in model.named_modules()},
        "ids": {n: id(p) for n, p in model.named_parameters()},
    }


def _same(a, b):
    def eq(x, y):
        if x is None or y is None:
            return x is y
        return x.dtype == y.dtype and x.shape == y.shape and torch.equal(x, y)
    return (all(eq(a["params"][k], b["params"][k]) for k in a["params"])
            and all(eq(a["grads"][k], b["grads"][k]) for k in a["grads"])
            and all(eq(a["buffers"][k], b["buffers"][k]) for k in a["buffers"])
            and a["modes"] == b["modes"] and a["ids"] == b["ids"])


def _rng_states():
    return torch.random.get_rng_state().clone(), np.random.get_state()[1].copy(), random.getstate()


def _user_loader():
    gen = torch.Generator().manual_seed(1234)
    return DataLoader(Indexed(), batch_size=BATCH, shuffle=True, generator=gen, num_workers=0)


@pytest.mark.timeout(90)
@pytest.mark.parametrize("fn_name", ["profile", "autotune"])
def test_model_rng_and_loader_untouched(fn_name, no_orphans):
    torch.manual_seed(7)
    np.random.seed(7)
    random.seed(7)
    model = _prepared_model()
    loader = _user_loader()
    state, rng = _snapshot(model), _rng_states()
    cfg, gen_state = loader_config(loader), loader.generator.get_state().clone()
    expected = epoch_digest(clone_loader(loader))

    if fn_name == "profile":
        po.profile(loader, model, steps=4, warmup=1)
    else:
        po.autotune(loader, model, time_budget_s=6)

    assert _same(state, _snapshot(model)), "parameters, buffers, grads or modes changed"
    t, n, r = _rng_states()
    assert torch.equal(t, rng[0]) and np.array_equal(n, rng[1]) and r == rng[2], "an RNG state changed"
    assert loader_config(loader) == cfg
    assert torch.equal(loader.generator.get_state(), gen_state), "the user's generator was advanced"
    assert epoch_digest(loader) == expected, "the user's loader no longer yields what it did"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("overrides", [
    {"num_workers": 0}, {"num_workers": 1}, {"num_workers": 2, "prefetch_factor": 1},
    {"num_workers": 2, "persistent_workers": True, "pin_memory": True},
    {"num_workers": 1, "multiprocessing_context": "spawn"},
])
def test_every_candidate_setting_yields_the_same_samples_in_order(overrides, no_orphans):
    loader = _user_loader()
    expected = epoch_digest(clone_loader(loader))
    assert sorted(i for i, _ in expected) == list(range(len(loader.dataset)))  # every index once
    reference = clone_loader(loader)
    candidate = clone_loader(loader, **overrides)
    assert epoch_digest(candidate) == expected
    # the next epoch too: the candidate's sampler RNG advances exactly like the original's
    epoch_digest(reference)
    second, second_ref = epoch_digest(candidate), epoch_digest(reference)
    del candidate, reference  # persistent workers exit with their loader
    assert second == second_ref, "epoch 2 order differs from the original loader's"


@pytest.mark.timeout(90)
def test_tuned_loader_yields_the_original_epoch(no_orphans):
    loader = _user_loader()
    expected = epoch_digest(clone_loader(loader))
    result = po.autotune(loader, tiny_model(), time_budget_s=6)
    got = epoch_digest(result.loader)
    assert sorted(i for i, _ in got) == list(range(len(loader.dataset))), "an index is missing or repeated"
    assert got == expected, "the tuned loader's first epoch differs from the original's (order or content)"

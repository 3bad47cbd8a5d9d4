"""The front doors' step check (pipeline_opt._core.step.validate_step): one real step on one batch before
any measurement, and errors that name the bad value and the fix."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import pipeline_opt as po
from pipeline_opt._core.step import BackwardOnLoss, CheckedStep, default_step, validate_step

BOTH = pytest.mark.parametrize("front_door", ["profile", "autotune"])


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
                               torch.nn.Linear(4, 2))


def _loader(images: torch.Tensor | None = None) -> DataLoader:
    images = torch.rand(16, 3, 8, 8) if images is None else images
    return DataLoader(TensorDataset(images, torch.zeros(len(images), dtype=torch.long)), batch_size=4)


def _run(front_door: str, loader, model, **kw):
    if front_door == "profile":
        return po.profile(loader, model, steps=2, warmup=1, limit=False, trace_steps=0, **kw)
    return po.autotune(loader, model, time_budget_s=5, progress=False, **kw)


@BOTH
def test_a_model_on_the_meta_device_is_refused(front_door):
    with pytest.raises(ValueError) as info:
        _run(front_door, _loader(), _model().to("meta"))
    msg = str(info.value)
    assert "meta device" in msg and "'0.weight'" in msg and "to_empty" in msg, msg


@BOTH
def test_float32_images_for_a_float64_model_are_refused_as_a_plain_forward_would(front_door):
    model = _model().double()
    with pytest.raises(RuntimeError):
        model(torch.rand(4, 3, 8, 8))  # what the user's own loop would hit
    with pytest.raises(ValueError) as info:
        _run(front_door, _loader(), model)
    msg = str(info.value)
    assert "torch.float32" in msg and "torch.float64" in msg and "model.to(torch.float32)" in msg, msg


def test_the_default_step_no_longer_casts_floating_images():
    with pytest.raises(RuntimeError):
        default_step(_model().double(), (torch.rand(2, 3, 8, 8),))
    # integer images still become the model's dtype in [0, 1]
    default_step(_model().double(), (torch.randint(0, 256, (2, 3, 8, 8), dtype=torch.uint8),))


@BOTH
def test_images_on_another_device_than_the_model_are_refused(front_door):
    loader = _loader(torch.rand(16, 3, 8, 8, device="meta"))
    with pytest.raises(ValueError) as info:
        _run(front_door, loader, _model())
    msg = str(info.value)
    assert "on meta" in msg and "on cpu" in msg and "model.to('meta')" in msg, msg


def test_a_step_that_moves_the_batch_elsewhere_gets_a_device_hint():
    def step(model, batch):
        model(batch[0].to("meta")).sum().backward()

    with pytest.raises(ValueError) as info:
        po.profile(_loader(), _model(), step_fn=step, steps=2, warmup=1, limit=False, trace_steps=0)
    msg = str(info.value)
    assert "step_fn raised RuntimeError on the first batch" in msg and "parameters are on cpu" in msg, msg
    assert isinstance(info.value.__cause__, RuntimeError)


@pytest.mark.parametrize(("images", "says"), [
    (torch.rand(16, 3, 8, 8, dtype=torch.float64), "the batch's floating-point tensors are torch.float64"),
    (torch.randint(0, 255, (16, 3, 8, 8), dtype=torch.uint8),
     "the batch holds no floating-point tensor (its tensors are torch.int64, torch.uint8: uint8 images need a "
     "ToTensor"),
])
def test_a_step_that_feeds_another_dtype_gets_a_dtype_hint_in_sentences(images, says):
    def step(model, batch):
        model(batch[0]).sum().backward()

    with pytest.raises(ValueError) as info:
        po.profile(_loader(images), _model(), step_fn=step, steps=2, warmup=1, limit=False, trace_steps=0)
    msg = str(info.value)
    assert "The model's parameters are torch.float32 and " + says in msg, msg
    assert " - " not in msg and msg.endswith("torch.autocast."), msg


def test_a_step_fn_that_runs_no_backward_and_returns_nothing_is_measured_forward_only_with_a_warning(caplog):
    def forward_only(model, batch):
        model(batch[0])

    batch = next(iter(_loader()))
    with caplog.at_level("WARNING", logger="pipeline_opt"):
        step, out = validate_step(_model(), batch, forward_only)
    assert step is forward_only and out is None
    msg = caplog.text
    assert "returned None" in msg and "forward-only" in msg and "loss.backward()" in msg, msg


def test_a_step_fn_that_returns_its_loss_gets_the_default_backward():
    model = _model()

    def loss_only(model, batch):
        return torch.nn.functional.cross_entropy(model(batch[0]), batch[1])

    step, out = validate_step(model, next(iter(_loader())), loss_only)
    assert isinstance(step, BackwardOnLoss) and not out.requires_grad
    assert all(p.grad is not None for p in model.parameters())
    fresh = _model()
    report = po.profile(_loader(), fresh, step_fn=loss_only, steps=2, warmup=1, limit=False, trace_steps=0)
    assert len(report.steps) == 2
    assert all(p.grad is None for p in fresh.parameters()), "the profile restores the gradients"


def test_a_frozen_model_needs_no_backward():
    model = _model().requires_grad_(False)
    step, _ = validate_step(model, next(iter(_loader())), lambda m, b: m(b[0]))
    assert not isinstance(step, BackwardOnLoss)


def test_the_default_step_names_an_output_it_cannot_reduce():
    class ReturnsNone(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 2, 3)

        def forward(self, x):
            self.conv(x)

    with pytest.raises(TypeError) as info:
        po.profile(_loader(), ReturnsNone(), steps=2, warmup=1, limit=False, trace_steps=0)
    msg = str(info.value)
    assert "needs a loss" in msg and "returned None" in msg and "step_fn" in msg, msg


def test_a_good_step_is_validated_once_and_then_runs_as_given():
    calls = []

    def step(model, batch):
        calls.append(1)
        model(batch[0]).sum().backward()

    checked = CheckedStep(step, "cpu")
    model, batch = _model(), next(iter(_loader()))
    checked.check(model, batch)
    checked.check(model, batch)  # validated already: no second run
    checked(model, batch)
    assert checked.checked and checked.step is step and len(calls) == 2


def test_a_step_error_that_is_no_mismatch_propagates_as_it_is():
    def nan(model, batch):
        raise RuntimeError("loss is NaN; CUDA error: device-side assert triggered")

    with pytest.raises(RuntimeError, match="loss is NaN") as info:
        validate_step(_model(), next(iter(_loader())), nan)
    assert any("first batch" in note for note in getattr(info.value, "__notes__", []))


def test_a_user_step_on_mismatched_dtypes_gets_a_dtype_hint():
    with pytest.raises(ValueError) as info:
        validate_step(_model().double(), next(iter(_loader())), lambda m, b: m(b[0]).sum().backward())
    msg = str(info.value)
    assert "parameters are torch.float64" in msg and "torch.float32" in msg and "autocast" in msg, msg


def test_map_leaves_replaces_every_nested_leaf_of_its_kind_and_rebuilds_the_containers():
    from collections import OrderedDict, namedtuple

    from pipeline_opt._core.step import iter_leaves, map_leaves

    Pair = namedtuple("Pair", "a b")
    a, b, c, d = (torch.full((2,), float(i)) for i in range(4))
    names = tuple(f"img_{i}.jpg" for i in range(64))
    shapes = tuple((480, 640) for _ in range(64))
    batch = {"img": a, "pair": Pair(b, "x"), "items": [c, 3, None], "od": OrderedDict(k=(d, 1.5)),
             "im_file": names, "ori_shape": shapes, "mixed": ((1, 2), (a,))}
    out = map_leaves(batch, torch.Tensor, lambda t: t + 10)
    assert out["img"].tolist() == [10.0, 10.0] and out["mixed"][1][0].tolist() == [10.0, 10.0]
    assert isinstance(out["pair"], Pair) and out["pair"].a.tolist() == [11.0, 11.0] and out["pair"].b == "x"
    assert out["items"][0].tolist() == [12.0, 12.0] and out["items"][1:] == [3, None]
    assert out["items"] is not batch["items"]  # lists are rebuilt: the input's stay as they were
    assert isinstance(out["od"], OrderedDict) and out["od"]["k"][0].tolist() == [13.0, 13.0]
    assert out["im_file"] is names and out["ori_shape"] is shapes  # tuples of atoms: nothing to map or copy
    assert out["mixed"][0] == (1, 2)
    assert batch["img"].tolist() == [0.0, 0.0]  # the input is not modified
    found = list(iter_leaves(batch))
    assert [t.tolist()[0] for t in found] == [0.0, 1.0, 2.0, 3.0, 0.0]  # dict order, depth first
    assert list(iter_leaves(batch, str)) == []  # strings are atoms, never leaves of a kind


def test_map_leaves_finds_a_custom_leaf_kind_inside_tuples():
    from pipeline_opt._core.step import iter_leaves, map_leaves

    class Ref:
        def __init__(self, n):
            self.n = n

    batch = {"img": Ref(1), "boxes": (Ref(2), (Ref(3), "s")), "name": ("a", "b")}
    out = map_leaves(batch, Ref, lambda r: r.n * 100)
    assert out == {"img": 100, "boxes": (200, (300, "s")), "name": ("a", "b")}
    assert [r.n for r in iter_leaves(batch, Ref)] == [1, 2, 3]

"""Training-step plumbing shared by the profiler and the tuner.

* :func:`extract_images` finds the image tensor of a batch (first tensor of a tuple/list,
  ``batch["img"]`` / ``batch["image"]`` / first tensor value of a dict).
* :func:`default_step` is the step used when the user gives no ``step_fn``: forward, a scalar
  reduction of the output as loss, backward. It never touches an optimizer.
* :func:`move_to_device` copies every tensor nested in tuples/lists/dicts; :func:`map_leaves` and
  :func:`iter_leaves` are the walks under it (a tuple of strings or numbers costs no call per element).
* :class:`ModelStateGuard` snapshots parameters, buffers, gradients, train/eval mode and the RNG
  states (torch, CUDA, numpy, random) and restores them bitwise.
* :func:`validate_step` / :class:`CheckedStep` are the front doors' check of the training step: one
  real step on one batch before any measurement, with errors that name the bad value and the fix
  (a model on the meta device, images of another dtype or device than the model, a step that
  neither runs backward nor returns a loss to run it on).
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from pipeline_opt._core.device import resolve_device as resolve_any_device
from pipeline_opt._core.log import get_logger
from pipeline_opt._core.staging import staging_for

log = get_logger("step")

StepFn = Callable[[torch.nn.Module, Any], Any]

_IMAGE_KEYS = ("img", "image", "images", "input", "inputs", "pixel_values", "x")


def extract_images(batch: Any) -> torch.Tensor:
    """Return the image tensor of ``batch`` or raise ``TypeError`` naming what was found."""
    if isinstance(batch, torch.Tensor):
        return batch
    if isinstance(batch, Mapping):
        for key in _IMAGE_KEYS:
            value = batch.get(key)
            if isinstance(value, torch.Tensor):
                return value
        for value in batch.values():
            if isinstance(value, torch.Tensor) and value.dim() >= 2:
                return value
        raise TypeError(
            f"the default step found no image tensor in a dict batch with keys {sorted(map(str, batch))}; "
            f"put the images under one of {list(_IMAGE_KEYS)} or pass step_fn=..."
        )
    if isinstance(batch, Sequence) and not isinstance(batch, (str, bytes)):
        for value in batch:
            if isinstance(value, torch.Tensor):
                return value
        raise TypeError(
            f"the default step found no tensor in a {type(batch).__name__} batch of "
            f"{[type(v).__name__ for v in batch]}; pass step_fn=... that handles this batch"
        )
    raise TypeError(
        f"the default step cannot handle a batch of type {type(batch).__name__}; "
        "yield a tensor, a tuple/list starting with a tensor or a dict with 'img', or pass step_fn=..."
    )


def _model_dtype_device(model: torch.nn.Module) -> tuple[torch.dtype, torch.device]:
    for p in model.parameters():
        return p.dtype, p.device
    for b in model.buffers():
        return b.dtype, b.device
    return torch.float32, torch.device("cpu")


def default_step(model: torch.nn.Module, batch: Any) -> torch.Tensor:
    """Forward and backward on the batch's images with ``output.float().mean()`` as the loss.

    Integer images (uint8) become the model's dtype in [0, 1]. Floating images go to the model as
    they are: casting them to the model's dtype here would profile a step that the user's own
    loop cannot run (a float64 model fed float32 images raises in a plain forward);
    :func:`validate_step` names that mismatch up front instead.
    """
    images = extract_images(batch)
    dtype, device = _model_dtype_device(model)
    if images.device != device:
        images = images.to(device, non_blocking=True)
    if not images.is_floating_point():
        images = images.to(dtype).div_(255.0)
    out = model(images)
    loss = _scalar_of(out)
    if loss.requires_grad:
        loss.backward()
    return loss.detach()


def _scalar_of(out: Any) -> torch.Tensor:
    if isinstance(out, torch.Tensor):
        return out.float().mean()
    if isinstance(out, Mapping):
        parts = [_scalar_of(v) for v in out.values() if _has_tensor(v)]
    elif isinstance(out, Sequence) and not isinstance(out, (str, bytes)):
        parts = [_scalar_of(v) for v in out if _has_tensor(v)]
    else:
        parts = []
    if not parts:
        raise TypeError(
            f"the default step needs a loss to run backward, but the model returned {_describe(out)}, which "
            "holds no floating-point tensor; return the output tensor (e.g. the logits) from forward, or pass "
            "step_fn=... that computes the loss and calls loss.backward()")
    return torch.stack(parts).sum()


def _has_tensor(value: Any) -> bool:
    """Whether a floating-point tensor is nested in ``value``."""
    return any(t.is_floating_point() for t in iter_leaves(value))


# leaves that can hold no tensor: a walk returns them (and tuples made only of them) at once.
# Collated batches carry long tuples of them (ultralytics: a file name, shapes and pads per image)
_ATOMS = frozenset({str, bytes, int, float, bool, complex, type(None)})


def _inert(value: Any) -> bool:
    """Whether ``value`` is an atom or a (nested) plain tuple of atoms: immutable, nothing to map."""
    cls = type(value)
    if cls in _ATOMS:
        return True
    if cls is not tuple:
        return False
    for v in value:
        if not _inert(v):
            return False
    return True


def map_leaves(batch: Any, kind: type | tuple[type, ...], fn: Callable[[Any], Any]) -> Any:
    """``batch`` with every instance of ``kind`` nested in it replaced by ``fn(leaf)``.

    Dicts, lists, tuples, named tuples and other mappings are rebuilt as their own type; anything
    else is kept. Plain tuples of strings and numbers (nested or not) are returned as they are,
    without a walk through their elements: the walk runs on every batch, in the training process.
    ``kind`` must not be one of those atom types."""
    if _inert(batch):
        return batch
    if isinstance(batch, kind):
        return fn(batch)
    cls = type(batch)
    if cls is dict:
        return {k: map_leaves(v, kind, fn) for k, v in batch.items()}
    if cls is tuple or cls is list:
        return cls([map_leaves(v, kind, fn) for v in batch])
    if isinstance(batch, Mapping):
        return cls({k: map_leaves(v, kind, fn) for k, v in batch.items()})
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return cls(*(map_leaves(v, kind, fn) for v in batch))
    if isinstance(batch, (list, tuple)):
        return cls(map_leaves(v, kind, fn) for v in batch)
    return batch


def iter_leaves(batch: Any, kind: type | tuple[type, ...] = torch.Tensor) -> Iterator[Any]:
    """Every instance of ``kind`` nested in ``batch`` (mappings, lists, tuples and other sequences), in order."""
    if _inert(batch):
        return
    if isinstance(batch, kind):
        yield batch
    elif isinstance(batch, Mapping):
        for value in batch.values():
            yield from iter_leaves(value, kind)
    elif isinstance(batch, (list, tuple)) or (isinstance(batch, Sequence) and not isinstance(batch, (str, bytes))):
        for value in batch:
            yield from iter_leaves(value, kind)


def tensor_bytes(batch: Any) -> int:
    """Bytes of every tensor nested in ``batch`` (what crosses the worker -> main process boundary)."""
    return sum(t.element_size() * t.nelement() for t in iter_leaves(batch, torch.Tensor))


def move_to_device(batch: Any, device: torch.device | str, non_blocking: bool = True) -> Any:
    """Copy every tensor nested in ``batch`` (tuples, lists, dicts, namedtuples) to ``device``."""
    return map_leaves(batch, torch.Tensor, lambda t: t.to(device, non_blocking=non_blocking))


def to_device_async(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``t`` on ``device`` without making the host wait: a pageable CPU tensor goes through a
    reused page-locked buffer (:mod:`pipeline_opt._core.staging`), then is copied without blocking (a
    copy from pageable memory waits for the device's queue)."""
    if t.device == device:
        return t
    if device.type == "cuda" and t.device.type == "cpu":
        if t.is_pinned():
            return t.to(device, non_blocking=True)
        return staging_for(device).upload(t)
    return t.to(device)


def batch_size_of(batch: Any) -> int:
    """Number of samples in ``batch`` (leading dimension of its image tensor, else of its first tensor)."""
    try:
        return int(extract_images(batch).shape[0])
    except TypeError:
        pass
    if isinstance(batch, Sequence) and not isinstance(batch, (str, bytes)):
        return len(batch)
    return 1


def resolve_device(model: torch.nn.Module, device: torch.device | str | None) -> torch.device:
    """The device to run on: ``device`` if given (resolved by :func:`pipeline_opt._core.device.resolve_device`,
    validated against the model), else the model's.

    A model on the meta device is refused first (:func:`check_model`)."""
    check_model(model)
    _, model_device = _model_dtype_device(model)
    if device is None:
        return model_device
    dev = resolve_any_device(device)  # the one resolver: ints, CUDA without an index, the error messages
    if any(True for _ in model.parameters()) and model_device != dev:
        raise ValueError(
            f"the model is on {model_device} but device={device!r} was requested; "
            f"move the model first (model.to({str(dev)!r})) or pass device=None"
        )
    return dev


# ---------------------------------------------------------------- the front doors' step check


def check_model(model: torch.nn.Module) -> None:
    """Raise ``ValueError`` when any parameter or buffer of ``model`` is on the meta device.

    Meta tensors have shapes and no data: every op on them "runs" instantly, so a profile of such a
    model measures nothing and a tuner would optimise for a step that does no work."""
    tensors = list(model.named_parameters()) + list(model.named_buffers())
    meta = [name for name, t in tensors if t.device.type == "meta"]
    if meta:
        raise ValueError(
            f"{len(meta)} of the model's {len(tensors)} parameters/buffers are on the meta device (e.g. "
            f"{meta[0]!r}): they have shapes but no data, so nothing real would be measured; materialize the "
            "model first, e.g. model.to_empty(device='cuda') then model.load_state_dict(...), or build it "
            "without device='meta'")


def _describe(value: Any) -> str:
    """A short description of a value for an error message (type, and shape/dtype/device of a tensor)."""
    if isinstance(value, torch.Tensor):
        grad = ", requires grad" if value.requires_grad else ""
        return f"a {value.dtype} tensor of shape {tuple(value.shape)} on {value.device}{grad}"
    if value is None:
        return "None"
    return f"a {type(value).__name__} ({value!r:.60})"


def _check_default_inputs(model: torch.nn.Module, batch: Any) -> None:
    """What the default step would otherwise hide: images on another device, or of another floating
    dtype, than the model's parameters (a plain ``model(images)`` raises on both)."""
    images = extract_images(batch)
    params = list(model.parameters())
    if not params:
        return
    dtype, device = params[0].dtype, params[0].device
    if images.device != device:
        raise ValueError(
            f"the batch's images are on {images.device} but the model's parameters are on {device}; yield the "
            f"batches on the model's device, move the model (model.to({str(images.device)!r})), or pass "
            "step_fn=... that moves the batch")
    if images.is_floating_point() and images.dtype != dtype:
        raise ValueError(
            f"the batch's images are {images.dtype} but the model's parameters are {dtype}: a plain forward "
            f"raises on this mismatch; cast the model (model.to({images.dtype})) or the images "
            f"(a transform that yields {dtype}), or pass step_fn=... that casts them or runs the "
            "forward under torch.autocast")


_DEVICE_ERROR = re.compile(r"same device|expected device|not on the expected|different device", re.IGNORECASE)
_DTYPE_ERROR = re.compile(r"same dtype|should be the same|expected scalar type|dtype .*but got|must have the same",
                          re.IGNORECASE)


def _mismatch_hint(model: torch.nn.Module, batch: Any, exc: BaseException) -> str | None:
    """Why a step failed when torch's message says it was a device or dtype mismatch: the model's
    device / dtype against the batch's; None for any other error (it propagates as it is)."""
    params = list(model.parameters())
    if not params:
        return None
    dtype, device = params[0].dtype, params[0].device
    tensors = list(iter_leaves(batch))
    text = str(exc)
    if _DEVICE_ERROR.search(text):
        devices = sorted({str(t.device) for t in tensors})
        return (f"the model's parameters are on {device} and the batch's tensors on {', '.join(devices) or '-'}; "
                f"put every input of the step on {device} (batch.to({str(device)!r}) inside step_fn) or move "
                "the model")
    if _DTYPE_ERROR.search(text):
        floats = sorted({str(t.dtype) for t in tensors if t.is_floating_point()})
        others = sorted({str(t.dtype) for t in tensors if not t.is_floating_point()})
        batch_is = (f"the batch's floating-point tensors are {', '.join(floats)}" if floats else
                    f"the batch holds no floating-point tensor (its tensors are {', '.join(others) or 'none'}: "
                    "uint8 images need a ToTensor / ToDtype(torch.float32, scale=True) or a cast in step_fn)")
        return (f"the model's parameters are {dtype} and {batch_is}; cast one to the other (model.to(...) or "
                "the inputs inside step_fn), or run the forward under torch.autocast")
    return None


def _is_loss(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.requires_grad and value.numel() == 1 \
        and value.is_floating_point()


class BackwardOnLoss:
    """``step_fn`` followed by ``loss.backward()`` on the loss it returns (the default backward, for a
    step_fn that computes the loss and leaves backward to the caller)."""

    def __init__(self, step_fn: StepFn) -> None:
        self.step_fn = step_fn

    def __call__(self, model: torch.nn.Module, batch: Any) -> Any:
        loss = self.step_fn(model, batch)
        if _is_loss(loss):
            loss.backward()
            return loss.detach()
        return loss


def validate_step(model: torch.nn.Module, batch: Any, step_fn: StepFn | None) -> tuple[StepFn, Any]:
    """Run the training step once on ``batch`` (as the step receives it: on the device already)
    and return ``(the step to measure, what this run returned)``.

    Raises, naming the value and the fix, for a model on the meta device, images of another
    device or floating dtype than the model (default step), a step that raised on a device or
    dtype mismatch. A ``step_fn`` that neither ran backward nor returned a loss while the model has
    trainable parameters is measured as a forward-only step, with a warning that says so. A ``step_fn`` that returns a loss without calling backward gets the
    default backward: the returned step is :class:`BackwardOnLoss`. Other errors of the step
    propagate unchanged, with a note that they happened on the first batch.
    """
    check_model(model)
    if step_fn is None or step_fn is default_step:
        _check_default_inputs(model, batch)
        step = default_step
    else:
        step = step_fn
    trainable = [p for p in model.parameters() if p.requires_grad]
    accumulated = [0]

    def count(_: torch.Tensor) -> None:
        accumulated[0] += 1

    handles = [p.register_post_accumulate_grad_hook(count) for p in trainable]
    try:
        out = step(model, batch)
    except Exception as exc:
        hint = None if step is default_step else _mismatch_hint(model, batch, exc)
        if hint is not None:
            first = str(exc).strip().splitlines()[0].rstrip(". ") if str(exc).strip() else "(no message)"
            raise ValueError(f"step_fn raised {type(exc).__name__} on the first batch, before any measurement: "
                             f"{first}. {hint[0].upper()}{hint[1:]}.") from exc
        if hasattr(exc, "add_note"):
            exc.add_note("pipeline_opt: raised by the training step on the first batch, before any measurement")
        raise
    finally:
        for h in handles:
            h.remove()
    if not trainable or accumulated[0] > 0:
        return step, out
    if step is default_step:
        log.warning("the model's output does not require grad although %d parameter(s) do (a forward under "
                    "torch.no_grad?): the default step measures a forward without backward", len(trainable))
        return step, out
    if _is_loss(out):
        log.info("step_fn returned the loss without calling backward: the profiler runs loss.backward() after it")
        out.backward()
        return BackwardOnLoss(step_fn), out.detach()
    # a forward-only step (inference, a data-only benchmark) is legitimate: say what is measured
    log.warning("step_fn ran no backward (none of the model's %d trainable parameters received a gradient) and "
                "returned %s: it is measured as a forward-only step. If your training step runs backward, call "
                "loss.backward() inside step_fn or return the loss (the profiler then runs backward on it)",
                len(trainable), _describe(out))
    return step, out


class CheckedStep:
    """The training step as the front doors run it: the first call is :func:`validate_step` (one real
    step, with clear errors), later calls run the step it chose.

    :meth:`check` validates on a batch as the loader yields it (moved to ``device`` first on CUDA)."""

    def __init__(self, step_fn: StepFn | None, device: torch.device | str | None = None) -> None:
        if isinstance(step_fn, CheckedStep):
            step_fn = step_fn.user
        self.user = step_fn
        self.device = None if device is None else torch.device(device)
        self.step: StepFn | None = None

    @property
    def checked(self) -> bool:
        return self.step is not None

    def __call__(self, model: torch.nn.Module, batch: Any) -> Any:
        if self.step is None:
            self.step, out = validate_step(model, batch, self.user)
            return out
        return self.step(model, batch)

    def check(self, model: torch.nn.Module, batch: Any) -> None:
        """Validate on ``batch`` unless done already (a CUDA device receives the batch first, as in a step)."""
        if self.step is not None:
            return
        if self.device is not None and self.device.type == "cuda":
            batch = move_to_device(batch, self.device)
        self(model, batch)


class ModelStateGuard:
    """Snapshot a model's full state on entry and restore it bitwise on exit.

    Restores parameters, buffers, ``.grad`` of every parameter (including ``None``), the
    ``training`` flag of every submodule, and the torch / CUDA / numpy / ``random`` RNG states.
    """

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model

    def __enter__(self) -> ModelStateGuard:
        m = self.model
        self._params = {n: p.detach().clone() for n, p in m.named_parameters()}
        self._grads = {n: (None if p.grad is None else p.grad.detach().clone()) for n, p in m.named_parameters()}
        self._buffers = {n: b.detach().clone() for n, b in m.named_buffers()}
        self._modes = {n: mod.training for n, mod in m.named_modules()}
        self._rng_torch = torch.random.get_rng_state()
        self._rng_cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
        self._rng_numpy = np.random.get_state()
        self._rng_random = random.getstate()
        return self

    def __exit__(self, *exc: object) -> None:
        self.restore()

    def restore(self) -> None:
        m = self.model
        with torch.no_grad():
            for n, p in m.named_parameters():
                p.copy_(self._params[n])
                saved = self._grads[n]
                if saved is None:
                    p.grad = None
                elif p.grad is None or p.grad.shape != saved.shape:
                    p.grad = saved.clone()
                else:
                    p.grad.copy_(saved)
            for n, b in m.named_buffers():
                if n in self._buffers:
                    b.copy_(self._buffers[n])
        for n, mod in m.named_modules():
            if n in self._modes:
                mod.training = self._modes[n]
        torch.random.set_rng_state(self._rng_torch)
        if self._rng_cuda is not None:
            torch.cuda.set_rng_state_all(self._rng_cuda)
        np.random.set_state(self._rng_numpy)
        random.setstate(self._rng_random)


def image_key(batch: Any) -> Any:
    """The key / index of the image tensor in ``batch`` (where :func:`extract_images` finds it)."""
    if isinstance(batch, Mapping):
        for key in _IMAGE_KEYS:
            if isinstance(batch.get(key), torch.Tensor):
                return key
        for key, value in batch.items():
            if isinstance(value, torch.Tensor) and value.dim() >= 2:
                return key
    elif isinstance(batch, Sequence) and not isinstance(batch, (str, bytes)):
        for i, value in enumerate(batch):
            if isinstance(value, torch.Tensor):
                return i
    extract_images(batch)  # raises the TypeError that names what was found
    raise TypeError(f"no image tensor in a batch of type {type(batch).__name__}")  # pragma: no cover

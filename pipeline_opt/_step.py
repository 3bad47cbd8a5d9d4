"""Training-step plumbing shared by the profiler and the tuner.

* :func:`extract_images` finds the image tensor of a batch (first tensor of a tuple/list,
  ``batch["img"]`` / ``batch["image"]`` / first tensor value of a dict).
* :func:`default_step` is the step used when the user gives no ``step_fn``: forward, a scalar
  reduction of the output as loss, backward. It never touches an optimizer.
* :func:`move_to_device` copies every tensor nested in tuples/lists/dicts.
* :class:`ModelStateGuard` snapshots parameters, buffers, gradients, train/eval mode and the RNG
  states (torch, CUDA, numpy, random) and restores them bitwise.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from pipeline_opt._staging import staging_for

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
    """Forward and backward on the batch's images with ``output.float().mean()`` as the loss."""
    images = extract_images(batch)
    dtype, device = _model_dtype_device(model)
    if images.device != device:
        images = images.to(device, non_blocking=True)
    if not images.is_floating_point():
        images = images.to(dtype).div_(255.0)
    elif images.dtype != dtype:
        images = images.to(dtype)
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
        raise TypeError(f"the default step cannot reduce a model output of type {type(out).__name__}; pass step_fn=...")
    return torch.stack(parts).sum()


def _has_tensor(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return value.is_floating_point()
    if isinstance(value, Mapping):
        return any(_has_tensor(v) for v in value.values())
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
        return any(_has_tensor(v) for v in value)
    return False


def move_to_device(batch: Any, device: torch.device | str, non_blocking: bool = True) -> Any:
    """Copy every tensor nested in ``batch`` (tuples, lists, dicts, namedtuples) to ``device``."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=non_blocking)
    if isinstance(batch, Mapping):
        return type(batch)({k: move_to_device(v, device, non_blocking) for k, v in batch.items()}) \
            if type(batch) is not dict else {k: move_to_device(v, device, non_blocking) for k, v in batch.items()}
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return type(batch)(*(move_to_device(v, device, non_blocking) for v in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(move_to_device(v, device, non_blocking) for v in batch)
    return batch


def to_device_async(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``t`` on ``device`` without making the host wait: a pageable CPU tensor goes through a
    reused page-locked buffer (:mod:`pipeline_opt._staging`), then is copied without blocking (a
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
    """The device to run on: ``device`` if given (validated against the model), else the model's."""
    _, model_device = _model_dtype_device(model)
    if device is None:
        return model_device
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={device!r} was requested but CUDA is not available; pass device='cpu' or None")
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    if any(True for _ in model.parameters()) and model_device != dev:
        raise ValueError(
            f"the model is on {model_device} but device={device!r} was requested; "
            f"move the model first (model.to({str(dev)!r})) or pass device=None"
        )
    return dev


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

"""The one device resolver: what ``device=`` means everywhere in pipeline_opt."""

from __future__ import annotations

import torch


def resolve_device(device: torch.device | str | int | None = None) -> torch.device:
    """``device`` as a ``torch.device``: None is the current CUDA device when CUDA is available, else
    the CPU; an int (or a string of digits) is that CUDA index, as ultralytics' ``device=0``; a CUDA
    device without an index is the current one. Raises ``ValueError`` naming the fix when the value is
    no device or asks for CUDA where none is available."""
    if device is None:
        return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    if isinstance(device, bool):
        raise ValueError(f"device={device!r} is not a device; pass e.g. 'cuda', 'cuda:1', 0, 'cpu' or None")
    if isinstance(device, int) or (isinstance(device, str) and device.isdigit()):
        device = f"cuda:{int(device)}"
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"device={device!r} is not a device; pass e.g. 'cuda', 'cuda:1', 0, 'cpu' or None") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device={device!r} was requested but CUDA is not available; pass device='cpu' or None")
        if dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
    return dev

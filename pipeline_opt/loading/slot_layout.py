"""The layout of a shared slot, and the placeholders of tensors sent by reference.

A slot is one shared-memory storage: a :data:`HEADER_BYTES` header (magic, flag index, ticket,
storage id), then the batch's image tensor, then the batch's other tensors, each starting at a
multiple of :data:`ALIGN`. :func:`header` / :func:`tensor_header` / :func:`slot_header` read the
header back; :func:`bytes_view` is a tensor over a slot's bytes.

Once the training process holds a slot's storage (it received one batch of it the ordinary way),
the worker sends the next batches of that slot *by reference*: the image and the batch's other
tensors (boxes, labels, indices) are written into the slot and the batch carries small
:class:`SlotRef` placeholders that :meth:`~pipeline_opt.loading.slot_receiver.SlotReceiver.receive`
turns back into tensors. Such a batch pickles without a single file descriptor: the ordinary path
hands one descriptor per tensor over through the worker's resource-sharer thread, which has to wait
for that busy worker's GIL.
"""

from __future__ import annotations

import torch

MAGIC = 0x706F5F736C6F7473  # "po_slots"
HEADER_BYTES = 64  # magic, flag index, ticket, storage id; 64 keeps the payload aligned for every dtype
ALIGN = 64  # every tensor packed into a slot starts at a multiple of this
PACK_RESERVE_MIN = 256 * 1024  # room in a slot beyond its image for the batch's other tensors


def aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def bytes_view(storage: torch.UntypedStorage, offset: int, shape: tuple, dtype: torch.dtype) -> torch.Tensor:
    """A contiguous ``shape`` / ``dtype`` tensor over ``storage`` from byte ``offset``."""
    numel = 1
    for d in shape:
        numel *= int(d)
    raw = torch.empty(0, dtype=torch.uint8).set_(storage, offset, (numel * dtype.itemsize,))
    return raw.view(dtype).view(shape)


def header(storage: torch.UntypedStorage) -> list[int] | None:
    """``[magic, flag index, ticket, storage id]`` of a slot storage, else None."""
    if storage.nbytes() < HEADER_BYTES:
        return None
    head = torch.empty(0, dtype=torch.uint8).set_(storage, 0, (32,)).view(torch.int64).tolist()
    return head if head[0] == MAGIC else None


class SlotRef:
    """A tensor a worker wrote into a slot the receiver holds: where it is, not its bytes."""

    __slots__ = ("storage_id", "index", "ticket", "offset", "shape", "dtype")

    def __init__(self, storage_id: int, index: int, ticket: int, offset: int, shape: tuple, dtype: torch.dtype) -> None:
        self.storage_id, self.index, self.ticket = storage_id, index, ticket
        self.offset, self.shape, self.dtype = offset, shape, dtype

    def __reduce__(self) -> tuple:
        return SlotRef, (self.storage_id, self.index, self.ticket, self.offset, self.shape, self.dtype)

    def __repr__(self) -> str:
        return f"SlotRef(slot={self.index}, offset={self.offset}, shape={self.shape}, dtype={self.dtype})"


def tensor_header(t: torch.Tensor) -> list[int] | None:
    """The slot header of the storage ``t`` lives in (past the header), else None."""
    if t.device.type != "cpu" or t.storage_offset() * t.element_size() < HEADER_BYTES:
        return None
    return header(t.untyped_storage())


def slot_header(t: torch.Tensor) -> tuple[int, int] | None:
    """``(flag index, ticket)`` when ``t`` lives in a slot's payload, else None."""
    head = tensor_header(t)
    return None if head is None else (int(head[1]), int(head[2]))

"""Batches delivered through shared-memory slots that the DataLoader workers reuse: the names in one place.

The slots live in four modules, each importing only the ones above it:

* :mod:`~pipeline_opt.loading.slot_layout` — a slot's header and payload layout (``HEADER_BYTES``,
  ``ALIGN``, ``header``, ``slot_header``) and :class:`SlotRef`, a tensor sent by reference.
* :mod:`~pipeline_opt.loading.slot_receiver` — the training process's side: :class:`SlotReceiver`
  (receive, page-lock, release), :class:`ReceiveThread` (receiving in a background thread),
  :class:`ReceiveStats`.
* :mod:`~pipeline_opt.loading.slot_pool` — :class:`SlotPool`, the shared state of one loader's slots
  (flags, owners, counters, the lock; its safety rules), and :class:`SlotStats`.
* :mod:`~pipeline_opt.loading.slot_collate` — the workers' side: :class:`SlotCollate` claims a slot
  and packs the batch into it; :func:`slot_loader` builds a loader that delivers through slots
  (:func:`slot_collate_of`, :func:`slot_pool_of`, :func:`with_own_pool`).

This module re-exports their public names; new code imports them from where they live.
"""

from __future__ import annotations

from pipeline_opt.loading.slot_collate import (
    DEFAULT_EXTRA_SLOTS,
    SlotCollate,
    slot_collate_of,
    slot_loader,
    slot_pool_of,
    with_own_pool,
)
from pipeline_opt.loading.slot_layout import (
    ALIGN,
    HEADER_BYTES,
    MAGIC,
    PACK_RESERVE_MIN,
    SlotRef,
    slot_header,
)
from pipeline_opt.loading.slot_layout import header as _header  # noqa: F401  (the tests read slot headers)
from pipeline_opt.loading.slot_pool import LOCK_TIMEOUT_S, SlotPool, SlotStats
from pipeline_opt.loading.slot_receiver import ReceiveStats, ReceiveThread, SlotReceiver

__all__ = [
    "ALIGN", "DEFAULT_EXTRA_SLOTS", "HEADER_BYTES", "LOCK_TIMEOUT_S", "MAGIC", "PACK_RESERVE_MIN",
    "ReceiveStats", "ReceiveThread", "SlotCollate", "SlotPool", "SlotReceiver", "SlotRef", "SlotStats",
    "slot_collate_of", "slot_header", "slot_loader", "slot_pool_of", "with_own_pool",
]

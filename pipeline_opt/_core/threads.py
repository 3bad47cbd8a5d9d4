"""Small host-side tensor work without torch's intra-op thread pool.

A GPU augmentation step does a little CPU tensor work per batch (drawing parameters, building
3x3 matrices, moving a few hundred boxes). Some of those operations (advanced indexing, ``cat``,
batched ``matmul``) open a parallel region of torch's OpenMP pool even for tiny tensors. When the
DataLoader's workers keep the other cores busy, each region waits for pool threads that are not
scheduled, so the training thread of a GPU augmentation step spends markedly more CPU per step
with the loader running than on a replayed batch.

:func:`single_intra_op_thread` runs a block on the calling thread alone. With torch's OpenMP
backend the setting is per thread (other Python threads keep their own count); MKL's count is
process-wide, so a concurrent MKL call in another thread may run single-threaded meanwhile.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


@contextmanager
def single_intra_op_thread() -> Iterator[None]:
    """Run the block's CPU tensor operations with one intra-op thread; the count is restored after.

    Use it only around small CPU work: large CPU image operations inside it lose their parallelism.
    """
    saved = torch.get_num_threads()
    if saved <= 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(saved)

"""pipeline_opt._core.staging: uploads through a ring of reused page-locked buffers."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pipeline_opt._core import staging as _staging
from pipeline_opt._core.staging import PinnedStaging, _as_bytes, staging_for
from pipeline_opt._core.step import to_device_async


@pytest.mark.parametrize("t", [
    torch.arange(12, dtype=torch.float64).reshape(3, 4),
    torch.tensor([True, False, True]),
    torch.arange(-5, 5, dtype=torch.int64),
    torch.arange(24, dtype=torch.uint8).reshape(2, 3, 4).transpose(0, 2),  # not contiguous
])
def test_as_bytes_holds_the_tensors_bytes_in_order(t):
    raw = _as_bytes(t)
    assert raw.dtype == np.uint8 and raw.size == t.numel() * t.element_size()
    back = torch.from_numpy(raw.copy()).view(t.dtype).reshape(t.shape)
    assert torch.equal(back, t)


def test_staging_refuses_a_cpu_device_and_a_ring_too_short():
    with pytest.raises(ValueError, match="CUDA device"):
        staging_for("cpu")
    with pytest.raises(ValueError, match="ring=1"):
        PinnedStaging(torch.device("cuda", 0), ring=1)


def test_to_device_async_on_the_same_device_returns_the_tensor():
    t = torch.ones(3)
    assert to_device_async(t, torch.device("cpu")) is t


@pytest.mark.cuda
def test_uploads_equal_their_sources_across_dtypes_and_shapes():
    dev = torch.device("cuda", torch.cuda.current_device())
    sources = [
        torch.randint(0, 256, (64, 770), dtype=torch.uint8),
        torch.rand(64) < 0.5,
        torch.randn(64, 2, 3, dtype=torch.float64),
        torch.arange(10, dtype=torch.int64).reshape(2, 5).t(),  # not contiguous
        torch.empty(0, 4),
        torch.randn(3, dtype=torch.complex64),  # not staged: page-locked on its own
        torch.randn(_staging.MAX_STAGED_BYTES // 4 + 1),  # too large to stage
    ]
    for src in sources:
        out = to_device_async(src, dev)
        assert out.device == dev and out.dtype == src.dtype and out.shape == src.shape
        assert torch.equal(out.cpu(), src)


@pytest.mark.cuda
def test_a_buffer_is_not_rewritten_while_its_copy_waits_in_the_queue():
    dev = torch.device("cuda", torch.cuda.current_device())
    staging = PinnedStaging(dev, ring=2)
    torch.cuda._sleep(200_000_000)  # keep the stream busy, so the copies below wait in its queue
    sources = [torch.full((1000,), k, dtype=torch.int32) for k in range(7)]
    outs = [staging.upload(s) for s in sources]  # 7 uploads through 2 buffers: each reuse must wait
    torch.cuda.synchronize(dev)
    for src, out in zip(sources, outs):
        assert torch.equal(out.cpu(), src)


@pytest.mark.cuda
def test_upload_never_waits_for_the_device_in_steady_state():
    dev = torch.device("cuda", torch.cuda.current_device())
    staging = staging_for(dev)
    src = torch.randint(0, 256, (64, 770), dtype=torch.uint8)
    for _ in range(2 * _staging.RING):  # fill the ring, then let its copies finish
        staging.upload(src)
    torch.cuda.synchronize(dev)
    torch.cuda.set_sync_debug_mode("error")
    try:
        out = staging.upload(src)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert torch.equal(out.cpu(), src)

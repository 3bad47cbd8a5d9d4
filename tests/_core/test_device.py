"""The one device resolver."""

from __future__ import annotations

import pytest
import torch

from pipeline_opt._core.device import resolve_device


def test_none_is_the_cpu_without_cuda_and_cpu_stays_cpu():
    if not torch.cuda.is_available():
        assert resolve_device(None) == torch.device("cpu")
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device(torch.device("cpu")) == torch.device("cpu")


@pytest.mark.parametrize("bad", ["gpu", "cuda:x", True, 1.5])
def test_a_value_that_is_no_device_is_named(bad):
    with pytest.raises(ValueError, match="is not a device"):
        resolve_device(bad)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message where CUDA is missing")
@pytest.mark.parametrize("cuda", ["cuda", "cuda:1", 0, "0"])
def test_cuda_without_cuda_names_the_fix(cuda):
    with pytest.raises(ValueError, match="CUDA is not available; pass device='cpu'"):
        resolve_device(cuda)


@pytest.mark.cuda
def test_cuda_gets_an_index_and_ints_are_cuda_indices():
    assert resolve_device("cuda").index == torch.cuda.current_device()
    assert resolve_device(0) == torch.device("cuda", 0) == resolve_device("0")

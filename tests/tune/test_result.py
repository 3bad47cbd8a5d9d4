"""TuneResult's helpers for applying the result by hand: DataLoader arguments vs the other changes."""

from __future__ import annotations

import dataclasses

import pytest
from torch.utils.data import DataLoader
from tune_fixtures import Fast

from pipeline_opt.tune.exactness import PixelChange
from pipeline_opt.tune.result import DATALOADER_ARGS, TuneResult

ORIGINAL = {"num_workers": 0, "pin_memory": False, "persistent_workers": False, "prefetch_factor": None,
            "gpu_transforms": [], "decode": "pil", "draft_decode": False, "shared_slots": False}


def _result(**config) -> TuneResult:
    return TuneResult(loader=None, config={**ORIGINAL, **config}, baseline=None, best=None, trials=(), speedup=1.5,
                      original_config=dict(ORIGINAL))


def test_dataloader_kwargs_are_only_real_dataloader_arguments():
    result = _result(num_workers=4, persistent_workers=True, prefetch_factor=4, gpu_transforms=["Normalize"],
                     decode="draft", draft_decode=True, shared_slots=True, pin_memory=True)
    kwargs = result.dataloader_kwargs()
    assert kwargs == {"num_workers": 4, "pin_memory": True, "persistent_workers": True, "prefetch_factor": 4}
    assert set(kwargs) <= set(DATALOADER_ARGS)
    DataLoader(Fast(), batch_size=8, **kwargs)  # torch accepts them as they are
    assert result.dataloader_kwargs(changed_only=True) == kwargs  # all four differ from the loader as given


def test_without_workers_the_worker_only_arguments_are_left_out():
    kwargs = _result(pin_memory=True).dataloader_kwargs()
    assert kwargs == {"num_workers": 0, "pin_memory": True}
    DataLoader(Fast(), batch_size=8, **kwargs)  # prefetch_factor / persistent_workers would raise here
    assert _result(pin_memory=True).dataloader_kwargs(changed_only=True) == {"pin_memory": True}
    assert _result().dataloader_kwargs(changed_only=True) == {}


def test_other_changes_say_how_to_apply_each():
    assert _result(num_workers=2).other_changes() == {}
    draft = PixelChange("JPEG draft decoding", "decode", "decode=draft", 0.5, 12.0, 12)
    result = dataclasses.replace(_result(num_workers=2, decode="draft", draft_decode=True,
                                         gpu_transforms=["ToFloat", "Normalize"], shared_slots=True),
                                 pixel_changes=(draft,), exactness="decode")
    other = result.other_changes()
    assert set(other) == {"gpu_transforms", "decode", "shared_slots"}
    assert "draft_dataset" in other["decode"] and "max 12/255" in other["decode"]
    assert "ToFloat+Normalize" in other["gpu_transforms"] and "DeviceLoader" in other["gpu_transforms"]
    assert "slot_loader" in other["shared_slots"]
    nvjpeg = _result(num_workers=4, decode="nvjpeg").other_changes()
    assert list(nvjpeg) == ["decode"] and "gpu_jpeg_loader" in nvjpeg["decode"]
    assert "prepare_in_thread=False" in nvjpeg["decode"]  # decoding in the loop is not the loader's default
    threaded = _result(num_workers=4, decode="nvjpeg", decode_thread=True).other_changes()
    assert "gpu_jpeg_loader" in threaded["decode"] and "prepare_in_thread" not in threaded["decode"]
    from pipeline_opt.tune.exactness import REPLAY_NAME

    replay = PixelChange(REPLAY_NAME, "decode", "decode=nvjpeg", 0.8, 20.0, 3)
    replayed = dataclasses.replace(_result(num_workers=4, decode="nvjpeg"), pixel_changes=(replay,),
                                   exactness="decode").other_changes()
    assert "plan_random_gpu_pipeline" in replayed["decode"] and "gpu_jpeg_loader" not in replayed["decode"]


@pytest.mark.parametrize("key", ["gpu_transforms", "decode", "draft_decode", "shared_slots", "decode_thread"])
def test_tuner_knobs_are_never_dataloader_kwargs(key):
    assert key not in _result(num_workers=2, decode="draft", draft_decode=True, shared_slots=True,
                              gpu_transforms=["Normalize"], decode_thread=True).dataloader_kwargs()

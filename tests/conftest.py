"""Shared pytest set-up: the ``cuda`` marker, a cache folder per session, a tiny image folder."""

from __future__ import annotations

import pytest
import torch

from pipeline_opt.datasets import make_image_folder


def pytest_collection_modifyitems(config, items):
    """Skip tests marked ``@pytest.mark.cuda`` when no CUDA device is present."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    """Point PIPELINE_OPT_CACHE at a session temp folder so tests never write to ~/.cache."""
    monkeypatch.setenv("PIPELINE_OPT_CACHE", str(_session_cache(tmp_path_factory)))


def _session_cache(tmp_path_factory):
    base = tmp_path_factory.getbasetemp() / "pipeline_opt_cache"
    base.mkdir(exist_ok=True)
    return base


@pytest.fixture(scope="session")
def tiny_image_folder(tmp_path_factory):
    """A 48-image, 4-class ImageFolder of 320x240 JPEGs, generated once per session."""
    return make_image_folder(n_images=48, size=(320, 240), num_classes=4, seed=0,
                             root=tmp_path_factory.mktemp("tiny_images"), workers=1)

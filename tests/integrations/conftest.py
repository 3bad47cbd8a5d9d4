"""Offline ultralytics for the integration tests: the environment is set before anything imports it."""

from __future__ import annotations

import ipaddress
import socket
import tempfile

import pytest

from pipeline_opt.integrations.ultralytics import prepare_offline_env

prepare_offline_env(tempfile.mkdtemp(prefix="pipeline_opt-test-yolo-config-"))
pytest.importorskip("ultralytics")

from pipeline_opt.datasets import make_yolo_dataset  # noqa: E402


@pytest.fixture
def replayable():
    """``replayable(ds, n, seed)`` gives a function that returns ``ds[0..n)`` (modulo its length) drawn
    from the same Mosaic buffer and the same seeds at every call: two pipelines' samples compared."""
    import random

    import numpy as np

    def make(ds, n=6, seed=3):
        state = (list(ds.buffer), list(ds.ims), list(ds.im_hw0), list(ds.im_hw))

        def samples():
            ds.buffer, ds.ims, ds.im_hw0, ds.im_hw = (list(x) for x in state)
            random.seed(seed)
            np.random.seed(seed)
            return [ds[i % len(ds)] for i in range(n)]

        return samples

    return make


@pytest.fixture
def train_args():
    """The smallest real training run: 1 epoch of 4 batches at 32 px on the CPU, no plots, no val."""
    return dict(epochs=1, imgsz=32, batch=4, workers=0, device="cpu", amp=False, val=False, plots=False,
                close_mosaic=0, pretrained=False, exist_ok=True, verbose=False, seed=0)


@pytest.fixture(scope="session")
def yolo_data(tmp_path_factory):
    """A 16-train / 4-val synthetic detection set (160x128 JPEGs); returns its data.yaml."""
    return make_yolo_dataset(n_train=16, n_val=4, size=(160, 128), root=tmp_path_factory.mktemp("yolo"), workers=1)


def _is_local(host) -> bool:
    if host in (None, "", "localhost"):
        return True
    try:
        return ipaddress.ip_address(str(host).split("%")[0]).is_loopback
    except ValueError:
        return False


@pytest.fixture
def no_network(monkeypatch):
    """Make every non-loopback connection or DNS lookup fail; returns the list of attempts."""
    attempts: list[str] = []
    real_connect, real_getaddrinfo = socket.socket.connect, socket.getaddrinfo
    real_create_connection = socket.create_connection

    def connect(self, address):
        host = address[0] if isinstance(address, tuple) else None
        if self.family in (socket.AF_INET, socket.AF_INET6) and not _is_local(host):
            attempts.append(f"connect {address!r}")
            raise OSError(f"network disabled in this test: connect to {address!r}")
        return real_connect(self, address)

    def create_connection(address, *args, **kwargs):
        if not _is_local(address[0]):
            attempts.append(f"create_connection {address!r}")
            raise OSError(f"network disabled in this test: create_connection to {address!r}")
        return real_create_connection(address, *args, **kwargs)

    def getaddrinfo(host, *args, **kwargs):
        if not _is_local(host):
            attempts.append(f"getaddrinfo {host!r}")
            raise socket.gaierror(f"network disabled in this test: lookup of {host!r}")
        return real_getaddrinfo(host, *args, **kwargs)

    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(socket, "create_connection", create_connection)
    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    return attempts


def _quick_profile(loader, model, **kwargs):
    import pipeline_opt as po

    kwargs.update(steps=2, warmup=1, limit=False)
    return po.profile(loader, model, **kwargs)


@pytest.fixture
def quick_profile():
    """The tuner's baseline / best profiler shortened for CPU tests (2 measured steps, no limit replay)."""
    return _quick_profile

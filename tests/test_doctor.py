"""pipeline-opt doctor: every check runs here, and the decisions follow the facts fed to them."""

from __future__ import annotations

import importlib.metadata as metadata
from collections import namedtuple

import PIL
import pytest

from pipeline_opt import doctor

_Usage = namedtuple("_Usage", "total used free")


def test_run_doctor_covers_every_check():
    report = doctor.run_doctor()
    assert [f.check for f in report.findings] == ["cpu", "/dev/shm", "ram", "cuda", "versions", "pillow", "opencv",
                                                  "start method"]
    assert all(f.status in ("ok", "warn", "info") for f in report.findings)
    table = report.table()
    for f in report.findings:
        assert f.check in table and f.value in table
    assert "torch " in report.get("versions").value
    assert "resize" in report.get("pillow").value
    assert report.to_dict()["findings"][0]["check"] == "cpu"
    with pytest.raises(KeyError, match="known"):
        report.get("nope")


def _fake_versions(monkeypatch, versions):
    def fake(dist):
        if dist in versions:
            return versions[dist]
        raise metadata.PackageNotFoundError(dist)

    monkeypatch.setattr(doctor.metadata, "version", fake)


def test_pillow_simd_detected_only_when_it_is_what_loads(monkeypatch):
    _fake_versions(monkeypatch, {"pillow-simd": "9.5.0.post2"})
    monkeypatch.setattr(PIL, "__version__", "9.5.0.post2")
    assert doctor.pillow_flavour() == ("pillow-simd", "9.5.0.post2")
    assert doctor.check_pillow().status == "ok"
    # stock Pillow restored over it by a later install: metadata and the loaded module disagree
    monkeypatch.setattr(PIL, "__version__", "11.0.0")
    assert doctor.pillow_flavour() == ("pillow", "11.0.0")
    finding = doctor.check_pillow()
    assert finding.status == "warn" and "make simd" in finding.recommendation


def test_stock_pillow_recommends_simd(monkeypatch):
    _fake_versions(monkeypatch, {"pillow": "11.0.0"})
    finding = doctor.check_pillow()
    assert finding.status == "info" and "Pillow-SIMD" in finding.recommendation
    assert doctor.measure_resize_ms(repeats=3) > 0


def test_small_shm_warns(monkeypatch):
    monkeypatch.setattr(doctor.shutil, "disk_usage", lambda p: _Usage(64 * 2**20, 0, 64 * 2**20))
    finding = doctor.check_shm()
    assert finding.status == "warn" and "--shm-size" in finding.recommendation


def test_affinity_restriction_warns(monkeypatch):
    monkeypatch.setattr(doctor.os, "cpu_count", lambda: 16)
    monkeypatch.setattr(doctor.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3, 4, 5, 6, 7})
    finding = doctor.check_cpu()
    assert finding.status == "warn" and "8 usable of 16" in finding.value


def test_a_failing_check_becomes_a_warning(monkeypatch):
    def broken():
        raise RuntimeError("boom")

    broken.__name__ = "check_broken"
    monkeypatch.setattr(doctor, "CHECKS", (doctor.check_ram, broken))
    report = doctor.run_doctor()
    assert report.get("broken").status == "warn" and "boom" in report.get("broken").value


def test_finding_rejects_unknown_status():
    with pytest.raises(ValueError, match="status='bad'"):
        doctor.Finding("x", "y", "bad", "")


@pytest.mark.parametrize("has_cuda", [False, True])
def test_gpu_advice_only_where_there_is_a_gpu(monkeypatch, has_cuda):
    """A machine without a GPU was advised to move tensor work and resizes to the GPU."""
    _fake_versions(monkeypatch, {"pillow": "11.0.0"})
    monkeypatch.setattr(doctor.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(doctor.os, "sched_getaffinity", lambda pid: {0, 1})
    cpu, pillow = doctor.check_cpu(has_cuda=has_cuda), doctor.check_pillow(has_cuda=has_cuda)
    assert ("GPU" in cpu.recommendation) is has_cuda, cpu.recommendation
    assert ("GPU" in pillow.recommendation) is has_cuda, pillow.recommendation
    assert "few cores" in cpu.recommendation and "Pillow-SIMD" in pillow.recommendation

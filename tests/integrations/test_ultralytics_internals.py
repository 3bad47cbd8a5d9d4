"""The ultralytics internals the integration patches: present on the installed version, gated elsewhere."""

from __future__ import annotations

import warnings

import pytest

from pipeline_opt.integrations import ultralytics as po_yolo
from pipeline_opt.integrations.ultralytics import _internals


def test_every_patched_attribute_exists_in_the_installed_ultralytics():
    missing = _internals.missing_internals()
    assert not missing, (
        f"ultralytics {_internals.installed_version()} lacks {missing}, which "
        "pipeline_opt/integrations/ultralytics/_internals.py patches: adapt the patch or narrow TESTED_RANGE")


def test_the_installed_version_is_in_the_tested_range_pinned_in_pyproject():
    import pathlib
    import re

    version = _internals.installed_version()
    assert _internals.is_tested_version(version), f"ultralytics {version} is outside {_internals.TESTED_RANGE}"
    pyproject = (pathlib.Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
    (low, high) = _internals.TESTED_RANGE
    assert re.search(rf'"ultralytics>={low[0]}\.{low[1]},<{high[0]}\.{high[1]}"', pyproject), \
        "pyproject's yolo extra must pin the same range as _internals.TESTED_RANGE"


@pytest.mark.parametrize(("version", "tested"), [("8.3.0", True), ("8.4.190", True), ("8.5.0", False),
                                                  ("8.2.99", False), ("9.0", False), (None, False)])
def test_version_gate(version, tested):
    assert _internals.is_tested_version(version) is tested


def test_a_missing_attribute_is_named(monkeypatch):
    monkeypatch.setattr(_internals, "PATCHED_ATTRIBUTES",
                        (("ultralytics.data.augment", "Format", "_no_such_method"),))
    assert _internals.missing_internals() == ["ultralytics.data.augment.Format._no_such_method"]
    assert "Format._no_such_method" in _internals.support_problem("8.4.1")


def test_a_moved_imported_name_is_named(monkeypatch):
    monkeypatch.setattr(_internals, "IMPORTED", {**_internals.IMPORTED,
                                                 "gone": ("ultralytics.utils.checks", "check_no_such_thing")})
    monkeypatch.setattr(_internals, "PATCHED_ATTRIBUTES", ())
    assert _internals.missing_internals() == ["ultralytics.utils.checks.check_no_such_thing"]
    with pytest.raises(KeyError, match="not declared in IMPORTED"):
        _internals.ultralytics_name("YOLOWorld")


def test_the_adapter_is_the_only_module_that_imports_ultralytics():
    import ast
    import pathlib

    package = pathlib.Path(po_yolo.__file__).parent
    importers = []
    for path in sorted(package.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            if any(n.split(".")[0] == "ultralytics" for n in names):
                importers.append(path.name)
    assert set(importers) <= {"_internals.py"}, importers  # _internals imports through importlib, by name
    for name in ("DetectionModel", "autocast", "RandomHSV"):
        assert name in _internals.IMPORTED


class _Model:
    def __init__(self):
        self.callbacks = {}

    def add_callback(self, event, fn):
        self.callbacks.setdefault(event, []).append(fn)


def test_attach_on_an_untested_version_warns_with_the_version_and_only_profiles(monkeypatch):
    monkeypatch.setattr(_internals, "installed_version", lambda: "8.9.1")
    with pytest.warns(RuntimeWarning, match=r"ultralytics 8\.9\.1 is outside the tested range"):
        integration = po_yolo.attach(_Model(), tune=True, gpu_augment=True, gpu_affine=True, shared_slots=True)
    opts = integration.options
    assert opts.profile and not opts.tune and not opts.gpu_augment and not opts.gpu_affine and not opts.shared_slots


def test_attach_on_the_tested_version_keeps_the_options():
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        integration = po_yolo.attach(_Model(), gpu_affine=True)
    assert integration.options.tune and integration.options.gpu_affine


def test_former_internal_exports_still_import_with_a_deprecation_warning():
    with pytest.warns(DeprecationWarning, match="disable_cpu_augment is internal"):
        fn = po_yolo.disable_cpu_augment
    from pipeline_opt.integrations.ultralytics._augment import disable_cpu_augment

    assert fn is disable_cpu_augment
    with pytest.raises(AttributeError):
        po_yolo.no_such_name  # noqa: B018


def test_the_public_names_load_lazily_and_match_all():
    import importlib
    import subprocess
    import sys

    assert sorted(po_yolo.__all__) == sorted(po_yolo._PUBLIC)
    for name in po_yolo.__all__:
        assert getattr(po_yolo, name) is getattr(importlib.import_module(f"{po_yolo.__name__}.{po_yolo._PUBLIC[name]}"),
                                                  name)
    # importing the package (as shared slots do for the collate helpers) loads none of the trainer code
    code = ("import sys, pipeline_opt; "
            "print(sorted(m for m in sys.modules if m.startswith('pipeline_opt.integrations.ultralytics.')))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "_callbacks" not in loaded and "_pipeline" not in loaded, loaded

"""The transform registry: one entry per class, asked by every part; no other module names a class."""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

import pytest
import torch
import torchvision.transforms as T1
import torchvision.transforms.v2 as T2

import pipeline_opt
from pipeline_opt.transforms import gpu, registry
from pipeline_opt.transforms.cpu_ops import ToUint8CHW
from pipeline_opt.transforms.registry import TransformInfo, UnsupportedTransform

PACKAGE = pathlib.Path(pipeline_opt.__file__).parent
# The modules that declare transform classes by name: the registry, and ultralytics' entries and adapter.
REGISTRIES = {"transforms/registry.py", "transforms/timm_recipe.py", "integrations/ultralytics/_protocol.py",
              "integrations/ultralytics/_internals.py"}


def test_v1_and_v2_classes_share_one_entry_and_subclasses_are_unknown():
    assert registry.info_of(T1.Resize(8)) is registry.info_of(T2.Resize(8))
    assert registry.info_of(T1.Resize(8)).op == "resize"
    assert registry.info_of(T2.ToImage()).op == "to_uint8"

    class MyResize(T1.Resize):
        pass

    assert registry.info_of(MyResize(8)) is None  # it may override forward: kept on the CPU
    assert registry.info_of(lambda x: x) is None


def test_every_registered_torchvision_class_is_the_one_torchvision_exports_under_that_name():
    for info in registry.registered():
        if info.origin != "torchvision":
            continue
        assert info.classes, info.name
        for cls in info.classes:
            assert cls.__name__ == info.name
            assert cls in (getattr(T1, info.name, None), getattr(T2, info.name, None))


def test_names_and_profiler_suffixes_find_every_origin():
    assert {i.origin for i in registry.infos_named("Resize")} == {"torchvision", "pipeline_opt"}
    assert registry.infos_named("Resize#2") == registry.infos_named("Resize")
    assert [i.origin for i in registry.infos_named("RandomPerspective")] == ["torchvision", "ultralytics"]
    assert registry.infos_named("NoSuchTransform") == ()


def test_device_modules_say_how_exact_they_are():
    assert registry.device_exactness("ToFloat") == "bitwise"
    assert registry.device_exactness("Normalize") == "bitwise"
    assert registry.device_exactness("CenterCrop") == "bitwise"
    assert registry.device_exactness("Resize") == "tolerance"
    assert registry.device_exactness("ColorJitter") is None  # not a device module of the project


@pytest.mark.parametrize("transform, equal_before, equal_after", [
    (T1.Resize(32), False, False),
    (T1.Resize((32, 24)), False, True),
    (T2.Resize([32]), True, True),
    (T1.CenterCrop(16), False, True),
    (T2.RandomResizedCrop(16), False, True),
    (T1.ColorJitter(0.2), True, True),
    (T1.ColorJitter(0.2), False, False),
    (T1.RandomRotation(10, expand=True), True, False),
    (T1.RandomRotation(10), True, True),
    (T1.Lambda(lambda x: x), True, False),  # unknown sizes afterwards
    (object(), True, False),  # unregistered
])
def test_sizes_after_each_op(transform, equal_before, equal_after):
    assert registry.equal_sizes_after(transform, equal_before) is equal_after


@pytest.mark.parametrize("transform, before, after", [
    (T1.ToTensor(), "pil", "float"),
    (T1.PILToTensor(), "pil", "uint8"),
    (T2.ToImage(), "pil", "uint8"),
    (T2.ToDtype(torch.float32, scale=True), "uint8", "float"),
    (T2.ToDtype(torch.uint8), "float", "uint8"),
    (T2.ToDtype({torch.Tensor: torch.float32}), "uint8", "uint8"),  # a per-type dict: not read
    (T1.ToPILImage(), "uint8", "pil"),
    (T1.Normalize([0.5], [0.5]), "float", "float"),
    (ToUint8CHW(), "pil", "uint8"),
])
def test_domain_after_each_op(transform, before, after):
    assert registry.domain_after(transform, before) == after


def test_batch_modules_follow_the_domain():
    resize = registry.info_of(T1.Resize(32))
    assert isinstance(resize.to_device(T1.Resize(32), "pil"), gpu.Resize)
    assert resize.to_device(T1.Resize(32, interpolation=T1.InterpolationMode.BICUBIC), "pil") is None
    to_tensor = registry.info_of(T1.ToTensor())
    assert isinstance(to_tensor.to_device(T1.ToTensor(), "pil"), gpu.ToFloat)
    assert to_tensor.to_device(T1.ToTensor(), "float") is None
    assert registry.info_of(T2.ToImage()).to_device(T2.ToImage(), "pil") == registry.BOUNDARY
    normalize = T1.Normalize([0.5] * 3, [0.25] * 3)
    assert registry.info_of(normalize).to_device(normalize, "uint8") is None  # torchvision needs floats


def test_replay_specs_name_the_kind_and_refuse_what_is_not_replayed():
    spec = registry.info_of(T1.RandomResizedCrop(64)).replay(T1.RandomResizedCrop(64), "pil")
    assert spec.kind == "resized_crop" and spec.options == {"size": (64, 64), "antialias": True}
    assert spec.domain_after == "pil"
    grayscale = T1.Grayscale(1)
    with pytest.raises(UnsupportedTransform, match="num_output_channels=3"):
        registry.info_of(grayscale).replay(grayscale, "pil")


def test_an_entry_is_validated_and_a_class_registers_once():
    with pytest.raises(ValueError, match="cost="):
        TransformInfo(name="X", origin="test", op="x", cost="pixels")
    with pytest.raises(ValueError, match="needs a hint"):
        TransformInfo(name="X", origin="test", op="x", cost="other", device="replay")
    with pytest.raises(ValueError, match="registered already"):
        registry.register(TransformInfo(name="Resize", origin="test", op="resize", cost="resize",
                                        classes=(T1.Resize,)))


def test_an_integration_registers_by_name_without_importing_its_framework():
    code = ("import sys, pipeline_opt.transforms.registry as r; "
            "assert [i.device for i in r.infos_named('RandomHSV')] == ['attach'], r.infos_named('RandomHSV'); "
            "assert 'ultralytics' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


def _string_constants(tree: ast.AST) -> list[ast.Constant]:
    """String constants that are not docstrings and not ``__all__`` lists."""
    skip: set[int] = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body \
                and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            skip.add(id(body[0].value))
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            skip.update(id(c) for c in ast.walk(node.value))
    return [n for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in skip]


def test_transform_class_names_are_strings_in_the_registries_alone():
    names = {info.name for info in registry.registered()}
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel in REGISTRIES:
            continue
        for node in _string_constants(ast.parse(path.read_text(), filename=str(path))):
            if node.value in names:
                found.append(f"{rel}:{node.lineno} {node.value!r}")
    assert not found, ("transform class names outside the registries (ask pipeline_opt.transforms.registry "
                       f"instead): {found}")

"""The package's shape: one adapter per outside world, and the layers holding (walked in the AST)."""

from __future__ import annotations

import ast
import pathlib
import re

import pipeline_opt

PACKAGE = pathlib.Path(pipeline_opt.__file__).parent
ULTRALYTICS_CLASSES = {"InfiniteDataLoader", "YOLODataset", "DetectionTrainer", "BaseTrainer", "LetterBox",
                       "CopyPaste", "Albumentations", "Mosaic"}  # (RandomHSV, RandomFlip: the project has its own)
DATALOADER_PRIVATES = re.compile(r"\._(dataset_kind|iterator|shutdown_workers|index_sampler|DatasetKind|get_iterator)\b|"
                                 r"[\"'](_iterator|_shutdown_workers)[\"']")


def _modules():
    for path in sorted(PACKAGE.rglob("*.py")):
        yield path.relative_to(PACKAGE).as_posix(), path.read_text()


def test_torch_dataloader_privates_are_touched_in_the_adapter_alone():
    found = sorted(rel for rel, src in _modules() if DATALOADER_PRIVATES.search(src))
    assert found == ["loading/dataloader.py"], found


def test_ultralytics_is_imported_and_named_inside_its_integration_alone():
    outside = []
    for rel, src in _modules():
        if rel.startswith("integrations/") or rel in ("cli.py", "doctor.py"):
            continue
        for node in ast.walk(ast.parse(src)):
            imported = (isinstance(node, ast.Import) and any(a.name.split(".")[0] == "ultralytics" for a in node.names)) \
                or (isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                    ("ultralytics", "pipeline_opt.integrations")))
            named = isinstance(node, ast.Constant) and node.value in ULTRALYTICS_CLASSES
            if imported or named:
                outside.append(f"{rel}:{node.lineno}")
    assert not outside, outside

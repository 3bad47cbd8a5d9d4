"""Integrations with training frameworks. Each submodule imports its framework only when used:
``pipeline_opt.integrations.ultralytics`` needs the ``yolo`` extra.

Importing this package registers the frameworks' transforms in
:mod:`pipeline_opt.transforms.registry` by name (no framework is imported for that), so a profile
of their pipelines names what moves to the GPU.
"""

from pipeline_opt.integrations.ultralytics import _protocol  # noqa: F401  (registers ultralytics through the protocols)

__all__ = ["ultralytics"]


def __getattr__(name: str):
    if name == "ultralytics":
        import importlib

        return importlib.import_module("pipeline_opt.integrations.ultralytics")
    raise AttributeError(name)

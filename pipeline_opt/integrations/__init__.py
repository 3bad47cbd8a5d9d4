"""Integrations with training frameworks. Each submodule imports its framework only when used:
``pipeline_opt.integrations.ultralytics`` needs the ``yolo`` extra."""

__all__ = ["ultralytics"]


def __getattr__(name: str):
    if name == "ultralytics":
        import importlib

        return importlib.import_module("pipeline_opt.integrations.ultralytics")
    raise AttributeError(name)

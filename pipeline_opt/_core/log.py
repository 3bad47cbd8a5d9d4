"""The package logger. Library code logs under ``pipeline_opt``; it never prints."""

from __future__ import annotations

import logging

LOGGER_NAME = "pipeline_opt"


def get_logger(name: str | None = None) -> logging.Logger:
    """Return the package logger or a child of it (``pipeline_opt.<name>``)."""
    if not name or name == LOGGER_NAME:
        return logging.getLogger(LOGGER_NAME)
    if name.startswith(LOGGER_NAME + "."):
        return logging.getLogger(name)
    return logging.getLogger(f"{LOGGER_NAME}.{name}")


def enable_console_logging(level: int = logging.INFO) -> None:
    """Attach a plain stderr handler to the package logger (used by the CLI and examples)."""
    logger = get_logger()
    if not any(getattr(h, "_pipeline_opt", False) for h in logger.handlers):
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S"))
        handler._pipeline_opt = True  # type: ignore[attr-defined]
        logger.addHandler(handler)
    logger.setLevel(level)

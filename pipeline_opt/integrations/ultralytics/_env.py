"""Make ultralytics run offline: no download, no install, no HTTP check, no telemetry.

ultralytics reads ``YOLO_OFFLINE`` / ``YOLO_AUTOINSTALL`` / ``YOLO_CONFIG_DIR`` once, when it is
imported, and ``check_font`` (run by every dataset check) sends an HTTP HEAD for ``Arial.ttf``
unless that file is already in its config directory. :func:`prepare_offline_env` sets the three
variables and puts matplotlib's DejaVuSans there under both names ultralytics asks for.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

from pipeline_opt._core.log import get_logger

log = get_logger("integrations.ultralytics")

FONT_NAMES = ("Arial.ttf", "Arial.Unicode.ttf")
_SUB_DIR = "Ultralytics"  # ultralytics appends it to $YOLO_CONFIG_DIR


def _dejavu_sans() -> Path:
    import matplotlib

    path = Path(matplotlib.get_data_path()) / "fonts" / "ttf" / "DejaVuSans.ttf"
    if not path.is_file():
        raise FileNotFoundError(
            f"matplotlib's DejaVuSans.ttf is missing at {path}; reinstall matplotlib or copy any TTF font "
            f"to $YOLO_CONFIG_DIR/{_SUB_DIR}/Arial.ttf yourself"
        )
    return path


def install_fonts(directory: str | os.PathLike) -> list[Path]:
    """Copy DejaVuSans.ttf to ``directory`` as ``Arial.ttf`` and ``Arial.Unicode.ttf`` (kept if present)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    font = None
    out = []
    for name in FONT_NAMES:
        target = directory / name
        if not target.exists():
            font = font or _dejavu_sans()
            shutil.copyfile(font, target)
        out.append(target)
    return out


def prepare_offline_env(config_dir: str | os.PathLike | None = None) -> Path:
    """Configure ultralytics for a machine without network access; returns its config directory.

    Sets ``YOLO_OFFLINE=1`` and ``YOLO_AUTOINSTALL=0``; points ``YOLO_CONFIG_DIR`` at
    ``config_dir`` (default: the ``YOLO_CONFIG_DIR`` already set, else a new temporary directory)
    and installs the fonts ``check_font`` looks for. Call it before ``import ultralytics``: the
    variables are read at import. When ultralytics is already imported the fonts are also put in
    the directory it actually uses, and a warning says which settings came too late.
    """
    if config_dir is None:
        config_dir = os.environ.get("YOLO_CONFIG_DIR") or tempfile.mkdtemp(prefix="pipeline_opt-yolo-config-")
    root = Path(config_dir).expanduser().resolve()
    root.mkdir(parents=True, exist_ok=True)
    os.environ["YOLO_CONFIG_DIR"] = str(root)
    os.environ["YOLO_OFFLINE"] = "1"
    os.environ["YOLO_AUTOINSTALL"] = "0"
    user_dir = root / _SUB_DIR
    install_fonts(user_dir)
    utils = sys.modules.get("ultralytics.utils")
    if utils is not None:
        live_dir = Path(getattr(utils, "USER_CONFIG_DIR", user_dir))
        if live_dir.resolve() != user_dir.resolve():
            install_fonts(live_dir)
        late = [name for name, value in (("YOLO_OFFLINE", not getattr(utils, "ONLINE", False)),
                                         ("YOLO_AUTOINSTALL", not getattr(utils, "AUTOINSTALL", False)))
                if not value]
        events = getattr(sys.modules.get("ultralytics.utils.events"), "events", None)
        if events is not None and getattr(events, "enabled", False):
            events.enabled = False  # telemetry: in memory only, the user's settings file is not touched
        if late:
            log.warning("ultralytics was imported before prepare_offline_env(): %s take effect only in a new "
                        "process; call prepare_offline_env() before `import ultralytics`", ", ".join(late))
    log.debug("ultralytics offline: YOLO_CONFIG_DIR=%s", root)
    return user_dir

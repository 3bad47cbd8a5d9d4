"""The fix for the loader errors newcomers meet most, added to torch's message.

torch's own message says where a batch failed but not what to change: a dataset that returns PIL
images without a ``ToTensor`` (``default_collate`` cannot stack them), and a lambda or nested
function (``collate_fn``, ``worker_init_fn``, a transform) that worker processes started with spawn
or forkserver cannot receive. :func:`with_loader_hint` returns the same exception type with the fix
appended; other errors are left as they are.
"""

from __future__ import annotations

import re

_PIL_IN_COLLATE = re.compile(r"default_collate: .*found <class 'PIL\.")
_UNPICKLABLE = re.compile(r"Can't (?:pickle|get) local object '([^']+)'|Can't pickle <function (<lambda>|[\w.]+)")

PIL_HINT = ("the dataset returns PIL images, which the default collate cannot stack: end its transform with "
            "torchvision.transforms.ToTensor() (float in [0, 1]) or PILToTensor() (uint8), after the last PIL "
            "transform")


def loader_error_hint(exc: BaseException) -> str:
    """The fix for ``exc`` when it is one of the common loader mistakes, else ""."""
    text = str(exc)
    if _PIL_IN_COLLATE.search(text):
        return PIL_HINT
    found = _UNPICKLABLE.search(text)
    if found:
        name = found.group(1) or found.group(2)
        return (f"{name} is a lambda or a function defined inside another function, which worker processes "
                "started with spawn or forkserver cannot receive: define it at module level (functools.partial "
                "of a module-level function works too), or pass multiprocessing_context='fork' to the "
                "DataLoader on Linux")
    return ""


def with_loader_hint(exc: BaseException) -> BaseException | None:
    """``exc``'s type with the fix appended to its message, or None when there is no hint or the type
    cannot be rebuilt from a message."""
    hint = loader_error_hint(exc)
    if not hint or hint in str(exc):
        return None
    return with_message(exc, f"{str(exc).rstrip('. ')}. Fix: {hint}.")


def with_message(exc: BaseException, message: str) -> BaseException | None:
    """An exception of ``exc``'s type whose text is ``message``, or None when the type cannot be
    rebuilt from a message alone."""
    try:
        new = type(exc)(message)
    except Exception:
        return None
    return new if str(new) == message else None

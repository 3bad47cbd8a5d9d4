"""The front door of tuning: :func:`autotune` tunes in this process, or across the ranks of a
torchrun / DDP job (every rank tunes, the ranks agree on one configuration).

It sits above both :mod:`pipeline_opt.tune.api` (the tuner of one process) and
:mod:`pipeline_opt.distributed_api` (the coordination), so neither imports the other's caller.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from typing import Any

from pipeline_opt._core.distributed import should_coordinate
from pipeline_opt.distributed_api import autotune_distributed
from pipeline_opt.tune.api import tune_loader
from pipeline_opt.tune.exactness import changes_in, exactness_of
from pipeline_opt.tune.result import TuneResult


@functools.wraps(tune_loader, assigned=("__doc__", "__annotations__"))
def autotune(loader: Any, model: Any, *args: Any, **kwargs: Any) -> TuneResult:
    if not should_coordinate():
        return tune_loader(loader, model, *args, **kwargs)
    # Inside torchrun / DDP: every rank tunes its own loader, the ranks agree on one configuration
    # and every rank's loader is rebuilt with it.

    bound = inspect.signature(tune_loader).bind(loader, model, *args, **kwargs)
    named = {k: v for k, v in bound.arguments.items() if k not in ("loader", "model", "step_fn")}
    shared = autotune_distributed(loader, model, step_fn=bound.arguments.get("step_fn"), **named)
    config = dict(shared.config)
    return dataclasses.replace(shared.local, loader=shared.loader, config=config, exactness=exactness_of(config),
                               pixel_changes=changes_in(config, shared.local.pixel_checks))


autotune.__signature__ = inspect.signature(tune_loader)  # help() and IDEs show the real arguments

"""Module-level code run inside the spawned / torchrun ranks of tests/distributed (picklable for spawn)."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path


def free_port() -> int:
    """A free TCP port on 127.0.0.1 (the rendezvous never leaves this host)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def live_children() -> set[int]:
    """Pids of this process's live descendants, without multiprocessing's own resource tracker."""
    import psutil

    out = set()
    for child in psutil.Process().children(recursive=True):
        try:
            if child.status() == psutil.STATUS_ZOMBIE or "resource_tracker" in " ".join(child.cmdline()):
                continue
        except psutil.NoSuchProcess:
            continue
        out.add(child.pid)
    return out


def init_gloo(rank: int, world_size: int, port: int) -> None:
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)


def collectives_rank(rank: int, world_size: int, port: int, out_dir: str) -> None:
    """dist_info / agree_on_config / gather_reports / is_main_process on one rank; results to JSON."""
    import torch.distributed as dist

    from pipeline_opt._core.distributed import (
        agree_on_config,
        config_key,
        dist_info,
        gather_reports,
        is_main_process,
    )

    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        os.environ.pop(name, None)
    init_gloo(rank, world_size, port)
    try:
        info = dist_info()
        # rank 0 prefers 4 workers, rank 1 prefers 2; 2 has the better worst-rank throughput
        own = {"num_workers": 4 if rank == 0 else 2, "pin_memory": False}
        scores = {config_key({"num_workers": 4, "pin_memory": False}): 200.0 if rank == 0 else 50.0,
                  config_key({"num_workers": 2, "pin_memory": False}): 100.0 if rank == 0 else 90.0}
        agreed = agree_on_config(own, scores)
        unscored = agree_on_config({"num_workers": 7 + rank})  # no common scores: rank 0's choice
        gathered = gather_reports({"rank": rank, "pid": os.getpid()})
        out = {"info": info.__dict__, "agreed": agreed, "unscored": unscored, "gathered": gathered,
               "main": is_main_process()}
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(out))
    finally:
        dist.destroy_process_group()


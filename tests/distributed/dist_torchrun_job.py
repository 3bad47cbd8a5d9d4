"""The training job run under ``torchrun --nproc_per_node 2`` by test_dist_torchrun.py.

Each rank: a tiny uint8 image dataset behind a DistributedSampler, a tiny conv net wrapped in
DistributedDataParallel (gloo), then profile_distributed and autotune_distributed. Each rank writes
what it saw to ``<out>/rank<N>.json``; rank 0 also writes the combined reports.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler


class TinyImages(Dataset):
    """Deterministic uint8 3x32x32 images with a label; a little CPU work per sample."""

    def __init__(self, n: int = 96) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int):
        g = torch.Generator().manual_seed(index)
        img = torch.randint(0, 256, (3, 32, 32), dtype=torch.uint8, generator=g)
        return img, index % 4


def tiny_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
                               torch.nn.Flatten(), torch.nn.Linear(4, 4))


def main(argv: list[str]) -> int:
    import pipeline_opt as po
    from pipeline_opt._core.distributed import dist_info
    from pipeline_opt.distributed_api import autotune_distributed, profile_distributed
    from pipeline_opt.loading.dataloader import loader_config

    out = Path(argv[0])
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    try:
        info = dist_info()
        ds = TinyImages()
        sampler = DistributedSampler(ds, shuffle=True, seed=0)
        loader = DataLoader(ds, batch_size=8, sampler=sampler, num_workers=1, persistent_workers=False)
        model = torch.nn.parallel.DistributedDataParallel(tiny_model())
        before = {k: v.clone() for k, v in model.state_dict().items()}

        prof = profile_distributed(loader, model, steps=4, warmup=1, out_dir=out / "profile")
        tuned = autotune_distributed(loader, model, time_budget_s=6, out_dir=out / "tune")
        plain = po.autotune(loader, model, time_budget_s=4, progress=False)  # unchanged call: ranks agree too
        batches = sum(1 for _ in tuned.loader)
        unchanged = all(torch.equal(before[k], v) for k, v in model.state_dict().items())
        record = {
            "info": info.__dict__,
            "usable_cpus": len(os.sched_getaffinity(0)),
            "profile_throughput": prof.report.throughput,
            "profile_dir": None if prof.directory is None else str(prof.directory),
            "config": tuned.config,
            "reason": tuned.reason,
            "tried_num_workers": [t.config.get("num_workers") for t in tuned.local.trials],
            "tuned_loader_config": loader_config(tuned.loader),
            "plain_config": plain.config,
            "plain_loader_config": loader_config(plain.loader),
            "tuned_batches": batches,
            "tune_dir": None if tuned.directory is None else str(tuned.directory),
            "model_unchanged": unchanged,
            "version": po.__version__,
        }
        (out / f"rank{info.rank}.json").write_text(json.dumps(record))
        dist.barrier()
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

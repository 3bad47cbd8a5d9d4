"""One rank of the 2-rank gloo job of test_yolo_ddp.py: the YOLO integration's callbacks in DDP.

ultralytics' own DDP launch needs CUDA devices (it calls ``set_device`` and wraps with
``device_ids``), so the job builds what an ultralytics DDP rank has when the callbacks fire, from
ultralytics' own pieces, on the CPU: the process group, a ``DetectionModel`` in
``DistributedDataParallel``, the train ``InfiniteDataLoader`` with its ``DistributedSampler`` (as
``build_dataloader(rank=...)`` makes it), the trainer's ``preprocess_batch``. Then it runs the
callbacks in the trainer's order around real DDP training steps (gradient all-reduce included)
and writes what it saw to ``<out>/rank<N>.json``.
"""

from __future__ import annotations

import hashlib
import json
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist


def _digest(model: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for k, v in sorted(model.state_dict().items()):
        h.update(k.encode())
        h.update(v.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


class RankTrainer:
    """The attributes of an ultralytics DDP rank's trainer that the integration reads."""

    def __init__(self, data_yaml: str, save_dir: Path, rank: int, world_size: int) -> None:
        from ultralytics.cfg import get_cfg
        from ultralytics.data import build_dataloader, build_yolo_dataset
        from ultralytics.data.utils import check_det_dataset
        from ultralytics.nn.tasks import DetectionModel
        from ultralytics.utils import DEFAULT_CFG

        self.args = get_cfg(DEFAULT_CFG, {"data": data_yaml, "model": "yolo11n.yaml", "imgsz": 32, "batch": 4,
                                          "workers": 1, "amp": False, "device": "cpu"})
        data = check_det_dataset(data_yaml)
        torch.manual_seed(0)  # the same initial weights on both ranks (DDP also broadcasts rank 0's)
        model = DetectionModel("yolo11n.yaml", nc=data["nc"], verbose=False)
        model.nc, model.names, model.args = data["nc"], data["names"], self.args
        model.train()
        self.model = torch.nn.parallel.DistributedDataParallel(model, find_unused_parameters=True)
        dataset = build_yolo_dataset(self.args, data["train"], 4, data, mode="train", stride=32)
        self.train_loader = build_dataloader(dataset, batch=4, workers=1, shuffle=True, rank=rank)
        self.device = torch.device("cpu")
        self.scaler = torch.amp.GradScaler("cpu", enabled=False)
        self.amp = False
        self.save_dir = save_dir
        self.world_size = world_size
        self.epoch = self.start_epoch = 0
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.001)

    def preprocess_batch(self, batch: dict) -> dict:
        batch["img"] = batch["img"].to(self.device).float() / 255
        return batch

    def train_step(self, batch: dict) -> None:
        loss, _ = self.model(self.preprocess_batch(batch))
        loss.sum().backward()  # DDP: the gradient all-reduce over gloo
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)


def main(argv: list[str]) -> int:
    from pipeline_opt.integrations.ultralytics import prepare_offline_env

    out, data_yaml = Path(argv[0]), argv[1]
    prepare_offline_env(tempfile.mkdtemp(prefix="pipeline_opt-ddp-yolo-config-"))
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()

    from pipeline_opt.integrations.ultralytics import AttachOptions, YoloIntegration
    from pipeline_opt.loading.dataloader import loader_config

    trainer = RankTrainer(data_yaml, out / "run", rank, world)
    options = AttachOptions(profile=True, tune=True, gpu_augment=True, tune_budget_s=10.0, steps=3, warmup=1,
                            trace_steps=2,
                            augment_kwargs={"rounds": 1, "windows": 1, "steps": 2, "warmup": 0, "time_budget_s": 20.0})
    integration = YoloIntegration(options)
    integration.on_pretrain_routine_start(trainer)
    before = _digest(trainer.model.module)
    integration.on_pretrain_routine_end(trainer)
    after_setup = _digest(trainer.model.module)
    run = integration.run
    steps = 0
    for epoch in range(6):
        trainer.epoch = epoch
        integration.on_train_epoch_start(trainer)
        for batch in trainer.train_loader:
            integration.on_train_batch_start(trainer)
            trainer.train_step(batch)
            integration.on_train_batch_end(trainer)
            steps += 1
        if run.report is not None and epoch >= 1:
            break
    integration.on_train_end(trainer)
    integration.teardown(trainer)
    loader = trainer.train_loader
    cfg = loader_config(loader)
    record = {
        "rank": rank, "world_size": world, "steps": steps,
        "weights_unchanged_by_setup": before == after_setup,
        "gpu_augment_applied": bool(run.switch.active), "augment_votes": run.augment_votes,
        "decision": run.switch.decision.to_dict() if run.switch.decision else None,
        "loader": {k: cfg[k] for k in ("num_workers", "pin_memory", "prefetch_factor")},
        "loader_class": type(loader).__name__, "sampler_class": type(loader.sampler).__name__,
        "tunes": run.tunes, "profile_steps": None if run.report is None else len(run.report.steps),
        "out_dir": str(run.out_dir), "root_dir": str(run.root_dir),
    }
    (out / f"rank{rank}.json").write_text(json.dumps(record, default=str))
    close = getattr(loader, "close", None)
    if callable(close):
        close()
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

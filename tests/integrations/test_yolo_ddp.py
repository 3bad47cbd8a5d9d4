"""The YOLO integration's callbacks in a 2-rank DDP job (torchrun, gloo, CPU): agree, combine, no hang."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from pipeline_opt.datasets import make_yolo_dataset

HERE = Path(__file__).parent
JOB_TIMEOUT_S = 300


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _live_children() -> set[int]:
    out = set()
    for child in psutil.Process().children(recursive=True):
        try:
            if child.status() == psutil.STATUS_ZOMBIE or "resource_tracker" in " ".join(child.cmdline()):
                continue
        except psutil.NoSuchProcess:
            continue
        out.add(child.pid)
    return out


@pytest.fixture(scope="module")
def ddp_job(tmp_path_factory):
    """Run the 2-rank job once for the module; returns (output folder, children before, rank records)."""
    data_yaml = make_yolo_dataset(n_train=48, n_val=4, size=(160, 128), root=tmp_path_factory.mktemp("ddp_yolo"),
                                  workers=1)
    out = tmp_path_factory.mktemp("ddp_out")
    before = _live_children()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node", "2",
           "--master_addr", "127.0.0.1", "--master_port", str(_free_port()),
           str(HERE / "yolo_ddp_job.py"), str(out), str(data_yaml)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        log, _ = proc.communicate(timeout=JOB_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        log, _ = proc.communicate()
        pytest.fail(f"the DDP job did not finish in {JOB_TIMEOUT_S} s (a rank waiting in a collective?):\n"
                    f"{log[-4000:]}")
    assert proc.returncode == 0, f"DDP job failed (rc={proc.returncode}):\n{log[-6000:]}"
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]
    return out, before, ranks


def test_ranks_agree_on_the_augmentation_and_the_loader(ddp_job):
    _, _, (r0, r1) = ddp_job
    assert r0["gpu_augment_applied"] == r1["gpu_augment_applied"]
    assert r0["augment_votes"] == r1["augment_votes"] and len(r0["augment_votes"]) == 2
    assert r0["gpu_augment_applied"] == all(r0["augment_votes"])
    assert r0["loader"] == r1["loader"], "both ranks must train with the agreed loader settings"
    for r in (r0, r1):
        assert r["loader_class"] == "InfiniteDataLoader" and r["sampler_class"] == "DistributedSampler"
        assert r["tunes"] and r["tunes"][0]["config"]["num_workers"] == r["loader"]["num_workers"]
        assert r["weights_unchanged_by_setup"], "measuring must not change the model"


def test_rank0_writes_the_combined_profile_of_both_ranks(ddp_job):
    out, _, (r0, r1) = ddp_job
    root = Path(r0["root_dir"])
    assert root == Path(r1["root_dir"]) == out / "run" / "pipeline_opt"
    assert r0["profile_steps"] == r1["profile_steps"] == 3
    summary = json.loads((root / "distributed.json").read_text())
    assert summary["world_size"] == 2 and [r["rank"] for r in summary["ranks"]] == [0, 1]
    assert {"imbalance", "sync"} <= set(summary)
    for rank in (0, 1):
        assert json.loads((root / f"rank_{rank}" / "report.json").read_text())["throughput"] > 0
        integration = json.loads((root / f"rank_{rank}" / "integration.json").read_text())
        assert integration["ddp"]["rank"] == rank and integration["ddp"]["world_size"] == 2
        assert (root / f"rank_{rank}" / "tune").is_dir()
    trace = json.loads((root / "trace.json").read_text())["traceEvents"]
    assert {r["pid"] for r in summary["ranks"]} <= {e["pid"] for e in trace if e.get("ph") != "M"}
    assert (root / "rank_0" / "report.html").is_file()  # rank 0's own full report
    assert not (root / "rank_1" / "report.html").exists()  # rank 1's is in the combined one only


def test_no_orphan_processes_after_the_ddp_job(ddp_job):
    _, before, _ = ddp_job
    assert _live_children() <= before


def test_attached_callbacks_survive_the_pickling_of_ultralytics_ddp_launch():
    """ultralytics' DDP launch cloudpickles the trainer's callbacks into each rank's start-up file."""
    cloudpickle = pytest.importorskip("cloudpickle")
    from ultralytics import YOLO

    from pipeline_opt.integrations.ultralytics import attach

    model = YOLO("yolo11n.yaml")
    integration = attach(model, tune_budget_s=5.0, steps=4)
    restored = cloudpickle.loads(cloudpickle.dumps(model.callbacks))
    for event in integration.EVENTS:
        mine = [fn for fn in restored[event] if getattr(fn, "__self__", None).__class__.__name__ == "YoloIntegration"]
        assert len(mine) == 1, event
        assert mine[0].__self__.options == integration.options and mine[0].__self__.run is None

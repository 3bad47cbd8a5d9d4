"""po.profile / po.autotune inside a real ``torchrun --nproc_per_node 2`` gloo job (CPU)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from dist_workers import free_port, live_children

HERE = Path(__file__).parent
JOB_TIMEOUT_S = 160


@pytest.fixture(scope="module")
def torchrun_job(tmp_path_factory):
    """Run the 2-rank job once for all the tests of this module; returns its output folder."""
    out = tmp_path_factory.mktemp("torchrun")
    before = live_children()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node", "2",
           "--master_addr", "127.0.0.1", "--master_port", str(free_port()),
           str(HERE / "dist_torchrun_job.py"), str(out)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        log, _ = proc.communicate(timeout=JOB_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        log, _ = proc.communicate()
        pytest.fail(f"the torchrun job did not finish in {JOB_TIMEOUT_S} s:\n{log[-4000:]}")
    assert proc.returncode == 0, f"torchrun job failed (rc={proc.returncode}):\n{log[-6000:]}"
    return out, before


def _ranks(out):
    return [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]


def test_both_ranks_profile_and_tune_and_agree(torchrun_job):
    out, _ = torchrun_job
    r0, r1 = _ranks(out)
    assert [r["info"]["rank"] for r in (r0, r1)] == [0, 1]
    assert all(r["info"]["local_world_size"] == 2 and r["info"]["backend"] == "gloo" for r in (r0, r1))
    assert r0["profile_throughput"] > 0 and r1["profile_throughput"] > 0
    assert r0["config"] == r1["config"], "ranks must adopt one configuration"
    assert r0["reason"] == r1["reason"]
    for r in (r0, r1):  # each rank's loader was rebuilt with the agreed settings
        for key in ("num_workers", "pin_memory"):
            assert r["tuned_loader_config"][key] == r["config"][key]
        assert r["tuned_batches"] == 96 // 2 // 8  # DistributedSampler: half the dataset per rank
        assert r["model_unchanged"]


def test_plain_autotune_inside_torchrun_agrees_across_ranks(torchrun_job):
    out, _ = torchrun_job
    r0, r1 = _ranks(out)
    assert r0["plain_config"] == r1["plain_config"], "po.autotune must agree on one configuration under DDP"
    for r in (r0, r1):
        assert r["plain_loader_config"]["num_workers"] == r["plain_config"]["num_workers"]


def test_cpu_budget_is_divided_by_local_ranks(torchrun_job):
    out, _ = torchrun_job
    for r in _ranks(out):
        cap = max(1, r["usable_cpus"] // r["info"]["local_world_size"])
        assert max(n or 0 for n in r["tried_num_workers"]) <= cap, (r["tried_num_workers"], cap)


def test_rank0_alone_writes_one_combined_report_with_both_ranks(torchrun_job):
    out, _ = torchrun_job
    r0, r1 = _ranks(out)
    assert r1["profile_dir"] is None and r1["tune_dir"] is None
    for kind in ("profile", "tune"):
        d = out / kind
        assert Path(r0[f"{kind}_dir"]) == d
        summary = json.loads((d / "distributed.json").read_text())
        assert summary["world_size"] == 2 and [r["rank"] for r in summary["ranks"]] == [0, 1]
        assert {"imbalance", "sync"} <= set(summary)
        assert summary["imbalance"]["slowest_rank"] in (0, 1)
        for rank in (0, 1):
            assert json.loads((d / f"rank_{rank}" / "report.json").read_text())["throughput"] > 0
        trace = json.loads((d / "trace.json").read_text())["traceEvents"]
        names = {e["pid"]: e["args"]["name"] for e in trace if e.get("name") == "process_name"}
        rank_mains = {r["pid"] for r in summary["ranks"]}
        assert rank_mains <= {e["pid"] for e in trace if e.get("ph") != "M"}, "each rank's main process has events"
        assert {n.split()[1] for n in names.values()} == {"0", "1"}
        assert len(names) >= 4, f"main + worker of both ranks expected, got {names}"
    tune = json.loads((out / "tune" / "distributed.json").read_text())
    assert tune["config"] == r0["config"] and len(tune["proposals"]) == 2


def test_no_orphan_processes_after_the_job(torchrun_job):
    _, before = torchrun_job
    assert live_children() <= before

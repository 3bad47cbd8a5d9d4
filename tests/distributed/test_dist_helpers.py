"""Pure helpers of pipeline_opt._core.distributed: no process group needed."""

from __future__ import annotations

import json

import pytest

from pipeline_opt._core.distributed import (
    agree_on_config,
    choose_config,
    config_key,
    detect_sync_bound,
    dist_info,
    gather_reports,
    is_main_process,
    local_share,
    local_world_size,
    merge_rank_traces,
    rank_imbalance,
    scores_from_trials,
)
from pipeline_opt.profile.report import OpStat
from pipeline_opt.tune.result import Trial

_DIST_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")


@pytest.fixture
def clean_env(monkeypatch):
    for name in _DIST_ENV:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_dist_info_single_process(clean_env):
    info = dist_info()
    assert (info.rank, info.world_size, info.local_rank, info.local_world_size) == (0, 1, 0, 1)
    assert not info.initialized and info.backend is None and not info.is_distributed
    assert is_main_process() and local_world_size() == 1


def test_dist_info_from_torchrun_env(clean_env):
    for k, v in {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4"}.items():
        clean_env.setenv(k, v)
    info = dist_info()
    assert (info.rank, info.world_size, info.local_rank, info.local_world_size) == (5, 8, 1, 4)
    assert not is_main_process() and local_world_size() == 4


@pytest.mark.parametrize("env", [{"RANK": "3", "WORLD_SIZE": "2"}, {"WORLD_SIZE": "zero"},
                                 {"WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "LOCAL_RANK": "2"}])
def test_dist_info_rejects_inconsistent_env(clean_env, env):
    for k, v in env.items():
        clean_env.setenv(k, v)
    with pytest.raises(ValueError, match="RANK|WORLD_SIZE"):
        dist_info()


def test_collectives_are_identity_without_a_group(clean_env):
    cfg = {"num_workers": 2, "pin_memory": False}
    out = agree_on_config(cfg, {config_key(cfg): 10.0})
    assert out == cfg and out is not cfg
    assert gather_reports({"a": 1}) == [{"a": 1}]


def test_config_key_is_canonical_and_validates():
    assert config_key({"b": 1, "a": [1, 2]}) == config_key({"a": [1, 2], "b": 1})
    assert json.loads(config_key({"num_workers": 3})) == {"num_workers": 3}
    with pytest.raises(TypeError, match="JSON"):
        config_key({"fn": object()})
    with pytest.raises(TypeError, match="dict"):
        config_key([("num_workers", 1)])
    with pytest.raises(TypeError, match="scores"):
        agree_on_config({"num_workers": 1}, scores=[1.0])


def _k(nw):
    return config_key({"num_workers": nw})


def test_choose_config_maximises_worst_rank_throughput():
    # rank 0 prefers 4 workers, rank 1 prefers 2; 2 workers has the better worst rank (90 vs 50)
    proposals = [({"num_workers": 4}, {_k(4): 200.0, _k(2): 100.0, _k(1): 10.0}),
                 ({"num_workers": 2}, {_k(4): 50.0, _k(2): 90.0})]
    cfg, why = choose_config(proposals)
    assert cfg == {"num_workers": 2} and "worst-rank" in why
    # the result does not depend on the rank order of equal data, and ties go to the smaller key
    tie = [({"num_workers": 1}, {_k(1): 5.0, _k(2): 5.0}), ({"num_workers": 2}, {_k(1): 5.0, _k(2): 5.0})]
    assert choose_config(tie)[0] == choose_config(tie[::-1])[0] == {"num_workers": 1}


def test_choose_config_keeps_a_unanimous_choice_over_raw_scores():
    # both tuners kept 2 workers (4 was within their noise); the raw worst-rank score of 4 is not a reason
    proposals = [({"num_workers": 2}, {_k(2): 100.0, _k(4): 103.0}), ({"num_workers": 2}, {_k(2): 98.0, _k(4): 101.0})]
    cfg, why = choose_config(proposals)
    assert cfg == {"num_workers": 2} and "every rank chose it" in why


def test_choose_config_falls_back_to_rank0_without_common_candidates():
    proposals = [({"num_workers": 3}, {_k(3): 1.0}), ({"num_workers": 1}, {_k(1): 9.0})]
    cfg, why = choose_config(proposals)
    assert cfg == {"num_workers": 3} and "rank 0" in why
    # failed (zero) scores do not count as measured
    assert choose_config([({"num_workers": 3}, {_k(1): 0.0}), ({"num_workers": 1}, {_k(1): 9.0})])[0] == {
        "num_workers": 3}
    with pytest.raises(ValueError, match="at least one"):
        choose_config([])


def test_scores_from_trials_keeps_best_ok_trial():
    trials = [Trial({"num_workers": 1}, 10.0, 0.1, True, "baseline"),
              Trial({"num_workers": 1}, 12.0, 0.1, False, "repeat"),
              Trial({"num_workers": 2}, 0.0, 0.0, False, "worker died", status="failed"),
              Trial({"num_workers": 3}, 30.0, 0.0, False, "no RAM", status="skipped")]
    assert scores_from_trials(trials) == {_k(1): 12.0}


def _trace(pid, worker_pid, flow_id):
    return [{"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": "main"}},
            {"ph": "X", "name": "step", "pid": pid, "tid": 1, "ts": 10, "dur": 5},
            {"ph": "X", "name": "__getitem__", "pid": worker_pid, "tid": 1, "ts": 11, "dur": 2},
            {"ph": "s", "name": "flow", "id": flow_id, "pid": pid, "tid": 1, "ts": 10},
            {"ph": "f", "name": "flow", "id": flow_id, "pid": worker_pid, "tid": 1, "ts": 12, "bp": "e"}]


def test_merge_rank_traces_keeps_every_process_distinct_and_named():
    r0, r1 = _trace(100, 101, 7), _trace(200, 201, 7)
    merged = merge_rank_traces([r0, r1])
    pids = {e["pid"] for e in merged}
    assert pids == {100, 101, 200, 201}
    names = {e["pid"]: e["args"]["name"] for e in merged if e.get("name") == "process_name"}
    assert names[100] == "rank 0 main" and names[200] == "rank 1 main"
    assert names[101].startswith("rank 0") and names[201].startswith("rank 1")  # added for unnamed workers
    flow_ids = {e["id"] for e in merged if e.get("ph") in ("s", "f")}
    assert len(flow_ids) == 2  # the same flow id on two ranks no longer links them
    assert r0[0]["args"]["name"] == "main"  # inputs are not mutated
    assert sum(1 for e in merged if e.get("ph") == "X") == 4


def test_merge_rank_traces_remaps_colliding_pids():
    merged = merge_rank_traces([_trace(100, 101, 1), {"traceEvents": _trace(100, 102, 1)}])
    rank1_pids = {e["pid"] for e in merged if e.get("name") == "process_name" and e["args"]["name"].startswith("rank 1")}
    assert rank1_pids == {10_000_100, 102}
    assert {e["pid"] for e in merged if e.get("ph") == "X"} == {100, 101, 10_000_100, 102}
    # kineto-style string pids and device lanes collide too: each rank keeps its own
    lanes = merge_rank_traces([[{"ph": "X", "pid": "Spans", "tid": 0, "ts": 1, "dur": 1}, {"ph": "X", "pid": 0}],
                               [{"ph": "X", "pid": "Spans", "tid": 0, "ts": 1, "dur": 1}, {"ph": "X", "pid": 0}]])
    assert {e["pid"] for e in lanes if e["ph"] == "X"} == {"Spans", 0, "rank 1 Spans", 10_000_000}
    with pytest.raises(ValueError, match="one rank per trace"):
        merge_rank_traces([[], []], ranks=[0])
    with pytest.raises(TypeError, match="one list of trace events per rank"):
        merge_rank_traces("trace.json")


def _report(wait_s, step_s=0.1):
    return {"throughput": 320.0, "step_time_s": step_s, "data_wait_frac": wait_s / step_s,
            "steps": [{"data_wait_s": wait_s, "step_s": step_s}] * 3}


def test_rank_imbalance_names_the_starved_rank():
    out = rank_imbalance([_report(0.01), _report(0.012), _report(0.06), _report(0.011)])
    assert out["imbalanced"] and out["slowest_rank"] == 2
    assert out["slowest_data_wait_s"] == pytest.approx(0.06)
    assert out["median_data_wait_s"] == pytest.approx(0.0115)
    assert "rank 2" in out["message"]
    balanced = rank_imbalance([_report(0.01), _report(0.012)])
    assert not balanced["imbalanced"] and "balanced" in balanced["message"]
    assert not rank_imbalance([_report(0.09)])["imbalanced"]  # one rank cannot be imbalanced
    with pytest.raises(ValueError, match="at least one"):
        rank_imbalance([])


def test_rank_imbalance_without_step_records_uses_fractions():
    reps = [{"step_time_s": 0.2, "data_wait_frac": 0.05}, {"step_time_s": 0.2, "data_wait_frac": 0.5}]
    out = rank_imbalance(reps)
    assert out["slowest_rank"] == 1 and out["imbalanced"]


# op lists recorded from torch.profiler key_averages() (names as torch / kineto spell them)
NCCL_BOUND_OPS = [
    OpStat("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", 30, 0.0, 1.20),
    OpStat("c10d::allreduce_", 30, 0.004, 1.20),  # the op row also carries its kernel's time
    OpStat("cudaStreamSynchronize", 30, 0.05, 0.0),
    OpStat("aten::convolution", 60, 0.02, 0.30),
    OpStat("aten::broadcast_tensors", 30, 0.4, 0.0),  # not a collective
]
COMPUTE_BOUND_OPS = [
    OpStat("aten::cudnn_convolution", 300, 0.2, 2.5),
    OpStat("sm90_xmma_fprop_implicit_gemm_bf16", 300, 0.0, 2.2),
    OpStat("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", 30, 0.0, 0.09),
    OpStat("aten::item", 30, 0.003, 0.0),
]
HOST_SYNC_OPS = [{"name": "aten::item", "self_cpu_s": 0.9, "self_cuda_s": 0.0},
                 {"name": "aten::_local_scalar_dense", "self_cpu_s": 0.6, "self_cuda_s": 0.0},
                 {"name": "Memcpy DtoH (Device -> Pageable)", "self_cpu_s": 0.0, "self_cuda_s": 0.01},
                 {"name": "aten::addmm", "self_cpu_s": 0.3, "self_cuda_s": 0.2}]


def test_detect_sync_bound_on_recorded_nccl_profile():
    bound, evidence = detect_sync_bound(NCCL_BOUND_OPS, step_time_s=0.1, steps=30)
    assert bound
    assert "ncclDevKernel_AllReduce" in " ".join(evidence) or "c10d::allreduce_" in " ".join(evidence)
    # the kernel and the op that launched it are not double counted: 1.2 s / 30 steps = 40 ms
    assert "40.0 ms of a 100.0 ms step" in evidence[0]
    assert "broadcast_tensors" not in " ".join(evidence)


def test_detect_sync_bound_rejects_compute_bound_profile():
    bound, evidence = detect_sync_bound(COMPUTE_BOUND_OPS, step_time_s=0.2, steps=30)
    assert not bound and "%" in evidence[0]


def test_detect_sync_bound_on_host_syncs_and_edge_cases():
    bound, evidence = detect_sync_bound(HOST_SYNC_OPS, step_time_s=0.1, steps=10)
    assert bound and any("aten::item" in e for e in evidence)
    assert detect_sync_bound([OpStat("aten::mm", 5, 1.0, 0.0)], 0.1, steps=5) == (
        False, ("no communication or host-sync ops among the profiled ops",))
    assert not detect_sync_bound(NCCL_BOUND_OPS, step_time_s=0.0)[0]
    with pytest.raises(ValueError, match="steps=0"):
        detect_sync_bound(NCCL_BOUND_OPS, 0.1, steps=0)


def test_local_share_divides_host_budgets(clean_env):
    assert local_share(16) == 16 and local_share(2.0**30) == 2.0**30
    for k, v in {"RANK": "1", "WORLD_SIZE": "6", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "3"}.items():
        clean_env.setenv(k, v)
    assert local_share(16) == 5 and local_share(2) == 1 and local_share(0) == 0
    assert local_share(3.0 * 2**30) == pytest.approx(2**30)
    for bad in (-1, "8", True):
        with pytest.raises(ValueError, match="total="):
            local_share(bad)

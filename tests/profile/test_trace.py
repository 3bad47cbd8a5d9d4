"""Timeline helpers on recorded data: clock alignment, GPU idle, batch matching, the merged trace."""

import json

import pytest

from pipeline_opt.profile.collector import BatchRecord, WorkerRecord
from pipeline_opt.profile.main_result import BatchReceipt, MainResult
from pipeline_opt.profile.report import StepRecord
from pipeline_opt.profile.trace import (
    STEPS_TID,
    build_trace,
    busy_time,
    clock_offset_us,
    gpu_intervals,
    idle_fraction,
    match_batches,
    rebase,
)


def test_busy_time_is_the_union_clipped_to_the_window():
    intervals = [(0, 10), (5, 15), (20, 30), (29, 31), (100, 200)]
    assert busy_time(intervals, (0, 50)) == 15 + 11
    assert busy_time(intervals, (8, 25)) == 7 + 5
    assert idle_fraction([(0, 25)], (0, 100)) == pytest.approx(0.75)
    assert idle_fraction([], (0, 100)) == 1.0
    with pytest.raises(ValueError, match="window"):
        idle_fraction([], (5, 5))


def test_gpu_intervals_take_kernels_and_copies_only():
    events = [{"ph": "X", "cat": "kernel", "ts": 10, "dur": 5}, {"ph": "X", "cat": "gpu_memcpy", "ts": 20, "dur": 1},
              {"ph": "X", "cat": "cpu_op", "ts": 0, "dur": 100}, {"ph": "M", "cat": "kernel", "ts": 0}]
    assert gpu_intervals(events) == [(10.0, 15.0), (20.0, 21.0)]


def test_clock_offset_from_anchor_ranges_else_base_time():
    events = [{"ph": "X", "name": "data_wait", "ts": 100.0}, {"ph": "X", "name": "data_wait", "ts": 200.0},
              {"ph": "X", "name": "other", "ts": 5.0}]
    assert clock_offset_us(events, [1100.0, 1201.0], "data_wait") == pytest.approx(1000.5)
    assert clock_offset_us(events, [1.0], "data_wait", base_ns=7_000) == 7.0
    assert clock_offset_us([], [1.0], "data_wait") is None
    shifted = rebase(events, 10.0)
    assert [e["ts"] for e in shifted] == [110.0, 210.0, 15.0] and events[0]["ts"] == 100.0


def _receipt(step, position, t):
    return BatchReceipt(step=step, epoch=0, position=position, t_request_ns=t - 5, t_received_ns=t)


def _batch(wid, seq, t1):
    return BatchRecord(worker_id=wid, pid=100 + wid, seq=seq, t0_ns=t1 - 3, t1_ns=t1, size=4, first_index=None)


def test_match_batches_round_robin_and_causal_fallback():
    batches = [_batch(0, 0, 10), _batch(1, 0, 11), _batch(0, 1, 20), _batch(1, 1, 50)]
    receipts = [_receipt(0, 0, 12), _receipt(1, 1, 13), _receipt(2, 2, 25), _receipt(3, 3, 60)]
    pairs = match_batches(receipts, batches, num_workers=2)
    assert [(r.step, b.worker_id, b.seq) for r, b in pairs] == [(0, 0, 0), (1, 1, 0), (2, 0, 1), (3, 1, 1)]
    # worker 1 ran dry: batch 3 came from worker 0 (only a batch finished before the receipt qualifies)
    batches = [_batch(0, 0, 10), _batch(1, 0, 11), _batch(0, 1, 20), _batch(0, 2, 30)]
    pairs = match_batches(receipts, batches, num_workers=2)
    assert [(r.step, b.worker_id, b.seq) for r, b in pairs] == [(0, 0, 0), (1, 1, 0), (2, 0, 1), (3, 0, 2)]
    assert match_batches([_receipt(0, 0, 5)], [_batch(0, 0, 10)], num_workers=1) == []


def _main_result(t0):
    steps = (StepRecord(index=1, data_wait_s=0.001, h2d_s=0.0, compute_s=0.002, step_s=0.003, samples=4),)
    return MainResult(
        steps=steps, window_s=0.003, samples=4, throughput=4 / 0.003,
        receipts=(_receipt(0, 0, t0 + 2_000_000), _receipt(1, 1, t0 + 5_000_000)),
        spans=(("data_wait", 0, t0 + 1_000_000, t0 + 2_000_000), ("compute", 0, t0 + 2_000_000, t0 + 4_000_000)),
        session_ns=(t0, t0 + 10_000_000), window_ns=(t0 + 4_000_000, t0 + 7_000_000),
        traced_steps=1, traced_ns=(t0 + 4_000_000, t0 + 7_000_000),
        torch_events=({"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "python"}},
                      {"ph": "X", "name": "aten::mm", "cat": "cpu_op", "pid": 1, "tid": 1, "ts": t0 / 1e3 + 3000,
                       "dur": 10}),
        top_cpu_ops=(), top_cuda_ops=(), sync_s=0.0, sync_ops=(), gpu_idle_frac=None)


def _worker(wid, pid, t0):
    spans = (("sample", 0, t0 + 100_000, t0 + 900_000), ("transform", "Resize", t0 + 200_000, t0 + 500_000),
             ("collate", 0, t0 + 900_000, t0 + 1_000_000, 4, 0))
    return WorkerRecord(worker_id=wid, pid=pid, start_ns=t0, last_ns=t0 + 1_000_000, samples=1, batches=1,
                        sample_ns=800_000, collate_ns=100_000, transform_ns={"Resize": 300_000}, cpu_percent=50.0,
                        rss_bytes=1, errors=(), spans=spans)


def test_build_trace_names_every_process_and_links_batches():
    t0 = 1_700_000_000_000_000_000
    events = build_trace(_main_result(t0), [_worker(0, 200, t0), _worker(1, 201, t0)], main_pid=1, num_workers=2)
    json.dumps(events)
    names = {e["pid"]: e["args"]["name"] for e in events if e.get("name") == "process_name"}
    assert names == {1: "main process (pid 1)", 200: "DataLoader worker 0 (pid 200)", 201: "DataLoader worker 1 (pid 201)"}
    flows = [e for e in events if e.get("cat") == "batch"]
    assert sorted(e["ph"] for e in flows) == ["f", "f", "s", "s"]
    starts = {e["id"]: e for e in flows if e["ph"] == "s"}
    for f in (e for e in flows if e["ph"] == "f"):
        assert f["pid"] == 1 and f["tid"] == STEPS_TID and starts[f["id"]]["ts"] < f["ts"]
    resize = [e for e in events if e.get("name") == "Resize"]
    assert len(resize) == 2 and resize[0]["dur"] == pytest.approx(300.0)


def test_main_process_loader_spans_go_to_the_main_pid():
    t0 = 1_700_000_000_000_000_000
    events = build_trace(_main_result(t0), [_worker(-1, 999, t0)], main_pid=1, num_workers=0)
    assert {e["pid"] for e in events if e.get("cat") in ("sample", "transform", "collate")} == {1}


def test_the_results_moved_out_of_the_main_profiler_stay_importable_from_there():
    from pipeline_opt.profile import main_analysis, main_profiler, main_result

    assert main_profiler.MainResult is MainResult and main_profiler.BatchReceipt is BatchReceipt
    assert main_profiler.median is main_result.median
    assert main_profiler.RANGE_NAMES is main_analysis.RANGE_NAMES

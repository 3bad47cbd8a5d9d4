"""The benchmark harness, and every benchmark script run with --quick on the CPU.

The scripts run in subprocesses (as run_gpu.sh runs them) on tiny generated data; the checks are
on the JSON they write: the keys the ledger and the README need, and positive, consistent numbers.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks import harness as H

REPO = Path(__file__).resolve().parents[1]


# --------------------------------------------------------------------------------------------------
# harness units


def test_summarize_median_quartiles_and_spread():
    s = H.summarize([10.0, 30.0, 20.0, 40.0])
    assert s["median"] == 25.0 and s["min"] == 10.0 and s["max"] == 40.0
    assert s["q1"] == 17.5 and s["q3"] == 32.5 and s["iqr"] == 15.0
    assert s["spread"] == pytest.approx(30.0 / 25.0) and s["n"] == 4
    with pytest.raises(ValueError):
        H.summarize([])


def test_row_validation_and_ledger_shape():
    with pytest.raises(ValueError, match="status"):
        H.Row("x", status="bogus")
    with pytest.raises(ValueError, match="no measurements"):
        H.Row("x")
    d = H.row_of("a", [100.0, 200.0], {"k": 1}, efficiency=0.5).to_dict()
    assert d["throughput"] == 150.0 and d["spread"] == pytest.approx(100.0 / 150.0) and d["efficiency"] == 0.5
    assert H.not_run("b", "missing", "no API").to_dict()["reason"] == "no API"
    with pytest.raises(ValueError, match="positive"):
        H.row_of_times("t", [0.0], 1)


def test_row_round_trips_through_json_as_the_yolo_child_returns_it():
    from benchmarks.bench_yolo import _row_from_dict

    row = H.row_of("r @8 cores", [5.0, 7.0], {"cores": 8}, efficiency=0.9)
    back = _row_from_dict(json.loads(json.dumps(row.to_dict())))
    assert back.to_dict() == row.to_dict()
    gone = H.not_run("x", "failed", "boom")
    assert _row_from_dict(gone.to_dict()).to_dict() == gone.to_dict()


def test_yolo_summary_flags_a_limit_that_was_no_ceiling_and_the_markdown_says_so():
    from benchmarks.bench_yolo import SLOTS_ROW, summarize

    sfx = "all cores"
    rows = [H.row_of(f"limit (replayed pinned batch) @{sfx}", [799.0, 824.0, 1014.0]),
            H.row_of(f"default (ultralytics, workers=8) @{sfx}", [708.0, 725.0, 804.0]),
            H.row_of(f"{SLOTS_ROW} @{sfx}", [773.0, 880.0, 883.0]),
            H.row_of(f"integration (tuned, GPU augment if it wins) @{sfx}", [692.0, 839.0, 885.0])]
    part = summarize(rows, [sfx])[sfx]
    assert part["target integration >= 0.95x limit"] is True  # 839 / 824: the ratio alone says met
    caveats = part["caveats"]
    assert len(caveats) == 2, caveats
    assert "no ceiling" in caveats[0] and SLOTS_ROW in caveats[0] and "integration" in caveats[0]
    assert "default (ultralytics" not in caveats[0] and "spread 26%" in caveats[1]
    md = H.markdown_summary([{"benchmark": "bench_yolo", "rows": [r.to_dict() for r in rows],
                              "summary": {"parts": {}, sfx: part}}])
    assert f"- {sfx}: target integration >= 0.95x limit: **met**" in md
    assert f"- {sfx}: caveat: the limit (824 img/s) read below" in md
    # a limit above every loader row, with windows that agree, carries no caveat
    steady = [H.row_of(f"limit (replayed pinned batch) @{sfx}", [1083.0, 1119.0, 1150.0])] + rows[1:]
    assert summarize(steady, [sfx])[sfx]["caveats"] == []


class _Counter:
    """An endless source that records which batches were handed out."""

    def __init__(self, log, name):
        self.log, self.name = log, name

    def __iter__(self):
        i = 0
        while True:
            self.log.append((self.name, i))
            yield torch.zeros(4, 1)
            i += 1


def test_window_discards_then_counts_samples_and_interleave_alternates_order():
    taken = []
    a = H.Candidate("a", lambda: _Counter(taken, "a"), lambda b: None, discard=3)
    b = H.Candidate("b", lambda: _Counter(taken, "b"), lambda b: None, discard=1)
    res = H.interleave([a, b], 3, "cpu", min_steps=2, min_seconds=0.0, max_seconds=5.0)
    assert [len(res[n].windows) for n in "ab"] == [3, 3]
    w = res["a"].windows[0]
    assert w.steps == 2 and w.samples == 8 and w.discarded == 3 and w.throughput > 0
    # a's iterator stays alive across rounds: each window discards 3 and times 2 -> 15 batches
    assert sum(1 for n, _ in taken if n == "a") == 15
    order = [n for n, i in taken if (n == "a" and i % 5 == 0) or (n == "b" and i % 3 == 0)]
    assert order == ["a", "b", "b", "a", "a", "b"], "rounds must alternate A B / B A"


def test_interleave_records_a_failing_candidate_and_runs_the_others():
    def boom(batch):
        raise RuntimeError("step exploded")

    good = H.Candidate("good", lambda: H.replay(torch.zeros(2, 1)), lambda b: None, discard=0)
    bad = H.Candidate("bad", lambda: H.replay(torch.zeros(2, 1)), boom, discard=0)
    res = H.interleave([bad, good], 2, "cpu", min_steps=1, min_seconds=0.0)
    rows = {r.name: r for r in H.rows_of([bad, good], res)}
    assert rows["bad"].status == "failed" and "step exploded" in rows["bad"].reason
    assert rows["good"].status == "ok" and rows["good"].stats["n"] == 2


def test_prefilled_batches_reads_the_loader_under_a_wrapper():
    ds = torch.utils.data.TensorDataset(torch.zeros(8, 1))
    loader = torch.utils.data.DataLoader(ds, batch_size=2, num_workers=2, prefetch_factor=4)

    class Wrapper:
        def __init__(self, loader):
            self.loader = loader

    assert H.prefilled_batches(Wrapper(loader)) == 8
    assert H.prefilled_batches(torch.utils.data.DataLoader(ds)) == 0


def test_optional_reports_what_is_missing():
    assert H.optional("json", "dumps") is json.dumps
    missing = H.optional("json", "no_such_name")
    assert not missing and "json.no_such_name" in missing.reason
    assert not H.optional("no_such_module_xyz", "x")


def test_environment_has_commit_versions_and_hardware(monkeypatch):
    monkeypatch.setenv("PO_COMMIT", "abc123")
    env = H.environment()
    assert env["commit"] == "abc123"
    assert env["hardware"]["usable_cores"] == len(env["hardware"]["affinity"]) >= 1
    assert env["versions"]["torch"] == torch.__version__
    assert env["versions"]["pillow"]["flavour"] in ("pillow", "pillow-simd")


class _ScriptedSource:
    """A batch source whose every ``next()`` takes ``delay_s``, with a DataLoader's settings under
    ``.loader`` (never iterated: it only gives ``num_workers`` and ``prefetch_factor``). Real workers
    made this test time-sensitive: on a busy 2-core machine their batches arrived late at random."""

    def __init__(self, workers: int, prefetch: int, delay_s: float) -> None:
        self.loader = torch.utils.data.DataLoader(range(8), num_workers=workers, prefetch_factor=prefetch)
        self.delay_s = delay_s

    def __iter__(self):
        import time

        i = 0
        while True:
            if self.delay_s:
                time.sleep(self.delay_s)
            yield torch.tensor([float(i)])
            i += 1


def test_run_folder_names_follow_the_scheme(monkeypatch, tmp_path):
    def env(gpu: str | None, usable: int = 16, total: int = 16, commit: str = "894df79c0ffee") -> dict:
        return {"date": "2026-12-06T10:00:00+00:00", "commit": commit,
                "hardware": {"gpu": {"available": gpu is not None, **({"name": gpu} if gpu else {})},
                             "usable_cores": usable, "cpu_count": total}}

    assert H.run_folder_name(["bench_classification"], env("NVIDIA H100 80GB HBM3")) \
        == "20261206-894df79-classification-h100"
    assert H.run_folder_name(["yolo_trainer"], env("NVIDIA H200", usable=8)) == "20261206-894df79-yolo-trainer-8cores-h200"
    assert H.run_folder_name(["yolo_worker_stages"], env(None, 2, 2)) == "20261206-894df79-worker-stages-cpu"
    assert H.run_folder_name(["yolo_gap", "bench_classification"], env("NVIDIA H200", commit="ac2f6e9+threads")) \
        == "20261206-ac2f6e9-classification+yolo-gap-h200"
    assert H.run_folder_name(["overhead", "classification", "transforms", "yolo"], env("NVIDIA H200")) \
        == "20261206-894df79-gpu-suite-h200"
    assert H.run_folder_name(["classification"], env(None, commit="unknown")) == "20261206-unknown-classification-cpu"
    assert [H.gpu_tag(env(name)) for name in ("NVIDIA GeForce RTX 4090", "NVIDIA A100-SXM4-40GB", "Tesla T4")] \
        == ["rtx4090", "a100", "t4"]
    with pytest.raises(ValueError, match="at least one benchmark"):
        H.bench_tag([])
    # a script run without --out writes there
    monkeypatch.setattr(H, "RESULTS_DIR", tmp_path)
    path = H.write_result(None, "bench_overhead", [H.row_of("plain", [1.0, 2.0])], config={},
                          env=env("NVIDIA H100 80GB HBM3", usable=8))
    assert path == tmp_path / "20261206-894df79-overhead-8cores-h100" / "bench_overhead.json"
    assert json.loads(path.read_text())["rows"][0]["name"] == "plain"


def test_harness_prints_this_machines_folder_name(capsys):
    assert H._main(["--folder-name", "bench_yolo", "yolo_gap"]) == 0
    name = capsys.readouterr().out.strip()
    assert name == H.run_folder_name(["yolo", "yolo_gap"]) and "-yolo+yolo-gap" in name


def test_window_drains_the_ready_queue_of_a_data_bound_loader_only():
    # data-bound: every next() waits (the queue is empty): the drain stops at the second wait
    cand = H.Candidate("slow", lambda: _ScriptedSource(2, 2, delay_s=0.02), lambda b: None, min_discard=0)
    w = cand.window(None, min_steps=2, min_seconds=0.0, max_seconds=5.0)
    assert cand.discard == cand.drain_max == 4
    assert w.discarded == cand.discard + 2, w  # stopped at the second wait within a round
    cand.close()
    # compute-bound: batches are always ready: drained to the cap
    cand = H.Candidate("fast", lambda: _ScriptedSource(2, 4, delay_s=0.0), lambda b: None, min_discard=0)
    w = cand.window(None, min_steps=2, min_seconds=0.0, max_seconds=5.0)
    assert cand.discard == cand.drain_max == 8
    assert w.discarded == cand.discard + cand.drain_max, w
    cand.close()
    # no workers: nothing to drain
    cand = H.Candidate("replay", lambda: H.replay(torch.zeros(2)), lambda b: None, count=lambda b: 2)
    assert cand.window(None, min_steps=2, min_seconds=0.0).discarded == cand.discard == 2


def test_settle_waits_at_most_its_limit():
    import time

    t0 = time.perf_counter()
    waited = H.settle(max_s=0.6, busy_cores=0.0)  # never quiet enough: waits the whole limit
    assert 0.5 <= waited <= time.perf_counter() - t0 < 2.0
    assert H.settle(max_s=5.0, busy_cores=1e9) < 1.0  # always quiet: returns after one interval


def test_yolo_decide_settle_replays_decisions_with_longer_warm_up():
    from benchmarks.bench_yolo_decide import merged, ramp, replay, trials_of

    assert trials_of([1, 2, 3, 4, 5], 2) == [] and trials_of([1, 2, 3, 4], 2) == [[1, 2], [3, 4]]
    assert merged([100, 200, 200, 400, 400], skip=1, merge=2, keep=3) == [200.0, 400.0]
    assert merged([100.0, 300.0], skip=0, merge=2, keep=1) == [150.0]  # equal steps: harmonic mean
    # every trial starts slow (a 0.5x first window), then settles: CPU at 500, GPU at 600 (+20%)
    cpu_trial, gpu_trial = [250, 500, 500, 500], [300, 600, 600, 600]
    decision = {"cpu_windows": cpu_trial * 2, "gpu_windows": gpu_trial * 2, "order": ["cpu", "gpu", "cpu", "gpu"]}
    assert ramp([decision], 4) == [0.5, 1.0, 1.0, 1.0]
    replayed = replay([decision], per_trial=4, merge=1, keep=3)
    assert [r["skip_windows"] for r in replayed] == [0, 1]
    current, longer = replayed
    assert current["median_noise"] == 0.25 and current["kept"] == 0  # the slow window is half the noise
    assert longer["median_noise"] == 0.0 and longer["kept"] == 1 and longer["median_gain"] == 0.2


def test_yolo_gap_row_selection_prefixes_commas_and_whole_names():
    from types import SimpleNamespace

    from benchmarks.bench_yolo_gap import _on_device, select, worker_deltas

    names = ["limit (replayed pinned batch)", "default (ultralytics, workers=8)", "default, shared slots",
             "default, shared slots, not page-locked", "12 workers", "loader alone: 12 workers"]
    cands = [SimpleNamespace(name=n) for n in names]
    pick = lambda rows: [c.name for c in select(cands, rows)]  # noqa: E731
    assert pick("default,_shared") == [names[0], names[2], names[3]]
    assert pick("default,_shared_slots$") == [names[0], names[2]]
    assert pick("12_workers,loader_alone") == [names[0], names[4], names[5]]
    with pytest.raises(SystemExit, match="matches no row"):
        select(cands, "nothing_like_it")
    # children's counters: deltas summed, a child that appeared counts from zero, none negative
    before = {1: (1.0, 0.5, 10, 0), 2: (2.0, 0.0, 5, 1)}
    after = {1: (1.5, 0.75, 30, 0), 2: (2.0, 0.0, 5, 1), 3: (0.25, 0.25, 7, 2)}
    assert worker_deltas(before, after) == (0.75, 0.5, 27, 2)
    # only device events count as device time (a host operation's own device time repeats its kernels')
    from torch.autograd import DeviceType

    assert _on_device(SimpleNamespace(device_type=DeviceType.CUDA))
    assert not _on_device(SimpleNamespace(device_type=DeviceType.CPU)) and not _on_device(SimpleNamespace())


def test_yolo_gap_tracing_keeps_going_past_a_failing_row_and_stops_at_its_budget(monkeypatch):
    from types import SimpleNamespace

    import benchmarks.bench_yolo_gap as gap

    closed, written = [], []

    def fake_profile(cand, device, steps, stacks=False):
        if cand.name == "bad":
            raise RuntimeError("boom")
        return {"steps": steps}

    monkeypatch.setattr(gap, "torch_profile", fake_profile)
    cands = [SimpleNamespace(name=n, close=lambda n=n: closed.append(n)) for n in ("a", "bad", "c")]
    out = gap.trace_rows(cands, torch.device("cpu"), 3, False, 60.0, {}, on_row=lambda: written.append(1))
    assert out == {"a": {"steps": 3}, "bad": {"error": "RuntimeError: boom"}, "c": {"steps": 3}}
    assert closed == ["a", "bad", "c"] and len(written) == 3
    closed.clear()
    out = gap.trace_rows(cands, torch.device("cpu"), 3, False, 0.0, {})  # no time: every row skipped, all closed
    assert all("tracing budget ran out" in v["skipped"] for v in out.values()) and closed == ["a", "bad", "c"]


def test_yolo_gap_intra_op_threads_are_set_for_the_block_and_restored():
    from benchmarks.bench_yolo_gap import _IntraOpThreads

    before = torch.get_num_threads()
    with _IntraOpThreads(1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
    with pytest.raises(RuntimeError, match="inside"):
        with _IntraOpThreads(1):
            raise RuntimeError("inside")
    assert torch.get_num_threads() == before
    with _IntraOpThreads(None):  # no row setting: untouched
        assert torch.get_num_threads() == before


# --------------------------------------------------------------------------------------------------
# the scripts, end to end on the CPU


NAMES = ("bench_classification", "bench_yolo", "bench_transforms", "bench_overhead", "bench_yolo_gap", "bench_batch_size",
         "bench_yolo_decide", "bench_yolo_trainer")


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """Run the scripts once (quick, CPU); returns {name: parsed JSON or the failure}."""
    base = tmp_path_factory.mktemp("bench")
    out = base / "out"
    env = {**os.environ, "PIPELINE_OPT_CACHE": str(base / "cache"), "PO_COMMIT": "smoke-test",
           "YOLO_CONFIG_DIR": str(base / "yolo_cfg"), "CUDA_VISIBLE_DEVICES": ""}
    found = {}
    for name in NAMES:
        # bench_yolo runs its restricted-cores part as `--cores 1` directly (the child mode), which
        # exercises the same code as the child process at half the cost
        extra = {"bench_yolo": ["--cores", "1"], "bench_yolo_gap": ["--torch-profile", "2", "--profile-stacks",
                                                                   "--profile-budget-s", "900"],
                 "bench_yolo_decide": ["--steps", "2,3", "--repeats", "1"]}.get(name, [])
        proc = subprocess.run([sys.executable, "-m", f"benchmarks.{name}", "--quick", "--device", "cpu",
                               "--out", str(out), *extra], cwd=REPO, env=env, capture_output=True, text=True,
                              timeout=300)
        path = out / f"{name}.json"
        found[name] = (json.loads(path.read_text()) if proc.returncode == 0 and path.exists()
                       else f"rc={proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    found["_out"] = out
    return found




@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_script_writes_complete_json(results, name):
    res = results[name]
    assert isinstance(res, dict), res
    assert res["benchmark"] == name and res["commit"] == "smoke-test" and res["date"]
    hw, versions = res["env"]["hardware"], res["env"]["versions"]
    assert {"gpu", "cpu_count", "affinity", "cpu_model"} <= hw.keys()
    assert {"python", "torch", "torchvision", "kornia", "ultralytics", "pillow"} <= versions.keys()
    assert res["rows"], f"no measured row; not measured: {res['not_measured']}"
    for row in res["rows"]:
        s = row["stats"]
        assert row["throughput"] > 0 and s["min"] > 0, row["name"]
        assert s["min"] <= s["median"] <= s["max"] and s["n"] == len(row["samples"]) >= 1
    for row in res["not_measured"]:
        assert row["status"] in ("skipped", "failed", "missing") and row["reason"], row


@pytest.mark.slow
def test_classification_rows_and_ratios(results):
    res = results["bench_classification"]
    names = [r["name"] for r in res["rows"]]
    assert names[0].startswith("limit") and names[1].startswith("default")
    assert any(n.startswith("grid") for n in names)
    assert res["rows"][0]["efficiency"] == 1.0
    assert {"autotune_vs_grid_best", "autotune_vs_default", "autotune_vs_limit", "targets"} <= res["summary"].keys()
    every = {r["name"]: r for r in res["rows"] + res["not_measured"]}
    for decode in ("pil", "draft", "nvjpeg"):
        assert any(n.endswith(f"decode={decode}") for n in every), f"no grid row for decode={decode}"
    pinned = [r for n, r in every.items() if "pin=on" in n]
    assert pinned and all(r["status"] == "skipped" and "CUDA" in r["reason"] for r in pinned)


@pytest.mark.slow
def test_yolo_has_both_core_settings(results):
    res = results["bench_yolo"]
    every = [r["name"] for r in res["rows"] + res["not_measured"]]
    assert every and all(n.endswith("@1 cores") for n in every)
    assert res["rows"][0]["name"].startswith("limit")
    assert "default + shared slots @1 cores" in every
    assert res["env"]["hardware"]["usable_cores"] == 1, "--cores 1 must restrict the CPU affinity"
    assert "1 cores" in res["summary"]


def test_yolo_trainer_row_selection_keeps_the_table_order_and_names_bad_keys():
    from benchmarks.bench_yolo_trainer import ROWS, selected_rows

    assert selected_rows(None) == list(ROWS)
    assert selected_rows("slots, limit") == ["limit: trainer on one replayed batch",
                                             "trainer, GPU HSV/flip + shared slots"]
    with pytest.raises(SystemExit, match="unknown \\['gpus'\\]"):
        selected_rows("limit,gpus")
    assert selected_rows("slots_warp_ram,slots") == ["trainer, GPU HSV/flip + shared slots",
                                                     "trainer, GPU HSV/flip/warp + shared slots, cache='ram'"]


def test_yolo_trainer_names_runs_that_moved_other_stages_than_their_row_says():
    from benchmarks.bench_yolo_trainer import SLOTS_ROW, WARP_ROW, caveats

    base = {"throughput": 1.0, "gpu_augment_applied": True, "shared_slots": {"applied": True}}
    right = ["RandomHSV", "RandomFlip(horizontal)"]
    assert caveats({SLOTS_ROW: [{**base, "moved_to_device": right}]}) == []
    assert caveats({WARP_ROW: [{**base, "moved_to_device": [*right, "RandomPerspective"]}]}) == []
    (only,) = caveats({WARP_ROW: [{**base, "moved_to_device": right}]})  # the warp stayed in the workers
    assert only.startswith(WARP_ROW) and "1 of 1 runs" in only
    (cache,) = caveats({SLOTS_ROW: [{**base, "moved_to_device": right, "image_cache": "ram"}]})
    assert "the image cache was not None in 1 of 1 runs" in cache


def test_yolo_trainer_names_rows_above_the_limit_beyond_the_spread():
    from benchmarks.bench_yolo_trainer import limit_caveats

    vs_limit = {"gpu": 0.98, "slots": 1.13, "cpu": None}
    # one run per row: any row above the limit is named
    (only,) = limit_caveats(vs_limit, spread=None, repeated=False)
    assert only.startswith("slots read 1.13x the limit row") and "--rounds 3" in only
    # repeated runs: only beyond the largest spread
    assert limit_caveats(vs_limit, spread=0.2, repeated=True) == []
    assert [c.split()[0] for c in limit_caveats(vs_limit, spread=0.1, repeated=True)] == ["slots"]


@pytest.mark.slow
def test_yolo_trainer_rows_trained_what_they_say(results):
    from benchmarks.bench_yolo_trainer import limit_caveats

    res = results["bench_yolo_trainer"]
    rows = {r["name"]: r for r in res["rows"]}
    assert set(rows) == {"limit: trainer on one replayed batch", "trainer, CPU augmentation", "trainer, GPU HSV/flip",
                         "trainer, GPU HSV/flip + shared slots",
                         "trainer, GPU HSV/flip/warp + shared slots",
                         "trainer, GPU HSV/flip/warp + shared slots, cache='ram'"}
    assert set(res["summary"]["vs_limit"]) == set(rows) - {"limit: trainer on one replayed batch"}
    assert all(v > 0 for v in res["summary"]["vs_limit"].values())
    # every row applied what it names; the only caveats allowed are rows above the (noisy) limit
    above_limit = limit_caveats(res["summary"]["vs_limit"], res["summary"]["largest_spread"], repeated=False)
    assert res["summary"]["caveats"] == above_limit
    (slots_run,) = rows["trainer, GPU HSV/flip + shared slots"]["meta"]["runs"]
    assert slots_run["shared_slots"]["applied"] and slots_run["shared_slots"]["stats"]["slotted"] > 0
    # the traced step after the window says where the training thread's CPU went
    assert slots_run["traced_steps"] >= 1 and slots_run["top_cpu_ops"][0]["self_cpu_s"] > 0
    (cpu_run,) = rows["trainer, CPU augmentation"]["meta"]["runs"]
    assert not cpu_run["gpu_augment_applied"] and not cpu_run["shared_slots"]["applied"]
    assert cpu_run["moved_to_device"] == []
    assert set(slots_run["moved_to_device"]) == {"RandomHSV", "RandomFlip(horizontal)"}
    (warp_run,) = rows["trainer, GPU HSV/flip/warp + shared slots"]["meta"]["runs"]
    assert set(warp_run["moved_to_device"]) == {"RandomHSV", "RandomFlip(horizontal)", "RandomPerspective"}
    assert res["summary"]["cache_ram_vs_decoding_workers"] > 0
    (ram_run,) = rows["trainer, GPU HSV/flip/warp + shared slots, cache='ram'"]["meta"]["runs"]
    assert set(ram_run["moved_to_device"]) == set(warp_run["moved_to_device"])
    assert ram_run["image_cache"] == "ram" and warp_run["image_cache"] is None
    assert res["summary"]["slots_gain_beyond_spread"] is None  # one run per row: no verdict
    assert set(res["summary"]["feature_verdicts"]) == {"shared slots"}
    assert all("no verdict" in v for v in res["summary"]["feature_verdicts"].values())


@pytest.mark.slow
def test_transforms_reports_the_pillow_flavour(results):
    res = results["bench_transforms"]
    flavour = res["env"]["versions"]["pillow"]["flavour"]
    assert any(r["name"].startswith(f"cpu decode {flavour}") for r in res["rows"])
    assert set(res["summary"]) == {"normalize", "resize", "hsv", "flip", "affine", "pillow_simd", "fused"}
    assert {"colour+flips", "colour+flips (torch ops)", "hsv (torch ops)"} <= {r["meta"].get("op") for r in res["rows"]}


def test_pillow_simd_rows_come_from_a_child_importing_the_given_site(tmp_path):
    """A site directory without Pillow-SIMD gives a skipped row that says what it held; the summary
    pairs the two flavours' rows op by op."""
    from benchmarks import bench_transforms as T

    rows = T.other_pillow_rows(T.QUICK, str(tmp_path), quick=True)
    assert len(rows) == 1 and rows[0].status == "skipped" and "not Pillow-SIMD" in rows[0].reason
    stock = T._decode_row("decode", [0.01, 0.01, 0.012], T.QUICK, "pillow")
    simd = T._decode_row("decode", [0.005, 0.005, 0.006], T.QUICK, "pillow-simd")
    assert T.pillow_summary([stock, simd])["decode"]["simd_vs_stock"] == pytest.approx(2.0)
    assert T.pillow_summary([stock]) == {}


@pytest.mark.slow
def test_overhead_compares_against_plain(results):
    res = results["bench_overhead"]
    assert res["rows"][0]["name"] == "plain" and res["rows"][0]["vs_plain"] == 1.0


@pytest.mark.slow
def test_summary_table_and_ledger(results, tmp_path):
    out = results["_out"]
    ledger = tmp_path / "ledger.jsonl"
    assert H._main([str(out), "--ledger", str(ledger)]) == 0
    md = (out / "results.md").read_text()
    assert all(f"### {n}" in md for n in NAMES if isinstance(results[n], dict))
    if H.optional("pipeline_opt.report.ledger", "append"):
        lines = [json.loads(x) for x in ledger.read_text().splitlines()]
        assert lines and all(x["throughput"] > 0 and x["commit"] == "smoke-test" for x in lines)


@pytest.mark.slow
def test_yolo_decide_rows_and_decisions(results):
    res = results["bench_yolo_decide"]
    assert [r["name"] for r in res["rows"]] == ["CPU HSV/flip, windows of 2 steps", "GPU HSV/flip, windows of 2 steps",
                                                "CPU HSV/flip, windows of 3 steps", "GPU HSV/flip, windows of 3 steps"]
    decisions = res["summary"]["decisions"]
    assert [d["steps"] for d in decisions] == [2, 3]
    for d, rows in zip(decisions, (res["rows"][:2], res["rows"][2:])):
        assert d["order"] == ["cpu", "gpu", "cpu", "gpu"] and d["wall_s"] > 0 and d["verdict"]
        assert rows[0]["stats"]["n"] == len(d["cpu_windows"]) > 0 and rows[1]["stats"]["n"] == len(d["gpu_windows"]) > 0
    assert res["summary"]["kept"] == {str(s): [sum(d["applied"] for d in decisions if d["steps"] == s), 1] for s in (2, 3)}
    settle = res["summary"]["settle"]  # 3 windows per trial, none merged: the replay without a skip is the decision
    assert settle["windows_per_trial"] == 3 and len(settle["ramp"]) == 3
    [same] = settle["replayed"]
    assert same["skip_windows"] == 0 and same["decisions"] == len(decisions)
    for d, v in zip(decisions, same["verdicts"]):
        assert v["applied"] == d["applied"] and abs(v["gain"] - d["gain"]) < 1e-3


def _children_cores(row: dict) -> float:
    """Median over a row's windows of the CPU cores its child processes used (user + system)."""
    import statistics

    cores = [(w["user_ms_per_batch"] + w["sys_ms_per_batch"]) * (win["steps"] + win["discarded"]) / 1e3
             / win["seconds"] for w, win in zip(row["meta"]["workers_per_window"], row["windows"], strict=True)]
    return statistics.median(cores)


def test_yolo_gap_rows_and_cpu_load(results):
    res = results["bench_yolo_gap"]
    names = [r["name"] for r in res["rows"]]
    assert names[0].startswith("limit (replayed") and names[1].startswith("replay of 3 distinct")
    assert names[2].startswith("limit + 1 CPU-busy")
    assert {"cache=ram", "cache=ram + GPU HSV/flip", "default, GIL switch 0.2 ms", "default, pin_memory=False",
            "default + GPU HSV/flip (fused kernel)", "default + GPU HSV/flip, torch ops",
            "2 workers + GPU HSV/flip (fused kernel)", "default + GPU HSV/flip (fused), 1 intra-op thread"} <= set(names)
    one = next(r for r in res["rows"] if r["name"].endswith("1 intra-op thread"))
    assert one["throughput"] > 0 and one["meta"]["intra_op_threads"] == 1
    busy = res["summary"]["busy cores"]
    assert all(v is not None and v >= 0 for v in busy.values()), busy
    # the busy processes (children of the benchmark) run during their row's windows, and are stopped
    # for the others; measured by the children's own CPU time, which other load on the machine
    # does not add to (the machine-wide busy cores it does)
    by_name = {r["name"]: r for r in res["rows"]}
    quiet = _children_cores(by_name[names[0]])
    for loaded in (names[2], "limit + 1 dataset processes"):
        assert _children_cores(by_name[loaded]) > quiet + 0.3, (loaded, _children_cores(by_name[loaded]), quiet)
    drained = next(r for r in res["rows"] if r["name"].startswith("ring + loader drained"))
    assert drained["throughput"] > 0 and "drops one batch" in drained["meta"]["what"]
    per_step = res["summary"]["train thread CPU s/step"]
    assert all(v is not None and v > 0 for v in per_step.values()), per_step
    # --torch-profile 2 --profile-stacks: every row traced, its ops attributed to a thread and a call site
    traced = res["summary"]["torch_profile"]
    assert set(traced) == set(names), set(names) ^ set(traced)
    for name, prof in traced.items():
        assert "error" not in prof, (name, prof)
        assert prof["steps"] == 2 and prof["wall_ms_per_step"] > 0 and prof["cpu_ms_per_step"] > 0
        assert prof["device_ms_per_step"] == 0  # no device on the CPU: no kernel counted
        assert prof["top_cpu"] and all(ms >= 0 and calls > 0 for _, ms, calls in prof["top_cpu"])
        sites = [site for _, _, _, site in prof["top_cpu_by_stack"]]
        assert sites and all(site.startswith("[thread ") for site in sites)
    gpu_step = traced["limit + GPU HSV/flip (fused kernel)"]["top_cpu_by_stack"]
    assert any("ultralytics/_step.py" in site for *_, site in gpu_step), gpu_step
    slots = next(r for r in res["rows"] if r["name"] == "default, shared slots")
    assert slots["throughput"] > 0 and "slot_stats" in slots["meta"]
    assert slots["meta"]["slot_stats"]["worker_fetch_ms_per_batch"] > 0
    placed = {r["name"]: r for r in res["rows"] if r["name"].startswith("default + GPU HSV/flip")}
    assert placed["default + GPU HSV/flip (fused), workers nice 10"]["meta"]["worker_nice"] == 10
    off = next(r for n, r in placed.items() if "workers off" in n)
    assert off["meta"]["worker_cores"] and off["meta"]["reserved_cores"] and off["throughput"] > 0
    for n in ("default + GPU HSV/flip (fused), shared slots", "default + GPU HSV/flip + affine, shared slots"):
        assert placed[n]["throughput"] > 0 and placed[n]["meta"]["slot_stats"]["slotted"] > 0, n
    affine = placed["default + GPU HSV/flip + affine (gpu_affine)"]
    assert affine["throughput"] > 0 and "RandomPerspective" in affine["meta"]["cpu_stages_disabled"]
    timed = next(r for r in res["rows"] if r["name"] == "default, workers timed")
    assert timed["meta"]["worker_stats"]["batches"] > 0 and timed["meta"]["worker_stats"]["worker_fetch_ms_per_batch"] > 0
    # more workers, and the loader without a training step (its delivery rate)
    assert {"2 workers", "2 workers, shared slots", "loader alone: default (workers=1)", "loader alone: 2 workers",
            "loader alone: default, shared slots", "loader alone: 2 workers, shared slots"} <= set(names)
    alone = next(r for r in res["rows"] if r["name"] == "loader alone: default (workers=1)")
    default = next(r for r in res["rows"] if r["name"].startswith("default (ultralytics"))
    assert alone["throughput"] > default["throughput"], (alone["throughput"], default["throughput"])
    # the workers' CPU per batch, per window, for the rows whose workers run
    per_window = default["meta"]["workers_per_window"]
    assert len(per_window) == default["stats"]["n"]
    assert sum(w["user_ms_per_batch"] + w["sys_ms_per_batch"] for w in per_window) > 0, per_window
    course = res["summary"]["timecourse"]
    assert course["throughput"] and len(course["throughput"]) == len(course["data_wait_frac"])
    assert sum(course["throughput"]) > 0
    gpu_row = next(r for r in res["rows"] if r["name"] == "cache=ram + GPU HSV/flip")
    assert "RandomHSV" in gpu_row["meta"]["cpu_stages_disabled"]


def test_yolo_worker_stages_times_each_stage(tmp_path):
    from benchmarks.yolo_worker_stages import main

    assert main(["--out", str(tmp_path), "--samples", "20", "--images", "64", "--runs", "2",
                 "--loader-batches", "2", "--loader-warmup", "1", "--workers", "1"]) == 0
    record = json.loads((tmp_path / "yolo_worker_stages.json").read_text())
    assert set(record["runs"]) == {"default"} and len(record["runs"]["default"]) == 2
    ms = record["medians_ms"]["default"]
    assert ms["getitem"] > 0 and 0 < ms["pre:Mosaic"] < ms["getitem"] and ms["load_image"] > 0
    assert ms["loader_img_s"] > 0


def test_classification_training_pipeline_grid_replays_on_the_device_and_drops_draft():
    from dataclasses import replace

    from benchmarks.bench_classification import QUICK, cpu_compose, grid_points

    train = replace(QUICK, pipeline="train")
    decodes = {p.decode for p in grid_points(train, cores=2)}
    assert decodes == {"replay", "replay-thread", "pil"}
    assert all(p.offload for p in grid_points(train, cores=2) if p.decode.startswith("replay"))
    assert all(p.pin for p in grid_points(train, cores=2) if p.decode.endswith("-thread"))
    assert type(cpu_compose(32, "train").transforms[0]).__name__ == "RandomResizedCrop"
    assert {p.decode for p in grid_points(QUICK, cores=2)} == {"nvjpeg", "nvjpeg-thread", "draft", "pil"}


def test_classification_reference_recipe_is_replayed_on_the_device(tiny_image_folder):
    """torchvision's reference recipe (TrivialAugmentWide, RandomErasing) gets the replay grid, and the
    plan autotune would use accepts it: the policy's draws in the workers, its pixels on the device."""
    from dataclasses import replace

    import torchvision

    from benchmarks.bench_classification import QUICK, cpu_compose, grid_points
    from pipeline_opt.loading.random_plan import plan_random_gpu_pipeline

    pytest.importorskip("kornia")
    tvref = replace(QUICK, pipeline="tvref")
    assert {p.decode for p in grid_points(tvref, cores=2)} == {"replay", "replay-thread", "pil"}
    names = [type(t).__name__ for t in cpu_compose(32, "tvref").transforms]
    assert names[2] == "TrivialAugmentWide" and names[-1] == "RandomErasing"
    dataset = torchvision.datasets.ImageFolder(str(tiny_image_folder), transform=cpu_compose(32, "tvref"))
    plan, why = plan_random_gpu_pipeline(dataset)
    assert plan is not None and "TrivialAugmentWide" in plan.moved, why


def test_classification_names_the_grid_row_of_autotunes_configuration():
    from benchmarks import harness as H
    from benchmarks.bench_classification import grid_point_of, summarize

    config = {"num_workers": 2, "pin_memory": True, "gpu_transforms": [], "decode": "nvjpeg", "decode_thread": True}
    assert grid_point_of(config).name == "grid nw=2  pin=on  offload=on  decode=nvjpeg-thread"
    assert grid_point_of(config, "train").name.endswith("decode=replay-thread")
    draft = {"num_workers": 15, "pin_memory": False, "gpu_transforms": ["ToFloat", "Normalize"], "decode": "draft"}
    assert grid_point_of(draft).name == "grid nw=15 pin=off offload=on  decode=draft"
    assert grid_point_of({**config, "shared_slots": True}) is None and grid_point_of(None) is None

    def row(name, *values):
        return H.Row(name, stats=H.summarize(list(values)), samples=values)

    finals = [row("limit (device-resident replay)", 3600.0), row("default (nw=4, CPU transforms)", 300.0),
              row("final: grid nw=4  pin=on  offload=on  decode=nvjpeg-thread", 3100.0),
              row("final: " + grid_point_of(config).name, 3000.0), row("autotune", 2700.0)]
    out = summarize(finals, finals, [], {"config": config, "speedup_reported": 9.0}, 0.05, 0.0)
    assert out["autotune_vs_grid_best"] == pytest.approx(2700 / 3100)
    assert out["autotune_config_in_grid"]["row"].endswith("nw=2  pin=on  offload=on  decode=nvjpeg-thread")
    assert out["autotune_config_in_grid"]["vs_grid_best"] == pytest.approx(3000 / 3100)
    other = summarize(finals, finals, [], {"config": {**config, "num_workers": 3}}, 0.05, 0.0)
    assert other["autotune_config_in_grid"] is None  # no grid point with 3 workers


def test_classification_grid_point_decoding_in_a_thread_builds_a_threaded_loader(tmp_path):
    from benchmarks.bench_classification import QUICK, Point, build_source
    from pipeline_opt.datasets import make_image_folder

    root = make_image_folder(n_images=16, size=(64, 48), num_classes=2, root=tmp_path / "imgs")
    for decode in ("nvjpeg-thread", "nvjpeg"):
        source = build_source(root, QUICK, Point(1, False, True, decode), torch.device("cpu"))
        assert source.prepare_in_thread == decode.endswith("-thread")
        images, labels = next(iter(source))
        assert images.shape == (QUICK.batch, 3, QUICK.crop, QUICK.crop) and images.dtype == torch.float32


def test_the_true_batch_limit_is_found_by_doubling_then_bisection():
    from benchmarks.bench_batch_size import QUICK, Workload, true_limit
    from benchmarks.harness import Deadline

    MiB = 1 << 20

    class Fake:  # a step's peak is 1000 MiB + 10 MiB a sample; past 3400 MiB it runs out of memory
        released = 0

        def reset_peak(self):
            self.peak = 0

        def release(self):
            self.released += 1

        def peaks(self):
            return self.peak, self.peak

        def step(self, model, batch):
            need = 1000 * MiB + 10 * MiB * batch.shape[0]
            if need > 3400 * MiB:
                raise RuntimeError("CUDA out of memory. Tried to allocate")
            self.peak = need
            model(batch).sum().backward()

    fake, model = Fake(), torch.nn.Linear(4, 1)
    before = [p.detach().clone() for p in model.parameters()]
    work = Workload("fake", None, model, fake.step)
    got = true_limit(work, lambda n: torch.ones(n, 4), 32, torch.device("cpu"), QUICK, Deadline(60), memory=fake)
    # 32 64 128 fit, 256 does not; bisection closes in on 240 (the last size within 3400 MiB)
    assert [n for n, _ in got["probes"][:4]] == [32, 64, 128, 256] and got["complete"]
    assert 240 - max(1, int(0.02 * 240)) <= got["fits"] <= 240 < got["fails"]
    assert got["peak_bytes"] == 1000 * MiB + 10 * MiB * got["fits"]
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))  # the model is restored
    assert fake.released >= len(got["probes"])  # the allocator's cache released before every probe


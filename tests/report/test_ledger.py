"""The baseline ledger: parsing benchmark results, appending, reading back, comparing commits."""

from __future__ import annotations

import pytest

from pipeline_opt.report import ledger as L

RESULT = {
    "benchmark": "bench_classification", "git_commit": "aaa111", "date": "2025-01-01T00:00:00+00:00",
    "model": "resnet50", "batch": 128, "resolution": 224, "ddp": False, "amp": "bf16",
    "rows": [
        {"name": "limit", "throughput": 4300.0, "spread": 0.02},
        {"name": "default", "throughput": 180.0, "spread": 0.05, "top_cpu_op": "aten::copy_"},
        {"name": "autotune", "img_per_s": 2500.0, "spread": 0.10, "efficiency": 0.58, "batch_size": 64},
    ],
}


def _with(throughputs: dict[str, float], commit: str) -> dict:
    rows = [dict(r, throughput=throughputs.get(r["name"], r.get("throughput", 2500.0))) for r in RESULT["rows"]]
    for r in rows:
        r.pop("img_per_s", None)
    return dict(RESULT, git_commit=commit, rows=rows)


def test_rows_from_result_merges_top_level_and_row_fields():
    rows = L.rows_from_result(RESULT)
    assert [r.config for r in rows] == ["limit", "default", "autotune"]
    assert all(r.commit == "aaa111" and r.model == "resnet50" and r.amp == "bf16" for r in rows)
    assert rows[2].throughput == 2500.0 and rows[2].batch == 64 and rows[0].batch == 128
    assert rows[1].top_cpu_op == "aten::copy_" and rows[2].efficiency == 0.58


def test_result_without_rows_is_one_row_and_commit_defaults():
    [row] = L.rows_from_result({"throughput": 10.0}, benchmark="bench_overhead", commit="c0ffee")
    assert (row.benchmark, row.commit, row.config, row.throughput) == ("bench_overhead", "c0ffee", "default", 10.0)
    assert row.date  # filled with now


def test_missing_throughput_is_a_clear_error():
    with pytest.raises(ValueError, match="no throughput"):
        L.rows_from_result({"rows": [{"name": "x"}]})
    with pytest.raises(TypeError):
        L.rows_from_result([1, 2])


@pytest.mark.parametrize("suffix", [".jsonl", ".csv"])
def test_append_and_read_round_trip(tmp_path, suffix):
    path = tmp_path / f"ledger{suffix}"
    first = L.rows_from_result(RESULT)
    L.append(first, path)
    L.append(L.rows_from_result(_with({}, "bbb222")), path)
    back = L.read(path)
    assert len(back) == 6
    assert back[:3] == first
    assert path.read_text().count("bench_classification") == 6
    if suffix == ".csv":
        assert path.read_text().splitlines()[0].split(",") == list(L.COLUMNS)


def test_bad_ledger_suffix_and_missing_file(tmp_path):
    with pytest.raises(ValueError, match=r"\.jsonl or \.csv"):
        L.append([], tmp_path / "ledger.txt")
    with pytest.raises(FileNotFoundError, match="pipeline-opt bench"):
        L.read(tmp_path / "none.jsonl")


def test_compare_flags_only_drops_beyond_noise(tmp_path):
    path = tmp_path / "ledger.jsonl"
    L.append(L.rows_from_result(RESULT), path)
    # limit -1% (noise 2%): ok; default -20% (noise 5%): regressed; autotune +4%: ok
    L.append(L.rows_from_result(_with({"limit": 4257.0, "default": 144.0, "autotune": 2600.0}, "bbb222")), path)
    rows = L.read(path)
    comps = {c.key[1]: c for c in L.compare(L.select(rows, "aaa"), L.select(rows, "bbb222"))}
    assert set(comps) == {"limit", "default", "autotune"}
    assert [name for name, c in comps.items() if c.regressed] == ["default"]
    assert comps["default"].change == pytest.approx(-0.2)
    assert comps["default"].noise == pytest.approx(0.05)
    table = L.comparison_table(list(comps.values()), "aaa", "bbb")
    assert "REGRESSED" in table and "bench_classification/default" in table


def test_select_keeps_latest_row_per_config():
    rows = L.rows_from_result(RESULT) + L.rows_from_result(_with({"limit": 1.0}, "aaa111"))
    chosen = {r.config: r.throughput for r in L.select(rows, "aaa111")}
    assert chosen["limit"] == 1.0
    assert L.select(rows, "zzz") == []


def test_rows_with_different_batch_are_not_compared():
    a = L.rows_from_result(RESULT)
    b = [r.__class__(**{**r.to_dict(), "batch": 256, "commit": "b"}) for r in a]
    assert L.compare(a, b) == []

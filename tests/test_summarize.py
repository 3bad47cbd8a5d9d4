"""benchmarks/summarize.py: RESULTS.md generated from the committed result JSON, and kept current.

(a) the generator on a tiny synthetic results folder: tables, ratios, "-" for keys an older JSON
lacks, date order, links and the headline; (b) the committed benchmarks/RESULTS.md is what the
generator writes now (``--check``), and the README holds the headline table it computes.
"""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks import harness as H
from benchmarks import summarize as S

REPO = Path(__file__).resolve().parents[1]
TRAINER_LIMIT = "limit: trainer on one replayed batch"


def _env(date: str, commit: str, gpu: str | None, cores: int) -> dict:
    gpu_info = {"available": gpu is not None, **({"name": gpu} if gpu else {})}
    return {"date": date, "commit": commit, "hardware": {"gpu": gpu_info, "usable_cores": cores},
            "versions": {"torch": "2.0"}}


def _result(benchmark: str, date: str, commit: str, rows, summary=None, gpu="NVIDIA H200", cores=16,
            not_measured=()) -> dict:
    return {"schema": 1, "benchmark": benchmark, "commit": commit, "date": date,
            "env": _env(date, commit, gpu, cores), "rows": [r.to_dict() for r in rows],
            "not_measured": [r.to_dict() for r in not_measured], "summary": summary or {}}


def _write(folder: Path, name: str, payload: dict) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(json.dumps(payload))


def _synthetic_results(root: Path) -> Path:
    results = root / "benchmarks" / "results"
    limit = H.row_of("limit (device-resident replay)", [1000.0, 1100.0, 900.0]).with_extra(efficiency=1.0)
    default = H.row_of("default (nw=4, CPU transforms)", [100.0, 110.0, 90.0]).with_extra(efficiency=0.1)
    auto = H.row_of("autotune", [600.0, 500.0, 700.0]).with_extra(efficiency=0.6)
    cut = H.not_run("grid nw=2 pin=on offload=on decode=pil", "skipped", "time budget | coarse pass")
    _write(results / "20260102-bbbbbbb-classification-h200", "bench_classification.json",
           _result("bench_classification", "2026-01-02T10:00:00+00:00", "bbbbbbb1234567", [limit, default, auto],
                   {"autotune_vs_default": 6.0, "autotune_vs_limit": 0.6, "autotune_info": {"x_vs_y": 9.0},
                    "targets": {"autotune >= 8x default": False}}, not_measured=[cut]))
    # an older schema: no env, no stats, no summary, a row without its spread
    _write(results / "20260101-aaaaaaa-classification-h200", "bench_classification.json",
           {"benchmark": "bench_classification", "rows": [{"name": "autotune", "throughput": 321.0}]})
    trainer_rows = [H.row_of(TRAINER_LIMIT, [1000.0, 1000.0]), H.row_of("trainer, CPU augmentation", [500.0, 500.0]),
                    H.row_of("trainer, GPU HSV/flip", [600.0, 640.0]),
                    H.row_of("trainer, GPU HSV/flip + shared slots", [800.0, 800.0])]
    _write(results / "20260103-ccccccc-yolo-trainer-16cores-h100", "bench_yolo_trainer.json",
           _result("bench_yolo_trainer", "2026-01-03T10:00:00+00:00", "ccccccc", trainer_rows,
                   {"vs_limit": {"trainer, GPU HSV/flip": 0.62}, "gpu_augment_vs_cpu": 1.24,
                    "caveats": ["one round only"]}, gpu="NVIDIA H100 80GB HBM3"))
    # a later trainer run without the CPU row does not become the headline
    _write(results / "20260104-ddddddd-yolo-trainer-16cores-h100", "bench_yolo_trainer.json",
           _result("bench_yolo_trainer", "2026-01-04T10:00:00+00:00", "ddddddd",
                   [trainer_rows[0], trainer_rows[3]], gpu="NVIDIA H100 80GB HBM3"))
    _write(results / "20260104-eeeeeee-worker-stages-cpu", "yolo_worker_stages.json",
           {"commit": "eeeeeee", "env": _env("2026-01-04T11:00:00+00:00", "eeeeeee", None, 2),
            "medians_ms": {"window": {"getitem": 1.5, "loader_img_s": 480.0}}, "runs": {"window": [{}, {}, {}]}})
    return results


def test_generator_writes_one_table_per_run_with_ratios_dashes_and_links(tmp_path):
    results = _synthetic_results(tmp_path)
    (results / "20260102-bbbbbbb-classification-h200" / "COMMIT_NOTE.md").write_text(
        "autotune missed 8x: the trace shows\n\n- 31% data wait\n")
    out = tmp_path / "benchmarks" / "RESULTS.md"
    assert S.main(["--out", str(out), "--results", str(results)]) == 0
    text = out.read_text()
    assert text.startswith("# Benchmark results\n") and "python -m benchmarks.summarize" in text

    classification = text[text.index("## bench_classification"):text.index("## bench_yolo_trainer")]
    # date order, oldest first, each run linked relative to RESULTS.md
    older, newer = "20260101-aaaaaaa-classification-h200", "20260102-bbbbbbb-classification-h200"
    assert classification.index(f"[{older}](results/{older}/)") < classification.index(f"[{newer}](results/{newer}/)")
    assert "NVIDIA H200 · 16 usable cores · commit `bbbbbbb123` · 2026-01-02T10:00:00+00:00" in classification
    assert "| row | img/s (median) | min..max | spread | n | ratio |" in classification
    assert "| limit (device-resident replay) | 1000.0 | 900..1100 | 20% | 3 | 1.00x limit |" in classification
    assert "| autotune | 600.0 | 500..700 | 33% | 3 | 0.60x limit |" in classification
    assert "| grid nw=2 pin=on offload=on decode=pil | skipped: time budget \\| coarse pass | | | | |" \
        in classification
    assert "autotune_vs_default 6.00" in classification and "x_vs_y" not in classification  # logs left out
    assert "- autotune >= 8x default: **missed**" in classification
    # a run folder's note is quoted under its own table, and only there
    note = "> autotune missed 8x: the trace shows\n>\n> - 31% data wait\n"
    assert classification.count(note) == 1
    assert classification.index("[20260102-bbbbbbb-classification-h200]") < classification.index(note)
    # the older schema: whatever is missing reads "-"
    assert "- · - usable cores · commit `-` · 2026-01-01" in classification
    assert "| autotune | 321.0 | -..- | - | - | - |" in classification

    trainer = text[text.index("## bench_yolo_trainer"):text.index("## yolo_worker_stages")]
    assert "| trainer, GPU HSV/flip | 620.0 | 600..640 | 6% | 2 | 0.62x limit |" in trainer
    assert "gpu_augment_vs_cpu 1.24" in trainer and "- caveat: one round only" in trainer
    assert "| window | 1.50 | - | - | - | - | 480 | 3 |" in text

    rows = S.headline(S.load_runs(results))
    assert [(r.spec.benchmark, r.run.folder.name) for r in rows] == [
        ("bench_classification", "20260102-bbbbbbb-classification-h200"),
        ("bench_yolo_trainer", "20260103-ccccccc-yolo-trainer-16cores-h100"),  # the 01-04 run lacks the CPU row
        ("bench_yolo_trainer", "20260103-ccccccc-yolo-trainer-16cores-h100")]
    table = S.headline_table(rows, "benchmarks/results/")
    assert ("| H200, 16 | 100 | 600 | 1,000 | 6.00x | 0.60x | 3 | 2026-01-02 | [20260102-bbbbbbb-classification-h200]"
            "(benchmarks/results/20260102-bbbbbbb-classification-h200/) |") in table
    assert "| H100, 16 | 500 | 620 | 1,000 | 1.24x | 0.62x | 2 | 2026-01-03 |" in table
    assert "| H100, 16 | 500 | 800 | 1,000 | 1.60x | 0.80x | 2 | 2026-01-03 |" in table
    assert S.headline_table(rows, "results/") in text  # RESULTS.md repeats the headline


def test_check_passes_when_current_and_fails_after_a_change(tmp_path, capsys):
    results = _synthetic_results(tmp_path)
    out = tmp_path / "RESULTS.md"
    args = ["--out", str(out), "--results", str(results)]
    assert S.main([*args, "--check"]) == 1  # not written yet
    assert S.main(args) == 0
    assert S.main([*args, "--check"]) == 0
    out.write_text(out.read_text().replace("600.0", "601.0"))
    assert S.main([*args, "--check"]) == 1
    assert "out of date" in capsys.readouterr().err


def test_synthetic_folders_follow_the_naming_scheme_and_each_kind_of_break_is_named(tmp_path, capsys):
    results = _synthetic_results(tmp_path)
    assert S.naming_problems(results) == []
    out = tmp_path / "RESULTS.md"
    assert S.main(["--out", str(out), "--results", str(results)]) == 0

    def rename(old: str, new: str) -> None:
        (results / old).rename(results / new)

    rename("20260102-bbbbbbb-classification-h200", "20260102-bbbbbbb-h200")  # no bench
    rename("20260103-ccccccc-yolo-trainer-16cores-h100", "20260103-ccccccc-yolo-trainer-16cores-h200")  # wrong GPU
    rename("20260104-eeeeeee-worker-stages-cpu", "20260104-eeeeeeee-worker-stages-cpu")  # 8 hex digits
    eight = _result("bench_yolo", "2026-01-05T10:00:00+00:00", "fffffff", [H.row_of("limit", [1.0, 1.0])])
    eight["env"]["hardware"].update(usable_cores=8, cpu_count=16)
    _write(results / "20260105-fffffff-yolo-h200", "bench_yolo.json", eight)  # taskset, not in the name
    _write(results / "20260105-fffffff-yolo-9cores-h200", "bench_yolo.json", eight)  # the wrong count
    _write(results / "20260106-fffffff-yolo-8cores-h200", "bench_yolo.json", eight)  # the JSON's date is 01-05
    (results / "20260101-aaaaaaa-classification-h200" / "probe.py").write_text("print(1)\n")
    (results / "notes.md").write_text("loose file\n")
    problems = S.naming_problems(results)
    assert problems == [
        "20260101-aaaaaaa-classification-h200: code in a results folder, move probe.py to benchmarks/probes/",
        "20260102-bbbbbbb-h200: its JSON says 20260102-bbbbbbb-classification[-<n>cores]-h200[-suffix]",
        "20260103-ccccccc-yolo-trainer-16cores-h200: its JSON says "
        "20260103-ccccccc-yolo-trainer[-<n>cores]-h100[-suffix]",
        "20260104-eeeeeeee-worker-stages-cpu: not <YYYYMMDD>-<commit7>-<bench>-<gpu>[-suffix]",
        "20260105-fffffff-yolo-9cores-h200: the JSON ran on 8 usable cores",
        "20260105-fffffff-yolo-h200: 8 of 16 cores usable, so 20260105-fffffff-yolo-8cores-...",
        "20260106-fffffff-yolo-8cores-h200: the JSON's date is 20260105",
        "notes.md: not a run folder (results/ holds one folder per run)"]
    S.main(["--out", str(out), "--results", str(results)])  # bring RESULTS.md up to date: only the names fail now
    capsys.readouterr()
    assert S.main(["--out", str(out), "--results", str(results), "--check"]) == 1
    err = capsys.readouterr().err
    assert "8 run folder name problem(s)" in err and "results/notes.md: not a run folder" in err


def test_committed_run_folders_follow_the_naming_scheme():
    assert S.naming_problems() == []
    assert not list(S.RESULTS_DIR.rglob("*.py")), "scripts belong in benchmarks/probes/"


def test_committed_results_md_is_current():
    assert S.main(["--check"]) == 0, "benchmarks/RESULTS.md is stale: run python -m benchmarks.summarize"


def test_readme_headline_table_is_the_generated_one():
    table = S.headline_table(S.headline(S.load_runs()), S.README_LINK_PREFIX)
    readme = (REPO / "README.md").read_text()
    missing = [line for line in table.splitlines() if line not in readme.splitlines()]
    assert not missing, "README.md's headline table differs from python -m benchmarks.summarize --headline:\n" \
        + "\n".join(missing)

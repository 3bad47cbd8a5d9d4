"""Text tables rendered from hand-built reports."""

from __future__ import annotations

import dataclasses
import re

import pytest
from report_samples import make_profile, make_tune

from pipeline_opt.report.text import before_after_table, grid, profile_table, tune_table


def test_profile_table_shows_every_section(sample_profile):
    text = profile_table(sample_profile)
    for needle in ("250.0 samples/s", "94.0 ms", "60% of step time", "n/a  (CPU run)", "0.25x of the limit",
                   "bottleneck: DATA", "main thread waited 60%", "1. raise num_workers from 2 to 6",
                   "workers (2):", "Resize ms", "2.20", "aten::convolution", "410.00"):
        assert needle in text, needle
    assert "top CUDA ops" not in text  # empty sections are left out


def test_profile_table_same_from_object_and_dict(sample_profile):
    assert profile_table(sample_profile) == profile_table(sample_profile.to_dict()) == sample_profile.table()


def test_profile_table_gpu_fields():
    report = dataclasses.replace(make_profile(), gpu_idle_frac=0.42, device="cuda:0", efficiency=None,
                                 limit_throughput=None)
    text = profile_table(report)
    assert "GPU idle    42%" in text and "CPU run" not in text
    assert "n/a (limit not measured)" in text


def test_main_process_worker_is_labelled():
    report = make_profile(num_workers=1)
    report = dataclasses.replace(report, workers=(dataclasses.replace(report.workers[0], worker_id=-1),))
    row = [line for line in profile_table(report).splitlines() if "1000" in line][0]
    assert row.split()[0] == "main"


def test_tune_table_lists_trials_and_not_tried(sample_tune):
    text = tune_table(sample_tune)
    assert "4 trials in 31.5 s" in text
    assert "speedup 2.40x (beyond noise; measured noise ±8%)" in text
    assert re.search(r"num_workers +2 +-> 4   \(changed\)", text)
    assert re.search(r"pin_memory +False +-> False\n", text)
    assert "[Normalize]" in text
    rows = [line.split() for line in text.splitlines() if line.strip()[:1].isdigit() and "%" in line]
    assert [r[0] for r in rows] == ["1", "2", "3", "4"]
    assert rows[1][3] == "yes" and rows[2][3] == "no"
    assert rows[3][1] == "failed"
    # trial configs show what changed against the loader as given
    assert rows[0][4:6] == ["as", "given"]
    assert rows[2][4:6] == ["num_workers=4", "pin_memory=True"]
    assert "gpu decode: no CUDA device" in text
    assert tune_table(sample_tune.to_dict()) == text == sample_tune.table()


def test_tune_table_says_within_noise():
    result = dataclasses.replace(make_tune(), speedup=1.05, noise=0.08)
    assert "within noise" in tune_table(result)


def test_before_after_ratios():
    text = before_after_table(make_profile(200.0), make_profile(500.0), {"num_workers": 3})
    line = [x for x in text.splitlines() if "throughput" in x][0]
    assert line.split()[-1] == "2.50x"
    assert "num_workers  2 -> 3   (changed)" in text


def test_grid_aligns_columns():
    out = grid(["a", "long header"], [[1, 2], ["wide cell", None]]).splitlines()
    assert len({len(line.rstrip()) for line in out[:2]}) == 1
    assert out[2].index("2") == out[0].index("long header")


def test_rejects_unknown_objects():
    with pytest.raises(TypeError, match="ProfileReport/TuneResult"):
        profile_table(object())


def test_many_transforms_are_folded_into_others():
    report = make_profile(num_workers=1)
    costs = {f"T{i}": 0.001 * (10 - i) for i in range(9)}
    report = dataclasses.replace(report, workers=(dataclasses.replace(report.workers[0], transform_s=costs),))
    text = profile_table(report)
    assert "T5 ms" in text and "T6 ms" not in text and "3 others ms" in text
    row = [line for line in text.splitlines() if "1000" in line][0].split()
    assert row[-1] == f"{(4 + 3 + 2):.2f}"  # T6..T8: 4 + 3 + 2 ms


def test_tuner_knobs_left_off_are_not_marked_changed():
    config = {"num_workers": 2, "gpu_transforms": [], "decode": "pil", "draft_decode": False, "shared_slots": True}
    text = before_after_table(make_profile(200.0), make_profile(500.0), config)
    assert re.search(r"gpu_transforms +\[\] +-> \[\]$", text, re.M)
    assert re.search(r"decode +pil +-> pil$", text, re.M) and re.search(r"draft_decode +False +-> False$", text, re.M)
    assert re.search(r"shared_slots +False +-> True   \(changed\)", text)


def _with_pixel_changes():
    from pipeline_opt.tune.exactness import PixelChange

    draft = PixelChange("JPEG draft decoding", "decode", "decode=draft", 1.12, 14.0, 12)
    resize = PixelChange("Resize on the device", "tolerance", "gpu_transforms=Resize", 0.21, 1.0, 12)
    return dataclasses.replace(make_tune(), exactness="decode", pixel_changes=(draft, resize),
                               pixel_checks=(draft, resize))


def test_a_change_that_altered_no_pixel_checked_is_not_called_a_difference():
    from pipeline_opt.tune.exactness import PixelChange
    from pipeline_opt.tune.vetting import samples_clause

    same = PixelChange("JPEG draft decoding", "decode", "decode=draft", 0.0, 0.0, 12)
    result = dataclasses.replace(make_tune(), exactness="decode", pixel_changes=(same,), pixel_checks=(same,))
    text = tune_table(result)
    assert "samples: identical on every image checked, but not guaranteed bit-for-bit (decode changes)" in text
    assert "NOT bit-for-bit" not in text and "exact=True" in text
    clause = samples_clause("decode", (same,))
    assert clause.startswith("samples identical on every image checked but not guaranteed bit-for-bit")
    assert "max 0/255" in clause and "exact=True" in clause
    unmeasured = PixelChange("JPEG draft decoding", "decode", "decode=draft", None, 32.0, 0)
    assert samples_clause("decode", (unmeasured,)).startswith("samples NOT bit-for-bit identical")


def test_tune_table_names_every_change_that_alters_pixels():
    result = _with_pixel_changes()
    text = tune_table(result)
    assert "samples: NOT bit-for-bit identical to the loader as given (decode changes)" in text
    assert ("JPEG draft decoding (decode=draft; a different JPEG decoder): mean 1.12/255, max 14/255 per pixel "
            "value over 12 of your images") in text
    assert "Resize on the device (gpu_transforms=Resize; the same operation, another kernel): mean 0.21/255" in text
    assert "exact=True" in text
    assert tune_table(result.to_dict()) == text  # a saved tune.json renders the same
    assert result.to_dict()["pixel_changes"][0] == {
        "name": "JPEG draft decoding", "kind": "decode", "setting": "decode=draft", "mean_error": 1.12,
        "max_error": 14.0, "n_images": 12, "size_mismatches": 0, "allowed": True, "note": ""}


def test_tune_table_says_when_samples_are_bitwise():
    text = tune_table(make_tune())
    assert "samples: bit-for-bit identical to the loader as given" in text
    old = {k: v for k, v in make_tune().to_dict().items() if k not in ("exactness", "pixel_changes")}
    assert "samples:" not in tune_table(old)  # a tune.json from before the field: nothing claimed


def test_trial_spread_leaves_start_up_windows_out():
    from pipeline_opt.report.text import trial_spread

    assert trial_spread({"spread": 0.12, "windows": [1, 2, 3]}) == "±12%"
    assert trial_spread({"spread": 0.0, "windows": [1, 2, 3], "startup_windows": [0, 2]}) == "-"
    assert trial_spread({"spread": 0.0, "windows": []}) == "±0%"


def test_tune_table_shows_only_the_results_speedup():
    # the profiles read 250 -> 600 (2.40x) while the interleaved trials, the speedup, read 1.23x
    result = dataclasses.replace(make_tune(), speedup=1.23, baseline_throughput=300.0, best_throughput=369.0,
                                 noise=0.05)
    text = tune_table(result)
    efficiency = [line for line in text.splitlines() if "efficiency" in line]
    ratios = re.findall(r"\b\d+\.\d+x\b", "\n".join(x for x in text.splitlines() if x not in efficiency))
    assert ratios and set(ratios) == {"1.23x"}, ratios
    assert "speedup 1.23x" in text and "2.40x" not in text
    row = next(line for line in text.splitlines() if "tuning trials" in line).split()
    assert row[-3:] == ["300.0", "369.0", "1.23x"]
    profile_row = next(line for line in text.splitlines() if "one short profile" in line).split()
    assert profile_row[-2:] == ["250.0", "600.0"]  # the profiles are shown, without a ratio


def test_tune_html_shows_only_the_results_speedup():
    from pipeline_opt.report.html import render_tune_html

    result = dataclasses.replace(make_tune(), speedup=1.23, baseline_throughput=300.0, best_throughput=369.0)
    page = render_tune_html(result.to_dict())
    assert "<b>1.23x</b><span>speedup</span>" in page and "2.40x" not in page
    assert "<b>369.0</b><span>samples/s after (tuning trials)" in page


def test_efficiency_above_the_limit_is_not_claimed():
    report = dataclasses.replace(make_profile(1300.0), efficiency=1.3)  # limit 1000/s, loader 1300/s
    text = profile_table(report)
    assert "1.30x" not in text and "the limit could not be measured reliably" in text
    assert "1,300.0 samples/s, above the 1,000.0 samples/s" in text
    table = before_after_table(make_profile(), report)
    assert "1.30x" not in table and "n/a (limit unreliable)" in table
    from pipeline_opt.report.html import render_profile_html

    page = render_profile_html(report.to_dict())
    assert "1.30x" not in page and "could not be measured reliably" in page


def _respawned():
    """Two workers started anew in each of three epochs: six processes, worker ids 0, 1, 0, 1, 0, 1."""
    report = make_profile(num_workers=2)
    procs = tuple(dataclasses.replace(report.workers[i % 2], pid=2000 + i, samples=32, batches=1,
                                      collate_s=0.004 * (1 + i % 2), rss_bytes=(100 + i) * 2**20)
                  for i in range(6))
    return dataclasses.replace(report, workers=procs)


def test_respawned_workers_are_grouped_by_worker_id():
    from pipeline_opt.report.text import group_workers

    text = profile_table(_respawned())
    assert "workers (2; 6 processes: the DataLoader started new ones each epoch" in text
    rows = [line.split() for line in text.splitlines() if "2000" in line or "2001" in line]
    assert [r[0] for r in rows] == ["0", "1"]  # each worker once
    header = next(line for line in text.splitlines() if "collate ms/batch" in line).split()
    assert header[:4] == ["worker", "pid", "processes", "samples"]
    assert rows[0][2:4] == ["3", "96"]  # 3 processes, 3 x 32 samples
    g = group_workers(_respawned().to_dict()["workers"])
    assert [x["worker_id"] for x in g] == [0, 1] and g[0]["pids"] == [2000, 2002, 2004]
    assert g[1]["collate_ms_per_batch"] == pytest.approx(8.0) and g[0]["rss_bytes"] == 104 * 2**20


def test_collate_column_is_per_batch():
    report = make_profile(num_workers=1)  # 12 ms of collate over 3 batches
    text = profile_table(report)
    header = next(line for line in text.splitlines() if "collate ms/batch" in line).split()
    row = next(line for line in text.splitlines() if "1000" in line).split()
    assert header[:9] == ["worker", "pid", "samples", "ms/sample", "cpu%", "rss", "MB", "collate", "ms/batch"]
    assert row[6] == "4.00"  # worker, pid, samples, ms/sample, cpu%, rss MB, collate ms/batch
    assert "processes" not in header  # no respawn: no column for it


def test_html_groups_respawned_workers():
    from pipeline_opt.report.html import render_profile_html

    page = render_profile_html(_respawned().to_dict())
    assert page.count("worker 0 (3 processes)") >= 1 and "2000, 2002, 2004" in page and "collate ms/batch" in page


def test_a_result_that_kept_the_loader_as_given_shows_one_measurement_not_a_before_and_after():
    """A run whose trials found nothing better printed `17.5 -> 17.5 1.00x` and `noise ±0%`: one trial as both
    sides of a claim. It now says no change, with the baseline's trials once."""
    given = make_tune().original_config
    result = dataclasses.replace(make_tune(), config=dict(given), speedup=1.0, noise=0.0)
    text = tune_table(result)
    assert "no change: nothing beat the loader as given beyond the noise (noise not measured)" in text
    assert "speedup 1.00x" not in text and "1.00x" not in text
    row = [x for x in text.splitlines() if x.strip().startswith("throughput, tuning trials")][0]
    assert "(same loader)" in row and row.split()[-1] == "-"
    for label in ("throughput, one short profile each", "step time (profile median)", "data wait", "bottleneck"):
        (line,) = [x for x in text.splitlines() if x.strip().startswith(label)]
        assert "(same loader)" in line, line  # one profile, not the same one shown as before and after
    assert "(changed)" not in text


def test_a_caution_is_printed_under_the_speedup():
    caution = "the winner's 2 trials read 480.0 to 800.0/s, 50% apart (more than twice the noise): the claim may not hold"
    text = tune_table(dataclasses.replace(make_tune(), cautions=(caution,)))
    lines = text.splitlines()
    assert lines[2] == f"  caution: {caution}" and lines[1].startswith("  speedup")

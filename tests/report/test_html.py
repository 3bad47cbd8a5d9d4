"""HTML reports: self-contained, escaped, and (in headless Chromium) the plots really render."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from report_samples import make_profile, make_tune

from pipeline_opt.report import html as H
from pipeline_opt.report.html import render_profile_html, render_tune_html

EVIL = "<script>alert('x')</script>&"


def _assert_self_contained(page: str) -> None:
    assert page.startswith("<!DOCTYPE html>")
    assert "<script" not in page.lower()
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page.replace('href="https://ui.perfetto.dev"', ""))
    assert "@import" not in page and "url(" not in page


def test_profile_html_has_plots_and_sections(sample_profile):
    page = render_profile_html(sample_profile.to_dict())
    _assert_self_contained(page)
    assert page.count("<svg") == 3  # steps, CPU per worker, per-transform cost
    assert page.count(f'fill="{H.DATA_WAIT_COLOR}"') >= 12  # one data-wait segment per step (+ legend)
    assert f'fill="{H.COMPUTE_COLOR}"' in page and f'fill="{H.H2D_COLOR}"' in page
    for needle in ("Bottleneck: DATA", "raise num_workers from 2 to 6", "Resize", "aten::convolution",
                   "trace.json", "ui.perfetto.dev", "chrome://tracing"):
        assert needle in page, needle


def test_profile_html_escapes_user_strings():
    page = render_profile_html(make_profile(evil=EVIL).to_dict())
    assert EVIL not in page
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;&amp;" in page
    _assert_self_contained(page)


def test_profile_html_without_steps_or_workers(sample_profile):
    d = sample_profile.to_dict()
    d["steps"], d["workers"] = [], []
    page = render_profile_html(d)
    assert "No per-step records" in page and "<svg" not in page


def test_tune_html_highlights_accepted_trials(sample_tune):
    page = render_tune_html(sample_tune.to_dict())
    _assert_self_contained(page)
    trial_svg = page[page.index("Throughput per trial"):]
    trial_svg = trial_svg[trial_svg.index("<svg"):trial_svg.index("</svg>")]
    assert trial_svg.count(f'fill="{H.ACCEPTED_COLOR}"') == 1
    assert trial_svg.count(f'fill="{H.REJECTED_COLOR}"') == 2
    assert "baseline 250" in trial_svg
    assert "#4 failed" in trial_svg
    assert trial_svg.count('stroke="#222"') == 3 * 3  # three whiskers (line + two caps) for trials with spread
    assert "2.40x" in page and "gpu decode: no CUDA device" in page


def test_tune_html_escapes_user_strings():
    page = render_tune_html(make_tune(evil=EVIL).to_dict())
    assert EVIL not in page and "&lt;script&gt;" in page


def _chromium() -> str | None:
    for name in ("/usr/bin/chromium", shutil.which("chromium"), shutil.which("chromium-browser")):
        if name and os.access(name, os.X_OK):
            return name
    return None


def _screenshot(browser: str, page: Path, tmp_path: Path) -> Path:
    png = tmp_path / "shot.png"
    cmd = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           f"--user-data-dir={tmp_path / 'profile'}", f"--screenshot={png}", "--window-size=1280,2000",
           page.as_uri()]
    subprocess.run(cmd, check=True, timeout=120, capture_output=True)
    return png


def _count_colour(img, hex_colour: str, tol: int = 6) -> int:
    target = tuple(int(hex_colour[i:i + 2], 16) for i in (1, 3, 5))
    return sum(n for n, px in img.getcolors(maxcolors=1 << 24)
               if all(abs(a - b) <= tol for a, b in zip(px[:3], target)))


@pytest.mark.skipif(_chromium() is None, reason="chromium is not installed (apt-get install chromium; .ci/run does)")
def test_report_renders_plots_in_headless_chromium(tmp_path, sample_tune):
    from PIL import Image

    page = tmp_path / "tune.html"
    page.write_text(render_tune_html(sample_tune.to_dict()))
    img = Image.open(_screenshot(_chromium(), page, tmp_path)).convert("RGB")
    assert img.size == (1280, 2000)
    extrema = img.getextrema()
    assert any(lo != hi for lo, hi in extrema), "the screenshot is blank"
    # the stacked step bars (data wait, H2D, compute) and the accepted trial bar are drawn
    for colour, minimum in ((H.DATA_WAIT_COLOR, 5000), (H.COMPUTE_COLOR, 5000), (H.H2D_COLOR, 300),
                            (H.ACCEPTED_COLOR, 2000), (H.REJECTED_COLOR, 2000)):
        assert _count_colour(img, colour) >= minimum, f"too few {colour} pixels: plot missing"


def test_tune_html_names_every_change_that_alters_pixels():
    import dataclasses

    from pipeline_opt.tune.exactness import PixelChange

    draft = PixelChange("JPEG draft decoding", "decode", "decode=draft", 1.12, 14.0, 12, note=EVIL)
    page = render_tune_html(dataclasses.replace(make_tune(), exactness="decode", pixel_changes=(draft,)).to_dict())
    _assert_self_contained(page)
    assert "Not bit-for-bit identical" in page and "1.12/255" in page and "14/255" in page
    assert "decode=draft" in page and EVIL not in page
    assert "Bit-for-bit identical to the loader as given" in render_tune_html(make_tune().to_dict())


def test_a_cpu_profile_has_no_cuda_column_and_draws_the_time_outside_the_transforms():
    from pipeline_opt.report.html import render_profile_html

    op = {"name": "aten::conv2d", "calls": 3, "self_cpu_s": 0.01, "self_cuda_s": 0.0}
    worker = {"worker_id": 0, "pid": 1, "samples": 8, "batches": 2, "mean_sample_s": 0.004,
              "transform_s": {"Resize": 0.001}, "collate_s": 0.0, "busy_s": 0.04, "cpu_percent": 90.0,
              "rss_bytes": 1 << 20}
    base = {"throughput": 10.0, "step_time_s": 0.1, "data_wait_frac": 0.5, "gpu_idle_frac": None,
            "bottleneck": "data", "top_cpu_ops": [op], "workers": [worker], "steps": []}
    cpu = render_profile_html({**base, "device": "cpu"})
    assert "self CPU ms" in cpu and "self CUDA ms" not in cpu
    assert "outside the transforms (reading, decoding)" in cpu and "3 ms/sample" in cpu
    assert "self CUDA ms" in render_profile_html({**base, "device": "cuda:0"})


def test_the_step_chart_marks_epoch_boundaries_and_names_its_axes():
    from pipeline_opt.report.html import step_chart

    steps = [{"index": i, "data_wait_s": 0.01, "h2d_s": 0.0, "compute_s": 0.02, "epoch": 0 if i < 7 else 1}
             for i in range(5, 10)]
    html = step_chart({"steps": steps})
    assert "e1|7" in html and "1 epoch boundary in the window" in html and "milliseconds (y)" in html
    assert "all in one epoch" in step_chart({"steps": steps[:2]})


def test_the_step_chart_has_no_h2d_legend_on_a_cpu_run():
    from pipeline_opt.report.html import step_chart

    steps = [{"index": i, "data_wait_s": 0.01, "h2d_s": 0.0, "compute_s": 0.02, "epoch": 0} for i in range(3)]
    assert "H2D" not in step_chart({"steps": steps, "device": "cpu"})
    assert "H2D" in step_chart({"steps": steps, "device": "cuda:0"})


def test_the_trial_charts_baseline_is_the_speedups_denominator(sample_tune):
    """The dashed line read 182 (the baseline's short profile) beside a headline dividing by 179.1."""
    from pipeline_opt.report.html import trial_chart

    d = sample_tune.to_dict()
    d = {**d, "baseline": {**d["baseline"], "throughput": 182.1}, "baseline_throughput": 179.1}
    chart = trial_chart(d)
    assert "baseline 179" in chart and "baseline 182" not in chart


def test_tune_html_shows_a_caution_under_the_cards():
    import dataclasses

    caution = "the winner's 2 trials read 480.0 to 800.0/s, 50% apart (more than twice the noise): <may not hold>"
    page = render_tune_html(dataclasses.replace(make_tune(), cautions=(caution,)).to_dict())
    assert '<p class="caution"><b>Caution:</b> the winner&#x27;s 2 trials' in page and "&lt;may not hold&gt;" in page
    assert 'class="caution"' not in render_tune_html(make_tune().to_dict())


def test_tune_html_of_a_run_that_kept_the_loader_says_no_change_not_1x():
    import dataclasses

    given = make_tune().original_config
    page = render_tune_html(dataclasses.replace(make_tune(), config=dict(given), speedup=1.0, noise=0.0).to_dict())
    assert "<b>no change</b>" in page and "1.00x" not in page
    assert "noise not measured" in page and "measured noise not measured" not in page

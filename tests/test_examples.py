"""Every example runs on CPU with tiny sizes (subprocess, as a user would run it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"






def _run(script: str, *args: str, tmp_path: Path, env: dict | None = None, timeout: int = 240) -> str:
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    proc = subprocess.run([sys.executable, str(EXAMPLES / script), *args], cwd=tmp_path, env=full_env,
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{script} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


SMALL = ("--images", "24", "--size", "96", "72", "--batch-size", "4", "--device", "cpu")


def test_autotune_loop(tmp_path):
    out = _run("autotune_loop.py", *SMALL, "--budget", "6", "--epochs", "1", tmp_path=tmp_path)
    assert "trials:" in out and "epoch 0: last loss" in out and "tuned settings:" in out


def test_profile_in_loop_with_perf_bench(tmp_path):
    # PERF_BENCH=1 ends the process (status 0) once the window is measured, long before 50 epochs
    out = _run("profile_in_loop.py", *SMALL, "--epochs", "50", "--steps", "6", "--out", "rep",
               tmp_path=tmp_path,
               env={"PERF_BENCH": "1"})
    assert "report written to" not in out
    report = json.loads((tmp_path / "rep" / "report.json").read_text())
    assert report["throughput"] > 0 and len(report["steps"]) == 6
    assert (tmp_path / "rep" / "report.html").is_file()


def test_gpu_transforms_example(tmp_path):
    out = _run("gpu_transforms.py", *SMALL, "--workers", "1", tmp_path=tmp_path)
    assert "24 images through 6 batches on cpu" in out and "(4, 3, 224, 224)" in out


def test_yolo_example(tmp_path):
    # --no-tune keeps the smoke run short (the integration's own tests cover tuning inside the trainer)
    out = _run("yolo_integration.py", "--images", "8", "--imgsz", "128", "--batch", "4", "--device", "cpu",
               "--steps", "2", "--no-tune", "--project", str(tmp_path / "runs"), tmp_path=tmp_path, timeout=400)
    assert "bottleneck: " in out and "reports in" in out
    assert (tmp_path / "runs" / "pipeline_opt" / "report.html").is_file()

"""The pipeline-opt command line: help, version, factories, doctor, bench/ledger, yolo forwarding, demo."""

from __future__ import annotations

import json
import subprocess
import sys
import types

import pytest
import torch

from pipeline_opt import cli
from pipeline_opt._version import __version__

FACTORY = '''
import torch
from torch.utils.data import DataLoader, TensorDataset


def build(n=64, batch=8):
    g = torch.Generator().manual_seed(0)
    ds = TensorDataset(torch.randn(n, 3, 16, 16, generator=g), torch.randint(0, 2, (n,), generator=g))
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 16 * 16, 2))
    return DataLoader(ds, batch_size=batch), model


def build_with_step(n=64, batch=8):
    loader, model = build(n, batch)
    def step(model, batch):
        loss = torch.nn.functional.cross_entropy(model(batch[0]), batch[1])
        loss.backward()
        return loss.detach()
    return loader, model, step


def wrong():
    return 42
'''


@pytest.fixture
def factory_file(tmp_path):
    path = tmp_path / "my_factory.py"
    path.write_text(FACTORY)
    return path








def test_help_lists_every_command(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for command in ("demo", "profile", "tune", "yolo", "bench", "doctor"):
        assert command in out


def test_version_from_a_fresh_interpreter():
    version = subprocess.run([sys.executable, "-m", "pipeline_opt.cli", "--version"], capture_output=True,
                             text=True, check=True).stdout
    assert version.strip() == f"pipeline-opt {__version__}"


def test_no_command_is_a_usage_error(capsys):
    assert cli.main([]) == cli.EXIT_USAGE
    assert "COMMAND" in capsys.readouterr().err


def test_load_factory_from_file_and_module(factory_file, monkeypatch):
    fn = cli.load_factory(f"{factory_file}:build")
    loader, model = fn(n=16)
    assert len(loader.dataset) == 16
    monkeypatch.chdir(factory_file.parent)
    assert callable(cli.load_factory("my_factory:build_with_step"))


@pytest.mark.parametrize("spec, message", [
    ("no_colon", "must look like"),
    ("missing_file.py:build", "does not exist"),
    ("surely_not_a_module_xyz:build", "cannot import"),
])
def test_bad_factory_specs(spec, message):
    with pytest.raises(cli.CLIError, match=message):
        cli.load_factory(spec)


def test_factory_must_return_loader_and_model(factory_file, capsys):
    assert cli.main(["profile", f"{factory_file}:wrong"]) == cli.EXIT_USAGE
    assert "must return (loader, model)" in capsys.readouterr().err
    assert cli.main(["profile", f"{factory_file}:nope"]) == cli.EXIT_USAGE
    assert "has no function 'nope'" in capsys.readouterr().err


def test_parse_kwargs():
    assert cli.parse_kwargs(["n=3", "name=abc", "flag=True", "size=(2, 3)"]) == \
        {"n": 3, "name": "abc", "flag": True, "size": (2, 3)}
    with pytest.raises(cli.CLIError, match="KEY=VALUE"):
        cli.parse_kwargs(["3=x"])


def test_doctor_command(capsys):
    assert cli.main(["doctor"]) == 0
    assert "pipeline_opt doctor" in capsys.readouterr().out
    assert cli.main(["doctor", "--json"]) == 0
    checks = [f["check"] for f in json.loads(capsys.readouterr().out)["findings"]]
    assert "pillow" in checks and "/dev/shm" in checks


def _result(commit: str, default: float, autotune: float) -> dict:
    return {"benchmark": "bench_classification", "commit": commit, "date": "2025-01-01", "model": "resnet50",
            "batch": 128, "resolution": 224, "rows": [
                {"name": "default", "throughput": default, "spread": 0.05},
                {"name": "autotune", "throughput": autotune, "spread": 0.05}]}


def test_bench_record_list_and_compare(tmp_path, capsys):
    ledger = tmp_path / "ledger.jsonl"
    for commit, default, autotune in (("aaa", 100.0, 1000.0), ("bbb", 99.0, 700.0), ("ccc", 101.0, 1010.0)):
        path = tmp_path / f"{commit}.json"
        path.write_text(json.dumps(_result(commit, default, autotune)))
        assert cli.main(["bench", "--record", str(path), "--ledger", str(ledger)]) == 0
    assert "appended 2 row(s)" in capsys.readouterr().out
    assert cli.main(["bench", "--ledger", str(ledger)]) == 0
    assert capsys.readouterr().out.count("bench_classification/") == 6
    # bbb lost 30% on autotune (noise 5%): a regression, exit status 1
    assert cli.main(["bench", "--compare", "aaa", "bbb", "--ledger", str(ledger)]) == cli.EXIT_FAILED
    out = capsys.readouterr().out
    assert "REGRESSED" in out and "1 configuration(s) regressed" in out
    assert cli.main(["bench", "--compare", "aaa", "ccc", "--ledger", str(ledger)]) == 0
    # a result file can stand for a commit
    assert cli.main(["bench", "--compare", str(tmp_path / "aaa.json"), "bbb", "--ledger", str(ledger)]) == 1
    capsys.readouterr()
    assert cli.main(["bench", "--compare", "zzz", "aaa", "--ledger", str(ledger)]) == cli.EXIT_USAGE
    assert "no rows for commit 'zzz'" in capsys.readouterr().err


def test_bench_errors_are_clear(tmp_path, capsys):
    assert cli.main(["bench", "--ledger", str(tmp_path / "none.jsonl")]) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert "no ledger at" in err and f"--record RESULT.json --ledger {tmp_path / 'none.jsonl'}" in err
    assert cli.main(["bench", "--record", str(tmp_path / "x.json"), "--ledger", str(tmp_path / "l.jsonl")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_bench_without_a_ledger_names_the_fix_and_files_compare_without_one(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no benchmarks/results/ledger.jsonl to fall back on, nor any default
    result = tmp_path / "aaa.json"
    result.write_text(json.dumps(_result("aaa", 100.0, 1000.0)))
    for argv, what in ((["bench"], "listing the ledger"), (["bench", "--record", str(result)], "--record"),
                       (["bench", "--run", "classification"], "--run"),
                       (["bench", "--compare", "aaa", str(result)], "--compare 'aaa'")):
        assert cli.main(argv) == cli.EXIT_USAGE, argv
        err = capsys.readouterr().err
        assert what in err and "needs a ledger: pass --ledger FILE" in err, err
        assert "benchmarks/results/<run>/ledger.jsonl" in err
    assert not list(tmp_path.rglob("*.jsonl"))  # nothing was written anywhere
    # two result files need no ledger
    other = tmp_path / "bbb.json"
    other.write_text(json.dumps(_result("bbb", 100.0, 990.0)))
    assert cli.main(["bench", "--compare", str(result), str(other)]) == cli.EXIT_OK
    assert "autotune" in capsys.readouterr().out


def test_yolo_forwards_every_argument(monkeypatch):
    seen = []
    fake = types.ModuleType("pipeline_opt.integrations.ultralytics")
    fake.cli_main = lambda argv: seen.append(argv) or 7
    monkeypatch.setitem(sys.modules, "pipeline_opt.integrations.ultralytics", fake)
    assert cli.main(["-q", "yolo", "--data", "x.yaml", "--epochs", "1", "--help"]) == 7
    assert seen == [["--data", "x.yaml", "--epochs", "1", "--help"]]


def test_profile_command_on_user_factory(factory_file, tmp_path, capsys):
    out = tmp_path / "prof"
    rc = cli.main(["-q", "profile", f"{factory_file}:build_with_step", "--arg", "n=96", "--steps", "4",
                   "--warmup", "1", "--trace-steps", "2", "--out", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "bottleneck:" in text and "samples/s" in text
    saved = json.loads((out / "report.json").read_text())
    assert (out / "report.html").is_file() and saved["throughput"] > 0 and saved["traced_steps"] == 2


def test_tune_command_on_user_factory(factory_file, tmp_path, capsys):
    out = tmp_path / "tune"
    rc = cli.main(["-q", "tune", f"{factory_file}:build", "--arg", "n=96", "--budget", "8", "--out", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "trials:" in text and "use these settings" not in text
    assert "set these DataLoader arguments: DataLoader(" in text or "no DataLoader argument changed" in text
    assert (out / "tune.html").is_file()


def test_tune_prints_dataloader_arguments_apart_from_the_other_changes(factory_file, tmp_path, capsys, monkeypatch):
    import pipeline_opt as po
    from pipeline_opt.tune.exactness import PixelChange
    from pipeline_opt.tune.result import TuneResult

    original = {"num_workers": 0, "pin_memory": False, "persistent_workers": False, "prefetch_factor": None,
                "gpu_transforms": [], "decode": "pil", "draft_decode": False, "shared_slots": False}
    config = {**original, "num_workers": 3, "persistent_workers": True, "prefetch_factor": 2,
              "gpu_transforms": ["Normalize"], "decode": "draft", "draft_decode": True}
    seen = {}

    def fake_autotune(loader, model, **kwargs):
        seen.update(kwargs)
        return TuneResult(loader=None, config=config, baseline=None, best=None, trials=(), speedup=2.0,
                          original_config=original, exactness="decode",
                          pixel_changes=(PixelChange("JPEG draft decoding", "decode", "decode=draft", 0.4, 9.0, 12),))

    monkeypatch.setattr(po, "autotune", fake_autotune)
    monkeypatch.setattr(TuneResult, "table", lambda self: "TABLE")
    monkeypatch.setattr(TuneResult, "save", lambda self, d: d)
    rc = cli.main(["-q", "tune", f"{factory_file}:build", "--arg", "n=16", "--exact", "--out", str(tmp_path)])
    assert rc == 0 and seen["exact"] is True
    text = capsys.readouterr().out
    line = next(x for x in text.splitlines() if x.startswith("set these DataLoader arguments"))
    assert line == "set these DataLoader arguments: DataLoader(..., num_workers=3, persistent_workers=True, prefetch_factor=2)"
    for knob in ("decode", "gpu_transforms", "draft_decode", "shared_slots"):
        assert knob not in line
    assert "other changes, not DataLoader arguments" in text
    assert "  - gpu_transforms: run Normalize on the device" in text
    assert "  - decode: JPEG draft decoding" in text and "max 9/255" in text


def test_demo_end_to_end_small(tmp_path, capsys):
    out = tmp_path / "demo"
    rc = cli.main(["-q", "demo", "--device", "cpu", "--out", str(out), "--images", "48", "--size", "160x120",
                   "--budget", "20", "--batch-size", "8", "--steps", "3"])
    assert rc == 0
    text = capsys.readouterr().out
    assert "throughput, tuning trials (samples/s)" in text and "settings:" in text and str(out / "report.html") in text
    assert "x over the naive loader in interleaved trials" in text or "autotune: no change: nothing beat" in text
    for name in ("report.html", "summary.txt", "trace.json", "baseline/report.html", "best/report.json",
                 "tune.json"):
        assert (out / name).is_file(), name
    assert not (out / "tune.html").exists()  # the tuning report is report.html, not also a byte-identical copy
    _assert_the_printed_table_is_the_saved_reports(text, out)


def _row(text: str, label: str) -> list[str]:
    (line,) = [ln for ln in text.splitlines() if ln.strip().startswith(label)]
    return line.strip()[len(label):].split()


def _assert_the_printed_table_is_the_saved_reports(text: str, out) -> None:
    """Every figure the demo prints is the one its JSON reports hold, to the printed rounding."""
    import json
    import re

    tune = json.loads((out / "tune.json").read_text())
    before = json.loads((out / "baseline" / "report.json").read_text())
    after = json.loads((out / "best" / "report.json").read_text())
    b, *a = _row(text, "throughput, tuning trials (samples/s)")
    assert float(b) == round(tune["baseline_throughput"], 1)
    assert abs(tune["speedup"] - tune["best_throughput"] / tune["baseline_throughput"]) < 1e-9  # one source
    headline = re.search(r"autotune: (?:([0-9.]+)x over|no change: nothing beat) the naive loader.*? in interleaved "
                         r"trials \((?:measured )?(.*?), (\d+) trials", text)
    assert headline, text
    if headline.group(1) is None:  # nothing won: one measurement, no before / after pair read from it
        assert a == ["(same", "loader)", "-"] and tune["config"] == {**tune["config"], **tune["original_config"]}
    else:
        assert float(a[0]) == round(tune["best_throughput"], 1) and a[1] == f"{tune['speedup']:.2f}x"
        assert headline.group(1) == f"{tune['speedup']:.2f}"
    assert int(headline.group(3)) == len(tune["trials"])
    noise = headline.group(2)
    assert noise == ("noise not measured" if not tune["noise"] else f"noise ±{tune['noise'] * 100:.0f}%"), noise
    same = headline.group(1) is None
    pb, *pa = _row(text, "throughput, one short profile each")
    assert float(pb) == round(before["throughput"], 1)
    assert pa == ["(same", "loader)"] if same else float(pa[0]) == round(after["throughput"], 1)
    sb, _, *sa = _row(text, "step time (profile median)")
    assert float(sb) == round(before["step_time_s"] * 1000, 1)
    assert sa == ["(same", "loader)"] if same else float(sa[0]) == round(after["step_time_s"] * 1000, 1)
    wb, *wa = _row(text, "data wait")
    assert wb == f"{before['data_wait_frac'] * 100:.0f}%"
    assert wa == ["(same", "loader)"] if same else wa == [f"{after['data_wait_frac'] * 100:.0f}%"]


def test_the_cpu_demo_steps_on_one_thread_and_restores_the_count(monkeypatch, tmp_path):
    import torch

    import pipeline_opt.demo as demo

    seen = []

    def fake_run(cfg):
        seen.append(torch.get_num_threads())
        raise RuntimeError("stop")

    monkeypatch.setattr(demo, "_run", fake_run)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with pytest.raises(RuntimeError, match="stop"):
            demo.run_demo(demo.DemoConfig(device="cpu", out=tmp_path))
        assert seen == [1] and torch.get_num_threads() == 2  # restored, also when the demo fails
    finally:
        torch.set_num_threads(before)


@pytest.mark.cuda
def test_demo_on_gpu_resnet50(tmp_path, capsys):
    """The GPU path of the demo: ResNet-50, bf16 autocast, channels_last, 4 naive workers."""
    out = tmp_path / "demo_gpu"
    rc = cli.main(["-q", "demo", "--device", "cuda", "--out", str(out), "--images", "512", "--size", "640x480",
                   "--budget", "40", "--batch-size", "64", "--steps", "10"])
    assert rc == 0
    text = capsys.readouterr().out
    assert "GPU idle" in text
    best = json.loads((out / "best" / "report.json").read_text())
    assert best["device"].startswith("cuda") and best["gpu_idle_frac"] is not None
    tune = json.loads((out / "tune.json").read_text())
    assert tune["original_config"]["num_workers"] == 4


def test_demo_config_defaults_and_validation(capsys):
    from pipeline_opt.demo import DemoConfig

    cpu = DemoConfig(device="cpu").resolved()
    assert (cpu.images, cpu.size, cpu.batch_size, cpu.budget_s) == (256, (640, 480), 8, 40.0)
    assert DemoConfig(device="cpu", images=64, size=(320, 240)).resolved().size == (320, 240)
    with pytest.raises(ValueError, match="fewer than one batch"):
        DemoConfig(device="cpu", images=4).resolved()
    with pytest.raises(ValueError, match="budget_s"):
        DemoConfig(device="cpu", budget_s=0).resolved()
    with pytest.raises(ValueError, match="not one of auto"):
        DemoConfig(device="tpu").resolved()
    assert cli.main(["demo", "--device", "cpu", "--images", "4"]) == cli.EXIT_USAGE
    assert "fewer than one batch" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["demo", "--size", "640by480"])
    assert "WIDTHxHEIGHT" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message shown without a GPU")
def test_demo_on_cuda_without_gpu_says_so():
    from pipeline_opt.demo import DemoConfig

    with pytest.raises(ValueError, match="CUDA is not available"):
        DemoConfig(device="cuda").resolved()


FAKE_BENCH = '''
import argparse, json, pathlib
p = argparse.ArgumentParser()
p.add_argument("--out", type=pathlib.Path)
p.add_argument("--quick", action="store_true")
p.add_argument("--fail", action="store_true")
a = p.parse_args()
if a.fail:
    raise SystemExit(3)
a.out.mkdir(parents=True, exist_ok=True)
rows = [{"name": "quick" if a.quick else "full", "throughput": 123.0, "spread": 0.1}]
(a.out / "bench_fake.json").write_text(json.dumps({"benchmark": "bench_fake", "commit": "f00", "rows": rows}))
'''


def test_bench_run_executes_the_benchmark_and_records_it(tmp_path, monkeypatch, capsys):
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "benchmarks" / "__init__.py").write_text("")
    (tmp_path / "benchmarks" / "bench_fake.py").write_text(FAKE_BENCH)
    monkeypatch.chdir(tmp_path)
    ledger_path = tmp_path / "ledger.jsonl"
    assert cli.main(["-q", "bench", "--run", "fake", "--quick", "--ledger", str(ledger_path)]) == 0
    assert "appended 1 row(s) of bench_fake" in capsys.readouterr().out
    from pipeline_opt.report.ledger import read

    [row] = read(ledger_path)
    assert (row.benchmark, row.config, row.commit, row.throughput) == ("bench_fake", "quick", "f00", 123.0)
    assert cli.main(["-q", "bench", "--run", "fake", "--bench-args=--fail", "--ledger", str(ledger_path)]) \
        == cli.EXIT_FAILED
    assert cli.main(["-q", "bench", "--run", "nope", "--ledger", str(ledger_path)]) == cli.EXIT_USAGE
    assert "benchmarks/bench_nope.py not found" in capsys.readouterr().err


def test_a_closed_stdout_pipe_ends_quietly():
    # `pipeline-opt tune ... | head`: head exits, the next write raises BrokenPipeError
    code = ("import sys\n"
            "from pipeline_opt import cli\n"
            "def flood(args):\n"
            "    for _ in range(100000): print('x' * 80)\n"
            "    return 0\n"
            "cli.cmd_doctor = flood\n"
            "sys.exit(cli.main(['doctor']))\n")
    reader = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.readline()"], stdin=subprocess.PIPE)
    proc = subprocess.run([sys.executable, "-c", code], stdout=reader.stdin, stderr=subprocess.PIPE, text=True,
                          timeout=120)
    reader.stdin.close()
    reader.wait(timeout=30)
    assert proc.returncode == 141, proc.stderr
    assert "BrokenPipeError" not in proc.stderr and "failed" not in proc.stderr

"""The public surface must not silently shrink, and the result contracts keep their fields."""

from __future__ import annotations

import dataclasses

import pipeline_opt as po

PUBLIC = {
    "DeviceLoader", "LoopProfiler", "OpStat", "ProfileReport", "StepRecord", "Trial", "TuneResult", "WorkerStats",
    "__version__", "autotune", "datasets", "enable_console_logging", "get_logger", "integrations", "profile",
    "profile_loop", "split_transforms", "transforms",
}

PROFILE_FIELDS = {
    "throughput", "step_time_s", "data_wait_frac", "gpu_idle_frac", "bottleneck", "evidence", "recommendations",
    "workers", "collate_s", "batch_cpu_s", "compute_time_s", "limit_throughput", "efficiency", "top_cpu_ops",
    "top_cuda_ops", "steps", "batch_size", "device", "loader_config", "environment", "trace_events",
}
WORKER_FIELDS = {"worker_id", "pid", "samples", "batches", "mean_sample_s", "transform_s", "collate_s", "busy_s",
                 "cpu_percent", "rss_bytes"}
STEP_FIELDS = {"index", "data_wait_s", "h2d_s", "compute_s", "step_s", "samples"}
OP_FIELDS = {"name", "calls", "self_cpu_s", "self_cuda_s"}
TUNE_FIELDS = {"loader", "config", "baseline", "best", "trials", "speedup", "noise", "tuning_time_s", "not_tried",
               "original_config"}
TRIAL_FIELDS = {"config", "throughput", "spread", "accepted", "reason", "status", "windows", "elapsed_s"}


def _fields(cls) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def test_all_is_a_superset_of_the_pinned_surface():
    missing = PUBLIC - set(po.__all__)
    assert not missing, f"public names removed from pipeline_opt.__all__: {sorted(missing)}"
    assert len(po.__all__) == len(set(po.__all__))
    for name in po.__all__:
        assert hasattr(po, name), name


def test_front_doors_are_callables_with_the_contract_arguments():
    import inspect

    profile = inspect.signature(po.profile).parameters
    assert list(profile)[:6] == ["loader", "model", "step_fn", "steps", "warmup", "device"]
    assert profile["steps"].default == 30 and profile["warmup"].default == 5
    tune = inspect.signature(po.autotune).parameters
    for name in ("loader", "model", "step_fn", "device", "time_budget_s", "gpu_transforms"):
        assert name in tune, name
    assert tune["time_budget_s"].default == 60 and tune["gpu_transforms"].default is True


def test_result_contracts_keep_their_fields():
    for cls, expected in ((po.ProfileReport, PROFILE_FIELDS), (po.WorkerStats, WORKER_FIELDS),
                          (po.StepRecord, STEP_FIELDS), (po.OpStat, OP_FIELDS), (po.TuneResult, TUNE_FIELDS),
                          (po.Trial, TRIAL_FIELDS)):
        missing = expected - _fields(cls)
        assert not missing, f"{cls.__name__} lost fields {sorted(missing)}"
        assert cls.__dataclass_params__.frozen, f"{cls.__name__} must stay frozen"


def test_results_have_their_methods():
    for cls, methods in ((po.ProfileReport, ("to_dict", "table", "save", "trace")),
                         (po.TuneResult, ("to_dict", "table", "save"))):
        for m in methods:
            assert callable(getattr(cls, m, None)), f"{cls.__name__}.{m}"


def test_subpackages_expose_their_front_doors():
    from pipeline_opt.report import html, ledger, text

    assert callable(po.transforms.split_transforms) and po.transforms.DeviceLoader is po.DeviceLoader
    assert "ultralytics" in po.integrations.__all__
    for fn in (text.profile_table, text.tune_table, text.before_after_table, html.render_profile_html,
               html.render_tune_html, ledger.append, ledger.compare):
        assert callable(fn)

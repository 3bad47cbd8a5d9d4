"""Hand-built ProfileReport / TuneResult objects: the report tests run on these, no profiling needed.

(A module of its own, not conftest: several test folders have a conftest.py.)
"""

from __future__ import annotations

from pipeline_opt.profile.report import OpStat, ProfileReport, StepRecord, WorkerStats
from pipeline_opt.tune.result import Trial, TuneResult


def make_profile(throughput: float = 250.0, data_wait: float = 0.6, num_workers: int = 2,
                 bottleneck: str = "data", evil: str = "") -> ProfileReport:
    """A plausible data-bound report; ``evil`` is injected into every free-text field."""
    steps = tuple(StepRecord(index=i, data_wait_s=0.060 * data_wait / 0.6 + 0.001 * i, h2d_s=0.004,
                             compute_s=0.030, step_s=0.094, samples=32) for i in range(12))
    workers = tuple(WorkerStats(worker_id=w, pid=1000 + w, samples=96, batches=3, mean_sample_s=0.0041,
                                transform_s={"Resize" + evil: 0.0022, "ToTensor": 0.0009, "Normalize": 0.0006},
                                collate_s=0.012, busy_s=0.41, cpu_percent=88.0 - 10 * w, rss_bytes=180 * 2**20)
                    for w in range(num_workers))
    return ProfileReport(
        throughput=throughput, step_time_s=0.094, data_wait_frac=data_wait, gpu_idle_frac=None,
        bottleneck=bottleneck, evidence=("main thread waited 60% of each step in next(loader)" + evil,),
        recommendations=("raise num_workers from 2 to 6" + evil, "move Normalize to the GPU"),
        workers=workers, collate_s=0.004, batch_cpu_s=0.135, compute_time_s=0.030,
        limit_throughput=1000.0, efficiency=throughput / 1000.0,
        top_cpu_ops=(OpStat("aten::convolution" + evil, 24, 0.41, 0.0), OpStat("aten::add_", 96, 0.05, 0.0)),
        top_cuda_ops=(), steps=steps, batch_size=32, device="cpu",
        loader_config={"num_workers": num_workers, "pin_memory": False, "persistent_workers": False,
                       "prefetch_factor": 2, "batch_size": 32},
        environment={"torch": "2.x", "cpu_count": 2},
    )


def make_tune(evil: str = "") -> TuneResult:
    baseline = make_profile(250.0, 0.6, evil=evil)
    best = make_profile(600.0, 0.1, num_workers=4, bottleneck="compute", evil=evil)
    trials = (
        Trial({"num_workers": 2, "pin_memory": False}, 250.0, 0.08, False, "baseline" + evil,
              windows=(240.0, 250.0, 260.0)),
        Trial({"num_workers": 4, "pin_memory": False}, 600.0, 0.05, True, "+140% > noise 8%",
              windows=(585.0, 600.0, 615.0)),
        Trial({"num_workers": 4, "pin_memory": True}, 590.0, 0.06, False, "within noise"),
        Trial({"num_workers": 8, "pin_memory": False}, 0.0, 0.0, False, "worker crashed", status="failed"),
    )
    return TuneResult(loader=None, config={"num_workers": 4, "pin_memory": False, "persistent_workers": True,
                                           "prefetch_factor": 2, "gpu_transforms": ["Normalize"]},
                      baseline=baseline, best=best, trials=trials, speedup=2.4, noise=0.08, tuning_time_s=31.5,
                      not_tried=("gpu decode: no CUDA device" + evil,),
                      original_config={"num_workers": 2, "pin_memory": False, "persistent_workers": False,
                                       "prefetch_factor": 2, "gpu_transforms": []})

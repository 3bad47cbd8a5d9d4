"""The diagnosis on recorded numbers (no GPU needed)."""

import pytest

from pipeline_opt.profile.diagnosis import Measurements, diagnose, is_sync_op, workers_needed


def _gpu(**kw):
    base = dict(device_type="cuda", step_time_s=0.1, compute_time_s=0.09, data_wait_frac=0.02,
                gpu_idle_frac=0.05, launch_time_s=0.03, num_workers=8, prefetch_factor=2, pin_memory=True,
                persistent_workers=True, usable_cpus=16)
    base.update(kw)
    return Measurements(**base)


def test_data_bound_step_from_the_field_asks_for_littles_law_workers_and_gpu_transforms():
    # DESIGN.md: 240 ms step, ~90 ms of kernels, 4 workers, CPU normalize/resize.
    m = _gpu(step_time_s=0.24, compute_time_s=0.09, data_wait_frac=0.55, gpu_idle_frac=0.6, num_workers=4,
             persistent_workers=False, batch_cpu_s=1.0, sample_s=0.008,
             transform_s={"ToTensor": 0.002, "Normalize": 0.0025, "Resize": 0.003})
    d = diagnose(m)
    assert d.bottleneck == "data"
    recs = "\n".join(d.recommendations)
    assert "raise num_workers from 4 to 14" in recs  # ceil(1.0 / 0.09) = 12, plus 25% rounded up
    assert "persistent_workers=True" in recs
    assert "Normalize" in recs and "to the GPU" in recs
    assert "Pillow-SIMD" in recs  # Resize is 38% of the sample time, stock Pillow
    assert any("data wait 55%" in e for e in d.evidence)


def test_worker_count_is_capped_by_free_cores():
    m = _gpu(data_wait_frac=0.7, gpu_idle_frac=0.7, num_workers=2, usable_cpus=4, batch_cpu_s=2.0)
    recs = diagnose(m).recommendations
    assert not any(r.startswith("raise num_workers") for r in recs)
    assert any("would be needed but only 2 cores" in r for r in recs)  # 4 cores - main - pin thread


def test_pillow_simd_not_recommended_when_installed_or_resize_is_small():
    shares = {"Resize": 0.006}
    with_simd = diagnose(_gpu(data_wait_frac=0.5, sample_s=0.01, transform_s=shares, pillow_simd=True))
    small = diagnose(_gpu(data_wait_frac=0.5, sample_s=0.01, transform_s={"Resize": 0.001}))
    assert not any("Pillow-SIMD" in r for r in with_simd.recommendations + small.recommendations)


def test_compute_bound_recommends_amp_and_channels_last_and_fewer_workers():
    m = _gpu(model_dtype="float32", has_conv=True, num_workers=12, batch_cpu_s=0.1)
    d = diagnose(m)
    assert d.bottleneck == "compute"
    recs = "\n".join(d.recommendations)
    assert "bfloat16" in recs and "channels_last" in recs
    assert "lower num_workers from 12 to 3" in recs  # ceil(0.1 / 0.09) + 1


def test_launch_bound_yolo_like_step_asks_for_fewer_workers():
    # YOLO11n on H200: GPU idle, main thread not waiting on data, 16 workers.
    m = _gpu(step_time_s=0.12, compute_time_s=0.07, launch_time_s=0.115, data_wait_frac=0.03,
             gpu_idle_frac=0.42, num_workers=16, batch_cpu_s=64 * 0.016)
    d = diagnose(m)
    assert d.bottleneck == "launch"
    assert any("lower num_workers from 16 to 12" in r for r in d.recommendations)  # ceil(1.024/0.115) + 25%
    assert any("reduce-overhead" in r for r in d.recommendations)


def test_sync_bound_names_the_sync_ops():
    m = _gpu(sync_frac=0.4, sync_ops=("cudaStreamSynchronize", "aten::item"), gpu_idle_frac=0.4)
    d = diagnose(m)
    assert d.bottleneck == "sync"
    assert "cudaStreamSynchronize" in d.recommendations[0] and ".item()" in d.recommendations[0]
    ddp = diagnose(_gpu(sync_frac=0.5, sync_ops=("nccl:all_reduce",)))
    assert any("no_sync()" in r for r in ddp.recommendations)


@pytest.mark.parametrize("wait,expected", [(0.5, "data"), (0.05, "compute"), (0.2, "balanced")])
def test_cpu_rules(wait, expected):
    m = Measurements(device_type="cpu", step_time_s=0.1, compute_time_s=0.1 * (1 - wait), data_wait_frac=wait)
    assert diagnose(m).bottleneck == expected


def test_gpu_middle_ground_is_balanced_and_missing_trace_falls_back_to_cpu_rules():
    assert diagnose(_gpu(gpu_idle_frac=0.22, data_wait_frac=0.05)).bottleneck == "balanced"
    assert diagnose(_gpu(gpu_idle_frac=None, data_wait_frac=0.05)).bottleneck == "compute"


def test_main_process_loader_is_told_to_use_workers():
    m = Measurements(device_type="cpu", step_time_s=0.1, compute_time_s=0.01, data_wait_frac=0.9,
                     num_workers=0, usable_cpus=8, batch_cpu_s=0.09)
    recs = diagnose(m).recommendations
    assert recs[0] == ("raise num_workers from 0 to 7 (Little's law: batch CPU 0.090 s / step 0.010 s = 9.0, rounded up "
                       "plus 25% (at least one) = 12; capped at 7, the cores free for workers)")
    assert "12 workers would be needed but only 7 cores" in recs[1]


def test_the_profile_and_the_tuner_read_one_worker_count_from_one_measurement():
    """The profile advised 6 workers and the tuner guessed 7 for one run (ceil + 1 against ceil + 25%)."""
    from pipeline_opt.tune.candidates import littles_law_workers

    for batch_s, step_s in [(0.42, 0.08), (2.2098, 0.0346), (0.05, 0.1), (1.0, 0.2), (0.6, 0.01)]:
        assert workers_needed(batch_s, step_s) == littles_law_workers(batch_s, step_s), (batch_s, step_s)


def test_workers_needed_and_validation():
    assert workers_needed(0.42, 0.08) == 6 + 2  # ceil(5.25), plus 25% of it rounded up: the tuner's formula
    assert workers_needed(0.0, 0.08) == 1
    with pytest.raises(ValueError, match="step_s"):
        workers_needed(0.1, 0.0)
    with pytest.raises(ValueError, match="data_wait_frac"):
        diagnose(_gpu(data_wait_frac=1.5))


def test_sync_op_names():
    assert is_sync_op("cudaStreamSynchronize") and is_sync_op("aten::_local_scalar_dense")
    assert is_sync_op("nccl:all_reduce") and is_sync_op("cudaMemcpy")
    assert not is_sync_op("cudaDeviceSynchronize") and not is_sync_op("cudaMemcpyAsync")
    assert not is_sync_op("aten::conv2d")


def test_reading_and_decoding_get_the_datasets_own_setting_when_it_has_one():
    """Outside the transforms: 40% names the dataset's setting; without one it takes > 50% for code advice."""
    shares = {"Mosaic": 0.0045, "Format": 0.0015}  # 60% of a 10 ms sample in the transforms
    advice = "ultralytics reads and decodes every image it loads in the workers (cache off): cache='ram' ..."
    recs = diagnose(_gpu(data_wait_frac=0.5, sample_s=0.01, transform_s=shares, decode_advice=advice)).recommendations
    assert [r for r in recs if "outside the transforms" in r] == [f"40% of sample time is outside the transforms: {advice}"]
    plain = diagnose(_gpu(data_wait_frac=0.5, sample_s=0.01, transform_s=shares)).recommendations
    assert not any("outside the transforms" in r for r in plain)  # 40% < 50%: no code change asked for
    mostly_decode = diagnose(_gpu(data_wait_frac=0.5, sample_s=0.01, transform_s={"Format": 0.004})).recommendations
    assert any("60% of sample time is outside the transforms (reading / decoding)" in r for r in mostly_decode)
    evidence = diagnose(_gpu(data_wait_frac=0.5, sample_s=0.01, transform_s=shares)).evidence
    assert any(e.endswith("transforms: Mosaic 45%, Format 15%; outside the transforms (reading, decoding): 40%")
               for e in evidence)
    little = diagnose(_gpu(data_wait_frac=0.5, sample_s=0.01, transform_s={"Mosaic": 0.008}, decode_advice=advice))
    assert not any("outside the transforms" in r for r in little.recommendations)  # 20%: below the 30%


def test_a_batch_copied_again_to_be_sent_is_named_from_8_mib():
    big = diagnose(_gpu(data_wait_frac=0.5, unshared_batch_bytes=79 << 20))
    (rec,) = [r for r in big.recommendations if "default_collate" in r]
    assert rec.startswith("the collate function returns 79 MiB per batch in ordinary memory")
    assert any("holds 79 MiB of tensors outside shared memory" in e for e in big.evidence)
    small = diagnose(_gpu(data_wait_frac=0.5, unshared_batch_bytes=4 << 20))
    assert not any("default_collate" in r for r in small.recommendations)  # 4 MiB: evidence only
    assert any("holds 4 MiB" in e for e in small.evidence)
    compute = diagnose(_gpu(unshared_batch_bytes=79 << 20))
    assert compute.bottleneck == "compute" and not any("default_collate" in r for r in compute.recommendations)


def test_throughput_above_the_limit_says_the_limit_is_unreliable():
    above = diagnose(_gpu(throughput=1300.0, limit_throughput=1000.0)).evidence
    assert any("could not be measured reliably" in e for e in above) and not any("130%" in e for e in above)
    below = diagnose(_gpu(throughput=250.0, limit_throughput=1000.0)).evidence
    assert any("= 25% of the 1000.0 samples/s" in e for e in below)


def test_a_cpu_step_spread_over_the_workers_cores_gets_a_thread_count():
    def cpu(**kw):
        base = dict(device_type="cpu", step_time_s=0.04, compute_time_s=0.008, data_wait_frac=0.8,
                    batch_cpu_s=0.034, num_workers=2, usable_cpus=2, intra_op_threads=2)
        base.update(kw)
        return diagnose(Measurements(**base)).recommendations

    (rec,) = [r for r in cpu() if "set_num_threads" in r]
    assert rec.startswith("the step's 2 intra-op threads and 2 worker(s) share 2 cores") and "set_num_threads(1)" in rec
    assert not any("set_num_threads" in r for r in cpu(intra_op_threads=1))  # already leaves the workers theirs
    assert not any("set_num_threads" in r for r in cpu(usable_cpus=16, intra_op_threads=8))  # cores to spare
    assert not any("set_num_threads" in r for r in cpu(device_type="cuda"))  # a GPU step uses one thread
    (none_yet,) = [r for r in cpu(num_workers=0) if "set_num_threads" in r]  # the workers it recommends count
    assert "set_num_threads(1)" in none_yet


def test_a_training_thread_queued_for_a_core_is_named_with_fewer_workers():
    # YOLO at 8 cores on an H100: the loader kept up (6% data wait) and the step still ran at 0.77x of
    # its limit; a training thread that waits for a core looks the same in wall and CPU time
    m = _gpu(step_time_s=0.1, compute_time_s=0.08, launch_time_s=0.06, data_wait_frac=0.06, gpu_idle_frac=0.1,
             num_workers=8, usable_cpus=8, batch_cpu_s=0.3, main_runqueue_s=0.02,
             main_runqueue_frac=0.2)
    d = diagnose(m)
    assert any("waited 20.0 ms per step for a free core (20% of the measured window" in e for e in d.evidence)
    recs = d.recommendations
    assert recs[0].startswith("the training thread waited for a core 20% of the time (8 worker(s) on 8 usable")
    assert "lower num_workers from 8 to 5" in recs[0]  # ceil(0.3 / 0.08) + 1
    assert sum("lower num_workers" in r for r in recs) == 1  # not repeated by the compute rule


def test_a_short_core_wait_is_evidence_only_and_an_unmeasured_one_is_silent():
    short = diagnose(_gpu(num_workers=8, batch_cpu_s=0.1, main_runqueue_s=0.002, main_runqueue_frac=0.02))
    assert any("waited 2.0 ms per step" in e for e in short.evidence)
    assert not any("for a core" in r for r in short.recommendations)
    unmeasured = diagnose(_gpu(num_workers=8, batch_cpu_s=0.1))
    assert not any("free core" in e for e in unmeasured.evidence)


def test_a_core_wait_with_workers_all_needed_asks_to_leave_the_thread_a_core():
    m = _gpu(step_time_s=0.1, compute_time_s=0.08, data_wait_frac=0.05, num_workers=4, usable_cpus=4,
             batch_cpu_s=0.5, main_runqueue_s=0.015, main_runqueue_frac=0.15)
    recs = diagnose(m).recommendations
    assert recs[0].endswith("po.autotune measures the worker count") and "leave it a core" in recs[0]


def test_a_data_bound_step_gets_its_data_recommendations_before_the_core_wait():
    m = _gpu(step_time_s=0.24, compute_time_s=0.09, data_wait_frac=0.55, gpu_idle_frac=0.6, num_workers=4,
             batch_cpu_s=1.0, main_runqueue_s=0.03, main_runqueue_frac=0.12)
    recs = diagnose(m).recommendations
    assert recs[0].startswith("raise num_workers from 4 to 14")
    assert any(r.startswith("the training thread waited for a core 12%") for r in recs[1:])


def test_the_training_threads_cpu_is_a_share_of_the_windows_mean_step_when_that_differs_from_the_median():
    """A window with a few long steps: 411.9 ms of CPU per step read as "100% of the step" beside a
    106.9 ms median step."""
    ev = diagnose(_gpu(step_time_s=0.1069, main_thread_cpu_s=0.4119, window_step_s=0.52)).evidence
    (line,) = [e for e in ev if "training thread ran on a CPU" in e]
    assert "(79% of the measured window's mean step of 520.0 ms; the median step is 106.9 ms)" in line, line
    close = diagnose(_gpu(step_time_s=0.06, main_thread_cpu_s=0.038, window_step_s=0.062)).evidence
    assert any("(61% of the step)" in e for e in close), close


def test_the_training_threads_own_cpu_is_stated_beside_the_processs():
    ev = diagnose(_gpu(step_time_s=0.06, main_thread_cpu_s=0.038, main_cpu_s=0.055)).evidence
    (line,) = [e for e in ev if "training thread ran on a CPU" in e]
    assert line.startswith("the training thread ran on a CPU 38.0 ms per step (63% of the step)")
    assert "threads together 55.0 ms" in line
    alone = diagnose(_gpu(step_time_s=0.06, main_thread_cpu_s=0.038, main_cpu_s=None)).evidence
    assert any(e.endswith("(63% of the step)") for e in alone)
    assert not any("training thread ran" in e for e in diagnose(_gpu(main_thread_cpu_s=None)).evidence)


def test_each_movable_transform_gets_the_way_its_framework_moves_it():
    """The registry's device path picks the advice: split_transforms for Normalize, the replay for a random
    crop, attach() for ultralytics' stages; RandomPerspective is read as the framework of its neighbours."""
    tv = diagnose(_gpu(data_wait_frac=0.5, sample_s=0.01,
                       transform_s={"RandomResizedCrop": 0.003, "RandomPerspective": 0.002, "Normalize": 0.002}))
    recs = [r for r in tv.recommendations if r.startswith("move ")]
    assert any("Normalize" in r and "split_transforms" in r for r in recs)
    assert any("RandomResizedCrop" in r and "same draws" in r for r in recs)
    assert any("RandomPerspective" in r and "kornia" in r for r in recs)
    yolo = diagnose(_gpu(data_wait_frac=0.5, sample_s=0.01,
                         transform_s={"Mosaic": 0.004, "RandomPerspective": 0.002, "RandomHSV": 0.002}))
    (rec,) = [r for r in yolo.recommendations if r.startswith("move ")]
    assert "RandomPerspective" in rec and "RandomHSV" in rec and "attach(model)" in rec
    assert "Mosaic" not in rec  # no device path: it stays
    cpu = diagnose(Measurements(device_type="cpu", step_time_s=0.1, compute_time_s=0.01, data_wait_frac=0.9,
                                sample_s=0.01, transform_s={"Normalize": 0.003, "Lambda": 0.003}))
    assert [r for r in cpu.recommendations if "cheapen" in r] == ["cheapen the per-sample CPU work: Normalize (30%)"]

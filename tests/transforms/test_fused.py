"""The fused colour + flip kernel against the torch reference (RandomHSV and the flip modules).

On the CPU the Triton kernel runs under Triton's interpreter (``TRITON_INTERPRET=1``, in a child
process so this process's Triton stays compiled-mode); on a GPU it runs compiled. Both must equal
the reference bit for bit, which itself is checked against OpenCV / ultralytics in test_augment.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from pipeline_opt.transforms import fused
from pipeline_opt.transforms.augment import RandomHSV, hsv_luts
from pipeline_opt.transforms.detection import DetectionGPUAugment

REPO = Path(__file__).resolve().parents[2]
has_triton = fused._triton() is not None
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _colour_cube(step: int = 1) -> torch.Tensor:
    """Every RGB colour (every ``step``-th level per channel) as a (1, 3, H, W) uint8 image."""
    levels = torch.arange(0, 256, step, dtype=torch.uint8)
    r, g, b = torch.meshgrid(levels, levels, levels, indexing="ij")
    n = r.numel()
    side = int(n ** 0.5)
    while n % side:
        side -= 1
    return torch.stack((r, g, b)).reshape(1, 3, n // side, side).contiguous()


def _reference(images: torch.Tensor, gains: torch.Tensor | None, ud: torch.Tensor, lr: torch.Tensor,
               order: str = "RGB") -> torch.Tensor:
    """RandomHSV.apply then the flips, as separate torch operations (the fused path switched off)."""
    out = images
    if gains is not None:
        from pipeline_opt.transforms.augment import HSVParams

        out = RandomHSV(0.5, 0.5, 0.5, channel_order=order, fused=False).apply(images, HSVParams(gains))
    dev = images.device
    out = torch.where(ud.to(dev).view(-1, 1, 1, 1), out.flip(-2), out)
    return torch.where(lr.to(dev).view(-1, 1, 1, 1), out.flip(-1), out)


def _gains(n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(n, 3, generator=g, dtype=torch.float64) * 2 - 1) * torch.tensor([0.5, 0.9, 0.9],
                                                                                         dtype=torch.float64)


def test_not_used_on_the_cpu_without_the_interpreter(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert not fused.fused_available("cpu")
    with pytest.raises(RuntimeError, match="needs CUDA and Triton"):
        fused.hsv_flip(torch.zeros(1, 3, 4, 4, dtype=torch.uint8))


def test_the_fused_path_is_an_option_of_the_modules():
    from pipeline_opt.transforms.detection import DetectionGPUAugment

    assert RandomHSV().fused and not RandomHSV(fused=False).fused
    det = DetectionGPUAugment(fused=False)
    assert not det.fused and not det.hsv.fused
    det.fused = True
    assert det.fused and det.hsv.fused


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="uint8 \\(B, 3, H, W\\)"):
        fused.hsv_flip(torch.zeros(1, 3, 4, 4))
    with pytest.raises(ValueError, match="channel_order"):
        fused.hsv_flip(torch.zeros(1, 3, 4, 4, dtype=torch.uint8), channel_order="HSV")


def test_division_tables_match_the_reference_expressions():
    t = fused.hsv_tables()
    assert t.shape == (2, 256) and t.dtype == torch.int32
    assert int(t[0, 255]) == round((255 << 12) / 255) and int(t[1, 1]) == (180 << 12) // 6
    assert torch.equal(t[:, 0], t[:, 1])  # the divisor is clamped to >= 1, as in rgb_to_hsv_u8


_INTERPRETED = textwrap.dedent("""
    import torch
    from pipeline_opt.transforms import fused
    from pipeline_opt.transforms.augment import hsv_luts
    from tests.transforms.test_fused import _colour_cube, _gains, _reference
    assert fused.fused_available("cpu")
    cube = _colour_cube(step=5)  # 52**3 colours, every edge case of the hue sectors included
    g = torch.Generator().manual_seed(0)
    noise = torch.randint(0, 256, (3, 3, 29, 41), generator=g, dtype=torch.uint8)
    for images, seed in ((cube, 1), (cube, 2), (noise, 3)):
        n = images.shape[0]
        gains = _gains(n, seed)
        ud = torch.rand(n, generator=g) < 0.5
        lr = torch.rand(n, generator=g) < 0.5
        for order in ("RGB", "BGR"):
            out = fused.hsv_flip(images, hsv_luts(gains), flip_ud=ud, flip_lr=lr, channel_order=order)
            ref = _reference(images, gains, ud, lr, order)
            assert torch.equal(out, ref), (order, seed, (out.int() - ref.int()).abs().max())
        flips = fused.hsv_flip(noise, None, flip_lr=torch.tensor([True, False, True]))
        assert torch.equal(flips, _reference(noise, None, torch.zeros(3, dtype=torch.bool),
                                             torch.tensor([True, False, True])))
    print("interpreted kernel equals the reference")
""")


@pytest.mark.skipif(not has_triton, reason="Triton is not installed")
def test_kernel_equals_the_reference_under_the_interpreter():
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", _INTERPRETED], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "equals the reference" in proc.stdout


# ------------------------------------------------------------------------------------------------- CUDA
@pytest.mark.cuda
@cuda
def test_cuda_kernel_equals_the_reference_on_every_colour():
    assert fused.fused_available("cuda"), "Triton should be importable next to a CUDA torch"
    cube = _colour_cube().cuda()  # all 2**24 colours
    for seed in range(3):
        gains = _gains(1, seed)
        for order in ("RGB", "BGR"):
            out = fused.hsv_flip(cube, hsv_luts(gains), channel_order=order)
            ref = _reference(cube, gains, torch.zeros(1, dtype=torch.bool), torch.zeros(1, dtype=torch.bool), order)
            assert torch.equal(out, ref), (seed, order, int((out.int() - ref.int()).abs().max()))


@pytest.mark.cuda
@cuda
def test_cuda_kernel_equals_the_reference_on_a_real_batch():
    cv2 = pytest.importorskip("cv2")
    ua = pytest.importorskip("ultralytics.data.augment")
    bgr = cv2.imread(str(Path(ua.__file__).parents[1] / "assets" / "bus.jpg"))
    img = torch.from_numpy(bgr[..., ::-1].copy()).permute(2, 0, 1).contiguous()
    batch = img.unsqueeze(0).repeat(16, 1, 1, 1).cuda()
    g = torch.Generator().manual_seed(5)
    gains = _gains(16, 5)
    ud, lr = torch.rand(16, generator=g) < 0.3, torch.rand(16, generator=g) < 0.5
    out = fused.hsv_flip(batch, hsv_luts(gains), flip_ud=ud, flip_lr=lr)
    assert torch.equal(out, _reference(batch, gains, ud, lr))


@pytest.mark.cuda
@cuda
def test_detection_augment_never_waits_for_the_device_and_equals_the_unfused_path(monkeypatch):
    n, s = 8, 320
    g = torch.Generator().manual_seed(0)
    boxes = torch.rand(3 * n, 4, generator=g) * 0.5 + 0.25
    batch = {"img": torch.randint(0, 256, (n, 3, s, s), generator=g, dtype=torch.uint8).cuda(),
             "bboxes": boxes.cuda(), "cls": torch.zeros(3 * n, 1).cuda(),
             "batch_idx": torch.arange(n).repeat_interleave(3).float().cuda()}
    fast = DetectionGPUAugment(fliplr=0.5, flipud=0.5, translate=0.0, scale=0.0, seed=7)
    fast(batch)  # first call: compiles the kernel and caches the division tables on the device
    fast = DetectionGPUAugment(fliplr=0.5, flipud=0.5, translate=0.0, scale=0.0, seed=7)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        out = fast(batch)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    slow = DetectionGPUAugment(fliplr=0.5, flipud=0.5, translate=0.0, scale=0.0, seed=7, fused=False)(batch)
    assert torch.equal(out["img"], slow["img"])
    for k in ("bboxes", "cls", "batch_idx"):
        assert torch.equal(out[k], slow[k]), k
    assert out["bboxes"].shape == batch["bboxes"].shape  # colour and flips drop no box

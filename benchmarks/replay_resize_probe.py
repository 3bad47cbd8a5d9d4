"""Is batching the replay's per-image crop + resize worth moving into the library? A probe, not a feature.

The random training pipeline's device stage (:class:`pipeline_opt.transforms.random_gpu.RandomGpuPipeline`)
crops and resizes each image on its own: about six kernels and 80 µs of Python per image, in the
preparing thread beside the training loop. This probe times that per-image path against one batched
version of the same arithmetic on the same decoded batch:

* per sample, the weights of PyTorch's antialiased bilinear kernel (``upsample_bilinear2d_aa``:
  triangle filter, support = scale when downscaling, normalised taps) for its crop box, as tap
  indices into the full image and tap weights;
* per batch, a horizontal pass over the full rows (one gather + multiply-add per tap), then a
  vertical pass over the output rows (one per tap), in chunks of ``--chunk`` images.

It reports milliseconds per batch (CUDA events), the host CPU time of the calling thread, and the
pixels where the two paths differ after rounding, so that the decision rests on a measured speed and
a measured error. Run on the GPU machine: ``python -m benchmarks.replay_resize_probe --device cuda``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from pipeline_opt.transforms.replay_parity import timed_call


def aa_taps(starts: torch.Tensor, lengths: torch.Tensor, out: int) -> tuple[torch.Tensor, torch.Tensor]:
    """For each sample's 1-D crop ``[start, start + length)`` resized to ``out``: the tap indices into
    the full axis ``(B, out, K)`` and their weights, as PyTorch's antialiased bilinear kernel computes
    them (float32, ``align_corners=False``); taps beyond a crop's own count carry weight 0."""
    device = starts.device
    length = lengths.to(torch.float32)
    scale = length / out
    ones = torch.ones_like(scale)
    support = torch.where(scale >= 1.0, scale, ones)
    invscale = torch.where(scale >= 1.0, 1.0 / scale, ones)
    center = scale[:, None] * (torch.arange(out, device=device, dtype=torch.float32)[None, :] + 0.5)
    first = torch.clamp((center - support[:, None] + 0.5).trunc(), min=0.0)
    count = torch.minimum((center + support[:, None] + 0.5).trunc(), length[:, None]) - first
    j = torch.arange(int(count.max().item()), device=device, dtype=torch.float32)
    weights = (1.0 - ((j + first[..., None] - center[..., None] + 0.5) * invscale[:, None, None]).abs()).clamp(min=0.0)
    weights = torch.where(j < count[..., None], weights, torch.zeros_like(weights))
    weights = weights / weights.sum(-1, keepdim=True)
    index = (first[..., None] + j).clamp(max=length[:, None, None] - 1.0) + starts.to(torch.float32)[:, None, None]
    return index.to(torch.long), weights


def crop_resize_batched(images: torch.Tensor, boxes: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """``images`` ``(B, C, H, W)`` uint8 of one size, ``boxes`` ``(B, 4)`` (top, left, height, width)
    -> ``(B, C, size)`` float32, unrounded: each crop resized with the antialiased bilinear weights."""
    b, c, height, _ = images.shape
    out_h, out_w = size
    top, left, box_h, box_w = boxes.to(images.device).unbind(-1)
    ix, wx = aa_taps(left, box_w, out_w)
    iy, wy = aa_taps(top, box_h, out_h)
    rows = None
    for k in range(ix.shape[-1]):  # horizontal pass over every row
        tap = images.gather(3, ix[:, None, None, :, k].expand(b, c, height, out_w)).to(torch.float32)
        tap.mul_(wx[:, None, None, :, k])
        rows = tap if rows is None else rows.add_(tap)
    out = None
    for k in range(iy.shape[-1]):  # vertical pass over the output rows
        tap = rows.gather(2, iy[:, None, :, k, None].expand(b, c, out_h, out_w))
        tap.mul_(wy[:, None, :, k, None])
        out = tap if out is None else out.add_(tap)
    return out


def crop_resize_per_image(images: torch.Tensor, boxes: Sequence[Sequence[int]], size: tuple[int, int]) -> torch.Tensor:
    """The library's per-image path: crop, to float, ``F.interpolate(antialias=True)``, one image at a time."""
    return torch.cat([F.interpolate(images[i:i + 1, :, t:t + h, x:x + w].to(torch.float32), size=list(size),
                                    mode="bilinear", align_corners=False, antialias=True)
                      for i, (t, x, h, w) in enumerate(boxes)])


def random_boxes(n: int, height: int, width: int, generator: torch.Generator) -> list[tuple[int, int, int, int]]:
    """RandomResizedCrop's boxes (scale 0.08-1, ratio 3/4-4/3) for ``n`` images of one size."""
    from torchvision.transforms import RandomResizedCrop

    state = torch.get_rng_state()
    torch.manual_seed(int(torch.randint(0, 2**31 - 1, (1,), generator=generator)))
    try:
        image = torch.empty(3, height, width)
        return [tuple(int(v) for v in RandomResizedCrop.get_params(image, [0.08, 1.0], [3 / 4, 4 / 3]))
                for _ in range(n)]
    finally:
        torch.set_rng_state(state)


def probe(device: torch.device, batch: int, height: int, width: int, size: tuple[int, int], chunk: int,
          repeats: int, seed: int = 0) -> dict[str, Any]:
    """Both paths on one synthetic photo-like batch: times, host CPU, and where they differ after rounding."""
    gen = torch.Generator().manual_seed(seed)
    noise = torch.randint(0, 256, (batch, 3, height // 8, width // 8), generator=gen, dtype=torch.uint8)
    images = F.interpolate(noise.to(torch.float32), size=(height, width), mode="bilinear",
                           align_corners=False).round().to(torch.uint8).to(device)
    boxes = random_boxes(batch, height, width, gen)
    box_tensor = torch.tensor(boxes, dtype=torch.long)

    def batched() -> torch.Tensor:
        return torch.cat([crop_resize_batched(images[i:i + chunk], box_tensor[i:i + chunk], size)
                          for i in range(0, batch, chunk)])

    def per_image() -> torch.Tensor:
        return crop_resize_per_image(images, boxes, size)

    want, got = per_image(), batched()
    want_q, got_q = torch.floor(want + 0.5).clamp(0, 255), torch.floor(got + 0.5).clamp(0, 255)
    per_s, per_host = timed_call(per_image, device, repeats)
    bat_s, bat_host = timed_call(batched, device, repeats)
    return {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "batch": batch, "image": [height, width], "size": list(size), "chunk": chunk, "repeats": repeats,
        "per_image_ms": per_s * 1e3, "per_image_host_ms": per_host * 1e3,
        "batched_ms": bat_s * 1e3, "batched_host_ms": bat_host * 1e3,
        "batched_vs_per_image": per_s / max(bat_s, 1e-12),
        "float_max_diff": float((got - want).abs().max()),
        "rounded_pixels_differing": float((got_q != want_q).to(torch.float32).mean()),
        "rounded_max_diff": float((got_q - want_q).abs().max()),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--image", default="1280x960", help="decoded image size, WxH")
    parser.add_argument("--size", type=int, default=224, help="output side")
    parser.add_argument("--chunk", type=int, default=32, help="images per batched call (bounds the memory)")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--out", type=Path, default=None, help="write the result JSON here")
    args = parser.parse_args(argv)
    width, height = (int(v) for v in args.image.lower().split("x"))
    result = probe(torch.device(args.device), args.batch, height, width, (args.size, args.size), args.chunk,
                   args.repeats)
    text = json.dumps(result, indent=1)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    sys.stdout.write(text + "\n")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())

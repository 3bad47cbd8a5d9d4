"""Transform benchmark: this project's batch transforms on the GPU against the CPU work they replace.

Per batch (GPU, CUDA events)
    normalize   uint8 (128, 3, 224, 224) -> float, /255, mean/std        (pipeline_opt.transforms.gpu)
    resize      uint8 (128, 3, 480, 640) -> (224, 224), bilinear + antialias
    hsv         uint8 (64, 3, 640, 640), ultralytics gains 0.015/0.7/0.4   (pipeline_opt.transforms.augment)
    flip        uint8 (64, 3, 640, 640), p=0.5
    affine      uint8 (64, 3, 640, 640), translate 0.1, scale 0.5
Per image on one CPU core (what a DataLoader worker spends; torch and OpenCV on one thread), times
the batch size for the per-batch comparison
    normalize   torchvision ToTensor + Normalize on a PIL image
    resize      PIL resize (BILINEAR) and cv2.resize (INTER_LINEAR)
    hsv         ultralytics RandomHSV (OpenCV LUTs);  flip: np.fliplr + ascontiguousarray
    affine      cv2.warpAffine (ultralytics RandomPerspective's warp), border 114
Per image decode on the CPU (1280x960 JPEG): Pillow decode, decode + resize to 224, draft decode
(``Image.draft``, DCT scaling) + resize, OpenCV imdecode, torchvision decode_jpeg. The Pillow flavour
that ran (stock Pillow or Pillow-SIMD) is in every decode row's name and in env.versions.pillow.

Every row is in images per second; ``seconds_per_call`` holds the raw time.

    python -m benchmarks.bench_transforms --out DIR        # H200: about 1 minute
"""

from __future__ import annotations

import io
import os
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # `python benchmarks/bench_transforms.py`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from benchmarks import harness as H  # noqa: E402

NAME = "bench_transforms"
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


@dataclass(frozen=True)
class Sizes:
    cls_batch: int = 128
    crop: int = 224
    src_hw: tuple[int, int] = (480, 640)
    det_batch: int = 64
    det_size: int = 640
    jpeg_size: tuple[int, int] = (1280, 960)
    reps: int = 20
    cpu_reps: int = 30
    max_seconds: float = 4.0
    budget_s: float = 120.0


QUICK = Sizes(cls_batch=4, crop=32, src_hw=(48, 64), det_batch=2, det_size=64, jpeg_size=(320, 240), reps=3,
              cpu_reps=3, max_seconds=0.5, budget_s=30.0)

OPS = ("normalize", "resize", "hsv", "flip", "affine")


# --------------------------------------------------------------------------------------------------
# the GPU side (this project's transforms)


def gpu_modules(sizes: Sizes) -> dict[str, Callable[[torch.Tensor], Any] | H.Missing]:
    """op -> a callable on a uint8 batch (or Missing with the reason)."""
    out: dict[str, Any] = {}
    gpu = H.optional("pipeline_opt.transforms.gpu", "ToFloat", "Normalize", "Resize")
    if gpu:
        to_float, normalize, resize = gpu
        tf, nm = to_float(), normalize(MEAN, STD)
        out["normalize"] = lambda x: nm(tf(x))
        out["resize"] = resize((sizes.crop, sizes.crop))
    else:
        out["normalize"] = out["resize"] = gpu
    aug = H.optional("pipeline_opt.transforms.augment", "RandomHSV", "RandomHorizontalFlip", "RandomAffine")
    if aug:
        hsv, flip, affine = aug
        out["hsv"] = hsv(0.015, 0.7, 0.4, seed=0)
        out["flip"] = flip(0.5, seed=0)
        out["affine"] = affine(translate=0.1, scale=0.5, seed=0)
    else:
        out["hsv"] = out["flip"] = out["affine"] = aug
    return out


def gpu_inputs(sizes: Sizes, device: torch.device) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)

    def u8(*shape: int) -> torch.Tensor:
        return torch.randint(0, 256, shape, generator=g, dtype=torch.uint8).to(device)

    cls = u8(sizes.cls_batch, 3, sizes.crop, sizes.crop)
    src = u8(sizes.cls_batch, 3, *sizes.src_hw)
    det = u8(sizes.det_batch, 3, sizes.det_size, sizes.det_size)
    return {"normalize": cls, "resize": src, "hsv": det, "flip": det, "affine": det}


def gpu_rows(sizes: Sizes, device: torch.device) -> list[H.Row]:
    mods, inputs = gpu_modules(sizes), gpu_inputs(sizes, device)
    rows = []
    for op in OPS:
        name = f"gpu {op} (per batch, {device.type})"
        mod, x = mods[op], inputs[op]
        if not mod:
            rows.append(H.not_run(name, "missing", mod.reason))
            continue
        if isinstance(mod, torch.nn.Module):
            mod.to(device)
        try:
            times = H.time_callable(lambda mod=mod, x=x: mod(x), device, reps=sizes.reps,
                                    max_seconds=sizes.max_seconds)
        except Exception as exc:
            H.log.exception("%s failed", name)
            rows.append(H.not_run(name, "failed", f"{type(exc).__name__}: {exc}"))
            continue
        rows.append(H.row_of_times(name, times, x.shape[0], {"op": op, "shape": list(x.shape), "side": "gpu"}))
    return rows


def host_seconds(fn: Callable[[], Any], device: torch.device, reps: int) -> float:
    """Median host seconds one call takes to return (its launches; the device is not waited for).

    The training thread of a launch-bound step pays this, however fast the kernels are."""
    times = []
    for _ in range(max(3, reps)):
        H.sync(device)
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    H.sync(device)
    return sorted(times)[len(times) // 2]


def detection_batch(sizes: Sizes, device: torch.device) -> dict[str, torch.Tensor]:
    """An ultralytics-like batch dict on ``device``: uint8 images, 4 boxes per image."""
    g = torch.Generator().manual_seed(1)
    n, s = sizes.det_batch, sizes.det_size
    return {"img": torch.randint(0, 256, (n, 3, s, s), generator=g, dtype=torch.uint8).to(device),
            "bboxes": (torch.rand(4 * n, 4, generator=g) * 0.5 + 0.25).to(device),
            "cls": torch.zeros(4 * n, 1).to(device),
            "batch_idx": torch.arange(n).repeat_interleave(4).float().to(device)}


def gpu_variant_rows(sizes: Sizes, device: torch.device) -> list[H.Row]:
    """The colour + flip work of ultralytics batches: the fused kernel against separate torch operations.

    Rows: RandomHSV alone without the fused kernel, and DetectionGPUAugment's colour + flips (no
    warp; what the ultralytics integration runs) fused and unfused. Each row also gives the host
    seconds per call (``host_seconds_per_call``): what the training thread spends launching it."""
    rows: list[H.Row] = []
    mods = H.optional("pipeline_opt.transforms.augment", "RandomHSV")
    det = H.optional("pipeline_opt.transforms.detection", "DetectionGPUAugment")
    if not mods or not det:
        return [H.not_run("gpu colour variants", "missing", (mods or det).reason)]
    hsv_cls, det_cls = mods, det
    fused_ok = H.optional("pipeline_opt.transforms.fused", "fused_available")
    x = gpu_inputs(sizes, device)["hsv"]
    batch = detection_batch(sizes, device)
    hsv = hsv_cls(0.015, 0.7, 0.4, seed=0)
    colour_flips = det_cls(translate=0.0, scale=0.0, fliplr=0.5, seed=0)
    variants = [
        ("gpu hsv, torch ops (per batch)", "hsv (torch ops)", H.AttrDuring(hsv, hsv, "fused", False), x),
        ("gpu colour+flips fused (per batch)", "colour+flips", colour_flips, batch),
        ("gpu colour+flips, torch ops (per batch)", "colour+flips (torch ops)",
         H.AttrDuring(colour_flips, colour_flips, "fused", False), batch),
    ]
    for name, op, fn, arg in variants:
        name = f"{name[:-1]}, {device.type})"
        try:
            times = H.time_callable(lambda fn=fn, arg=arg: fn(arg), device, reps=sizes.reps,
                                    max_seconds=sizes.max_seconds)
            host = host_seconds(lambda fn=fn, arg=arg: fn(arg), device, sizes.reps)
        except Exception as exc:
            H.log.exception("%s failed", name)
            rows.append(H.not_run(name, "failed", f"{type(exc).__name__}: {exc}"))
            continue
        meta = {"op": op, "shape": list(x.shape), "side": "gpu-variant",
                "fused_kernel": "torch ops" not in op and bool(fused_ok and fused_ok(device))}
        row = H.row_of_times(name, times, sizes.det_batch, meta)
        rows.append(row.with_extra(host_seconds_per_call=host))
    return rows


# --------------------------------------------------------------------------------------------------
# the CPU side (what one worker does per image)


def cpu_callables(sizes: Sizes) -> dict[str, Callable[[], Any]]:
    import cv2
    from PIL import Image
    from torchvision import transforms as T

    rng = np.random.default_rng(0)
    h, w = sizes.src_hw
    small = Image.fromarray(rng.integers(0, 256, (sizes.crop, sizes.crop, 3), dtype=np.uint8))
    src = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
    src_pil = Image.fromarray(src)
    det = rng.integers(0, 256, (sizes.det_size, sizes.det_size, 3), dtype=np.uint8)
    to_tensor_norm = T.Compose([T.ToTensor(), T.Normalize(MEAN, STD)])
    s = sizes.det_size
    matrix = cv2.getRotationMatrix2D((s / 2, s / 2), 0.0, 1.3)
    matrix[:, 2] += (0.05 * s, -0.05 * s)

    out: dict[str, Callable[[], Any]] = {
        "normalize torchvision ToTensor+Normalize": lambda: to_tensor_norm(small),
        "resize PIL bilinear": lambda: src_pil.resize((sizes.crop, sizes.crop), Image.BILINEAR),
        "resize cv2 linear": lambda: cv2.resize(src, (sizes.crop, sizes.crop), interpolation=cv2.INTER_LINEAR),
        "flip np.fliplr+contiguous": lambda: np.ascontiguousarray(np.fliplr(det)),
        "affine cv2.warpAffine": lambda: cv2.warpAffine(det, matrix, (s, s), borderValue=(114, 114, 114)),
    }
    hsv = H.optional("ultralytics.data.augment", "RandomHSV")
    if hsv:
        op = hsv(hgain=0.015, sgain=0.7, vgain=0.4)

        def ultralytics_hsv() -> Any:
            img = det.copy()  # RandomHSV works in place
            return op({"img": img})

        out["hsv ultralytics RandomHSV"] = ultralytics_hsv
    return out


def cpu_rows(sizes: Sizes) -> list[H.Row]:
    import cv2

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    cv2.setNumThreads(1)
    rows = []
    batch_of = {"normalize": sizes.cls_batch, "resize": sizes.cls_batch, "hsv": sizes.det_batch,
                "flip": sizes.det_batch, "affine": sizes.det_batch}
    try:
        for label, fn in cpu_callables(sizes).items():
            op = label.split()[0]
            times = H.time_callable(fn, None, reps=sizes.cpu_reps, max_seconds=sizes.max_seconds)
            row = H.row_of_times(f"cpu {label} (per image, 1 core)", times, 1, {"op": op, "side": "cpu"})
            per_image = row.extra["seconds_per_call"]
            rows.append(row.with_extra(worker_seconds_per_batch=per_image * batch_of[op], batch=batch_of[op]))
    finally:
        torch.set_num_threads(threads)
    return rows


PILLOW_OPS = ("decode", "decode+resize", "draft decode+resize")


class _Blobs:
    """The benchmark's JPEGs in memory, handed out round-robin."""

    def __init__(self, sizes: Sizes) -> None:
        folder, _ = H.image_folder(8, sizes.jpeg_size)
        self.blobs = [f.read_bytes() for f in sorted(folder.rglob("*.jpg"))]
        self.i = 0

    def __call__(self) -> bytes:
        self.i = (self.i + 1) % len(self.blobs)
        return self.blobs[self.i]


def _pillow_fns(sizes: Sizes, blob: _Blobs) -> dict[str, Callable[[], Any]]:
    from PIL import Image

    crop = (sizes.crop, sizes.crop)

    def decode() -> Any:
        return Image.open(io.BytesIO(blob())).convert("RGB")

    def decode_resize() -> Any:
        return decode().resize(crop, Image.BILINEAR)

    def draft_resize() -> Any:
        im = Image.open(io.BytesIO(blob()))
        im.draft("RGB", crop)
        return im.convert("RGB").resize(crop, Image.BILINEAR)

    return dict(zip(PILLOW_OPS, (decode, decode_resize, draft_resize)))


def _time_one_core(fns: dict[str, Callable[[], Any]], sizes: Sizes) -> dict[str, list[float]]:
    import cv2

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    cv2.setNumThreads(1)
    try:
        return {label: H.time_callable(fn, None, reps=sizes.cpu_reps, max_seconds=sizes.max_seconds)
                for label, fn in fns.items()}
    finally:
        torch.set_num_threads(threads)


def _decode_row(label: str, times: list[float], sizes: Sizes, flavour: str | None,
                version: str | None = None) -> H.Row:
    meta = {"op": "decode", "side": "cpu", "jpeg_size": list(sizes.jpeg_size)}
    if flavour is not None:
        meta.update(pillow=flavour, pillow_op=label, pillow_version=version)
    return H.row_of_times(f"cpu {label}{'' if flavour is None else ' ' + flavour} (per image, 1 core)", times, 1,
                          meta)


def pillow_times(sizes: Sizes) -> dict[str, Any]:
    """The Pillow decode rows' raw seconds with the Pillow this process imports (``--pillow-only``)."""
    return {**H.pillow_flavour(), "times": _time_one_core(_pillow_fns(sizes, _Blobs(sizes)), sizes)}


def other_pillow_rows(sizes: Sizes, site_dir: str, quick: bool) -> list[H.Row]:
    """The Pillow rows again in a child process that imports Pillow from ``site_dir`` first (a
    Pillow-SIMD build): both flavours measured in one run on one machine."""
    import json
    import os
    import subprocess

    name = "cpu decode pillow-simd (per image, 1 core)"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (site_dir, os.environ.get("PYTHONPATH")) if p)}
    cmd = [sys.executable, "-m", "benchmarks.bench_transforms", "--pillow-only"] + (["--quick"] if quick else [])
    try:
        proc = subprocess.run(cmd, env=env, cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True,
                              timeout=max(60.0, 10 * sizes.max_seconds * len(PILLOW_OPS)))
    except subprocess.TimeoutExpired:
        return [H.not_run(name, "failed", f"the child timing Pillow from {site_dir} ran past its limit")]
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        return [H.not_run(name, "failed", f"Pillow from {site_dir}: rc={proc.returncode}: {tail[0][:300]}")]
    got = json.loads(lines[-1])
    if got["flavour"] != "pillow-simd":
        return [H.not_run(name, "skipped", f"{site_dir} holds {got['flavour']} {got['version']}, not Pillow-SIMD")]
    return [_decode_row(label, got["times"][label], sizes, "pillow-simd", got["version"]) for label in PILLOW_OPS]


def decode_rows(sizes: Sizes, simd_dir: str | None = None, quick: bool = False) -> list[H.Row]:
    """Per-image JPEG decoding on one core: Pillow (stock, and Pillow-SIMD from ``simd_dir`` in a
    child process), draft, OpenCV, torchvision."""
    import cv2
    import torchvision

    flavour = H.pillow_flavour()["flavour"]
    blob = _Blobs(sizes)

    def cv2_decode() -> Any:
        return cv2.imdecode(np.frombuffer(blob(), np.uint8), cv2.IMREAD_COLOR)

    def tv_decode() -> Any:
        return torchvision.io.decode_jpeg(torch.frombuffer(bytearray(blob()), dtype=torch.uint8))

    times = _time_one_core(_pillow_fns(sizes, blob), sizes)
    version = H.pillow_flavour()["version"]
    rows = [_decode_row(label, times[label], sizes, flavour, version) for label in PILLOW_OPS]
    others = _time_one_core({"decode opencv imdecode": cv2_decode, "decode torchvision decode_jpeg (cpu)": tv_decode},
                            sizes)
    rows += [_decode_row(label, t, sizes, None) for label, t in others.items()]
    if flavour == "pillow-simd":
        pass
    elif simd_dir:
        rows += other_pillow_rows(sizes, simd_dir, quick)
    else:
        rows.append(H.not_run("cpu decode pillow-simd (per image, 1 core)", "skipped",
                              "no Pillow-SIMD given (--pillow-simd DIR, or make simd and rerun)"))
    return rows


def pillow_summary(rows: list[H.Row]) -> dict[str, Any]:
    """Per Pillow op: Pillow-SIMD's images/s over stock Pillow's, when both ran."""
    out = {}
    for op in PILLOW_OPS:
        by = {r.meta.get("pillow"): r for r in rows if r.status == "ok" and r.meta.get("pillow_op") == op}
        if "pillow" in by and "pillow-simd" in by:
            out[op] = {"pillow": by["pillow"].median, "pillow_simd": by["pillow-simd"].median,
                       "simd_vs_stock": H.ratio(by["pillow-simd"], by["pillow"])}
    return out


def summarize(rows: list[H.Row]) -> dict[str, Any]:
    """Per op: GPU seconds per batch vs one CPU worker's seconds for the same batch."""
    out: dict[str, Any] = {}
    for op in OPS:
        gpu = next((r for r in rows if r.meta.get("op") == op and r.meta.get("side") == "gpu" and r.status == "ok"),
                   None)
        cpus = [r for r in rows if r.meta.get("op") == op and r.meta.get("side") == "cpu" and r.status == "ok"]
        cpu = min(cpus, key=lambda r: r.extra["worker_seconds_per_batch"], default=None)
        entry: dict[str, Any] = {
            "gpu_seconds_per_batch": None if gpu is None else gpu.extra["seconds_per_call"],
            "cpu_best": None if cpu is None else cpu.name,
            "cpu_worker_seconds_per_batch": None if cpu is None else cpu.extra["worker_seconds_per_batch"],
        }
        if gpu is not None and cpu is not None:
            entry["gpu_speedup_vs_one_worker"] = entry["cpu_worker_seconds_per_batch"] / entry["gpu_seconds_per_batch"]
        out[op] = entry
    return out


def fused_summary(rows: list[H.Row]) -> dict[str, Any]:
    """Device and host seconds per batch of the colour work, fused kernel vs torch operations."""
    by = {r.meta.get("op"): r for r in rows if r.status == "ok" and str(r.meta.get("side", "")).startswith("gpu")}
    out: dict[str, Any] = {}
    for what, fused, unfused in (("hsv", "hsv", "hsv (torch ops)"),
                                 ("colour+flips", "colour+flips", "colour+flips (torch ops)")):
        a, b = by.get(fused), by.get(unfused)
        if a is None or b is None:
            continue
        out[what] = {"fused_s": a.extra["seconds_per_call"], "torch_ops_s": b.extra["seconds_per_call"],
                     "speedup": b.extra["seconds_per_call"] / a.extra["seconds_per_call"],
                     "fused_host_s": a.extra.get("host_seconds_per_call"),
                     "torch_ops_host_s": b.extra.get("host_seconds_per_call")}
    return out


def run(args: Any) -> Path:
    started = time.monotonic()
    sizes = QUICK if args.quick else Sizes()
    if args.budget_s:
        sizes = replace(sizes, budget_s=args.budget_s)
    device = H.pick_device(args.device)
    rows = []
    simd_dir = args.pillow_simd or os.environ.get("PO_PILLOW_SIMD_DIR") or None
    parts = [lambda: gpu_rows(sizes, device), lambda: gpu_variant_rows(sizes, device)]
    if not args.gpu_only:
        parts += [lambda: cpu_rows(sizes), lambda: decode_rows(sizes, simd_dir, args.quick)]
    for part in parts:
        try:
            rows += part()
        except Exception as exc:  # one failing part must not lose the others
            H.log.exception("part failed")
            rows.append(H.not_run(f"part {len(rows)}", "failed", f"{type(exc).__name__}: {exc}"))
    summary = {**summarize(rows), "pillow_simd": pillow_summary(rows), "fused": fused_summary(rows)}
    path = H.write_result(args.out, NAME, rows, config={**asdict(sizes), "device": str(device)}, summary=summary,
                          started=started, ledger={"model": "transforms", "ddp": False, "amp": ""})
    print(H.format_table(rows, title=f"{NAME} ({device})"))
    for op, entry in summary.items():
        if op == "fused":
            for name, e in entry.items():
                print(f"{name:<14} fused {e['fused_s'] * 1e3:.2f} ms vs torch ops {e['torch_ops_s'] * 1e3:.2f} ms "
                      f"per batch ({e['speedup']:.1f}x)")
            continue
        if op == "pillow_simd":
            for name, e in entry.items():
                print(f"{name:<20} pillow-simd / pillow = {e['simd_vs_stock']:.2f}")
            continue
        print(f"{op:<10} gpu/batch={entry['gpu_seconds_per_batch']}  one-worker/batch="
              f"{entry['cpu_worker_seconds_per_batch']}  x={entry.get('gpu_speedup_vs_one_worker')}")
    return path


def main(argv: list[str] | None = None) -> int:
    parser = H.common_parser(__doc__.splitlines()[0])
    parser.add_argument("--pillow-simd", default=None, metavar="DIR",
                        help="a site directory holding a Pillow-SIMD build: its decode rows are timed in a child "
                             "process next to the stock ones (default: $PO_PILLOW_SIMD_DIR)")
    parser.add_argument("--gpu-only", action="store_true",
                        help="only the GPU rows (skip the per-image CPU and decode rows)")
    parser.add_argument("--pillow-only", action="store_true",
                        help="only time the Pillow decode rows and print their seconds as JSON (the child's mode)")
    args = parser.parse_args(argv)
    H.setup(args)
    if args.pillow_only:
        import json

        print(json.dumps(pillow_times(QUICK if args.quick else Sizes())))
        return 0
    path = run(args)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

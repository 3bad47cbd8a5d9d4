"""The Replay* augmentations: Kornia augmentations fed the parameters the workers drew.

Each is a Kornia augmentation (``GeometricAugmentationBase2D`` / ``IntensityAugmentationBase2D``,
sharing :class:`ReplayAugment`) for one :class:`~pipeline_opt.transforms.replay.ReplayStep`;
:func:`replay_module` picks a step's class, and
:class:`~pipeline_opt.transforms.random_gpu.RandomGpuPipeline` runs them on a decoded batch.
They also work alone, in any ``AugmentationSequential`` (``data_keys`` with boxes for the geometric
ones): ``forward(x, params=aug.replay_params(rows))`` replays, ``forward(x)`` draws its own
parameters with torchvision's sampling functions — the same distribution, not the same draws.
Kornia's kernels are used where they match torchvision (flips; colour on float images), the
project's own where they do not (resize: Kornia's antialias is a Gaussian; colour on PIL images:
Pillow's 8-bit arithmetic; erasing with per-channel or random values); ``docs/gpu_ops.md`` has the
measured table. Needs Kornia (an ``ImportError`` names ``pip install 'pipeline-opt[gpu]'``): the
package reaches this module lazily, through :mod:`~pipeline_opt.transforms.random_gpu`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

try:
    from kornia.augmentation import GeometricAugmentationBase2D, IntensityAugmentationBase2D
    from kornia.augmentation import RandomHorizontalFlip as _KorniaHFlip
    from kornia.augmentation import RandomVerticalFlip as _KorniaVFlip
except ImportError as e:  # pragma: no cover - exercised by the no-kornia test through a subprocess
    raise ImportError(
        "pipeline_opt.transforms.replay_ops needs Kornia (kornia>=0.9), which is not installed: "
        "pip install 'pipeline-opt[gpu]' (or pip install 'kornia>=0.9')") from e

try:  # marks a matrix function that reads only the input's shape, so Kornia does not keep the batch alive
    from kornia.augmentation._2d.base import _input_metadata_only
except ImportError:  # pragma: no cover - a Kornia without the marker computes the matrix eagerly instead
    def _input_metadata_only(method):
        return method

from pipeline_opt.transforms import gpu
from pipeline_opt.transforms import replay_kernels as K
from pipeline_opt.transforms.policy_draws import OPS as POLICY_OPS
from pipeline_opt.transforms.policy_kernels import apply_op as apply_policy_op
from pipeline_opt.transforms.replay import ReplayStep, sample_step, step_of

__all__ = [
    "ReplayAugMix", "ReplayAugment", "ReplayCenterCrop", "ReplayColorJitter", "ReplayCrop", "ReplayErasing", "ReplayGrayscale",
    "ReplayHorizontalFlip", "ReplayAutoAugment", "ReplayResize", "ReplayResizedCrop", "ReplayVerticalFlip",
    "apply_slot", "register_replay_module", "replay_module",
]


class ReplayAugment:
    """What every Replay* augmentation shares: its :class:`ReplayStep`, the slice of the parameter
    row it owns, and parameter dicts built from rows (replay) or drawn here (same distribution)."""

    step: ReplayStep

    def _init_step(self, step: ReplayStep, kinds: Sequence[str]) -> None:
        if step.kind not in kinds:
            raise ValueError(f"{type(self).__name__} replays {'/'.join(kinds)} steps, got a {step.kind} step "
                             f"({step.name}); use replay_module(step) to pick the right class")
        self.step = step
        self.flavour = step.flavour

    @classmethod
    def from_transform(cls, transform: Any, flavour: str = "float") -> Any:
        """The augmentation for one torchvision transform, working on images of ``flavour``
        (``"float"``: [0, 1] floats, ``"uint8"`` / ``"pil"``: 0..255 integer-valued floats)."""
        return cls(step_of(transform, flavour))

    def rows(self, params: torch.Tensor) -> torch.Tensor:
        """This step's columns of the batch's ``(B, P)`` parameter rows."""
        return params[:, self.step.offset:self.step.offset + self.step.width]

    def replay_params(self, params: torch.Tensor, patches: Sequence[Sequence[torch.Tensor]] | None = None,
                      shape: Sequence[int] | None = None) -> dict[str, torch.Tensor]:
        """The Kornia parameter dict for the batch whose rows are ``params`` (``(B, P)`` float64,
        host); ``patches[b]`` are sample ``b``'s random erase patches for this step; ``shape`` is the
        input batch shape (for the transformation matrices)."""
        rows = self.rows(params)
        out = self._params_from_rows(rows, patches)
        out.setdefault("batch_prob", torch.ones(rows.shape[0]))
        if shape is not None:
            out["forward_input_shape"] = torch.tensor(list(shape), dtype=torch.long)
        return out

    def _params_from_rows(self, rows: torch.Tensor, patches: Any) -> dict[str, torch.Tensor]:
        return {}

    def forward_parameters(self, batch_shape: Sequence[int]) -> dict[str, torch.Tensor]:
        """Draw parameters here (no replay given): torchvision's sampling per sample, on the global
        torch RNG — the same distribution as the CPU pipeline, not the same draws."""
        b, c, h, w = (int(v) for v in batch_shape)
        rows = torch.zeros(b, self.step.offset + self.step.width, dtype=torch.float64)
        patches = []
        for i in range(b):
            own: list[torch.Tensor] = []
            if self.step.width:
                rows[i, self.step.offset:] = torch.tensor(sample_step(self.step, c, h, w, own), dtype=torch.float64)
            patches.append(own)
        return self.replay_params(rows, patches, shape=batch_shape)

    def replay_single(self, x: torch.Tensor, params: dict[str, torch.Tensor]) -> torch.Tensor:
        """Apply to a one-image batch outside Kornia's wrapper (the per-sample stage)."""
        if float(params["batch_prob"][0]) < 0.5:
            return x
        return self.apply_transform(x, params, self.flags)


# ---------------------------------------------------------------------------------------- geometric

def _crop_scale_matrix(top: torch.Tensor, left: torch.Tensor, h: torch.Tensor, w: torch.Tensor,
                       out_h: int, out_w: int, like: torch.Tensor) -> torch.Tensor:
    """(B, 3, 3) map of a crop box resized to ``out``: ``x' = s (x - left)`` — torchvision's box
    arithmetic (Kornia applies the matrix to the box corners as given)."""
    sx = out_w / w.to(like.dtype)
    sy = out_h / h.to(like.dtype)
    mat = torch.zeros(top.shape[0], 3, 3, dtype=like.dtype)
    mat[:, 0, 0] = sx
    mat[:, 1, 1] = sy
    mat[:, 0, 2] = -left.to(like.dtype) * sx
    mat[:, 1, 2] = -top.to(like.dtype) * sy
    mat[:, 2, 2] = 1.0
    return mat.to(like.device)


def _flip_matrix(input: torch.Tensor, params: dict, axis: int) -> torch.Tensor:
    """(B, 3, 3) flip ``x' = W - x`` (torchvision's box flip; Kornia's own uses ``W - 1``, one pixel off)."""
    size = float(params["forward_input_shape"][-1 if axis == 0 else -2])
    mat = torch.eye(3, dtype=input.dtype, device=input.device)
    mat[axis, axis] = -1.0
    mat[axis, 2] = size
    return mat.expand(input.shape[0], 3, 3)


class ReplayResizedCrop(ReplayAugment, GeometricAugmentationBase2D):
    """``RandomResizedCrop`` with given boxes: crop each sample, resize it with torchvision's
    bilinear (antialiased) kernel, round to levels where the CPU image was 8-bit."""

    def __init__(self, step: ReplayStep) -> None:
        GeometricAugmentationBase2D.__init__(self, p=1.0)
        self._init_step(step, ("resized_crop",))
        self.size = step.options["size"]
        self.antialias = step.options["antialias"]

    def _params_from_rows(self, rows: torch.Tensor, patches: Any) -> dict[str, torch.Tensor]:
        return {"box": rows[:, :4].to(torch.long)}

    def compute_transformation(self, input: torch.Tensor, params: dict, flags: dict) -> torch.Tensor:
        top, left, h, w = params["box"].unbind(-1)
        return _crop_scale_matrix(top, left, h, w, self.size[0], self.size[1], input)

    def apply_transform(self, input: torch.Tensor, params: dict, flags: dict,
                        transform: torch.Tensor | None = None) -> torch.Tensor:
        boxes = params["box"].tolist()
        return torch.cat([K.crop_resize(input[i:i + 1], *box, self.size, self.antialias, self.flavour)
                          for i, box in enumerate(boxes)])


class ReplayCrop(ReplayAugment, GeometricAugmentationBase2D):
    """``RandomCrop`` (with ``padding`` / ``pad_if_needed``) with given paddings and offsets."""

    def __init__(self, step: ReplayStep) -> None:
        GeometricAugmentationBase2D.__init__(self, p=1.0)
        self._init_step(step, ("crop",))
        self.size = step.options["size"]
        fill = step.options["fill"]
        self.fill = tuple(float(int(v)) for v in fill) if step.flavour == "pil" else fill
        self.padding_mode = step.options["padding_mode"]

    def _params_from_rows(self, rows: torch.Tensor, patches: Any) -> dict[str, torch.Tensor]:
        rows = rows.to(torch.long)
        return {"padding": rows[:, 0:4], "padding2": rows[:, 4:8], "offset": rows[:, 8:10]}

    def compute_transformation(self, input: torch.Tensor, params: dict, flags: dict) -> torch.Tensor:
        pad = params["padding"] + params["padding2"]
        dx = (pad[:, 0] - params["offset"][:, 1]).to(input.dtype)
        dy = (pad[:, 1] - params["offset"][:, 0]).to(input.dtype)
        mat = torch.eye(3, dtype=input.dtype).repeat(dx.shape[0], 1, 1)
        mat[:, 0, 2] = dx
        mat[:, 1, 2] = dy
        return mat.to(input.device)

    def apply_transform(self, input: torch.Tensor, params: dict, flags: dict,
                        transform: torch.Tensor | None = None) -> torch.Tensor:
        th, tw = self.size
        out = []
        for i, (p1, p2, (top, left)) in enumerate(zip(params["padding"].tolist(), params["padding2"].tolist(),
                                                      params["offset"].tolist())):
            x = K.pad(input[i:i + 1], p1, self.fill, self.padding_mode)
            x = K.pad(x, p2, self.fill, self.padding_mode)
            out.append(x[..., top:top + th, left:left + tw])
        return torch.cat(out)


class ReplayCenterCrop(ReplayAugment, GeometricAugmentationBase2D):
    """``CenterCrop`` (deterministic; zero padding when the crop is larger, as torchvision)."""

    def __init__(self, step: ReplayStep) -> None:
        GeometricAugmentationBase2D.__init__(self, p=1.0)
        self._init_step(step, ("center_crop",))
        self.crop = gpu.CenterCrop(step.options["size"])

    def compute_transformation(self, input: torch.Tensor, params: dict, flags: dict) -> torch.Tensor:
        h, w = input.shape[-2:]
        ch, cw = self.crop.size
        mat = torch.eye(3, dtype=input.dtype, device=input.device).repeat(input.shape[0], 1, 1)
        mat[:, 0, 2] = -float(int(round((w - cw) / 2.0)))
        mat[:, 1, 2] = -float(int(round((h - ch) / 2.0)))
        return mat

    def apply_transform(self, input: torch.Tensor, params: dict, flags: dict,
                        transform: torch.Tensor | None = None) -> torch.Tensor:
        return self.crop(input)


class ReplayResize(ReplayAugment, GeometricAugmentationBase2D):
    """``Resize`` (deterministic) with torchvision's bilinear kernel, rounded where the CPU image was 8-bit."""

    def __init__(self, step: ReplayStep) -> None:
        GeometricAugmentationBase2D.__init__(self, p=1.0)
        self._init_step(step, ("resize",))
        o = step.options
        self.resize = gpu.Resize(o["size"], antialias=o["antialias"], max_size=o["max_size"])

    def compute_transformation(self, input: torch.Tensor, params: dict, flags: dict) -> torch.Tensor:
        h, w = input.shape[-2:]
        oh, ow = self.resize.output_size(h, w)
        zero = torch.zeros(input.shape[0], dtype=torch.long)
        return _crop_scale_matrix(zero, zero, zero + h, zero + w, oh, ow, input)

    def apply_transform(self, input: torch.Tensor, params: dict, flags: dict,
                        transform: torch.Tensor | None = None) -> torch.Tensor:
        h, w = input.shape[-2:]
        out = K.crop_resize(input, 0, 0, h, w, self.resize.output_size(h, w), self.resize.antialias, self.flavour)
        return out


class ReplayHorizontalFlip(ReplayAugment, _KorniaHFlip):
    """``RandomHorizontalFlip`` with given flip bits: Kornia's flip kernel; boxes map as torchvision's."""

    def __init__(self, step: ReplayStep) -> None:
        _KorniaHFlip.__init__(self, p=step.options["p"])
        self._init_step(step, ("hflip",))

    @_input_metadata_only
    def compute_transformation(self, input: torch.Tensor, params: dict, flags: dict) -> torch.Tensor:
        return _flip_matrix(input, params, axis=0)

    def _params_from_rows(self, rows: torch.Tensor, patches: Any) -> dict[str, torch.Tensor]:
        return {"batch_prob": rows[:, 0].to(torch.float32)}


class ReplayVerticalFlip(ReplayAugment, _KorniaVFlip):
    """``RandomVerticalFlip`` with given flip bits: Kornia's flip kernel; boxes map as torchvision's."""

    def __init__(self, step: ReplayStep) -> None:
        _KorniaVFlip.__init__(self, p=step.options["p"])
        self._init_step(step, ("vflip",))

    @_input_metadata_only
    def compute_transformation(self, input: torch.Tensor, params: dict, flags: dict) -> torch.Tensor:
        return _flip_matrix(input, params, axis=1)

    def _params_from_rows(self, rows: torch.Tensor, patches: Any) -> dict[str, torch.Tensor]:
        return {"batch_prob": rows[:, 0].to(torch.float32)}


# ----------------------------------------------------------------------------------------- intensity

_JITTER = (K.adjust_brightness, K.adjust_contrast, K.adjust_saturation, K.adjust_hue)


class ReplayColorJitter(ReplayAugment, IntensityAugmentationBase2D):
    """``ColorJitter`` with given factors and per-sample order (``fn_idx``).

    At each of the four positions of the order, the samples whose op there is brightness (contrast,
    saturation, hue) get it with their own factor, in one batched kernel per op: four positions x
    four ops kernels at most per batch, each sample transformed once per op. The grouping is
    computed from the host copy of the parameters, so it makes no device synchronisation.
    """

    def __init__(self, step: ReplayStep) -> None:
        IntensityAugmentationBase2D.__init__(self, p=1.0)
        self._init_step(step, ("color_jitter",))
        self.enabled = tuple(step.options["ranges"][k] is not None
                             for k in ("brightness", "contrast", "saturation", "hue"))

    def _params_from_rows(self, rows: torch.Tensor, patches: Any) -> dict[str, torch.Tensor]:
        return {"order": rows[:, :4].to(torch.long), "factors": rows[:, 4:8].to(torch.float32)}

    def apply_transform(self, input: torch.Tensor, params: dict, flags: dict,
                        transform: torch.Tensor | None = None) -> torch.Tensor:
        order = params["order"].cpu()
        factors = params["factors"].cpu()
        x = input
        for position in range(4):
            for op in range(4):
                if not self.enabled[op]:
                    continue
                index = (order[:, position] == op).nonzero().view(-1)
                if index.numel() == 0:
                    continue
                f = factors[index, op]
                if index.numel() == x.shape[0]:
                    x = _JITTER[op](x, f, self.flavour)
                    continue
                dev_index = index.to(x.device, non_blocking=True)
                part = _JITTER[op](x.index_select(0, dev_index), f, self.flavour)
                x = x.index_copy(0, dev_index, part)
        return x


class ReplayGrayscale(ReplayAugment, IntensityAugmentationBase2D):
    """``RandomGrayscale`` with given bits, or ``Grayscale(3)`` (every sample)."""

    def __init__(self, step: ReplayStep) -> None:
        always = step.kind == "grayscale"
        IntensityAugmentationBase2D.__init__(self, p=1.0 if always else step.options["p"])
        self._init_step(step, ("grayscale", "random_grayscale"))
        self._always = always

    def _params_from_rows(self, rows: torch.Tensor, patches: Any) -> dict[str, torch.Tensor]:
        return {} if self._always else {"batch_prob": rows[:, 0].to(torch.float32)}

    def apply_transform(self, input: torch.Tensor, params: dict, flags: dict,
                        transform: torch.Tensor | None = None) -> torch.Tensor:
        return K.to_grayscale(input, self.flavour)


class ReplayErasing(ReplayAugment, IntensityAugmentationBase2D):
    """``RandomErasing`` with given boxes and values (one value, one per channel, or the random
    normal patches drawn on the CPU)."""

    def __init__(self, step: ReplayStep) -> None:
        IntensityAugmentationBase2D.__init__(self, p=step.options["p"])
        self._init_step(step, ("erase",))
        value = step.options["value"]
        self.value = None if value is None else torch.tensor(value, dtype=torch.float32)

    def _params_from_rows(self, rows: torch.Tensor, patches: Any) -> dict[str, torch.Tensor]:
        out = {"batch_prob": rows[:, 0].to(torch.float32), "box": rows[:, 1:5].to(torch.long)}
        if self.value is None:
            out["patches"] = list(patches) if patches is not None else [[] for _ in range(rows.shape[0])]
        return out

    def apply_transform(self, input: torch.Tensor, params: dict, flags: dict,
                        transform: torch.Tensor | None = None) -> torch.Tensor:
        apply = params["batch_prob"] > 0.5
        if self.value is not None:
            return K.erase_constant(input, params["box"], apply, self.value)
        chosen = apply.nonzero().view(-1).tolist()
        boxes = params["box"].tolist()
        missing = [i for i in chosen if not params["patches"][i]]
        if missing:
            raise ValueError(f"ReplayErasing(value='random') needs the drawn patches of samples {missing}; "
                             "pass patches= to replay_params (RandomGpuPipeline does)")
        return K.erase_patches(input, [boxes[i] for i in chosen], chosen, [params["patches"][i][0] for i in chosen])


class ReplayAutoAugment(ReplayAugment, IntensityAugmentationBase2D):
    """``AutoAugment`` / ``RandAugment`` / ``TrivialAugmentWide`` with the workers' draws.

    Each operation slot of the row (op code, magnitude) is applied in order; within a slot the
    samples that drew the same operation get it together, each with its own magnitude, in the
    arithmetic of the CPU image at that point (:mod:`~pipeline_opt.transforms.policy_kernels`):
    fifteen kernels per slot at most. The grouping reads the host copy of the rows (no device sync).
    """

    def __init__(self, step: ReplayStep) -> None:
        IntensityAugmentationBase2D.__init__(self, p=1.0)
        self._init_step(step, ("auto_augment",))
        if self.flavour == "float":
            raise ValueError(f"{step.name} is replayed on PIL or uint8 images only, got a float step")
        self.slots = int(step.options["slots"])

    def _params_from_rows(self, rows: torch.Tensor, patches: Any) -> dict[str, torch.Tensor]:
        return {"codes": rows[:, 0::2].to(torch.long), "magnitudes": rows[:, 1::2].clone()}

    def apply_transform(self, input: torch.Tensor, params: dict, flags: dict,
                        transform: torch.Tensor | None = None) -> torch.Tensor:
        codes, magnitudes = params["codes"].cpu(), params["magnitudes"].cpu()
        x, apply = input, _policy_op(self.flavour, self.step.options)
        for slot in range(self.slots):
            x = apply_slot(x, codes[:, slot], magnitudes[:, slot], apply)
        return x


def apply_slot(x: torch.Tensor, codes: torch.Tensor, magnitudes: torch.Tensor,
               apply: Callable[[int, torch.Tensor, list[float]], torch.Tensor]) -> torch.Tensor:
    """One operation slot: the samples that drew op ``code`` get ``apply(code, their images, their
    magnitudes)`` together (codes < 0: no op); the grouping reads host tensors, so nothing syncs."""
    for code in sorted(set(codes.tolist())):
        if code < 0:
            continue
        index = (codes == code).nonzero().view(-1)
        mags = magnitudes[index].tolist()
        if index.numel() == x.shape[0]:
            x = apply(code, x, mags)
            continue
        dev_index = index.to(x.device, non_blocking=True)
        x = x.index_copy(0, dev_index, apply(code, x.index_select(0, dev_index), mags))
    return x


def _policy_op(flavour: str, options: dict[str, Any]) -> Callable[[int, torch.Tensor, list[float]], torch.Tensor]:
    def apply(code: int, x: torch.Tensor, mags: list[float]) -> torch.Tensor:
        return apply_policy_op(POLICY_OPS[code], x, mags, flavour, options["interpolation"], options["fill"])
    return apply


class ReplayAugMix(ReplayAugment, IntensityAugmentationBase2D):
    """``AugMix`` with the workers' draws: ``mix = m0 * x + sum_i w_i * chain_i(x)``, truncated to levels.

    Each chain's ops run in torchvision's uint8 tensor arithmetic (AugMix converts a PIL image to a
    tensor before its chains), batched by op per slot as :class:`ReplayAutoAugment` does; the
    weights are the float32 Dirichlet draws, applied in the original's order.
    """

    def __init__(self, step: ReplayStep) -> None:
        IntensityAugmentationBase2D.__init__(self, p=1.0)
        self._init_step(step, ("augmix",))
        if self.flavour == "float":
            raise ValueError(f"{step.name} is replayed on PIL or uint8 images only, got a float step")
        self.chains = int(step.options["chains"])
        self.depth = int(step.options["depth"])

    def _params_from_rows(self, rows: torch.Tensor, patches: Any) -> dict[str, torch.Tensor]:
        k = self.chains
        ops = rows[:, 1 + k:].reshape(rows.shape[0], k, self.depth, 2)
        return {"weights": rows[:, :1 + k].to(torch.float32), "codes": ops[..., 0].to(torch.long),
                "magnitudes": ops[..., 1].clone()}

    def apply_transform(self, input: torch.Tensor, params: dict, flags: dict,
                        transform: torch.Tensor | None = None) -> torch.Tensor:
        codes, magnitudes = params["codes"].cpu(), params["magnitudes"].cpu()
        weights = params["weights"].to(input.device, non_blocking=True).view(input.shape[0], -1, 1, 1, 1)
        mix, apply = weights[:, 0] * input, _policy_op("uint8", self.step.options)
        for chain in range(self.chains):
            aug = input
            for slot in range(self.depth):
                aug = apply_slot(aug, codes[:, chain, slot], magnitudes[:, chain, slot], apply)
            mix.add_(weights[:, 1 + chain] * aug)
        return mix.trunc_()


class _Plain(torch.nn.Module):
    """A deterministic conversion (ToTensor / ToDtype / Normalize) on the batch."""

    def __init__(self, step: ReplayStep) -> None:
        super().__init__()
        self.step = step
        self.module = step.options["module"]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.step.kind == "to_float":  # x holds 0..255 levels as floats: scale as the uint8 image would be
            return _scale(self.module, x)
        return self.module(x)

    def extra_repr(self) -> str:
        return f"{self.step.name}: {self.module!r}"


def _scale(module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """uint8 -> float scaling applied to integer-valued floats, bit-identical to the uint8 path:
    ``ToFloat`` divides by 255, ``ConvertDtype`` (v2 ``to_dtype``) multiplies by 1/255."""
    if isinstance(module, gpu.ConvertDtype):
        return x.to(module.dtype).mul_(1.0 / 255)
    return x.to(module.dtype).div_(255.0)


_CLASSES: dict[str, Callable[[ReplayStep], torch.nn.Module]] = {
    "resized_crop": ReplayResizedCrop, "crop": ReplayCrop, "center_crop": ReplayCenterCrop, "resize": ReplayResize,
    "hflip": ReplayHorizontalFlip, "vflip": ReplayVerticalFlip, "color_jitter": ReplayColorJitter,
    "grayscale": ReplayGrayscale, "random_grayscale": ReplayGrayscale, "erase": ReplayErasing,
    "auto_augment": ReplayAutoAugment, "augmix": ReplayAugMix, "to_float": _Plain, "normalize": _Plain,
}


def register_replay_module(kind: str, cls: Callable[[ReplayStep], torch.nn.Module]) -> None:
    """Add the device module of replay ``kind`` (a framework's own steps: :mod:`~.timm_ops`); each kind once."""
    if kind in _CLASSES:
        raise ValueError(f"replay kind {kind!r} has a device module already ({_CLASSES[kind].__name__})")
    _CLASSES[kind] = cls


def replay_module(step: ReplayStep) -> torch.nn.Module | None:
    """The device module for ``step`` (``None`` for ``to_uint8``, which changes nothing on the device)."""
    if step.kind == "to_uint8":
        return None
    return _CLASSES[step.kind](step)

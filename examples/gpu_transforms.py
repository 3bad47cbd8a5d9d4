"""Move the tensor-level transforms of a torchvision pipeline onto the GPU, on whole batches.

    python examples/gpu_transforms.py --images 64

``split_transforms`` keeps decoding, PIL work and anything that needs one image at a time in the
workers (ending in uint8) and returns the tail it can reproduce on a collated batch (dtype
conversion, normalize, ...) as a batched GPU transform; ``DeviceLoader`` copies each uint8 batch to
the device (4x fewer bytes than float32) and applies it there. Both parts are printed. On a CPU-only machine the same code
runs with the transform applied on the CPU.
"""

from __future__ import annotations

import torch
import torchvision
import torchvision.transforms.v2 as T
from _common import TinyCNN, image_folder, parser
from torch.utils.data import DataLoader

import pipeline_opt as po


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--workers", type=int, default=2)
    args = p.parse_args()
    po.enable_console_logging()

    pipeline = T.Compose([T.PILToTensor(), T.Resize((224, 224), antialias=True), T.ToDtype(torch.float32, scale=True),
                          T.Normalize((0.5,) * 3, (0.25,) * 3)])
    cpu_part, gpu_part = po.split_transforms(pipeline)
    print("in the workers:", cpu_part)
    print("on the device: ", gpu_part)

    dataset = torchvision.datasets.ImageFolder(image_folder(args), transform=cpu_part)
    loader = DataLoader(dataset, batch_size=args.batch_size, num_workers=args.workers,
                        pin_memory=args.device.startswith("cuda"))
    device_loader = po.DeviceLoader(loader, device=args.device, transform=gpu_part)

    model = TinyCNN().to(args.device)
    seen = 0
    with torch.no_grad():
        for images, labels in device_loader:
            assert images.device.type == torch.device(args.device).type and images.is_floating_point()
            model(images)
            seen += labels.shape[0]
    print(f"{seen} images through {len(device_loader)} batches on {args.device}; batch shape {tuple(images.shape)}")


if __name__ == "__main__":
    main()

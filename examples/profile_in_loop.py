"""Profile your own training loop from the inside: iterate the profiler instead of the loader.

    python examples/profile_in_loop.py --epochs 1            # train as usual, report at the end
    PERF_BENCH=1 python examples/profile_in_loop.py          # a fixed, short standard profile, then exit

``po.profile_loop`` wraps the loader: it times the wait for every batch, the step between batches
(call ``.step()`` when a step is done) and the workers, and ``.report()`` returns the same
ProfileReport as ``po.profile``. With ``PERF_BENCH=1`` it measures a fixed window and stops the loop.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
import torchvision
import torchvision.transforms as T
from _common import TinyCNN, image_folder, parser
from torch.utils.data import DataLoader

import pipeline_opt as po


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--out", type=Path, default=Path("pipeline_opt_loop_profile"))
    p.add_argument("--steps", type=int, default=30, help="measured steps (PERF_BENCH's standard window: 30)")
    args = p.parse_args()
    po.enable_console_logging()

    transform = T.Compose([T.Resize((160, 160)), T.ToTensor(), T.Normalize((0.5,) * 3, (0.25,) * 3)])
    dataset = torchvision.datasets.ImageFolder(image_folder(args), transform=transform)
    loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=True, num_workers=1,
                        persistent_workers=True)
    model = TinyCNN().to(args.device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    # PERF_BENCH=1: after the measured window, step() saves the report to output_dir and exits (status 0)
    profiled = po.profile_loop(loader, model=model, steps=args.steps, output_dir=args.out)
    for _ in range(args.epochs):
        for images, labels in profiled:  # instead of `for images, labels in loader`
            images, labels = images.to(args.device), labels.to(args.device)
            optimizer.zero_grad(set_to_none=True)
            F.cross_entropy(model(images), labels).backward()
            optimizer.step()
            profiled.step()  # one training step done
    report = profiled.report()
    profiled.close()
    print(report.table())
    print("report written to", report.save(args.out))


if __name__ == "__main__":
    main()

"""A plain PyTorch training loop whose DataLoader is tuned by ``po.autotune`` first.

    python examples/autotune_loop.py                    # CPU or GPU, ~1 minute
    python examples/autotune_loop.py --images 32 --budget 5 --epochs 1   # a smoke run

Only two lines differ from the loop you already have: ``po.autotune(...)`` and iterating
``result.loader`` instead of your loader.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import torchvision
import torchvision.transforms as T
from _common import TinyCNN, image_folder, parser
from torch.utils.data import DataLoader

import pipeline_opt as po


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--budget", type=float, default=30.0, help="autotune time budget (seconds)")
    p.add_argument("--epochs", type=int, default=2)
    args = p.parse_args()
    po.enable_console_logging()

    transform = T.Compose([T.Resize((224, 224)), T.ToTensor(), T.Normalize((0.5,) * 3, (0.25,) * 3)])
    dataset = torchvision.datasets.ImageFolder(image_folder(args), transform=transform)
    loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=True, num_workers=0)  # your loader
    model = TinyCNN().to(args.device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    def step(model, batch):  # your training step, minus the optimizer (autotune never calls it)
        images, labels = batch[0].to(args.device), batch[1].to(args.device)
        loss = F.cross_entropy(model(images), labels)
        loss.backward()
        return loss.detach()

    result = po.autotune(loader, model, step_fn=step, time_budget_s=args.budget)  # <- 1
    print(result.table())

    for epoch in range(args.epochs):
        for batch in result.loader:  # <- 2: batches arrive ready for the model
            optimizer.zero_grad(set_to_none=True)
            loss = step(model, batch)
            optimizer.step()
        print(f"epoch {epoch}: last loss {loss.item():.3f}")
    print("tuned settings:", result.config)


if __name__ == "__main__":
    main()

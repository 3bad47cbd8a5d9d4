"""Small helpers shared by the examples: a synthetic JPEG folder and a tiny CNN."""

from __future__ import annotations

import argparse

import torch
from torch import nn

from pipeline_opt.datasets import make_image_folder


def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--images", type=int, default=256, help="synthetic JPEGs to generate (cached)")
    p.add_argument("--size", type=int, nargs=2, default=(640, 480), metavar=("W", "H"), help="JPEG size")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    return p


def image_folder(args: argparse.Namespace) -> str:
    return str(make_image_folder(n_images=args.images, size=tuple(args.size), num_classes=4, progress=True))


class TinyCNN(nn.Module):
    """Two strided convolutions and a linear head: a stand-in for your model."""

    def __init__(self, num_classes: int = 4) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 16, 3, stride=2, padding=1), nn.ReLU(),
                                  nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1))
        self.head = nn.Linear(32, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x).flatten(1))

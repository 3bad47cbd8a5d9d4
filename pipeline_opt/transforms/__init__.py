"""Changing data: Kornia-based GPU transforms, Compose splitting, the device loader, decoding."""

from pipeline_opt.transforms.device_loader import DeviceLoader
from pipeline_opt.transforms.split import split_transforms

__all__ = ["DeviceLoader", "split_transforms"]

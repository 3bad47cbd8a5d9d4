"""Compose splitting (placeholder)."""


def split_transforms(compose):
    raise NotImplementedError("split_transforms not built yet")

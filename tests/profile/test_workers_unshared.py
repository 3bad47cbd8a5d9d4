"""unshared_bytes: what a worker's DataLoader copies into shared memory to send a batch."""

import torch

from pipeline_opt.profile.workers import unshared_bytes


def test_unshared_bytes_counts_each_ordinary_storage_once():
    images = torch.zeros(4, 3, 8, 8)  # 3072 bytes
    shared = torch.zeros(100).share_memory_()
    batch = {"img": images, "views": [images[0], images[1:]], "shared": shared,
             "nested": ({"labels": torch.zeros(5, dtype=torch.int64)},), "name": "x", "n": 3}
    assert unshared_bytes(batch) == images.nbytes + 5 * 8
    assert unshared_bytes((shared, "a", None)) == 0
    assert unshared_bytes(torch.zeros(2, dtype=torch.uint8)) == 2
    deep = [[[[[[torch.zeros(10)]]]]]]  # below the depth looked into
    assert unshared_bytes(deep) == 0

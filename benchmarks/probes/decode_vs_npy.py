"""Per-image read, cv2.imread of a JPEG vs np.load of its .npy: benchmarks/results/20261205-373f101-worker-stages-cpu.

What ultralytics' load_image does with cache off (OpenCV's JPEG decode) against cache="disk" (np.load
of the same image saved as .npy); the folder's README.md holds the numbers.

    python benchmarks/probes/decode_vs_npy.py ~/.cache/pipeline_opt/datasets/yolo-<hash>   # the 2048-image set
"""

import glob
import os
import sys
import tempfile
import time

import cv2
import numpy as np

cv2.setNumThreads(0)  # as in a DataLoader worker
files = [f for f in sorted(glob.glob(os.path.join(sys.argv[1], "images", "train", "*.jpg")))[:300]]
tmp = tempfile.mkdtemp()
npys = []
for i, f in enumerate(files):
    path = os.path.join(tmp, f"{i}.npy")
    np.save(path, cv2.imread(f))
    npys.append(path)
ms = {"cv2.imread": [], "np.load": []}
for _ in range(3):
    start = time.perf_counter()
    for f in files:
        cv2.imread(f)
    ms["cv2.imread"].append((time.perf_counter() - start) / len(files) * 1e3)
    start = time.perf_counter()
    for p in npys:
        np.load(p)
    ms["np.load"].append((time.perf_counter() - start) / len(files) * 1e3)
print(len(files), "images, ms per image:", {k: [round(x, 3) for x in v] for k, v in ms.items()})

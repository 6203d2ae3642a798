#!/usr/bin/python3
"""PyTorch DataLoader with torchvision's ImageFolder on the image workload of bench_data_images.

images: the folder of 2000 JPEGs of 500x375 pixels (quality 90, 10 classes) that bench_data_images
writes (the same pixels are written here with PIL where the folder is missing), through
transforms.Compose([RandomResizedCrop(224), RandomHorizontalFlip(), ToTensor()]), shuffled, in
batches of 64, with num_workers 1 or 2 (prefetch_factor=2, persistent_workers). DataLoader's
workers are processes: "images/processes/<N>" is num_workers=N, the peer of bench_data_images's
SequenceAdapter on N worker processes. PyTorch has no thread workers, so its worker processes, its
parallel map, are also the peer of our map on N threads: "images/threads/<N>" is the same
measurement, made once for both names when both are selected. Prints a JSON list of {"workload",
"workers", "mode", "value", "unit"} on stdout. Run with /usr/bin/python3. Takes --list,
--only REGEX and --timeout S (see common.py).
"""
import json
import os
import sys
import tempfile
import time

import common

IMAGES = 2000
CLASSES = 10
WIDTH, HEIGHT = 500, 375
MEASURE_SECONDS = 2.0
WORKERS = (1, 2)
MODES = ("threads", "processes")
NAMES = [f"images/{mode}/{n}" for mode in MODES for n in WORKERS]

if __name__ == "__main__":
    # Before importing torch (seconds), so that --list is cheap.
    SELECTED, ARGS = common.select(NAMES, __doc__.splitlines()[0])

import numpy as np  # noqa: E402
import torch  # noqa: E402
from PIL import Image  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402
from torchvision import datasets, transforms  # noqa: E402


def root():
    return os.environ.get("LOADSTAR_BENCH_IMAGES") or os.path.join(
        tempfile.gettempdir(), "loadstar-bench-images-2000")


def pixels_of(i):
    """bench_data_images.cpp's pixels_of: waves with a hashed texture."""
    y, x = np.mgrid[0:HEIGHT, 0:WIDTH].astype(np.uint32)
    noise = ((x * np.uint32(73856093)) ^ (y * np.uint32(19349663))
             ^ np.uint32((i * 83492791) & 0xFFFFFFFF)) % np.uint32(41)
    planes = []
    for k in range(3):
        wave = 100.0 * np.sin((x * (k + 1.0) + y * (3.0 - k) + 17.0 * i) / 23.0)
        v = np.round(128.0 + wave).astype(np.int64) + noise.astype(np.int64) - 20
        planes.append(np.clip(v, 0, 255))
    return np.stack(planes, axis=-1).astype(np.uint8)


def ensure_images(path):
    if os.path.exists(os.path.join(path, "complete")):
        return
    partial = path + ".partial"
    for i in range(IMAGES):
        folder = os.path.join(partial, f"class{i % CLASSES}")
        os.makedirs(folder, exist_ok=True)
        Image.fromarray(pixels_of(i)).save(os.path.join(folder, f"{i}.jpg"), quality=90)
    with open(os.path.join(partial, "complete"), "w") as f:
        f.write(f"{IMAGES}\n")
    os.rename(partial, path)


def images_per_second(workers):
    dataset = datasets.ImageFolder(root(), transform=transforms.Compose([
        transforms.RandomResizedCrop(224), transforms.RandomHorizontalFlip(),
        transforms.ToTensor()]))
    loader = DataLoader(dataset, batch_size=64, shuffle=True, num_workers=workers,
                        prefetch_factor=2, persistent_workers=True, timeout=ARGS.timeout,
                        drop_last=True)
    it = iter(loader)
    for _ in range(3):  # warm up: workers started, queues full
        next(it)
    images = 0
    start = time.perf_counter()
    while True:
        try:
            batch = next(it)
        except StopIteration:
            it = iter(loader)
            continue
        images += batch[0].shape[0]
        elapsed = time.perf_counter() - start
        if elapsed >= MEASURE_SECONDS:
            return images / elapsed


def main():
    torch.set_num_threads(1)
    ensure_images(root())
    results = []
    for workers in WORKERS:
        modes = [mode for mode in MODES if f"images/{mode}/{workers}" in SELECTED]
        if not modes:
            continue
        try:
            value = images_per_second(workers)
        except Exception as error:  # a worker died or hung: one line, not a traceback
            common.fail(f"images/{modes[0]}/{workers}", f"{type(error).__name__}: "
                        + (str(error).strip().splitlines() or [""])[0])
        for mode in modes:  # one DataLoader configuration, the peer of both our modes
            results.append({"workload": "images", "workers": workers, "mode": mode,
                            "value": value, "unit": "images/s"})
    json.dump(results, sys.stdout)
    print()


if __name__ == "__main__":
    sys.exit(main())

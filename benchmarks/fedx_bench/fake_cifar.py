"""CIFAR-shaped data sets in torchvision's own files, for machines that cannot download CIFAR.

:func:`write` puts a CIFAR-10- or CIFAR-100-shaped set (32x32x3 uint8
images, 10 or 100 classes; 50000 + 10000 images by default) under a root
folder, in the pickle layout torchvision's ``CIFAR10`` / ``CIFAR100`` read,
so fedx loads it with its real loaders (``data-root``). A model can learn
it: each class has a smooth colour template, each image is its class's
template shifted by up to 4 pixels, plus noise. Training on it costs what
training on CIFAR costs (same shapes, same transforms); its accuracy says
only that training works.

torchvision checks every file's md5 sum against the real download's. The
md5 sums of the written files go to ``<root>/fake-cifar-md5.json``:
:func:`accept` makes this process's torchvision expect them, and a process
started with :data:`SITE` first on ``PYTHONPATH`` and
``FEDX_FAKE_CIFAR_MD5=<that file>`` in its environment does the same
(``fake_cifar_site/sitecustomize.py``): a simulation's Ray workers, a
SuperNode's ClientApps. torchvision's own checks still run, and nothing
installed is changed.

Usage: ``python benchmarks/fake_cifar.py ROOT [cifar10|cifar100] [TRAIN TEST]``.
"""

import argparse
import hashlib
import json
import pickle
from collections.abc import Sequence
from pathlib import Path

import numpy as np

#: Put first on ``PYTHONPATH`` (with ``FEDX_FAKE_CIFAR_MD5`` set) for processes that read the files.
SITE = Path(__file__).resolve().parent / "fake_cifar_site"
MD5_ENV = "FEDX_FAKE_CIFAR_MD5"
MD5_FILE = "fake-cifar-md5.json"
#: name -> (folder, number of classes, training files, test file, metadata file, label key)
LAYOUT = {
    "cifar10": (
        "cifar-10-batches-py",
        10,
        [f"data_batch_{i}" for i in range(1, 6)],
        "test_batch",
        "batches.meta",
        "labels",
    ),
    "cifar100": ("cifar-100-python", 100, ["train"], "test", "meta", "fine_labels"),
}
_CHUNK = 5000


def _images(templates: np.ndarray, count: int, rng: np.random.Generator) -> tuple[np.ndarray, list]:
    """``count`` rows of 3072 bytes (R, G, B planes) and their labels."""
    labels = rng.integers(0, len(templates), size=count)
    rows = np.empty((count, 3072), dtype=np.uint8)
    side = np.arange(32)
    for start in range(0, count, _CHUNK):
        chunk = labels[start : start + _CHUNK]
        n = len(chunk)
        shift = rng.integers(-4, 5, size=(n, 2))
        y = (side[None, :] - shift[:, :1]) % 32  # np.roll by the shift, per image
        x = (side[None, :] - shift[:, 1:]) % 32
        picked = templates[chunk[:, None, None, None], np.arange(3)[None, :, None, None],
                           y[:, None, :, None], x[:, None, None, :]]  # fmt: skip
        noisy = 128 + 45 * picked + 40 * rng.standard_normal(picked.shape, dtype=np.float32)
        rows[start : start + n] = np.clip(noisy, 0, 255).astype(np.uint8).reshape(n, 3072)
    return rows, labels.tolist()


def write(root: Path | str, name: str = "cifar10", train: int = 50000, test: int = 10000) -> Path:
    """Write a CIFAR-shaped ``name`` under ``root``; return its md5 file (see the module's notes)."""
    folder_name, classes, train_files, test_file, meta_file, label_key = LAYOUT[name]
    root = Path(root)
    folder = root / folder_name
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    low = rng.standard_normal((classes, 3, 8, 8)).astype(np.float32)
    templates = np.kron(low, np.ones((1, 1, 4, 4), dtype=np.float32))  # smooth, 32 x 32
    counts = [len(part) for part in np.array_split(np.arange(train), len(train_files))]
    for file_name, count in [*zip(train_files, counts, strict=True), (test_file, test)]:
        data, labels = _images(templates, count, rng)
        content = {"data": data, label_key: labels, "batch_label": "fake"}
        if name == "cifar100":
            content["coarse_labels"] = [label // 5 for label in labels]
        with open(folder / file_name, "wb") as handle:
            pickle.dump(content, handle)
    names = {
        "label_names" if name == "cifar10" else "fine_label_names": list(map(str, range(classes)))
    }
    with open(folder / meta_file, "wb") as handle:
        pickle.dump(names, handle)
    md5_path = root / MD5_FILE
    sums = json.loads(md5_path.read_text()) if md5_path.exists() else {}
    sums[name] = {
        path.name: hashlib.md5(path.read_bytes()).hexdigest() for path in folder.iterdir()
    }
    md5_path.write_text(json.dumps(sums, indent=1))
    return md5_path


def accept(md5_path: Path | str) -> None:
    """Make this process's torchvision expect the md5 sums of the written files."""
    # The child processes' patch, imported here only: with FEDX_FAKE_CIFAR_MD5 set, importing it
    # also hooks torchvision's later imports, which a process that merely writes data should not get.
    from torchvision.datasets import cifar  # pylint: disable=import-outside-toplevel

    from fedx_bench.fake_cifar_site import sitecustomize as site

    site.patch(cifar, str(md5_path))


def main(argv: Sequence[str] | None = None) -> None:
    """Write one set under ROOT and print the md5 file's path."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n", maxsplit=1)[0])
    parser.add_argument("root", type=Path, help="the folder torchvision's CIFAR classes read")
    parser.add_argument("name", nargs="?", default="cifar10", choices=sorted(LAYOUT))
    parser.add_argument("train", nargs="?", type=int, default=50000, help="training images")
    parser.add_argument("test", nargs="?", type=int, default=10000, help="test images")
    arguments = parser.parse_args(argv)
    print(write(arguments.root, arguments.name, arguments.train, arguments.test))

"""Pack a Ray wheel for the GPU machine: unpacked with every file's mode, stripped, as a .tar.xz.

``python -m zipfile -e`` (and ``ZipFile.extractall``) drop the modes a wheel
records for its files, so Ray's ``gcs_server``, ``raylet`` and the other
binaries lost their exec bits and no Ray simulation started from the packed
tree. A wheel keeps each file's Unix mode in the high 16 bits of its zip
entry's external attributes; this script restores it after extracting the
file, drops what Flower's simulation does not use (:data:`UNUSED`) and packs
the rest, modes included, for ``tar -xJf`` into a ``--target`` folder
(``benchmarks/gpu/run.sh``'s ``install`` step).

Usage (``prepare.sh`` runs it)::

    python3 benchmarks/fedx_bench/pack_ray.py .gpu/ray-2.55.1-cp312-...whl .gpu/ray-2.55.1-stripped.tar.xz
"""

import argparse
import os
import shutil
import stat
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Sequence
from pathlib import Path

#: Ray's parts that Flower's simulation never imports (Java, RLlib, Serve, Tune, Train, LLM, Data).
UNUSED = ("ray/jars", "ray/rllib", "ray/serve", "ray/tune", "ray/train", "ray/llm", "ray/data")
#: Ray's own processes: they must stay executable.
BINARIES = ("ray/core/src/ray/gcs/gcs_server", "ray/core/src/ray/raylet/raylet")


def unpack(wheel: Path, folder: Path) -> int:
    """Extract ``wheel`` into ``folder`` with the modes it records; the number of files."""
    count = 0
    with zipfile.ZipFile(wheel) as archive:
        for entry in archive.infolist():
            path = Path(archive.extract(entry, folder))
            mode = stat.S_IMODE(entry.external_attr >> 16)
            if mode and not entry.is_dir():
                os.chmod(path, mode)
            count += not entry.is_dir()
    return count


def strip(folder: Path) -> None:
    """Remove :data:`UNUSED` from an unpacked Ray."""
    for part in UNUSED:
        shutil.rmtree(folder / part, ignore_errors=True)


def pack(wheel: Path, archive: Path, preset: int = 6) -> None:
    """``wheel`` unpacked with its modes, stripped, written to ``archive`` (``.tar.xz``, xz's
    ``preset``: 6, xz's default, for the sitting; the tests take 0, minutes less on 2 cores)."""
    with tempfile.TemporaryDirectory(prefix="fedx-pack-ray-") as work:
        folder = Path(work)
        unpack(wheel, folder)
        strip(folder)
        not_executable = [
            b for b in BINARIES if (folder / b).exists() and not _executable(folder / b)
        ]
        if not_executable:
            raise SystemExit(f"{wheel.name}: not executable after unpacking: {not_executable}")
        with tarfile.open(archive, "w:xz", preset=preset) as tar:
            for entry in sorted(folder.iterdir()):
                tar.add(entry, arcname=entry.name)


def _executable(path: Path) -> bool:
    return bool(path.stat().st_mode & stat.S_IXUSR)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("wheel", type=Path)
    parser.add_argument("archive", type=Path)
    parser.add_argument("--preset", type=int, default=6, choices=range(10), help="xz's level")
    arguments = parser.parse_args(argv)
    pack(arguments.wheel, arguments.archive, arguments.preset)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Ray's wheel packed as benchmarks/gpu/prepare.sh packs it, and unpacked as run.sh does."""

import subprocess
import sys
from pathlib import Path

from fedx_bench import pack_ray

PACK_RAY = pack_ray.__file__


def pack_and_unpack(wheel: Path, folder: Path) -> Path:
    """``wheel`` packed as prepare.sh packs Ray, then unpacked as run.sh's install step does."""
    archive = folder / "ray-stripped.tar.xz"
    subprocess.run(
        [sys.executable, str(PACK_RAY), str(wheel), str(archive), "--preset", "0"], check=True
    )
    site = folder / "site"
    site.mkdir()
    subprocess.run(["tar", "-C", str(site), "-xJf", str(archive)], check=True)
    return site

"""Writing files so that a reader, or a crash, never sees half of one."""

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any


def write_atomically(
    path: Path, write: Callable[[IO[bytes]], Any], *, durable: bool = True
) -> None:
    """Call ``write(handle)`` on a temporary file beside ``path``, flush it to disk, rename it.

    On any error the temporary file is removed and ``path`` is untouched.
    With ``durable=False`` the data is not forced to the disk before the
    rename (``fsync``, a few to tens of milliseconds): readers and a crashed
    process still see the old file or the new one, never half of one, but
    after a crash of the machine itself the file may be empty.
    """
    with tempfile.NamedTemporaryFile("wb", dir=path.parent, suffix=".tmp", delete=False) as tmp:
        try:
            write(tmp)
            tmp.flush()
            if durable:
                os.fsync(tmp.fileno())
        except BaseException:
            os.unlink(tmp.name)
            raise
    # Temporary files are private (0600); results and checkpoints are not: in a
    # container they are written as uid 49999 and read by the user on the host.
    os.chmod(tmp.name, 0o644)
    os.replace(tmp.name, path)


def write_json_atomically(path: Path, payload: Any, *, durable: bool = True) -> None:
    """Write ``payload`` as indented JSON, atomically (``durable`` as for :func:`write_atomically`)."""
    write_atomically(
        path,
        lambda handle: handle.write(json.dumps(payload, indent=2).encode("utf-8")),
        durable=durable,
    )

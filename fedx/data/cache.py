"""Index arrays on disk: a partition is computed once, and every later process reads it.

In a deployment Flower starts a new ClientApp process for every message, and
each would otherwise split the data again (importing flwr-datasets and the
Hugging Face ``datasets`` stack to do it). The split is a pure function of
its inputs, so its result is stored under a key that hashes all of them:

* the settings (number of partitions, scheme, alphas, seed ...);
* the data's identity: a digest of the labels (and of the LEAF users) the
  split is computed from, so other data, or changed data, is another entry;
* the code: the versions of the libraries that compute it and a digest of
  fedx's module that calls them.

Any change among these is a new key, so a stale entry is never read; it just
stays on disk (delete the folder to reclaim it: entries are small, at most
8 bytes per sample).

Where: ``$FEDX_CACHE_DIR`` when set (an empty value turns the disk cache
off), else ``$XDG_CACHE_HOME/fedx``, else ``~/.cache/fedx``. Entries are
written atomically (a temporary file renamed into place), so processes that
compute the same entry at once, or a crash, never leave half of one. A folder
that cannot be written, or a damaged entry, costs a recomputation and a
warning, never the run.
"""

import functools
import hashlib
import json
import os
import zipfile
from collections.abc import Callable, Mapping, Sequence
from importlib.metadata import PackageNotFoundError, version
from logging import WARNING, getLogger
from pathlib import Path
from typing import Any

import numpy as np

from fedx.files import write_atomically

#: The environment variable that chooses the cache folder ("" turns it off).
CACHE_ENV = "FEDX_CACHE_DIR"

_LOG = getLogger("flwr")
_warned: set[str] = set()


def cache_dir() -> Path | None:
    """The cache folder, ``None`` when ``$FEDX_CACHE_DIR`` is set empty."""
    chosen = os.environ.get(CACHE_ENV)
    if chosen is not None:
        return Path(chosen).expanduser() if chosen.strip() else None
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "fedx"


def array_digest(values: np.ndarray | None) -> str | None:
    """A digest of an array's dtype, shape and contents (``None`` for ``None``)."""
    if values is None:
        return None
    values = np.ascontiguousarray(values)
    digest = hashlib.sha256(f"{values.dtype.str}{values.shape}".encode())
    digest.update(values.tobytes())
    return digest.hexdigest()


@functools.cache
def code_identity(module_file: str, *distributions: str) -> dict[str, str]:
    """What decides a computation besides its inputs: library versions and fedx's own module.

    ``module_file`` is the ``__file__`` of the fedx module that computes the
    arrays; ``distributions`` the installed packages it calls.
    """
    try:
        source = hashlib.sha256(Path(module_file).read_bytes()).hexdigest()
    except OSError:  # not a plain file (a zipped install): the installed version says it
        source = "fedx " + _version("fedx")
    identity = {"fedx-module": source}
    for name in ("numpy", *distributions):
        identity[name] = _version(name)
    return identity


def _version(distribution: str) -> str:
    try:
        return version(distribution)
    except PackageNotFoundError:
        return "absent"


def cached_indices(
    kind: str, key: Mapping[str, Any], compute: Callable[[], Sequence[np.ndarray]]
) -> tuple[np.ndarray, ...]:
    """``compute()``'s int64 arrays, read from the cache when an entry for ``key`` exists.

    Parameters
    ----------
    kind : str
        The entry's folder in the cache (``"partitions"``).
    key : Mapping
        Everything that decides the result, JSON-serializable: settings,
        digests of the data (:func:`array_digest`) and of the code
        (:func:`code_identity`).
    compute : callable
        Computes the arrays when the cache has no entry; its errors propagate
        and nothing is stored.

    Returns
    -------
    tuple[np.ndarray, ...]
        Read-only int64 arrays, the same whether computed or read.
    """
    folder = cache_dir()
    path = None
    if folder is not None:
        text = json.dumps({"kind": kind, **key}, sort_keys=True, default=str)
        path = folder / kind / f"{hashlib.sha256(text.encode()).hexdigest()}.npz"
        stored = _read(path)
        if stored is not None:
            return stored
    arrays = tuple(np.asarray(part, dtype=np.int64) for part in compute())
    if path is not None:
        _write(path, arrays)
    for part in arrays:
        part.setflags(write=False)
    return arrays


def _read(path: Path) -> tuple[np.ndarray, ...] | None:
    """The arrays of an entry; ``None`` when there is none or it cannot be read."""
    try:
        with np.load(path, allow_pickle=False) as stored:
            values, bounds = stored["values"], stored["bounds"]
        if values.dtype != np.int64 or bounds.ndim != 1 or bounds.sum() != len(values):
            raise ValueError("inconsistent entry")
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as err:
        _warn_once(str(path), "fedx: ignoring damaged cache entry %s (%s); recomputing", path, err)
        return None
    parts = tuple(np.split(values, np.cumsum(bounds)[:-1])) if len(bounds) else ()
    for part in parts:
        part.setflags(write=False)
    return parts


def _write(path: Path, arrays: tuple[np.ndarray, ...]) -> None:
    """Store arrays as one entry, atomically; a folder that cannot be written is only a warning."""
    values = np.concatenate(arrays) if arrays else np.zeros(0, dtype=np.int64)
    bounds = np.array([len(part) for part in arrays], dtype=np.int64)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(path, lambda handle: np.savez(handle, values=values, bounds=bounds))
    except OSError as err:
        _warn_once(
            str(path.parent),
            "fedx: cannot write the partition cache in %s (%s); set %s to a writable folder "
            "(or to an empty value to turn it off)",
            path.parent,
            err,
            CACHE_ENV,
        )


def _warn_once(topic: str, message: str, *args: object) -> None:
    if topic not in _warned:
        _warned.add(topic)
        _LOG.log(WARNING, message, *args)

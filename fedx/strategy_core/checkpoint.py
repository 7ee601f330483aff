"""Checkpoints of a strategy run: arrays in an ``.npz`` file, the rest in JSON.

A checkpoint is two files in a run directory:

``checkpoint-round-<r>.npz``
    Every numpy array of the state (the global model, the pool, whatever
    else a strategy keeps between rounds), under generated keys ``a0``,
    ``a1``, ...
``checkpoint.json``
    The round, the strategy's name, the JSON part of its state (RNG states,
    counters, metrics so far) with ``{"__ndarray__": "a7"}`` where an array
    was, and the name of the ``.npz`` file that holds them.

Both are written to temporary files and renamed into place, the ``.npz``
first, so ``checkpoint.json`` always names a complete arrays file: a crash
while saving round r leaves the checkpoint of round r-1 readable. Older
``.npz`` files are deleted once the new ``checkpoint.json`` is in place.
Loading never unpickles anything (``allow_pickle=False``), and a damaged
checkpoint (a truncated or edited file, a missing arrays file, a reference
to an array the arrays file lacks) is a :class:`CheckpointError` whose one
line names the file and what is wrong with it.

:func:`capture_run` and :func:`restore_run` turn a running strategy into such
a state and back: the global arrays, the strategy's ``state_dict()`` (fedx
strategies; Flower's own FedAvg and FedProx keep no state besides the global
arrays), Python's ``random`` state (Flower's strategies sample nodes with it)
and the metrics of the rounds done.
"""

import json
import random
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import MetricRecord
from flwr.serverapp.strategy import Result, Strategy

from fedx.files import write_atomically
from fedx.strategy_core.base import to_arrayrecord, to_model
from fedx.strategy_core.capabilities import Stateful

CHECKPOINT_FILE = "checkpoint.json"
FORMAT_VERSION = 1
_ARRAY_TAG = "__ndarray__"


@dataclass
class Checkpoint:
    """The state of a run after ``server_round`` complete rounds.

    Attributes
    ----------
    server_round : int
        Rounds completed; a resumed run starts with ``server_round + 1``.
    strategy : str
        Class name of the strategy that wrote it.
    state : dict[str, Any]
        Nested dicts/lists of JSON values and numpy arrays: the global
        arrays, the strategy's ``state_dict()``, metrics so far and whatever
        the app adds.
    path, arrays_path : Path, optional
        The files it was read from (:func:`load_checkpoint`), for messages.
    """

    server_round: int
    strategy: str
    state: dict[str, Any] = field(default_factory=dict)
    path: Path | None = None
    arrays_path: Path | None = None


class CheckpointError(ValueError):
    """A checkpoint is missing, incomplete or of an unknown format."""


def save_checkpoint(directory: Path, checkpoint: Checkpoint) -> Path:
    """Write ``checkpoint`` atomically into ``directory``; return the JSON path."""
    directory.mkdir(parents=True, exist_ok=True)
    arrays: dict[str, np.ndarray] = {}
    tree = _split_arrays(checkpoint.state, arrays)
    arrays_file = f"checkpoint-round-{checkpoint.server_round:05d}.npz"

    # numpy's stub reads **arrays as its allow_pickle argument; they are arrays.
    write_atomically(directory / arrays_file, lambda handle: np.savez(handle, **arrays))  # type: ignore[arg-type]
    manifest = {
        "format": FORMAT_VERSION,
        "round": checkpoint.server_round,
        "strategy": checkpoint.strategy,
        "arrays-file": arrays_file,
        "state": tree,
    }
    path = directory / CHECKPOINT_FILE
    write_atomically(
        path, lambda handle: handle.write(json.dumps(manifest, indent=1).encode("utf-8"))
    )
    for old in directory.glob("checkpoint-round-*.npz"):
        if old.name != arrays_file:
            old.unlink(missing_ok=True)
    return path


def find_checkpoint(location: str | Path) -> Path:
    """Return the ``checkpoint.json`` a run directory or file path points to.

    Raises
    ------
    CheckpointError
        When there is no checkpoint at ``location``.
    """
    path = Path(location).expanduser()
    if path.is_dir():
        path = path / CHECKPOINT_FILE
    if not path.is_file():
        raise CheckpointError(f"no {CHECKPOINT_FILE} at '{path}'")
    return path


def load_checkpoint(location: str | Path) -> Checkpoint:
    """Read the checkpoint in a run directory (or at a ``checkpoint.json`` path).

    Raises
    ------
    CheckpointError
        When the files are missing, unreadable, damaged (truncated or edited
        so that they no longer fit together) or of another format version;
        the message names the file and what is wrong.
    """
    path = find_checkpoint(location)
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise CheckpointError(f"'{path}' is not valid JSON (truncated or edited?): {err}") from None
    except (OSError, UnicodeDecodeError) as err:
        raise CheckpointError(f"cannot read '{path}': {_one_line(err)}") from None
    if not isinstance(manifest, dict):
        raise CheckpointError(f"'{path}' holds a JSON {type(manifest).__name__}, not a checkpoint")
    if manifest.get("format") != FORMAT_VERSION:
        raise CheckpointError(
            f"'{path}' has checkpoint format {manifest.get('format')!r}, "
            f"this fedx reads format {FORMAT_VERSION}"
        )
    server_round, strategy = manifest.get("round"), manifest.get("strategy")
    arrays_file, tree = manifest.get("arrays-file"), manifest.get("state")
    if not isinstance(server_round, int) or isinstance(server_round, bool) or server_round < 0:
        raise CheckpointError(f"'{path}': 'round' must be an integer >= 0, got {server_round!r}")
    if not isinstance(strategy, str) or not strategy:
        raise CheckpointError(f"'{path}': 'strategy' must name a strategy, got {strategy!r}")
    if (
        not isinstance(arrays_file, str)
        or Path(arrays_file).name != arrays_file
        or not arrays_file.endswith(".npz")
    ):
        raise CheckpointError(
            f"'{path}': 'arrays-file' must name an .npz file beside it, got {arrays_file!r}"
        )
    if not isinstance(tree, dict):
        raise CheckpointError(f"'{path}': 'state' must be a JSON object, got {type(tree).__name__}")
    arrays_path = path.parent / arrays_file
    arrays = _read_arrays(arrays_path, path)
    try:
        state = _join_arrays(tree, arrays)
    except KeyError as err:
        raise CheckpointError(
            f"'{path}' refers to array {err}, which '{arrays_path}' does not hold"
        ) from None
    except TypeError as err:
        raise CheckpointError(f"'{path}': an array reference is damaged: {err}") from None
    return Checkpoint(server_round, strategy, state, path=path, arrays_path=arrays_path)


def _read_arrays(arrays_path: Path, path: Path) -> dict[str, np.ndarray]:
    """Every array of a checkpoint's ``.npz`` file, or a :class:`CheckpointError`."""
    if not arrays_path.is_file():
        raise CheckpointError(f"'{arrays_path}', which '{path}' names, is missing")
    try:
        stored = np.load(arrays_path, allow_pickle=False)
        if not isinstance(stored, np.lib.npyio.NpzFile):
            raise ValueError("it is not an .npz archive")
        with stored:
            return {key: stored[key] for key in stored.files}
    except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile) as err:
        raise CheckpointError(
            f"cannot read '{arrays_path}' (truncated or damaged?): {_one_line(err)}"
        ) from None


def _one_line(err: BaseException) -> str:
    return " ".join(str(err).split()) or type(err).__name__


def capture_run(strategy: Strategy, result: Result) -> dict[str, Any]:
    """The state of a run between rounds, as :class:`Checkpoint` stores it.

    ``result.arrays`` is the global model the next round starts from.
    """
    return {
        "arrays": to_model(result.arrays),
        "strategy": strategy.state_dict() if isinstance(strategy, Stateful) else None,
        "python-random": random.getstate(),
        "metrics": {
            "train-clientapp": _metrics_to_json(result.train_metrics_clientapp),
            "evaluate-clientapp": _metrics_to_json(result.evaluate_metrics_clientapp),
            "evaluate-serverapp": _metrics_to_json(result.evaluate_metrics_serverapp),
        },
    }


def restore_run(strategy: Strategy, state: dict[str, Any]) -> Result:
    """Put ``strategy`` and ``random`` back into a captured state.

    Returns
    -------
    Result
        The metrics of the rounds done; its ``arrays`` are the global model
        to continue from.

    Raises
    ------
    CheckpointError
        When the state does not fit the strategy.
    """
    strategy_state = state.get("strategy")
    if strategy_state is not None:
        if not isinstance(strategy, Stateful):
            raise CheckpointError(
                f"the checkpoint holds a strategy state, {type(strategy).__name__} cannot load one"
            )
        try:
            strategy.load_state_dict(strategy_state)
        except (ValueError, TypeError, KeyError, AttributeError) as err:
            raise CheckpointError(
                f"the checkpoint does not fit {type(strategy).__name__}: {err}"
            ) from None
    try:
        version, internal, gauss = state["python-random"]
        random.setstate((version, tuple(internal), gauss))
        metrics = state["metrics"]
        return Result(
            arrays=to_arrayrecord(state["arrays"]),
            train_metrics_clientapp=_metrics_from_json(metrics["train-clientapp"]),
            evaluate_metrics_clientapp=_metrics_from_json(metrics["evaluate-clientapp"]),
            evaluate_metrics_serverapp=_metrics_from_json(metrics["evaluate-serverapp"]),
        )
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        raise CheckpointError(f"the checkpoint's run state is incomplete: {err!r}") from None


def _metrics_to_json(by_round: dict[int, MetricRecord]) -> dict[str, dict[str, Any]]:
    return {str(server_round): dict(record) for server_round, record in by_round.items()}


def _metrics_from_json(by_round: dict[str, dict[str, Any]]) -> dict[int, MetricRecord]:
    return {int(server_round): MetricRecord(values) for server_round, values in by_round.items()}


def _split_arrays(value: Any, arrays: dict[str, np.ndarray]) -> Any:
    """Copy ``value`` with every array replaced by a reference into ``arrays``."""
    if isinstance(value, np.ndarray):
        key = f"a{len(arrays)}"
        arrays[key] = value
        return {_ARRAY_TAG: key}
    if isinstance(value, dict):
        for key in value:
            if not isinstance(key, str):
                raise TypeError(f"checkpoint state keys must be strings, got {key!r}")
        return {key: _split_arrays(item, arrays) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_split_arrays(item, arrays) for item in value]
    if isinstance(value, np.generic):
        return value.item()
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise TypeError(f"cannot checkpoint a value of type {type(value).__name__}")


def _join_arrays(value: Any, arrays: dict[str, np.ndarray]) -> Any:
    """Inverse of :func:`_split_arrays`.

    Raises ``KeyError`` for a reference to an array ``arrays`` lacks,
    ``TypeError`` for a reference that is not a key.
    """
    if isinstance(value, dict):
        if set(value) == {_ARRAY_TAG}:
            if not isinstance(value[_ARRAY_TAG], str):
                raise TypeError(f"{value!r} is not an array reference")
            return arrays[value[_ARRAY_TAG]]
        return {key: _join_arrays(item, arrays) for key, item in value.items()}
    if isinstance(value, list):
        return [_join_arrays(item, arrays) for item in value]
    return value

"""LEAF's federated datasets: FEMNIST (characters by writer) and Shakespeare (lines by role).

LEAF (Caldas et al., "LEAF: A Benchmark for Federated Settings", 2018) ships
no data, only scripts that download the raw sources and write JSON files. Run
in ``leaf/data/<name>/``, ``./preprocess.sh ... -t sample`` writes
``data/train/*.json`` and ``data/test/*.json``, each file holding

``{"users": [...], "num_samples": [...], "user_data": {user: {"x": [...], "y": [...]}}}``

where, with ``-t sample``, every user's samples are split between the train
and the test files. This module reads those files from
``<root>/<name>/data/{train,test}/`` (so ``root`` may be LEAF's own ``data``
folder) and never downloads anything.

- FEMNIST: ``x`` is a 28x28 grey image flattened to 784 floats, which LEAF's
  ``data_to_json.py`` scales to ``[0, 1]`` (pixel / 255; white background
  1.0, dark strokes). They are used as stored. ``y`` is the class 0..61
  (digits, then upper-case, then lower-case letters).
- Shakespeare: ``x`` is a line of 80 characters, ``y`` the character that
  follows it. Characters are mapped to their position in LEAF's 80-letter
  alphabet (``ALL_LETTERS`` of LEAF's ``models/utils/language_utils.py``),
  which is also the class of ``y``.

A user (a writer, a speaking role) is one client. :func:`select_users` picks
which users take part, deterministically from a seed.
"""

import functools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

LEAF_DATASETS: tuple[str, ...] = ("femnist", "shakespeare")

#: LEAF's Shakespeare alphabet: a character's index here is its token and class.
SHAKESPEARE_LETTERS = (
    "\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]abcdefghijklmnopqrstuvwxyz}"
)
SHAKESPEARE_SEQUENCE_LENGTH = 80
FEMNIST_SIDE = 28
FEMNIST_CLASSES = 62

# Byte value -> token, -1 for bytes outside the alphabet (the alphabet is ASCII).
_TOKEN_OF_BYTE = np.full(256, -1, dtype=np.int16)
_TOKEN_OF_BYTE[np.frombuffer(SHAKESPEARE_LETTERS.encode("ascii"), dtype=np.uint8)] = np.arange(
    len(SHAKESPEARE_LETTERS)
)


@dataclass(frozen=True)
class _LeafSpec:
    """How a LEAF dataset is named and produced."""

    title: str
    #: The LEAF command, run in ``leaf/data/<name>/``, that writes the files
    #: for the papers' settings (``-t sample``: every user in train and test).
    preprocess: str


_SPECS: dict[str, _LeafSpec] = {
    # The papers' "writers with more than 100 samples" is LEAF's -k 100
    # (remove_users.py keeps users with num_samples > k); a 10% non-IID sample
    # leaves several hundred such writers to choose 180 from.
    "femnist": _LeafSpec("FEMNIST", "./preprocess.sh -s niid --sf 0.1 -k 100 -t sample"),
    # LEAF's README spells the fraction flag -tf; preprocess.sh only parses --tf.
    "shakespeare": _LeafSpec(
        "Shakespeare", "./preprocess.sh -s niid --sf 0.3 -k 100 -t sample --tf 0.8"
    ),
}


class LeafDataset(Dataset):
    """The samples of some LEAF users, user after user, in memory.

    Parameters
    ----------
    data : torch.Tensor
        FEMNIST: float32 images ``(N, 1, 28, 28)``. Shakespeare: uint8 tokens
        ``(N, 80)`` (compact in memory; items are int64).
    targets : np.ndarray
        Integer labels ``(N,)``.
    user_index : np.ndarray
        For every sample, the position of its user in ``users`` ``(N,)``.
    users : tuple[str, ...]
        The users' LEAF ids, in the order their samples appear.

    Attributes
    ----------
    data, targets, user_index, users
        As given; ``targets`` and ``user_index`` as int64 arrays (read by
        partitioning, like the ``targets`` of torchvision datasets).
    """

    def __init__(
        self,
        data: torch.Tensor,
        targets: np.ndarray,
        user_index: np.ndarray,
        users: tuple[str, ...],
    ) -> None:
        if not len(data) == len(targets) == len(user_index):
            raise ValueError(
                f"{len(data)} inputs, {len(targets)} labels and {len(user_index)} user indices"
            )
        self.data = data
        self.targets = np.asarray(targets, dtype=np.int64)
        self.user_index = np.asarray(user_index, dtype=np.int64)
        self.users = tuple(users)

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        inputs = self.data[index]
        if inputs.dtype == torch.uint8:
            # Token ids: nn.Embedding takes integer indices, uint8 is storage only.
            inputs = inputs.long()
        return inputs, int(self.targets[index])

    def gather(self, positions: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """The samples at ``positions`` as one batch: what ``default_collate`` makes of them."""
        inputs = self.data[torch.from_numpy(positions)]
        if inputs.dtype == torch.uint8:
            inputs = inputs.long()
        return inputs, torch.from_numpy(self.targets[positions])


def encode_text(text: str) -> np.ndarray:
    """Map a string to its tokens: positions in :data:`SHAKESPEARE_LETTERS`.

    Raises
    ------
    ValueError
        If a character is not in the alphabet.
    """
    return _encode_lines([text], len(text)).reshape(len(text)).astype(np.int64)


def decode_text(tokens: Sequence[int] | np.ndarray) -> str:
    """Map tokens back to the string :func:`encode_text` made them from."""
    return "".join(SHAKESPEARE_LETTERS[int(token)] for token in tokens)


def _encode_lines(lines: Sequence[str], length: int) -> np.ndarray:
    """Tokens of equally long lines as a uint8 array ``(len(lines), length)``."""
    wrong = [line for line in lines if not isinstance(line, str) or len(line) != length]
    if wrong:
        raise ValueError(f"expected strings of {length} characters, got {wrong[0]!r}")
    text = "".join(lines)
    try:
        raw = text.encode("ascii")
    except UnicodeEncodeError as err:
        raise ValueError(
            f"character {text[err.start]!r} is not in LEAF's Shakespeare alphabet"
        ) from None
    tokens = _TOKEN_OF_BYTE[np.frombuffer(raw, dtype=np.uint8)]
    unknown = np.flatnonzero(tokens < 0)
    if len(unknown):
        raise ValueError(f"character {text[unknown[0]]!r} is not in LEAF's Shakespeare alphabet")
    return tokens.astype(np.uint8).reshape(len(lines), length)


def _femnist_arrays(xs: list, ys: list) -> tuple[np.ndarray, np.ndarray]:
    pixels = FEMNIST_SIDE * FEMNIST_SIDE
    # A user without samples (LEAF's test files may list one) gives (0, 784).
    images = np.asarray(xs, dtype=np.float32) if xs else np.empty((0, pixels), np.float32)
    if images.shape != (len(ys), pixels):
        raise ValueError(f"expected {len(ys)} images of {pixels} values, got shape {images.shape}")
    labels = np.asarray(ys, dtype=np.int64)
    if len(labels) and not 0 <= labels.min() <= labels.max() < FEMNIST_CLASSES:
        raise ValueError(
            f"FEMNIST labels must be in [0, {FEMNIST_CLASSES}), got {labels.min()}..{labels.max()}"
        )
    return images.reshape(-1, 1, FEMNIST_SIDE, FEMNIST_SIDE), labels


def _shakespeare_arrays(xs: list, ys: list) -> tuple[np.ndarray, np.ndarray]:
    tokens = _encode_lines(xs, SHAKESPEARE_SEQUENCE_LENGTH)
    labels = _encode_lines(ys, 1).reshape(-1).astype(np.int64)
    return tokens, labels


_PARSERS = {"femnist": _femnist_arrays, "shakespeare": _shakespeare_arrays}


def leaf_folder(root: str | Path, name: str, split: str) -> Path:
    """Where LEAF's files of one split are expected: ``<root>/<name>/data/<split>``."""
    return Path(root) / name / "data" / split


def read_leaf_split(name: str, folder: Path) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Read every ``*.json`` file of a LEAF split folder.

    Parameters
    ----------
    name : str
        One of :data:`LEAF_DATASETS`; decides how ``x`` and ``y`` are parsed.
    folder : pathlib.Path
        The folder, for example ``leaf_folder(root, name, "train")``.

    Returns
    -------
    dict[str, tuple[np.ndarray, np.ndarray]]
        Inputs and labels of every user listed in a file's ``users``, by user
        id. Users in ``user_data`` but not in ``users`` are skipped: LEAF's
        ``split_data.py`` leaves such empty entries behind for users it drops.

    Raises
    ------
    FileNotFoundError
        If the folder has no ``.json`` file; the message says how to make them.
    ValueError
        If a file is not LEAF JSON, a sample is malformed, or a user appears
        in two files.
    """
    files = sorted(folder.glob("*.json"))
    if not files:
        spec = _SPECS[name]
        raise FileNotFoundError(
            f"{spec.title} not found: no .json files in {folder}. fedx never downloads "
            f"LEAF data; produce it with LEAF (https://github.com/TalwalkarLab/leaf): "
            f"cd leaf/data/{name} && {spec.preprocess}, then set data-root to leaf/data "
            f"(or copy leaf/data/{name}/data/train and test to {folder.parent})"
        )
    parse = _PARSERS[name]
    users: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for path in files:
        # One file's JSON at a time: the compact arrays are far smaller than
        # the parsed lists of Python floats and strings.
        with path.open(encoding="utf-8") as handle:
            content = json.load(handle)
        try:
            listed, user_data = content["users"], content["user_data"]
            for user in listed:
                if user in users:
                    raise ValueError(f"user {user!r} appears in more than one file")
                record = user_data[user]
                if len(record["x"]) != len(record["y"]):
                    raise ValueError(
                        f"user {user!r} has {len(record['x'])} inputs but {len(record['y'])} labels"
                    )
                users[user] = parse(record["x"], record["y"])
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"{path} is not a valid LEAF {name} file: {err}") from None
    return users


def select_users(
    train_counts: Mapping[str, int],
    test_counts: Mapping[str, int],
    num_users: int,
    min_samples: int,
    seed: int,
) -> tuple[str, ...]:
    """Choose the LEAF users that become clients.

    A user is eligible when it has at least one training sample and more than
    ``min_samples`` samples in all (train plus test, the count LEAF's ``-k``
    filter applies before splitting). The eligible ids are sorted; when
    ``num_users`` is positive, that many are drawn from them without
    replacement with ``np.random.default_rng([seed, 0x1EAF])``.

    Parameters
    ----------
    train_counts, test_counts : Mapping[str, int]
        Samples per user in the train and the test files.
    num_users : int
        How many users to choose; 0 takes every eligible user.
    min_samples : int
        Users need more than this many samples, >= 0.
    seed : int
        Seed of the draw.

    Returns
    -------
    tuple[str, ...]
        The chosen ids in sorted order: user ``i`` is partition ``i``.

    Raises
    ------
    ValueError
        On negative arguments, or when fewer users are eligible than asked for.
    """
    if num_users < 0 or min_samples < 0:
        raise ValueError(f"leaf-users={num_users} and leaf-min-samples={min_samples} must be >= 0")
    eligible = sorted(
        user
        for user, count in train_counts.items()
        if count > 0 and count + test_counts.get(user, 0) > min_samples
    )
    if num_users == 0:
        chosen = eligible
    elif len(eligible) < num_users:
        raise ValueError(
            f"leaf-users={num_users} but only {len(eligible)} of the {len(train_counts)} users "
            f"have more than leaf-min-samples={min_samples} samples"
        )
    else:
        picks = np.random.default_rng([seed, 0x1EAF]).choice(
            len(eligible), num_users, replace=False
        )
        chosen = [eligible[i] for i in np.sort(picks)]
    if not chosen:
        raise ValueError(
            f"no user has more than leaf-min-samples={min_samples} samples "
            f"(of {len(train_counts)} users)"
        )
    return tuple(chosen)


def load_leaf(
    name: str,
    split: str,
    *,
    root: str,
    num_users: int = 0,
    min_samples: int = 0,
    seed: int = 0,
) -> LeafDataset:
    """Return the training or test samples of the selected users of a LEAF dataset.

    Both splits come from one read of the files, cached per process, so the
    ClientApp calls that one simulation worker serves parse the JSON once.

    Parameters
    ----------
    name : str
        ``"femnist"`` or ``"shakespeare"``.
    split : str
        ``"train"`` or ``"test"``. The test split is the union of the selected
        users' test samples (the central test set).
    root : str
        Folder holding ``<name>/data/train/`` and ``<name>/data/test/``, for
        example LEAF's ``leaf/data``; resolved against the working directory.
    num_users, min_samples, seed
        As for :func:`select_users`.

    Returns
    -------
    LeafDataset
        The samples of the selected users, user after user in the order of
        :func:`select_users`; ``users`` holds the ids and ``user_index`` each
        sample's position among them.

    Raises
    ------
    FileNotFoundError
        If a split folder has no ``.json`` file.
    ValueError
        If the files are invalid, too few users qualify, or the selected users
        have no test samples (LEAF's ``-t user`` split puts other users in the
        test files).
    """
    if name not in _SPECS or split not in ("train", "test"):
        raise ValueError(f"no LEAF split {name!r}/{split!r}")
    resolved = str(Path(root).expanduser().resolve())
    train, test = _load_splits(name, resolved, int(num_users), int(min_samples), int(seed))
    return train if split == "train" else test


@functools.lru_cache(maxsize=4)
def _load_splits(
    name: str, root: str, num_users: int, min_samples: int, seed: int
) -> tuple[LeafDataset, LeafDataset]:
    train = read_leaf_split(name, leaf_folder(root, name, "train"))
    test = read_leaf_split(name, leaf_folder(root, name, "test"))
    users = select_users(
        {user: len(labels) for user, (_, labels) in train.items()},
        {user: len(labels) for user, (_, labels) in test.items()},
        num_users,
        min_samples,
        seed,
    )
    template = train[users[0]][0]
    test_set = _concatenate(test, users, template)
    if len(test_set) == 0:
        raise ValueError(
            f"the {len(users)} selected {_SPECS[name].title} users have no samples in "
            f"{leaf_folder(root, name, 'test')}: preprocess with LEAF's -t sample, which "
            "splits every user's samples between train and test"
        )
    return _concatenate(train, users, template), test_set


def _concatenate(
    arrays: Mapping[str, tuple[np.ndarray, np.ndarray]],
    users: tuple[str, ...],
    template: np.ndarray,
) -> LeafDataset:
    """The samples of ``users`` found in ``arrays``, shaped like ``template`` when none are."""
    # A selected user may lack test samples (LEAF's split keeps at least one
    # training sample); it then contributes nothing to the test split.
    present = [user for user in users if user in arrays]
    if not present:
        empty = np.empty((0, *template.shape[1:]), dtype=template.dtype)
        return LeafDataset(torch.from_numpy(empty), np.empty(0), np.empty(0), users)
    inputs = np.concatenate([arrays[user][0] for user in present])
    labels = np.concatenate([arrays[user][1] for user in present])
    position = {user: i for i, user in enumerate(users)}
    user_index = np.concatenate(
        [np.full(len(arrays[user][1]), position[user], dtype=np.int64) for user in present]
    )
    return LeafDataset(torch.from_numpy(inputs), labels, user_index, users)


__all__ = [
    "FEMNIST_CLASSES",
    "FEMNIST_SIDE",
    "LEAF_DATASETS",
    "SHAKESPEARE_LETTERS",
    "SHAKESPEARE_SEQUENCE_LENGTH",
    "LeafDataset",
    "decode_text",
    "encode_text",
    "leaf_folder",
    "load_leaf",
    "read_leaf_split",
    "select_users",
]

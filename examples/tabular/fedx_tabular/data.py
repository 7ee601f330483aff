"""The breast-cancer diagnoses as a fedx data set: two CSV files with a header row.

``train.csv`` and ``test.csv`` in the ``data-root`` folder hold one sample a
row: the 30 measurements, then the diagnosis (``malignant`` or ``benign``).
The loader standardises every measurement with the training file's mean and
standard deviation, and numbers the diagnoses in alphabetical order.
"""

import csv
import functools
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from fedx.data import DatasetSpec, SplitSource

FEATURES = 30
LABEL_COLUMN = "diagnosis"
CLASSES = ("benign", "malignant")


class Table(Dataset):
    """Rows of numbers with a label each, in memory."""

    def __init__(self, rows: np.ndarray, labels: np.ndarray) -> None:
        self.data = torch.as_tensor(rows, dtype=torch.float32)
        #: Every label, in order: fedx partitions the rows by them.
        self.targets = np.asarray(labels, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return self.data[index], int(self.targets[index])

    def gather(self, positions: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """A batch in one indexing (fedx uses it instead of one call per row)."""
        return self.data[torch.from_numpy(positions)], torch.from_numpy(self.targets[positions])


@functools.cache
def read_csv(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """The measurements ``(N, 30)`` and the labels of a CSV file.

    Raises
    ------
    FileNotFoundError
        When the file is missing (the message says how to write it).
    ValueError
        When a row does not have the columns of the header, or a diagnosis
        is neither of :data:`CLASSES`.
    """
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} not found: write the files with `python -m fedx_tabular.prepare "
            f"{path.parent}` and set data-root to that folder"
        )
    with path.open(newline="") as file:
        reader = csv.DictReader(file)
        columns = [c for c in reader.fieldnames or () if c != LABEL_COLUMN]
        if len(columns) != FEATURES:
            raise ValueError(f"{path}: expected {FEATURES} measurements, found {len(columns)}")
        rows, labels = [], []
        for number, row in enumerate(reader, start=2):
            if row[LABEL_COLUMN] not in CLASSES:
                raise ValueError(f"{path}, line {number}: diagnosis {row[LABEL_COLUMN]!r}")
            rows.append([float(row[c]) for c in columns])
            labels.append(CLASSES.index(row[LABEL_COLUMN]))
    return np.array(rows), np.array(labels)


def load(split: str, source: SplitSource) -> Table:
    """fedx's loader: the ``train`` or ``test`` split from ``<data-root>/<split>.csv``."""
    folder = Path(source.root)
    train, _ = read_csv(folder / "train.csv")
    rows, labels = read_csv(folder / f"{split}.csv")
    mean, std = train.mean(axis=0), train.std(axis=0)
    return Table((rows - mean) / np.where(std > 0, std, 1.0), labels)


#: What the fedx app needs to know: the input shape, the classes, the loader.
WDBC = DatasetSpec(input_shape=(FEATURES,), num_classes=len(CLASSES), load=load)

"""Write the breast-cancer diagnoses as ``train.csv`` and ``test.csv`` into a folder.

The data ship inside scikit-learn (``sklearn.datasets.load_breast_cancer``,
from the UCI repository): nothing is downloaded. 20% of the rows, stratified
by diagnosis, go to the test file::

    python -m fedx_tabular.prepare data/wdbc
"""

import argparse
import csv
from pathlib import Path

from fedx_tabular.data import CLASSES, LABEL_COLUMN


def write_files(folder: Path, seed: int = 0) -> list[Path]:
    """Write ``train.csv`` and ``test.csv`` into ``folder``; return their paths."""
    # pylint: disable=import-outside-toplevel  (only this script needs scikit-learn)
    from sklearn.datasets import load_breast_cancer
    from sklearn.model_selection import train_test_split

    data = load_breast_cancer()
    # scikit-learn numbers malignant 0 and benign 1.
    names = [str(data.target_names[label]) for label in data.target]
    assert set(names) == set(CLASSES), names
    train, test = train_test_split(
        range(len(names)), test_size=0.2, random_state=seed, stratify=names
    )
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for split, rows in (("train", train), ("test", test)):
        path = folder / f"{split}.csv"
        with path.open("w", newline="") as file:
            writer = csv.writer(file)
            writer.writerow([*data.feature_names, LABEL_COLUMN])
            for row in rows:
                writer.writerow([*(f"{value:g}" for value in data.data[row]), names[row]])
        paths.append(path)
    return paths


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m fedx_tabular.prepare", description=__doc__)
    parser.add_argument("folder", type=Path, help="where to write train.csv and test.csv")
    args = parser.parse_args(argv)
    for path in write_files(args.folder):
        print(f"wrote {path}")


if __name__ == "__main__":
    main()

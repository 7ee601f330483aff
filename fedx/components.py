"""What the run config's names of data sets, models, partitionings and devices may be.

:class:`Component` checks a ``dataset`` or ``model`` value: one of fedx's own,
one that an installed package declares (an entry point, :mod:`fedx.registry`)
or ``package.module:NAME``. The lists come from :mod:`fedx.data`,
:mod:`fedx.models` and :mod:`fedx.training`, imported only when a run config
is checked, so that importing :mod:`fedx.config` imports neither torch nor
the data sets.
"""

from collections.abc import Callable
from typing import Any

from fedx.checks import Allowed


class Component(Allowed):
    """A data set or a model: one of fedx's, one an installed package declares, or ``package.module:NAME``.

    Parameters
    ----------
    what : str
        ``"dataset"`` or ``"model"``.
    group : str
        The entry-point group of the other packages' (:mod:`fedx.registry`).
    names : callable
        ``names()``: fedx's own and the installed ones.
    find : callable
        ``find(name)`` loads one of another package, raising ``ValueError``
        with the reason when it cannot.
    """

    kind = str

    def __init__(
        self,
        what: str,
        group: str,
        names: Callable[[], tuple[str, ...]],
        find: Callable[[str], Any],
    ) -> None:
        self.what = what
        self.group = group
        self._names = names
        self._find = find

    @property
    def text(self) -> str:
        return (
            f"one of {', '.join(self._names())}, or a {self.what} of your own: "
            f"`package.module:NAME` or an entry point of the group {self.group}"
        )

    def contains(self, value: Any) -> bool:
        return self.reason(value) is None

    def reason(self, value: str) -> str | None:
        """Why ``value`` names no usable data set or model (``None``: it names one)."""
        if value in builtin_names(self.what):
            return None
        try:
            self._find(value)
        except ValueError as err:
            return str(err)
        return None


def builtin_names(what: str) -> tuple[str, ...]:
    """fedx's own model or data set names (``what``: ``"model"`` or ``"dataset"``)."""
    # pylint: disable=import-outside-toplevel
    if what == "model":
        from fedx.models import MODEL_NAMES

        return MODEL_NAMES
    from fedx.data import DATASET_NAMES

    return DATASET_NAMES


def model_names() -> tuple[str, ...]:
    """fedx's models and the installed packages' ones."""
    from fedx.models import model_names  # pylint: disable=import-outside-toplevel

    return model_names()


def find_model(name: str) -> Any:
    """The model function ``name`` stands for (:func:`fedx.models.find_model`)."""
    from fedx.models import find_model  # pylint: disable=import-outside-toplevel

    return find_model(name)


def dataset_names() -> tuple[str, ...]:
    """fedx's data sets and the installed packages' ones."""
    from fedx.data import dataset_names  # pylint: disable=import-outside-toplevel

    return dataset_names()


def find_dataset(name: str) -> Any:
    """The data set ``name`` stands for (:func:`fedx.data.find_dataset`)."""
    from fedx.data import find_dataset  # pylint: disable=import-outside-toplevel

    return find_dataset(name)


def partitionings() -> tuple[str, ...]:
    """The ``partitioning`` values (:data:`fedx.data.PARTITIONINGS`)."""
    from fedx.data import PARTITIONINGS  # pylint: disable=import-outside-toplevel

    return PARTITIONINGS


def devices() -> tuple[str, ...]:
    """The ``device`` values (:data:`fedx.training.DEVICES`)."""
    from fedx.training import DEVICES  # pylint: disable=import-outside-toplevel

    return DEVICES

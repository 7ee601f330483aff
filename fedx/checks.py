"""Allowed values: one object says what an argument accepts, checks it and words the error.

A strategy's constructor checks its arguments with these (:func:`check`), and
the run configuration describes its keys with the same objects, so the range
of a value is written once and every message about it reads the same:
``alpha must be a number in [0.5, 1), got 1.5`` from the constructor,
``invalid run config <method>-alpha=1.5: must be a number in [0.5, 1)`` from
the app. Pure Python: strategies and the run configuration import it
without numpy, Flower or torch.
"""

import math
import numbers
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any


class ArgumentError(ValueError):
    """An argument is of the wrong type or outside what it allows.

    Attributes
    ----------
    argument : str
        The argument's name (a constructor parameter).
    value : Any
        The value it was given.
    allowed : str
        What it allows, as a phrase: ``"a number in [0.5, 1)"``.
    """

    def __init__(self, argument: str, value: Any, allowed: str) -> None:
        super().__init__(f"{argument} must be {allowed}, got {value!r}")
        self.argument = argument
        self.value = value
        self.allowed = allowed


class Allowed(ABC):
    """What a value may be: its Python type (``kind``), a test and a phrase."""

    #: ``float`` (any real number, integers included), ``int``, ``str`` or ``bool``.
    kind: type

    @property
    @abstractmethod
    def text(self) -> str:
        """What is allowed, as a phrase that follows "must be"."""

    def contains(self, value: Any) -> bool:
        """Whether ``value``, already of the right type, is allowed."""
        del value
        return True

    def accepts(self, value: Any) -> bool:
        """Whether ``value`` is of the right type and allowed.

        An integer is a number; a boolean is neither a number nor an integer.
        """
        if isinstance(value, bool) and self.kind is not bool:
            return False
        if self.kind is float:
            return isinstance(value, numbers.Real) and self.contains(float(value))
        if self.kind is int:
            return isinstance(value, numbers.Integral) and self.contains(int(value))
        return isinstance(value, self.kind) and self.contains(value)


@dataclass(frozen=True)
class Number(Allowed):
    """A finite number in an interval; ``high=math.inf`` for no upper bound."""

    low: float = 0.0
    high: float = math.inf
    low_open: bool = False
    high_open: bool = False

    kind = float

    @property
    def text(self) -> str:
        left = "(" if self.low_open else "["
        right = ")" if self.high_open or math.isinf(self.high) else "]"
        high = "inf" if math.isinf(self.high) else f"{self.high:g}"
        return f"a number in {left}{self.low:g}, {high}{right}"

    def contains(self, value: Any) -> bool:
        above = value > self.low if self.low_open else value >= self.low
        below = value < self.high if self.high_open else value <= self.high
        return math.isfinite(value) and above and below


@dataclass(frozen=True)
class Integer(Allowed):
    """An integer of at least ``minimum``."""

    minimum: int = 0

    kind = int

    @property
    def text(self) -> str:
        return f"an integer >= {self.minimum}"

    def contains(self, value: Any) -> bool:
        return value >= self.minimum


class OneOf(Allowed):
    """One of a list of names; the list may be computed when first needed.

    Parameters
    ----------
    choices : sequence of str, or a callable returning one
        A callable defers the list to the first check, so that declaring a
        key does not import the module that knows the names (the models,
        the data sets, the registered methods).
    """

    kind = str

    def __init__(self, choices: Sequence[str] | Callable[[], Sequence[str]]) -> None:
        self._choices = choices

    @property
    def choices(self) -> tuple[str, ...]:
        """The allowed names."""
        choices = self._choices() if callable(self._choices) else self._choices
        return tuple(choices)

    @property
    def text(self) -> str:
        return f"one of {', '.join(self.choices)}"

    def contains(self, value: Any) -> bool:
        return value in self.choices


class Flag(Allowed):
    """``true`` or ``false``."""

    kind = bool

    @property
    def text(self) -> str:
        return "true or false"


class Text(Allowed):
    """Any string."""

    kind = str

    @property
    def text(self) -> str:
        return "a string"


class Rule(Allowed):
    """A value of ``kind`` that passes ``test``, described by ``text``."""

    def __init__(self, kind: type, test: Callable[[Any], bool], text: str) -> None:
        self.kind = kind
        self._test = test
        self._text = text

    @property
    def text(self) -> str:
        return self._text

    def contains(self, value: Any) -> bool:
        return self._test(value)


def check(argument: str, value: Any, allowed: Allowed) -> Any:
    """Return ``value`` if ``allowed`` accepts it (numbers as ``float``).

    Raises
    ------
    ArgumentError
        Naming the argument, what it allows and the value.
    """
    if not allowed.accepts(value):
        raise ArgumentError(argument, value, allowed.text)
    if allowed.kind is float:
        return float(value)
    return int(value) if allowed.kind is int else value


# Shared ranges.
#: A number in (0, inf).
POSITIVE = Number(0.0, math.inf, low_open=True)
#: A number in [0, inf).
NON_NEGATIVE = Number(0.0, math.inf)
#: A number in (0, 1].
FRACTION = Number(0.0, 1.0, low_open=True)
#: A number in (0, 1).
PROPER_FRACTION = Number(0.0, 1.0, low_open=True, high_open=True)
#: A number in [0, 1].
UNIT_INTERVAL = Number(0.0, 1.0)


class renamed:  # pylint: disable=invalid-name
    """Within the block, an :class:`ArgumentError` of argument ``x`` becomes one of ``prefix + x``.

    A strategy that builds a part from its own arguments (``secure_repeats``
    becomes a part's ``repeats``) reports the part's error by its own names.
    """

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, error: Any, traceback: Any) -> None:
        if isinstance(error, ArgumentError):
            raise ArgumentError(self.prefix + error.argument, error.value, error.allowed) from None

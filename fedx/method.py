"""What a method declares, next to its strategy: its run-config keys and what the app needs to run it.

A :class:`Method` names the strategy class, the run-config name that selects
it (``strategy = "<name>"``), its own run-config keys (:class:`Key`: type,
default, allowed values, the constructor argument each feeds), the app's
keys its constructor takes, whether it is personalized and how fedx-compare
runs it (:class:`Variant`). The strategy modules declare their methods with
these; the registry (:mod:`fedx.registry`) finds them, and the app derives
everything else from them.

Pure Python, and below everything that reads a run config: the callables a
method declares are given the run's :class:`fedx.config.RunConfig` when the
app calls them, and a strategy module that must not import the app's torch
code names it as ``"module:function"`` instead (:func:`resolve`).
"""

import importlib
import inspect
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from fedx.checks import Allowed

#: The app keys (run-config names) whose values Flower's ``FedAvg`` takes:
#: its sampling arguments.
SAMPLING = (
    "fraction-train",
    "fraction-evaluate",
    "min-train-nodes",
    "min-evaluate-nodes",
    "min-available-nodes",
)
#: What a pool strategy (:class:`fedx.strategies.MultiModelStrategy`) takes
#: besides its own keys: the sampling arguments, the seed and the node wait.
POOL = (*SAMPLING, "seed", "node-wait-timeout")


def comma_list(value: str) -> tuple[str, ...]:
    """Split a comma-separated run-config value into its stripped, non-empty items."""
    return tuple(item.strip() for item in value.split(",") if item.strip())


@dataclass(frozen=True)
class Key:
    """One run-config key.

    Attributes
    ----------
    name : str
        The key, kebab-case (``"<method>-alpha"``).
    default : Any
        Its value when the run config does not set it; ``pyproject.toml``
        lists the same (``python -m fedx.reference`` writes it).
    allowed : Allowed
        Its type and allowed values (:mod:`fedx.checks`). A method's
        constructor checks its own arguments; the app checks its own keys.
    help : str
        What it does, for the run-config reference. Empty (the default) for
        a key that feeds a constructor argument: the reference then takes
        the argument's description from the strategy's docstring
        (:meth:`Method.key_help`), so that it is written once.
    argument : str, optional
        The constructor argument the value feeds.
    parse : callable, optional
        Turns the run-config value into the argument's value (``"10,15"``
        into ``(10, 15)``; ``0`` into ``None``).
    exclusive : bool
        Setting it away from its default with a method that does not declare
        it is an error (``secure-recombination = true`` for a method
        without secure recombination).
    """

    name: str
    default: Any
    allowed: Allowed
    help: str = ""
    argument: str | None = None
    parse: Callable[[Any], Any] | None = None
    exclusive: bool = False

    def argument_value(self, value: Any) -> Any:
        """The constructor argument's value for the run-config ``value``."""
        return self.parse(value) if self.parse is not None else value


@dataclass(frozen=True)
class Variant:
    """A method as fedx-compare runs it: a name, and keys set on top of a setting.

    Attributes
    ----------
    name : str
        The name in ``--methods`` and in the report (``"<method>-two-stage"``).
    keys : Mapping[str, Any]
        Run-config keys it sets besides ``strategy``.
    requires : callable, optional
        ``requires(config)`` says what a setting lacks for the variant
        (``"needs proximal-mu > 0 ..."``), ``None`` when it suits it: FedProx
        without a proximal term is FedAvg.
    style : Mapping[str, Any]
        Its colour and line style in fedx-compare's plots (matplotlib's
        ``color`` and ``linestyle``), the same in every figure; a variant
        without one gets a colour chosen by its name.
    """

    name: str
    keys: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    requires: Callable[[Any], str | None] | None = None
    style: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))


@dataclass(frozen=True)
class Method:
    """What the app needs to run a strategy, declared next to the strategy.

    Attributes
    ----------
    name : str
        The run-config name (``strategy = "<name>"``).
    strategy : type
        The Flower ``Strategy`` class.
    description : str
        One line for the run-config tables and ``--help``.
    keys : tuple[Key, ...]
        The method's own run-config keys, each feeding a constructor
        argument. A key several methods share is one ``Key`` object.
    takes : tuple[str, ...]
        The app keys (run-config names, :data:`POOL` by default) whose values
        the constructor also takes, by the arguments the app keys name.
    personalized : bool
        Evaluated per client on the client's own test split; its clients use
        the personalized data layout (train, validation and test per client).
    model_key : str
        The key that names the models a run builds, comma-separated
        (``model``, or a key of the method's that lists several architectures).
    components : callable or str, optional
        ``components(config) -> {argument: value}``: constructor arguments
        the app builds for the run (torch callables for a method that runs
        models on the server), or the ``"module:function"`` that names it
        (imported when the app builds the strategy: :func:`resolve`). Reads
        no data.
    prepare : callable or str, optional
        ``prepare(config)``: what the ServerApp loads before round 1 so that
        missing data stops the run at its start, not in a later round
        (an unlabeled set held by the server); or its ``"module:function"``.
    checks_arguments : bool
        Whether the constructor checks the values of ``keys`` (fedx's
        strategies do). Flower's own strategies do not: for them the app
        checks each key against its ``allowed``.
    client_train : str, optional
        ``"module:function"`` that answers the method's training messages in
        fedx's ClientApp, when they are not the usual one model
        (``function(task) -> Message``, given a :class:`fedx.client.task.ClientTask`).
    variants : tuple[Variant, ...]
        How fedx-compare runs it; by default one variant named as the method.
    style : Mapping[str, Any]
        The plot style of that default variant (:attr:`Variant.style`).
    """

    name: str
    strategy: type
    description: str
    keys: tuple[Key, ...] = ()
    takes: tuple[str, ...] = POOL
    personalized: bool = False
    model_key: str = "model"
    components: Callable[[Any], dict[str, Any]] | str | None = None
    prepare: Callable[[Any], Any] | str | None = None
    checks_arguments: bool = True
    client_train: str | None = None
    variants: tuple[Variant, ...] = ()
    style: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))

    @property
    def comparison_variants(self) -> tuple[Variant, ...]:
        """The variants fedx-compare offers (the method itself when none are declared)."""
        return self.variants or (Variant(self.name, style=self.style),)

    def key(self, argument: str) -> Key | None:
        """The method's key that feeds ``argument``, if any."""
        return next((key for key in self.keys if key.argument == argument), None)

    def key_help(self, key: Key) -> str:
        """What ``key`` does: its own ``help``, else its argument's description in the strategy's docstring.

        Raises
        ------
        ValueError
            When the key has neither (a key must be documented somewhere).
        """
        if key.help:
            return key.help
        text = argument_doc(self.strategy, key.argument) if key.argument else None
        if text is None:
            raise ValueError(
                f"run-config key {key.name} has no help and {self.strategy.__name__}'s docstrings "
                f"do not describe its argument {key.argument!r}"
            )
        return text


def argument_doc(cls: type, argument: str) -> str | None:
    """The description of constructor argument ``argument`` in the docstrings of ``cls`` and its bases.

    The first class along the method resolution order whose numpy-style
    ``Parameters`` section lists the argument describes it: a class
    documents the arguments it introduces, and its subclasses do not repeat
    them. Inline reStructuredText (````code````, ``:class:`~a.B```) is
    turned into Markdown code spans; lines are joined into one paragraph.
    """
    for klass in cls.__mro__:
        described = _parameter_docs(klass.__doc__ or "").get(argument)
        if described is not None:
            return described
    return None


def _parameter_docs(docstring: str) -> dict[str, str]:
    """``{argument: description}`` of a numpy-style docstring's ``Parameters`` section."""
    lines = inspect.cleandoc(docstring).splitlines()
    try:
        start = next(
            i + 2
            for i, line in enumerate(lines[:-1])
            if line.strip() == "Parameters" and set(lines[i + 1].strip()) == {"-"}
        )
    except StopIteration:
        return {}
    entries: dict[str, list[str]] = {}
    names: list[str] = []
    for i in range(start, len(lines)):
        line = lines[i]
        if i + 1 < len(lines) and line and set(lines[i + 1].strip()) == {"-"}:
            break  # the next section's title
        if line and not line[0].isspace():
            names = [name.strip() for name in line.split(" : ")[0].split(",")]
            for name in names:
                entries[name] = []
        elif line.strip():
            for name in names:
                entries[name].append(line.strip())
    return {name: _markdown(" ".join(words)) for name, words in entries.items() if words}


def _markdown(text: str) -> str:
    """Inline reStructuredText of a docstring as Markdown: roles and literals as code spans."""

    def role(match: re.Match[str]) -> str:
        target = match.group(1)
        if "<" in target:  # :role:`title <target>`
            return f"`{target.split('<')[0].strip()}`"
        if target.startswith("~"):  # :role:`~a.b.C` shows C
            target = target[1:].rsplit(".", 1)[-1]
        return f"`{target}`"

    return re.sub(r":[\w:]+:`([^`]+)`", role, text).replace("``", "`")


def resolve(function: Callable[..., Any] | str) -> Callable[..., Any]:
    """A declared callable: itself, or the function a ``"module:function"`` string names (imported now)."""
    if callable(function):
        return function
    module, _, name = function.partition(":")
    return getattr(importlib.import_module(module), name)

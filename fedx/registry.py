"""The method registry: each method declares, where it is defined, what the app needs.

A :class:`Method` names the strategy class, the run-config name that selects
it (``strategy = "<name>"``), its own run-config keys (:class:`Key`: type,
default, allowed values, the constructor argument each feeds), the app's
keys its constructor takes, whether it is personalized and how fedx-compare
runs it. The app derives everything else from these declarations: run-config
validation (:mod:`fedx.config`), building the strategy
(:mod:`fedx.server.building`), fedx-compare's method list and the
documentation's run-config reference (:mod:`fedx.reference`).

Where methods come from:

* fedx's own: every ``Method`` defined at the top level of a module of
  :mod:`fedx.strategies` (a new file there is a new method);
* other packages: an entry point in the group ``fedx.methods`` whose name is
  the method's name and whose object is its ``Method``::

      [project.entry-points."fedx.methods"]
      fedblend = "fedx_fedblend:METHOD"

  Once the package is installed, ``flwr run . --run-config
  'strategy="fedblend"'`` runs it with fedx's ServerApp and ClientApp;
* in-process: :func:`register` (for a ServerApp of your own that imports the
  method's module, and for tests).

Pure Python: importing this module imports neither numpy nor Flower; the
strategy modules are imported when a method is first looked up.
"""

import importlib
import pkgutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib.metadata import EntryPoint, entry_points
from logging import WARNING, getLogger
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from fedx.checks import Allowed

if TYPE_CHECKING:
    from fedx.config import RunConfig

ENTRY_POINT_GROUP = "fedx.methods"

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

_LOG = getLogger("flwr")


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
        What it does, one line (the documentation's run-config tables).
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
    help: str
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
    """

    name: str
    keys: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    requires: "Callable[[RunConfig], str | None] | None" = None


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
    components : callable, optional
        ``components(config) -> {argument: value}``: constructor arguments
        the app builds for the run (torch callables for a method that runs
        models on the server). Imports what it
        needs when called; reads no data.
    prepare : callable, optional
        ``prepare(config)``: what the ServerApp loads before round 1 so that
        missing data stops the run at its start, not in a later round
        (an unlabeled set held by the server).
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
    """

    name: str
    strategy: type
    description: str
    keys: tuple[Key, ...] = ()
    takes: tuple[str, ...] = POOL
    personalized: bool = False
    model_key: str = "model"
    components: "Callable[[RunConfig], dict[str, Any]] | None" = None
    prepare: "Callable[[RunConfig], Any] | None" = None
    checks_arguments: bool = True
    client_train: str | None = None
    variants: tuple[Variant, ...] = ()

    @property
    def comparison_variants(self) -> tuple[Variant, ...]:
        """The variants fedx-compare offers (the method itself when none are declared)."""
        return self.variants or (Variant(self.name),)

    def key(self, argument: str) -> Key | None:
        """The method's key that feeds ``argument``, if any."""
        return next((key for key in self.keys if key.argument == argument), None)


class UnknownMethod(LookupError):
    """No method of that name is registered (the message lists the known ones)."""


class _Registry:
    """fedx's methods, then in-process registrations, then entry points."""

    def __init__(self) -> None:
        self._builtin: dict[str, Method] | None = None
        self._registered: dict[str, Method] = {}
        self._plugins: dict[str, Method] = {}
        self._failed: dict[str, str] = {}

    def builtin(self) -> dict[str, Method]:
        """fedx's own methods: those declared in the modules of ``fedx.strategies``."""
        if self._builtin is None:
            import fedx.strategies  # pylint: disable=import-outside-toplevel

            found: dict[str, Method] = {}
            for module_info in pkgutil.iter_modules(fedx.strategies.__path__):
                module = importlib.import_module(f"fedx.strategies.{module_info.name}")
                for value in vars(module).values():
                    if isinstance(value, Method) and found.get(value.name) is not value:
                        _add(found, value, f"fedx.strategies.{module_info.name}")
            self._builtin = found
        return self._builtin

    def register(self, method: Method) -> Method:
        if method.name in self.builtin():
            raise ValueError(f"method {method.name!r} is one of fedx's own")
        _add(self._registered, method, "register()")
        return method

    def _entry_points(self) -> dict[str, EntryPoint]:
        return {point.name: point for point in entry_points(group=ENTRY_POINT_GROUP)}

    def _load(self, point: EntryPoint) -> Method | None:
        if point.name in self._plugins:
            return self._plugins[point.name]
        try:
            method = point.load()
            if not isinstance(method, Method) or method.name != point.name:
                raise TypeError(f"{point.value} is not a fedx.registry.Method named {point.name!r}")
        except Exception as err:  # pylint: disable=broad-exception-caught
            # A broken plug-in must not stop runs of other methods.
            reason = f"{type(err).__name__}: {err}"
            if point.name not in self._failed:
                _LOG.log(
                    WARNING, "fedx: cannot load method %r (%s): %s", point.name, point.value, reason
                )
            self._failed[point.name] = reason
            return None
        self._plugins[point.name] = method
        return method

    def get(self, name: str) -> Method:
        """The method called ``name``.

        Raises
        ------
        UnknownMethod
            When no method has that name, or its entry point cannot be loaded.
        """
        method = self.builtin().get(name) or self._registered.get(name)
        if method is not None:
            return method
        point = self._entry_points().get(name)
        if point is not None and (method := self._load(point)) is not None:
            return method
        if name in self._failed:
            raise UnknownMethod(f"method {name!r} cannot be loaded: {self._failed[name]}")
        raise UnknownMethod(f"no method {name!r}; known methods: {', '.join(self.names())}")

    def all(self) -> tuple[Method, ...]:
        """Every method: fedx's, registered ones, then loadable entry points."""
        methods = {**self.builtin(), **self._registered}
        for name, point in self._entry_points().items():
            if name not in methods and (method := self._load(point)) is not None:
                methods[name] = method
        return tuple(methods.values())

    def names(self) -> tuple[str, ...]:
        return tuple(method.name for method in self.all())


def _add(methods: dict[str, Method], method: Method, origin: str) -> None:
    known = methods.get(method.name)
    if known is not None and known is not method:
        raise ValueError(f"two methods are called {method.name!r} ({origin})")
    methods[method.name] = method


_REGISTRY = _Registry()


def register(method: Method) -> Method:
    """Register a method in this process and return it.

    Raises
    ------
    ValueError
        When another method has its name already.
    """
    return _REGISTRY.register(method)


def get_method(name: str) -> Method:
    """The registered method called ``name`` (see :class:`UnknownMethod`)."""
    return _REGISTRY.get(name)


def all_methods() -> tuple[Method, ...]:
    """Every method this process can run: fedx's, registered, installed plug-ins."""
    return _REGISTRY.all()


def builtin_methods() -> tuple[Method, ...]:
    """fedx's own methods, in the order of their modules."""
    return tuple(_REGISTRY.builtin().values())


def method_names() -> tuple[str, ...]:
    """The names of :func:`all_methods`."""
    return _REGISTRY.names()

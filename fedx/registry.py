"""The method registry: every method this process can run, found where it is declared.

A method declares, next to its strategy, what the app needs to run it: a
:class:`~fedx.method.Method` with its run-config keys (:mod:`fedx.method`;
this module hands ``Method``, ``Key`` and ``Variant`` on, for plug-ins). The
app derives everything else from these declarations: run-config validation
(:mod:`fedx.config`), building the strategy (:mod:`fedx.server.building`),
fedx-compare's method list and the documentation's run-config reference
(:mod:`fedx.reference`).

Where methods come from:

* fedx's own: every ``Method`` at the top level of a module (or package)
  of :mod:`fedx.strategies`, the methods' folder (a new file there is a new
  method; what the methods share lives in :mod:`fedx.strategy_core`, which
  the registry does not read);
* other packages: an entry point in the group ``fedx.methods`` whose name is
  the method's name and whose object is its ``Method``::

      [project.entry-points."fedx.methods"]
      fedblend = "fedx_fedblend:METHOD"

  Once the package is installed, ``flwr run . --run-config
  'strategy="fedblend"'`` runs it with fedx's ServerApp and ClientApp;
* in-process: :func:`register` (for a ServerApp of your own that imports the
  method's module, and for tests).

Data sets and models come the same way from other packages: an entry point
in the group ``fedx.datasets`` (a :class:`fedx.data.DatasetSpec`) or
``fedx.models`` (a function ``(input_shape, num_classes) -> torch.nn.Module``)
whose name is what ``dataset`` or ``model`` then says, or the run-config
value ``package.module:NAME`` itself (:func:`find_component`). fedx's own
data sets and models are found first (:mod:`fedx.data`, :mod:`fedx.models`).

Pure Python: importing this module imports neither numpy nor Flower; the
strategy modules are imported when a method is first looked up. The
strategies import :mod:`fedx.method`, never this module, so that finding
them is the one way the two are tied.
"""

import importlib
import os
import pkgutil
import sys
from collections.abc import Callable, Collection
from importlib.metadata import EntryPoint, entry_points
from logging import WARNING, getLogger
from typing import Any

# What a method declares lives below the strategies (which declare their
# methods with it) and the registry (which finds them): fedx.method. A
# plug-in imports all it needs from here.
from fedx.method import POOL, SAMPLING, Key, Method, Variant, comma_list

__all__ = [
    "DATASET_GROUP",
    "ENTRY_POINT_GROUP",
    "MODEL_GROUP",
    "POOL",
    "SAMPLING",
    "Key",
    "Method",
    "UnknownMethod",
    "Variant",
    "all_methods",
    "builtin_methods",
    "comma_list",
    "component_label",
    "component_names",
    "find_component",
    "get_method",
    "method_names",
    "register",
    "register_component",
]

ENTRY_POINT_GROUP = "fedx.methods"
#: The entry-point groups of data sets and models of other packages.
DATASET_GROUP = "fedx.datasets"
MODEL_GROUP = "fedx.models"

_LOG = getLogger("flwr")


class UnknownMethod(LookupError):
    """No method of that name is registered (the message lists the known ones)."""


class _Registry:
    """fedx's methods, then in-process registrations, then entry points."""

    def __init__(self) -> None:
        self._builtin: dict[str, Method] | None = None
        self._registered: dict[str, Method] = {}
        self._plugins: dict[str, Method] = {}
        self._failed: dict[str, str] = {}
        self._points = _EntryPoints(ENTRY_POINT_GROUP)

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
        return self._points.get()

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


class _EntryPoints:
    """One group's entry points, read again only when the installed packages may have changed.

    Reading them reads every installed distribution's metadata, and a
    process that answers many messages (a warm executor's task, forked
    afresh for each) checks its run config for every one of them.
    """

    def __init__(self, group: str) -> None:
        self.group = group
        self._points: tuple[tuple, dict[str, EntryPoint]] | None = None

    def get(self) -> dict[str, EntryPoint]:
        """The group's entry points by name."""
        installation = _installation()
        if self._points is None or self._points[0] != installation:
            points = {point.name: point for point in entry_points(group=self.group)}
            self._points = (installation, points)
        return self._points[1]


def _installation() -> tuple[tuple[str, int | None], ...]:
    """What the installed distributions depend on: the import path, and when each folder on it last changed.

    Installing, upgrading or removing a package adds or removes its
    ``*.dist-info`` folder in a folder on the path, which changes that
    folder's modification time.
    """
    stamps = []
    for folder in sys.path:
        try:
            stamps.append((folder, os.stat(folder or os.curdir).st_mtime_ns))
        except OSError:
            stamps.append((folder, None))
    return tuple(stamps)


def _add(methods: dict[str, Method], method: Method, origin: str) -> None:
    known = methods.get(method.name)
    if known is not None and known is not method:
        raise ValueError(f"two methods are called {method.name!r} ({origin})")
    methods[method.name] = method


_REGISTRY = _Registry()
_COMPONENTS = {group: _EntryPoints(group) for group in (DATASET_GROUP, MODEL_GROUP)}
#: Data sets and models registered in this process (:func:`register_component`), by group.
_REGISTERED_COMPONENTS: dict[str, dict[str, Any]] = {DATASET_GROUP: {}, MODEL_GROUP: {}}


def register_component(group: str, name: str, value: Any) -> Any:
    """Register a data set (:data:`DATASET_GROUP`) or a model (:data:`MODEL_GROUP`) in this process; return it.

    As :func:`register` for methods: for a Flower app of your own whose
    modules register what it uses (every process that loads the app runs
    them), and for tests. An installed package says the same with an entry
    point.

    Raises
    ------
    ValueError
        When ``name`` is registered already, or is a ``package.module:NAME``
        reference.
    """
    if ":" in name:
        raise ValueError(f"{name!r} is a reference, not a name")
    registered = _REGISTERED_COMPONENTS[group]
    if name in registered and registered[name] is not value:
        raise ValueError(f"{name!r} is registered in the group {group} already")
    registered[name] = value
    return value


def component_names(group: str) -> tuple[str, ...]:
    """The names registered in this process and those of the installed entry points of ``group``."""
    return tuple(sorted({*_REGISTERED_COMPONENTS[group], *_COMPONENTS[group].get()}))


def find_component(group: str, name: str) -> Any:
    """What ``name`` stands for in ``group``: ``package.module:NAME``'s object, or an installed entry point's.

    A name with a colon is a reference: its module is imported now, from the
    import path (an installed package, or the folder of the Flower app that
    runs). Any other name is looked up among those registered in this
    process (:func:`register_component`), then the group's entry points, and
    loaded.

    Raises
    ------
    LookupError
        Saying why: no such entry point, or the module or its attribute
        cannot be loaded (the import's own error).
    """
    if ":" in name:
        module_name, _, attribute = name.partition(":")
        try:
            module = importlib.import_module(module_name)
        except Exception as err:  # pylint: disable=broad-exception-caught
            # The user's module: whatever its import raises is the reason.
            raise LookupError(f"cannot import {module_name}: {type(err).__name__}: {err}") from err
        if not hasattr(module, attribute):
            raise LookupError(f"module {module_name} has no attribute {attribute!r}")
        return getattr(module, attribute)
    if name in _REGISTERED_COMPONENTS[group]:
        return _REGISTERED_COMPONENTS[group][name]
    point = _COMPONENTS[group].get().get(name)
    if point is None:
        installed = ", ".join(component_names(group)) or "none"
        raise LookupError(f"no entry point {name!r} in the group {group} (installed: {installed})")
    try:
        return point.load()
    except Exception as err:  # pylint: disable=broad-exception-caught
        raise LookupError(
            f"entry point {point.value} cannot be loaded: {type(err).__name__}: {err}"
        ) from err


def find_plugin(
    kind: str,
    group: str,
    name: str,
    *,
    own: Collection[str],
    fits: Callable[[Any], bool],
    expected: str,
) -> Any:
    """:func:`find_component` for a loader of fedx's: what another package gives as ``name``.

    The data sets and the models share one contract (each raises the same
    three errors, worded alike), so it is kept here once. ``kind`` starts
    every message (``"dataset"``, ``"model"``); ``expected`` says what
    ``fits`` accepts (``"a function"``).

    Raises
    ------
    ValueError
        When ``name`` is one of ``own``, names nothing, cannot be loaded or
        does not fit; the message says which.
    """
    if name in own:
        raise ValueError(f"{kind} {name!r} is one of fedx's own")
    try:
        found = find_component(group, name)
    except LookupError as err:
        raise ValueError(f"{kind} {name!r}: {err}") from None
    if not fits(found):
        raise ValueError(f"{kind} {name!r} is a {type(found).__name__}, not {expected}")
    return found


def component_label(name: str) -> str:
    """A short name of a data set or model for folder names and titles: ``NAME`` of ``package.module:NAME``."""
    return name.rpartition(":")[2]


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

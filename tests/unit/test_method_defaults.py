"""One source per parameter: a method's run-config defaults are its constructor's defaults.

Every key a method declares feeds one constructor argument; its default,
parsed as the app parses it (``"10,15,18"`` into ``(10, 15, 18)``, ``0``
into ``None``), must be the argument's default in the signature, so that
``flwr run .`` and ``FedMut()`` in a ServerApp of one's own run the same
method. A setting that wants other values says so in its file under
``configs/``.
"""

import inspect

import pytest
from flwr.serverapp.strategy import FedAvg

from fedx.checks import NON_NEGATIVE
from fedx.config import APP_BY_NAME
from fedx.method import _parameter_docs  # pylint: disable=protected-access
from fedx.registry import Key, Method, builtin_methods
from fedx.strategies import FedMut, MultiModelStrategy

METHODS = builtin_methods()

#: App keys whose default is the app's, not the constructor's, and why.
APP_CHOICES = {
    # The app evaluates the global model centrally; Flower's FedAvg asks every
    # node (fraction_evaluate=1.0) when it is used in a ServerApp of one's own.
    "fraction-evaluate": "the app evaluates centrally",
    # A run of the app repeats from its seed; a strategy built in Python
    # without one draws fresh entropy, as numpy does.
    "seed": "the app's runs are seeded",
}


def _parameters(method: Method) -> dict[str, inspect.Parameter]:
    """The constructor's arguments, those it passes on to its bases (``**kwargs``) included."""
    parameters: dict[str, inspect.Parameter] = {}
    for cls in method.strategy.__mro__:
        if "__init__" in vars(cls):
            for name, parameter in inspect.signature(cls.__init__).parameters.items():
                parameters.setdefault(name, parameter)
    return parameters


@pytest.mark.parametrize("method", METHODS, ids=[m.name for m in METHODS])
def test_every_key_defaults_to_its_constructor_argument_default(method):
    parameters = _parameters(method)
    differ = []
    for key in method.keys:
        assert key.argument in parameters, f"{key.name} feeds {key.argument}, not an argument"
        default = parameters[key.argument].default
        if default is inspect.Parameter.empty:
            continue  # a required argument: the app must give it (FedMe's architectures)
        if key.argument_value(key.default) != default:
            differ.append(f"{key.name} = {key.default!r} but {key.argument}={default!r}")
    assert not differ, f"{method.name}: " + "; ".join(differ)


@pytest.mark.parametrize("method", METHODS, ids=[m.name for m in METHODS])
def test_the_app_keys_a_method_takes_default_to_its_arguments_defaults(method):
    parameters = _parameters(method)
    for name in method.takes:
        key = APP_BY_NAME[name]
        default = parameters[key.argument].default
        if name in APP_CHOICES:
            assert key.default != default, f"{name} agrees now: drop it from APP_CHOICES"
            continue
        assert key.default == default, f"{method.name}: {name} = {key.default!r}, {default!r}"


#: fedx's strategy classes: every method's, and the pool's base a method of one's own derives from.
STRATEGIES = tuple(
    dict.fromkeys(
        [m.strategy for m in METHODS if m.strategy.__module__.startswith("fedx.")]
        + [MultiModelStrategy]
    )
)


@pytest.mark.parametrize("strategy", STRATEGIES, ids=[s.__name__ for s in STRATEGIES])
def test_a_constructor_shows_every_argument_in_its_signature(strategy):
    kinds = {p.kind for p in inspect.signature(strategy).parameters.values()}
    assert not kinds & {inspect.Parameter.VAR_KEYWORD, inspect.Parameter.VAR_POSITIONAL}
    # FedAvg's arguments are there, by name, for the strategies built on it.
    if issubclass(strategy, FedAvg):
        assert set(inspect.signature(FedAvg).parameters) <= set(
            inspect.signature(strategy).parameters
        )


@pytest.mark.parametrize("strategy", STRATEGIES, ids=[s.__name__ for s in STRATEGIES])
def test_an_argument_a_class_shares_with_its_bases_has_their_default(strategy):
    own = inspect.signature(strategy).parameters
    for base in strategy.__mro__[1:]:
        if "__init__" not in vars(base) or base is object:
            continue
        for name, parameter in inspect.signature(base.__init__).parameters.items():
            if name in own and parameter.default is not inspect.Parameter.empty:
                assert own[name].default == parameter.default, (base.__name__, name)


@pytest.mark.parametrize("strategy", STRATEGIES, ids=[s.__name__ for s in STRATEGIES])
def test_every_argument_is_documented_once(strategy):
    """By the class that introduces it (Flower's FedAvg for its own): never twice in fedx."""
    for name in inspect.signature(strategy).parameters:
        documenting = [
            base.__qualname__
            for base in strategy.__mro__
            if name in _parameter_docs(base.__doc__ or "")
        ]
        ours = [base for base in documenting if base not in ("FedAvg", "FedProx")]
        assert documenting, f"{strategy.__name__}({name}=...) is documented nowhere"
        assert len(ours) <= 1, f"{strategy.__name__}({name}=...) is documented by {ours}"


@pytest.mark.parametrize("method", METHODS, ids=[m.name for m in METHODS])
def test_a_methods_keys_are_documented_by_its_arguments(method):
    """A key says nothing of its own: the reference shows its argument's description."""
    for key in method.keys:
        assert key.help == "", f"{key.name} has a description of its own"
        assert len(method.key_help(key)) > 20, key.name
    # The description comes from the docstring (the first class that describes it).
    if method.name == "fedmut":
        assert method.key_help(method.key("alpha")).startswith("Mutation range alpha")


def test_a_key_without_a_description_anywhere_is_refused():
    method = Method("x", FedMut, "x", keys=(Key("x-gamma", 1.0, NON_NEGATIVE, argument="gamma"),))
    with pytest.raises(ValueError, match="x-gamma has no help and FedMut's docstrings"):
        method.key_help(method.keys[0])
    # A plug-in's key may say what it does itself.
    described = Key("x-gamma", 1.0, NON_NEGATIVE, "the gamma", argument="gamma")
    assert Method("x", FedMut, "x", keys=(described,)).key_help(described) == "the gamma"


def test_docstring_markup_becomes_code_spans():
    docs = _parameter_docs(
        """Summary.

        Parameters
        ----------
        first, second : int (default: 1)
            Uses ``x`` and :class:`~fedx.strategies.FedMR`,
            :func:`fedx.ops.average` and :ref:`the guide <guide>`.

            Second paragraph.
        **kwargs
            Ignored.

        Examples
        --------
        >>> 1
        """
    )
    text = "Uses `x` and `FedMR`, `fedx.ops.average` and `the guide`. Second paragraph."
    assert docs["first"] == docs["second"] == text
    assert "Examples" not in docs and ">>> 1" not in " ".join(docs.values())

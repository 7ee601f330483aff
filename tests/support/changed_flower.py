"""A Flower whose code differs from the code fedx's changes were checked against.

:func:`changed_copy` makes, in process, a copy of one of Flower's functions
whose source has one more line (a test puts it in Flower's place with
``monkeypatch``); :func:`changed_flower` makes, on disk, a copy of the
installed Flower package with one function changed so, for processes started
with it first on ``PYTHONPATH``. Both behave as Flower's code does, plus the
line; their source, as :mod:`inspect` reads it, is not Flower's.
"""

import ast
import importlib
import inspect
import shutil
import tempfile
import textwrap
import types
from pathlib import Path


def _with_line(source: str, function: str, line: str) -> str:
    """``source`` with ``line`` as the first statement of ``function``'s body (after its docstring)."""
    tree = ast.parse(source)
    node = next(
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name == function
    )
    first = node.body[0]
    docstring = isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
    after = first.end_lineno if docstring else first.lineno - 1
    lines = source.splitlines(keepends=True)
    indent = " " * first.col_offset
    return "".join([*lines[:after], indent + line.strip() + "\n", *lines[after:]])


def changed_copy(function: types.FunctionType, line: str) -> types.FunctionType:
    """A copy of Flower's ``function`` with ``line`` first in its body, in its module's globals.

    Its source is in a file of its own (so :func:`inspect.getsource` reads
    it); its defaults are the original's.
    """
    source = _with_line(textwrap.dedent(inspect.getsource(function)), function.__name__, line)
    path = Path(tempfile.mkdtemp(prefix="changed-flower-")) / f"{function.__name__}.py"
    path.write_text(source)
    module = compile(source, str(path), "exec")
    code = next(c for c in module.co_consts if isinstance(c, types.CodeType))
    copy = types.FunctionType(
        code, importlib.import_module(function.__module__).__dict__, function.__name__
    )
    copy.__defaults__ = function.__defaults__
    copy.__kwdefaults__ = dict(function.__kwdefaults__ or {})
    copy.__module__ = function.__module__
    copy.__doc__ = function.__doc__
    return copy


def changed_flower(destination: Path, name: str, line: str) -> Path:
    """A copy of the installed ``flwr`` package in ``destination``, ``"module:function"`` changed.

    Returns the folder to put first on ``PYTHONPATH``.
    """
    import flwr  # pylint: disable=import-outside-toplevel

    installed = Path(flwr.__file__).parent
    shutil.copytree(installed, destination / "flwr", ignore=shutil.ignore_patterns("__pycache__"))
    module, _, function = name.partition(":")
    path = destination.joinpath(*module.split(".")).with_suffix(".py")
    path.write_text(_with_line(path.read_text(), function, line))
    return destination

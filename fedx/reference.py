"""The run-config reference, derived from the declarations.

The defaults in pyproject.toml's ``[tool.flwr.app.config]`` (which Flower
reads) and the tables of the documentation's run-config page
(``docs/run-config.md``) come from the app's keys (:mod:`fedx.config`) and
fedx's methods (:mod:`fedx.registry`). The page's tables are made when the
site is built (``docs/_ext/fedx_docs.py`` calls :func:`markdown_reference`);
pyproject.toml is a file in the repository::

    python -m fedx.reference             # rewrite pyproject.toml's table
    python -m fedx.reference --check     # exit 1 if it is out of date
    python -m fedx.reference --markdown  # print the page's tables

``tests/test_registry.py`` runs the check, so a key declared without
updating pyproject.toml fails the suite.
"""

import argparse
import sys
from pathlib import Path
from typing import Any

import tomli_w

from fedx.config import APP_KEYS
from fedx.registry import Key, Method, builtin_methods

PYPROJECT_TABLE = "[tool.flwr.app.config]"
PYPROJECT_HEADER = (
    "# Every run-config key with its default, written by `python -m fedx.reference` from the\n"
    "# declarations (fedx/config.py, and each method's module in fedx/strategies/): change\n"
    "# them there. docs/run-config.md says what each key does. Override with\n"
    '# `flwr run . --run-config configs/<file>.toml` or `--run-config "key=value ..."`.\n'
)
REPO = Path(__file__).resolve().parents[1]


def _toml(value: Any) -> str:
    return tomli_w.dumps({"v": value}).removeprefix("v = ").rstrip("\n")


def _escape_html(text: str) -> str:
    """``text`` with ``<`` outside code spans escaped: Markdown would take ``<name>`` for HTML."""
    parts = text.split("`")
    return "`".join(part if i % 2 else part.replace("<", "\\<") for i, part in enumerate(parts))


def _row(key: Key) -> str:
    cells = (f"`{key.name}`", f"`{_toml(key.default)}`", key.allowed.text, key.help)
    return "| " + " | ".join(map(_escape_html, cells)) + " |"


def _table(keys: list[Key]) -> list[str]:
    return ["| key | default | allowed | meaning |", "|---|---|---|---|", *map(_row, keys)]


def _users(methods: tuple[Method, ...]) -> dict[str, tuple[str, ...]]:
    """Key name -> the methods that declare it."""
    users: dict[str, tuple[str, ...]] = {}
    for method in methods:
        for key in method.keys:
            users[key.name] = (*users.get(key.name, ()), method.name)
    return users


def _sections(methods: tuple[Method, ...]) -> list[tuple[str, str, list[Key]]]:
    """The methods' keys in groups: (kind, title, keys), kind ``"shared"`` or ``"method"``.

    A key several methods declare comes once, in a group of its own before
    the first of them; each method follows with its own keys.
    """
    users = _users(methods)
    sections: list[tuple[str, str, list[Key]]] = []
    done: set[tuple[str, ...]] = set()
    for method in methods:
        for key in method.keys:
            group = users[key.name]
            if len(group) > 1 and group not in done:
                done.add(group)
                keys = [k for k in method.keys if users[k.name] == group]
                sections.append(("shared", ", ".join(group), keys))
        own = [key for key in method.keys if len(users[key.name]) == 1]
        shared = [key for key in method.keys if len(users[key.name]) > 1]
        title = f'`strategy = "{method.name}"`: {method.description}.'
        if shared:
            title += " Also " + ", ".join(f"`{key.name}`" for key in shared) + "."
        sections.append(("method", title, own))
    return sections


def markdown_reference() -> str:
    """The run-config tables in Markdown: the app's keys, then the methods', under headings.

    Each method's heading has the label ``run-config-<method>`` (MyST's
    ``(label)=``) for links from other pages.
    """
    lines = [
        "## Every run",
        "",
        "The run, the data, the model, local training and outputs, whichever method runs:",
        "",
        *_table(list(APP_KEYS)),
    ]
    for kind, title, keys in _sections(builtin_methods()):
        if kind == "shared":
            names = title.split(", ")
            label = "shared-" + "-".join(names)
            heading = "Shared by " + ", ".join(names)
            text = "Keys that " + ", ".join(f"`{name}`" for name in names) + " declare together."
        else:
            name = title.split('"')[1]
            label, heading, text = name, f"`{name}`", title
        lines += ["", f"(run-config-{label})=", f"## {heading}", "", _escape_html(text)]
        if keys:
            lines += ["", *_table(keys)]
    return "\n".join(lines) + "\n"


def pyproject_reference() -> str:
    """pyproject.toml's ``[tool.flwr.app.config]``: every key with its default."""
    lines = [PYPROJECT_HEADER + PYPROJECT_TABLE]
    lines += [f"{key.name} = {_toml(key.default)}" for key in APP_KEYS]
    methods = {method.name: method for method in builtin_methods()}
    for kind, title, keys in _sections(tuple(methods.values())):
        if keys:
            label = title if kind == "shared" else title.split('"')[1]
            lines.append(f"# {label}")
            lines += [f"{key.name} = {_toml(key.default)}" for key in keys]
    return "\n".join(lines) + "\n"


def replace_config_table(text: str, body: str) -> str:
    """pyproject.toml's text with its ``[tool.flwr.app.config]`` table (and the comment above it) replaced."""
    lines = text.splitlines(keepends=True)
    table = next(i for i, line in enumerate(lines) if line.strip() == PYPROJECT_TABLE)
    start = table
    while start > 0 and lines[start - 1].startswith("#"):
        start -= 1
    stop = next((i for i in range(table + 1, len(lines)) if lines[i].startswith("[")), len(lines))
    while stop > table + 1 and not lines[stop - 1].strip():
        stop -= 1
    return "".join(lines[:start]) + body + "".join(lines[stop:])


def updated(repo: Path = REPO) -> dict[Path, str]:
    """pyproject.toml as the declarations say it should be."""
    pyproject = repo / "pyproject.toml"
    return {pyproject: replace_config_table(pyproject.read_text(), pyproject_reference())}


def main(argv: list[str] | None = None) -> int:
    """Rewrite (or, with ``--check``, compare) pyproject.toml; or print the Markdown tables."""
    parser = argparse.ArgumentParser(
        prog="python -m fedx.reference", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--check", action="store_true", help="exit 1 if a file is out of date")
    parser.add_argument(
        "--markdown", action="store_true", help="print the run-config tables of the documentation"
    )
    args = parser.parse_args(argv)
    if args.markdown:
        print(markdown_reference(), end="")
        return 0
    stale = [path for path, text in updated().items() if path.read_text() != text]
    if args.check:
        for path in stale:
            print(f"{path} is out of date: run python -m fedx.reference", file=sys.stderr)
        return 1 if stale else 0
    for path, text in updated().items():
        if path in stale:
            path.write_text(text)
            print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

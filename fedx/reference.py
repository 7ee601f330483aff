"""The run-config reference, derived from the declarations.

The defaults in pyproject.toml's ``[tool.flwr.app.config]`` (which Flower
reads) and the tables of the documentation's run-config page
(``docs/run-config.md``, between its two marker comments, so that the page
reads the same on GitHub and in the built site) come from the app's keys
(:mod:`fedx.config`) and fedx's methods (:mod:`fedx.registry`); what a
method's key does is its argument's description in the strategy's docstring
(:meth:`fedx.method.Method.key_help`). Both are files in the repository::

    python -m fedx.reference             # rewrite both
    python -m fedx.reference --check     # exit 1 if either is out of date
    python -m fedx.reference --markdown  # print the page's tables

``tests/unit/test_registry.py`` runs the check, so a key declared or documented
without updating the two files fails the suite.
"""

import argparse
import re
import sys
from pathlib import Path
from typing import Any

import tomli_w

from fedx.config import APP_BY_NAME, APP_KEYS
from fedx.registry import Key, Method, builtin_methods

PYPROJECT_TABLE = "[tool.flwr.app.config]"
PYPROJECT_HEADER = (
    "# Every run-config key with its default, written by `python -m fedx.reference` from the\n"
    "# declarations (fedx/config.py, and each method's module in fedx/strategies/): change\n"
    "# them there. docs/run-config.md says what each key does. Override with\n"
    '# `flwr run . --run-config configs/<file>.toml` or `--run-config "key=value ..."`.\n'
)
PAGE_START = (
    "<!-- The tables below are written by `python -m fedx.reference` from the declarations: "
    "change them there. -->"
)
PAGE_END = "<!-- End of the tables written by `python -m fedx.reference`. -->"
REPO = Path(__file__).resolve().parents[1]


def _toml(value: Any) -> str:
    return tomli_w.dumps({"v": value}).removeprefix("v = ").rstrip("\n")


def _escape_html(text: str) -> str:
    """``text`` with ``<`` outside code spans escaped: Markdown would take ``<name>`` for HTML."""
    parts = text.split("`")
    return "`".join(part if i % 2 else part.replace("<", "\\<") for i, part in enumerate(parts))


def _row(key: Key, meaning: str) -> str:
    cells = (f"`{key.name}`", f"`{_toml(key.default)}`", key.allowed.text, meaning)
    return "| " + " | ".join(map(_escape_html, cells)) + " |"


def _table(rows: list[tuple[Key, str]]) -> list[str]:
    """A Markdown table of ``(key, what it does)``."""
    return [
        "| key | default | allowed | meaning |",
        "|---|---|---|---|",
        *(_row(key, meaning) for key, meaning in rows),
    ]


def _users(methods: tuple[Method, ...]) -> dict[str, tuple[str, ...]]:
    """Key name -> the methods that declare it."""
    users: dict[str, tuple[str, ...]] = {}
    for method in methods:
        for key in method.keys:
            users[key.name] = (*users.get(key.name, ()), method.name)
    return users


def _meaning(method: Method, key: Key) -> str:
    """What ``key`` does (:meth:`~fedx.method.Method.key_help`), naming run-config keys, not arguments.

    A code span that names one of the method's constructor arguments
    (`` `min_train_nodes` ``) becomes the key that feeds it
    (`` `min-train-nodes` ``).
    """
    keys = {k.argument: k.name for k in method.keys if k.argument}
    keys.update({APP_BY_NAME[n].argument: n for n in method.takes if APP_BY_NAME[n].argument})
    return re.sub(
        r"`([a-z_0-9]+)`",
        lambda match: f"`{keys.get(match.group(1), match.group(1))}`",
        method.key_help(key),
    )


def _sections(methods: tuple[Method, ...]) -> list[tuple[str, str, list[tuple[Key, str]]]]:
    """The methods' keys in groups: (kind, title, rows), kind ``"shared"`` or ``"method"``.

    A key several methods declare comes once, in a group of its own before
    the first of them (described by that method's strategy); each method
    follows with its own keys. A row is ``(key, what it does)``.
    """
    users = _users(methods)
    sections: list[tuple[str, str, list[tuple[Key, str]]]] = []
    done: set[tuple[str, ...]] = set()
    for method in methods:
        for key in method.keys:
            group = users[key.name]
            if len(group) > 1 and group not in done:
                done.add(group)
                rows = [(k, _meaning(method, k)) for k in method.keys if users[k.name] == group]
                sections.append(("shared", ", ".join(group), rows))
        own = [(key, _meaning(method, key)) for key in method.keys if len(users[key.name]) == 1]
        shared = [key for key in method.keys if len(users[key.name]) > 1]
        title = f'`strategy = "{method.name}"`: {method.description}.'
        if shared:
            title += " Also " + ", ".join(f"`{key.name}`" for key in shared) + "."
        sections.append(("method", title, own))
    return sections


def markdown_reference() -> str:
    """The run-config tables in Markdown: the app's keys, then the methods', under headings.

    A method's heading is its name, so its anchor is ``#<method>`` on GitHub
    and in the built site alike (``run-config.md#fedmr``).
    """
    lines = [
        "## Every run",
        "",
        "The run, the data, the model, local training and outputs, whichever method runs:",
        "",
        *_table([(key, key.help) for key in APP_KEYS]),
    ]
    for kind, title, rows in _sections(builtin_methods()):
        if kind == "shared":
            names = title.split(", ")
            heading = "Shared by " + ", ".join(names)
            text = "Keys that " + ", ".join(f"`{name}`" for name in names) + " declare together."
        else:
            name = title.split('"')[1]
            heading, text = f"`{name}`", title
        lines += ["", f"## {heading}", "", _escape_html(text)]
        if rows:
            lines += ["", *_table(rows)]
    return "\n".join(lines) + "\n"


def page_reference(page: str) -> str:
    """The run-config page ``page`` (its text) with the tables between its markers rewritten.

    Raises
    ------
    ValueError
        When the page lacks one of the two marker lines.
    """
    lines = page.splitlines(keepends=True)
    try:
        start = next(i for i, line in enumerate(lines) if line.strip() == PAGE_START)
        end = next(i for i, line in enumerate(lines) if line.strip() == PAGE_END)
    except StopIteration:
        raise ValueError(
            f"the run-config page lacks the lines {PAGE_START!r} and {PAGE_END!r}"
        ) from None
    return "".join(lines[: start + 1]) + "\n" + markdown_reference() + "\n" + "".join(lines[end:])


def pyproject_reference() -> str:
    """pyproject.toml's ``[tool.flwr.app.config]``: every key with its default."""
    lines = [PYPROJECT_HEADER + PYPROJECT_TABLE]
    lines += [f"{key.name} = {_toml(key.default)}" for key in APP_KEYS]
    methods = {method.name: method for method in builtin_methods()}
    for kind, title, rows in _sections(tuple(methods.values())):
        if rows:
            label = title if kind == "shared" else title.split('"')[1]
            lines.append(f"# {label}")
            lines += [f"{key.name} = {_toml(key.default)}" for key, _ in rows]
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
    """pyproject.toml and docs/run-config.md as the declarations say they should be."""
    pyproject = repo / "pyproject.toml"
    page = repo / "docs" / "run-config.md"
    return {
        pyproject: replace_config_table(pyproject.read_text(), pyproject_reference()),
        page: page_reference(page.read_text()),
    }


def main(argv: list[str] | None = None) -> int:
    """Rewrite (or, with ``--check``, compare) pyproject.toml and the page; or print the Markdown tables."""
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

"""fedx's own Sphinx extension: the run-config page must hold the tables the code makes.

``docs/run-config.md`` holds its tables as a file of the repository, written
by ``python -m fedx.reference`` from the method registry, so that GitHub
shows them too. When Sphinx reads the page, this extension compares it with
what :func:`fedx.reference.page_reference` makes of it now and stops the
build when they differ, so the site can never disagree with the code. The
page is read again on every build (a changed declaration changes no file of
the page itself).
"""

from typing import Any

from sphinx.application import Sphinx
from sphinx.environment import BuildEnvironment

PAGE = "run-config"


def check_reference(app: Sphinx, docname: str, source: list[str]) -> None:
    """Stop the build when the run-config page's tables are not those of the code."""
    if docname != PAGE:
        return
    from fedx.reference import page_reference  # pylint: disable=import-outside-toplevel

    if page_reference(source[0]) != source[0]:
        raise ValueError(f"docs/{PAGE}.md is out of date: run python -m fedx.reference")


def always_outdated(
    app: Sphinx, env: BuildEnvironment, added: set[str], changed: set[str], removed: set[str]
) -> list[str]:
    """The run-config page is read on every build: its tables come from the code."""
    return [PAGE] if PAGE in env.found_docs else []


def setup(app: Sphinx) -> dict[str, Any]:
    app.connect("source-read", check_reference)
    app.connect("env-get-outdated", always_outdated)
    return {"parallel_read_safe": True, "parallel_write_safe": True}

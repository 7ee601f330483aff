"""fedx's own Sphinx extension: the run-config reference generated from the method registry.

``docs/run-config.md`` holds a marker line; when Sphinx reads that page the
marker is replaced by :func:`fedx.reference.markdown_reference`, the tables
derived from the app's keys and every built-in method's declaration, so the
page can never disagree with the code. The page is read again on every
build (a changed declaration changes no file of the page itself).
"""

from typing import Any

from sphinx.application import Sphinx
from sphinx.environment import BuildEnvironment

PAGE = "run-config"
MARKER = "% fedx-run-config: the tables are generated here from the method registry"


def insert_reference(app: Sphinx, docname: str, source: list[str]) -> None:
    """Replace the marker line of the run-config page by the generated tables."""
    if docname != PAGE:
        return
    from fedx.reference import markdown_reference  # pylint: disable=import-outside-toplevel

    if MARKER not in source[0]:
        raise ValueError(f"docs/{PAGE}.md lacks the line {MARKER!r}")
    source[0] = source[0].replace(MARKER, markdown_reference())


def always_outdated(
    app: Sphinx, env: BuildEnvironment, added: set[str], changed: set[str], removed: set[str]
) -> list[str]:
    """The run-config page is read on every build: its tables come from the code."""
    return [PAGE] if PAGE in env.found_docs else []


def setup(app: Sphinx) -> dict[str, Any]:
    app.connect("source-read", insert_reference)
    app.connect("env-get-outdated", always_outdated)
    return {"parallel_read_safe": True, "parallel_write_safe": True}

"""Sphinx configuration of fedx's documentation site.

Build (the dev extra installs Sphinx, MyST and the theme)::

    sphinx-build -W docs docs/_build/html
    python docs/check_site.py docs/_build/html   # every page in headless Chromium

Pages are Markdown (MyST); the API reference comes from the code's
numpy-style docstrings (autodoc, napoleon); the run-config reference is
generated from the method registry while the site is built
(``_ext/fedx_docs.py``).
"""

import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
sys.path.insert(0, str(DOCS / "_ext"))
# fedx from this checkout, whether or not it is installed.
sys.path.insert(0, str(DOCS.parent))

project = "fedx"
author = "the fedx developers"
copyright = "the fedx developers, Apache-2.0"

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "fedx_docs",
]
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build", "_ext", "_static"]
root_doc = "index"

# Markdown: anchors for headings down to #####, so pages link to sections as on GitHub.
myst_heading_anchors = 5
myst_enable_extensions = ["colon_fence", "deflist"]

# numpy-style docstrings. "Attributes" sections become fields of the class
# (not attribute entries of their own, which would repeat a dataclass's fields).
napoleon_google_docstring = False
napoleon_numpy_docstring = True
napoleon_use_ivar = True
autodoc_member_order = "bysource"
autodoc_typehints = "description"
# Types go into the fields the docstrings describe, never into a list of their own:
# with the constructor shown apart from its class ("separated"), autodoc would
# otherwise list every typed __init__ parameter a second time, undescribed.
autodoc_typehints_description_target = "documented_params"
autodoc_class_signature = "separated"
# The API pages document the packages' public names (their __all__), not their inner modules.
autodoc_default_options = {"members": True, "show-inheritance": True}

html_theme = "furo"
html_title = "fedx"
html_static_path = ["_static"]
# Browsers ask every site for an icon; without one each page logs a failed load.
html_favicon = "_static/favicon.svg"
html_show_sourcelink = False
html_copy_source = False
# Nothing is loaded from the internet: the site reads the same offline.
html_theme_options = {"top_of_page_buttons": []}

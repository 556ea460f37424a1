"""Sphinx configuration: the Markdown pages in this folder (MyST) plus an API reference from docstrings.

Build: ``./dev docs`` (or ``sphinx-build -W --keep-going -b html docs docs/_build/html``). The API pages
import the installed pystrom, so build in an environment where it is installed (``.venv`` of ``./dev``);
``tests/test_docs.py`` runs this build with warnings as errors in CI.
"""

from __future__ import annotations

from docutils import nodes
from docutils.statemachine import StringList
from sphinx.util.docutils import SphinxDirective

import pystrom

project = "pystrom"
author = "the pystrom developers"
copyright = "2026, the pystrom developers"
release = pystrom.__version__
version = ".".join(release.split(".")[:2])

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store"]

# MyST: anchors for headings down to ### so pages can link to each other's sections (`ipc.md#security`).
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence"]

# Docstrings are numpydoc style; napoleon reads them without numpydoc's extra dependency.
napoleon_google_docstring = False
napoleon_numpy_docstring = True
napoleon_use_rtype = False

autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_default_options = {"members": True, "show-inheritance": True}
# The API pages list their objects with autosummary tables and document each object once with
# autodoc on the same page, so no stub pages are generated into the source tree.
autosummary_generate = False

html_theme = "alabaster"
html_title = f"pystrom {release}"
html_static_path: list[str] = []


class SettingsTable(SphinxDirective):
    """``.. pystrom-settings::``: every ``pystrom.defaults`` setting, its variable, default and meaning.

    Rendered from the settings' own definitions, so the page cannot drift from the code.
    """

    has_content = False

    def run(self) -> list[nodes.Node]:
        from pystrom._settings import _OPTIONS

        rows = [".. list-table::", "   :header-rows: 1", "", "   * - setting", "     - environment variable"]
        rows += ["     - default", "     - meaning"]
        for name, opt in _OPTIONS.items():
            rows += [f"   * - ``{name}``", f"     - ``{opt.env}``", f"     - ``{opt.default!r}``", f"     - {opt.doc}"]
        holder = nodes.container()
        self.state.nested_parse(StringList(rows, source="pystrom-settings"), self.content_offset, holder)
        return list(holder.children)


def setup(app):
    app.add_directive("pystrom-settings", SettingsTable)
    return {"parallel_read_safe": True}

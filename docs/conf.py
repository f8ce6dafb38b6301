"""Sphinx configuration for fusedkit's documentation.

Build: ``python -m sphinx -W --keep-going -b html docs docs/_build/html`` (no GPU, CuPy, torch or JAX
needed: autodoc mocks them).
"""
import importlib
import os
import sys

from docutils import nodes
from docutils.statemachine import StringList
from sphinx.ext.autodoc.mock import mock
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..")))

from fusedkit import __version__  # noqa: E402

project = "fusedkit"
author = "fusedkit contributors"
copyright = "fusedkit contributors"
version = release = __version__

extensions = ["sphinx.ext.autodoc", "sphinx.ext.napoleon"]
autodoc_mock_imports = ["cupy", "torch", "jax", "jaxlib"]
autodoc_member_order = "bysource"
autodoc_typehints = "description"
napoleon_google_docstring = True
napoleon_numpy_docstring = True

html_theme = "alabaster"
html_static_path = []
exclude_patterns = ["_build"]

_log = logging.getLogger(__name__)


class OptionalAutomodule(SphinxDirective):
    """``.. optional-automodule:: pkg.mod``: ``automodule`` (with members) when the module imports
    (with the mocked frameworks), else a short note; a module that exists but fails to import warns."""

    required_arguments = 1
    has_content = False

    def run(self):
        name = self.arguments[0]
        # re-read this page on every build: whether the module imports is not a source change
        self.env.fk_optional_docs = getattr(self.env, "fk_optional_docs", set()) | {self.env.docname}
        try:
            with mock(autodoc_mock_imports):
                importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name and (name == e.name or name.startswith(e.name + ".")):
                para = nodes.paragraph(text=f"{name} is not part of this build of fusedkit.")
                return [nodes.note("", para)]
            _log.warning(f"{name} failed to import: {e}", location=self.get_location())
            return []
        except Exception as e:  # noqa: BLE001 - a broken adapter must show up in the docs build
            _log.warning(f"{name} failed to import: {e!r}", location=self.get_location())
            return []
        rst = StringList([f".. automodule:: {name}", "   :members:", "   :show-inheritance:"],
                         source=self.get_source_info()[0])
        node = nodes.Element()
        node.document = self.state.document
        self.state.nested_parse(rst, self.content_offset, node)
        return node.children


def _reread_optional(app, env, added, changed, removed):
    return sorted(d for d in getattr(env, "fk_optional_docs", ()) if d in env.found_docs)


def setup(app):
    app.add_directive("optional-automodule", OptionalAutomodule)
    app.connect("env-get-outdated", _reread_optional)

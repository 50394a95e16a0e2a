"""Sphinx configuration of coffea-sonic's documentation site (docs/).

Build it (no network needed) with::

    .venv/bin/python -m sphinx -W --keep-going -b html docs build/docs/html -d build/docs/doctrees
    .venv/bin/python -m sphinx -W --keep-going -b doctest docs build/docs/doctest -d build/docs/doctrees

(``build/`` is ignored by git; tests/test_docs.py runs both into a temporary folder.)

Pages are Markdown (MyST); the API reference is autodoc, generated from ``coffea_sonic.__all__``
at build time by the ``sonic_docs`` extension in ``docs/_ext`` (so it lists exactly what the
package exports, whatever that is today).
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "_ext"))
# the checkout's package, also when it is not installed into the building environment
sys.path.insert(0, str(HERE.parent))

import coffea_sonic  # noqa: E402

project = "coffea-sonic"
author = "the coffea-sonic developers"
copyright = "the coffea-sonic developers"
release = coffea_sonic.__version__
version = release

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.doctest",
    "sphinx.ext.viewcode",
    "sonic_docs",
]

source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "_ext", "Thumbs.db", ".DS_Store"]

# MyST: fenced directives plus the few extensions the pages use
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

# autodoc: what a user reads; signatures keep the annotations as written
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_default_options = {"members": True, "show-inheritance": True}
# NumPy-style "Parameters" sections (TritonModel) and Google-style ones; attribute docstrings are
# left as written (sonic_docs: they are prose, not napoleon's "type: description")
napoleon_google_docstring = True
napoleon_numpy_docstring = True

# The package's own docstring examples are run by tests/test_doctests.py (some need a server);
# the doctest builder runs only the pages' explicit {doctest} blocks.
doctest_test_doctest_blocks = ""
# The pages' examples show the defaults: each document's examples run without the settings of
# the shell or of an endpoints file that would re-point models (where the server and the cache
# live may stay).
doctest_global_setup = """
import os as _os, tempfile as _tempfile
for _name in [_n for _n in _os.environ if _n.startswith("COFFEA_SONIC_")]:
    if _name not in ("COFFEA_SONIC_CACHE", "COFFEA_SONIC_SERVER_ENV", "COFFEA_SONIC_SERVER_PYTHON"):
        del _os.environ[_name]
_os.environ["XDG_CONFIG_HOME"] = _tempfile.mkdtemp(prefix="coffea-sonic-docs-")
"""

html_theme = "furo"
html_title = f"coffea-sonic {release}"
html_static_path: list[str] = []

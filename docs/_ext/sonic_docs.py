"""Sphinx extension of coffea-sonic's docs: pages generated from the package, so they cannot drift.

* ``.. sonic-public-api:: KIND`` (KIND: classes, functions, errors or data) writes an autodoc
  entry for every name of that kind in ``coffea_sonic.__all__``, read when the page is built;
  the four kinds together are exactly ``__all__``.
* ``.. sonic-settings-table::`` is the settings table, from
  :data:`coffea_sonic.core.settings.SETTINGS` (name, variable, Dask key, sources, default, what).
* Files included from outside ``docs/`` (``benchmarks/RESULTS.md``) keep their images, and their
  relative links, which point at files of the repository that are not pages of the site, are
  shown as the repository path they name instead of a broken link.

Both directives emit reStructuredText; in a Markdown page use them inside ``{eval-rst}``.
"""

from __future__ import annotations

import importlib
import os
import re
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from docutils import nodes
from docutils.statemachine import StringList
from sphinx.application import Sphinx
from sphinx.util.docutils import SphinxDirective
from sphinx.util.nodes import nested_parse_with_titles

#: the kinds of public names and the autodoc directive each is documented with
KINDS = {"classes": "autoclass", "functions": "autofunction", "errors": "autoexception",
         "data": "autodata"}


def kind_of(value: Any) -> str:
    """The :data:`KINDS` key for one public object.

    >>> kind_of(ValueError), kind_of(dict), kind_of(len), kind_of("0.1.0")
    ('errors', 'classes', 'functions', 'data')
    """
    if isinstance(value, type):
        return "errors" if issubclass(value, BaseException) else "classes"
    return "functions" if callable(value) else "data"


def public_names(kind: str, package: str = "coffea_sonic") -> list[str]:
    """The names of ``package.__all__`` of ``kind``, in ``__all__``'s order."""
    module = importlib.import_module(package)
    return [name for name in module.__all__ if kind_of(getattr(module, name)) == kind]


class PublicApi(SphinxDirective):
    """Autodoc entries for the names of one kind in ``coffea_sonic.__all__``."""

    required_arguments = 1

    def run(self) -> list[nodes.Node]:
        kind = self.arguments[0]
        if kind not in KINDS:
            raise self.error(f"sonic-public-api: kind must be one of {', '.join(KINDS)}, "
                             f"not {kind!r}")
        # the page is rebuilt whenever the package's list of exports changes
        self.env.note_dependency(str(Path(importlib.import_module("coffea_sonic").__file__)))
        lines: list[str] = []
        for name in public_names(kind):
            lines += [f".. {KINDS[kind]}:: coffea_sonic.{name}", ""]
        return self._parse(lines)

    def _parse(self, lines: list[str]) -> list[nodes.Node]:
        container = nodes.container()
        source = self.get_source_info()[0]
        nested_parse_with_titles(self.state, StringList(lines, source=source), container)
        return list(container.children)


@contextmanager
def _plain_environment() -> Iterator[None]:
    """Machine-dependent defaults as a fresh account sees them (no COFFEA_SONIC_*, XDG_*)."""
    saved = {key: value for key, value in os.environ.items()
             if key.startswith(("COFFEA_SONIC_", "XDG_"))}
    for key in saved:
        del os.environ[key]
    try:
        yield
    finally:
        os.environ.update(saved)


def _default_text(entry: Any) -> str:
    with _plain_environment():
        value = entry.default_value()
    if value is None or value == "":
        return "—"
    text = str(value).replace(os.path.expanduser("~"), "~", 1)
    return f"``{text}``"


def _other_sources(entry: Any) -> str:
    """Where else than an argument and the environment a setting is read from."""
    where = []
    if "dask config" in entry.sources:
        where.append(f"Dask config ``{entry.dask_key}``")
    if "endpoints file" in entry.sources:
        where.append(f"endpoints file key ``{entry.name}``")
    return ", ".join(where) or "— (environment only)"


def _rst_literals(text: str) -> str:
    """A help text as reStructuredText: Markdown-style `code` and URL schemes as literals.

    >>> _rst_literals("what `coffea-sonic server install` uses for triton+grpcs:// servers")
    'what ``coffea-sonic server install`` uses for ``triton+grpcs://`` servers'
    """
    text = re.sub(r"(?<!`)`([^`]+)`(?!`)", r"``\1``", text)
    return re.sub(r"(?<![`\w])([a-z][\w+.-]*://\S*)", r"``\1``", text)


class SettingsTable(SphinxDirective):
    """The table of every setting :data:`coffea_sonic.core.settings.SETTINGS` documents."""

    def run(self) -> list[nodes.Node]:
        from coffea_sonic.core.settings import SETTINGS

        self.env.note_dependency(str(Path(importlib.import_module(
            "coffea_sonic.core.settings").__file__)))
        lines = [".. list-table::", "   :header-rows: 1", "   :widths: 16 26 24 12 32", "",
                 "   * - setting", "     - environment", "     - also read from", "     - default",
                 "     - what"]
        for entry in SETTINGS:
            lines += [f"   * - ``{entry.name}``", f"     - ``{entry.env}``",
                      f"     - {_other_sources(entry)}", f"     - {_default_text(entry)}",
                      f"     - {_rst_literals(entry.help)}"]
        container = nodes.container()
        nested_parse_with_titles(self.state, StringList(lines, source=self.get_source_info()[0]),
                                 container)
        return list(container.children)


_LINK = re.compile(r"(?<!!)\[(?P<label>[^\]\n]+)\]\((?P<dest>[^)\s]+)\)")
_EXTERNAL = re.compile(r"^([a-z][a-z0-9+.-]*:|#|/)", re.IGNORECASE)


def repository_paths(text: str, folder: str) -> str:
    """``text`` (Markdown of a file in the repository's ``folder``) with each relative link shown
    as the repository path it names; URLs, anchors and images are kept.

    >>> repository_paths("[`results/h100/`](results/h100/results.md) and [x](#top)", "benchmarks")
    '`benchmarks/results/h100/results.md` and [x](#top)'
    >>> repository_paths("see [the plot](results/a.png); ![a](b.png)", "benchmarks")
    'see the plot (`benchmarks/results/a.png`); ![a](b.png)'
    """

    def shown(match: re.Match[str]) -> str:
        label, dest = match["label"], match["dest"]
        if _EXTERNAL.match(dest):
            return match[0]
        path = os.path.normpath(os.path.join(folder, dest.split("#", 1)[0]))
        if dest.endswith("/"):
            path += "/"
        bare = label.strip("`")
        if " " not in bare:  # the label is itself a path or a file name
            return f"`{path}`"
        return f"{label} (`{path}`)"

    return _LINK.sub(shown, text)


def _include_read(app: Sphinx, relative_path: Path, parent_docname: str,
                  content: list[str]) -> None:
    """Rewrite relative links of files included from outside the docs folder."""
    included = (Path(app.srcdir) / relative_path).resolve()
    root = Path(app.srcdir).resolve().parent
    if included.is_relative_to(Path(app.srcdir).resolve()) or not included.is_relative_to(root):
        return
    folder = included.parent.relative_to(root).as_posix()
    content[0] = repository_paths(content[0], folder)


#: autodoc object kinds whose docstring napoleon reads as one "type: description" line
_ATTRIBUTE_KINDS = {"attribute", "data", "property"}
_written: dict[str, list[str]] = {}


def _keep_attribute_docstring(app: Sphinx, what: str, name: str, obj: Any, options: Any,
                              lines: list[str]) -> None:
    """Before napoleon: remember an attribute's docstring as written.

    This package documents attributes in prose (``#: the served mirror of repository: ...``);
    napoleon would split such a line at its first colon into a bogus type and a description.
    """
    if what in _ATTRIBUTE_KINDS:
        _written[name] = list(lines)


def _restore_attribute_docstring(app: Sphinx, what: str, name: str, obj: Any, options: Any,
                                 lines: list[str]) -> None:
    """After napoleon: put an attribute's docstring back as written."""
    if what in _ATTRIBUTE_KINDS and name in _written:
        lines[:] = _written.pop(name)


def setup(app: Sphinx) -> dict[str, Any]:
    app.setup_extension("sphinx.ext.napoleon")  # connected at its default priority, 500
    app.connect("autodoc-process-docstring", _keep_attribute_docstring, priority=400)
    app.connect("autodoc-process-docstring", _restore_attribute_docstring, priority=600)
    app.add_directive("sonic-public-api", PublicApi)
    app.add_directive("sonic-settings-table", SettingsTable)
    app.connect("include-read", _include_read)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}

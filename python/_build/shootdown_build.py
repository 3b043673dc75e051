"""PEP 517 build backend: maturin, plus the repository's data shipped inside the wheel.

maturin builds everything (the Rust extension, the package under ``python/shootdown``, the
sdist). It has no way to place repository-root directories *inside* the package, so this thin
wrapper copies ``experiments/``, ``profiles/`` and ``scenarios/`` into
``python/shootdown/_data/`` for the duration of ``build_wheel`` and removes the copy
afterwards (it never touches a ``_data`` it did not create). Installed from the wheel,
``shootdown.paths.data_root()`` then finds the data at ``shootdown/_data``. Editable installs
need no copy: they find the repository itself.

Every other hook is maturin's, unchanged. Building from the sdist works the same way: the
sdist carries the three directories (``[tool.maturin] include``).
"""

from __future__ import annotations

import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, List, Mapping, Optional

import maturin
from maturin import (  # noqa: F401  (re-exported PEP 517 hooks)
    build_editable,
    build_sdist,
    get_requires_for_build_editable,
    get_requires_for_build_sdist,
    get_requires_for_build_wheel,
    prepare_metadata_for_build_editable,
    prepare_metadata_for_build_wheel,
)

#: Repository-root directories shipped in the wheel.
DATA_DIRS = ("experiments", "profiles", "scenarios")

_ROOT = Path(__file__).resolve().parents[2]  # python/_build/ -> repository (or sdist) root
_IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", ".*")


@contextmanager
def staged_data(root: Path = _ROOT) -> Iterator[Optional[Path]]:
    """Copy the data directories to ``root/python/shootdown/_data`` and remove them after.

    Yields the ``_data`` directory, or ``None`` when a ``_data`` already existed (it is then
    left alone and shipped as it is).
    """
    target = root / "python" / "shootdown" / "_data"
    if target.exists():
        yield None
        return
    try:
        target.mkdir(parents=True)
        for name in DATA_DIRS:
            source = root / name
            if source.is_dir():
                shutil.copytree(source, target / name, ignore=_IGNORE)
        yield target
    finally:
        shutil.rmtree(target, ignore_errors=True)


def build_wheel(
    wheel_directory: str,
    config_settings: Optional[Mapping[str, Any]] = None,
    metadata_directory: Optional[str] = None,
) -> str:
    """maturin's ``build_wheel`` with the data directories staged into the package."""
    with staged_data():
        return maturin.build_wheel(wheel_directory, config_settings, metadata_directory)


__all__: List[str] = [
    "build_editable",
    "build_sdist",
    "build_wheel",
    "get_requires_for_build_editable",
    "get_requires_for_build_sdist",
    "get_requires_for_build_wheel",
    "prepare_metadata_for_build_editable",
    "prepare_metadata_for_build_wheel",
    "staged_data",
]

"""Where shootdown finds its data: experiments, profiles and scenarios.

The repository keeps ``experiments/``, ``profiles/`` and ``scenarios/`` at its root. The package
finds them, in this order:

1. ``$SHOOTDOWN_HOME`` when set (a directory holding those three folders);
2. an ancestor of the installed package directory that contains ``experiments/seeds`` — this is
   the repository itself for in-repo (``PYTHONPATH=python``) and editable installs. The search
   stops at a ``site-packages``/``dist-packages`` directory so an installed copy never picks up
   an unrelated checkout that happens to contain it;
3. the copy shipped inside the wheel at ``shootdown/_data/`` (see ``python/_build``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping, Optional

__all__ = [
    "ENV_HOME",
    "DataNotFoundError",
    "data_root",
    "experiments_dir",
    "seeds_dir",
    "profiles_dir",
    "scenarios_dir",
    "resolve_scenario",
]

#: Environment variable that overrides the data root.
ENV_HOME = "SHOOTDOWN_HOME"

_PACKAGE_DIR = Path(__file__).resolve().parent
_INSTALL_DIRS = frozenset({"site-packages", "dist-packages"})


class DataNotFoundError(FileNotFoundError):
    """No data root (experiments/profiles/scenarios) could be found."""


def data_root(
    *,
    package_dir: Optional[Path] = None,
    environ: Optional[Mapping[str, str]] = None,
) -> Path:
    """Return the directory that holds ``experiments/``, ``profiles/`` and ``scenarios/``.

    ``package_dir`` and ``environ`` default to this package's directory and ``os.environ``;
    they exist so the search can be tested.

    Raises:
        DataNotFoundError: none of the three places has the data.
    """
    env = os.environ if environ is None else environ
    pkg = _PACKAGE_DIR if package_dir is None else Path(package_dir).resolve()

    home = env.get(ENV_HOME)
    if home:
        return Path(home).expanduser().resolve()

    for ancestor in pkg.parents:
        if ancestor.name in _INSTALL_DIRS:
            break
        if (ancestor / "experiments" / "seeds").is_dir():
            return ancestor

    shipped = pkg / "_data"
    if (shipped / "experiments").is_dir():
        return shipped

    raise DataNotFoundError(
        f"cannot find shootdown's data (experiments/, profiles/, scenarios/): set ${ENV_HOME}, "
        f"run from a checkout of the repository, or install the wheel (looked above {pkg} "
        f"and in {shipped})"
    )


def experiments_dir() -> Path:
    """``<data_root>/experiments``."""
    return data_root() / "experiments"


def seeds_dir() -> Path:
    """``<data_root>/experiments/seeds``: the experiments ``reproduce`` runs."""
    return data_root() / "experiments" / "seeds"


def profiles_dir() -> Path:
    """``<data_root>/profiles``."""
    return data_root() / "profiles"


def scenarios_dir() -> Path:
    """``<data_root>/scenarios``: the checker's scenario files."""
    return data_root() / "scenarios"


def resolve_scenario(name_or_path: str) -> Optional[Path]:
    """Resolve a checker scenario given as a path or as a name in ``<data_root>/scenarios``.

    A name is tried as ``scenarios/NAME``, then ``scenarios/NAME.toml``. Returns ``None`` when
    nothing matches (the caller reports the error).
    """
    direct = Path(name_or_path).expanduser()
    if direct.exists():
        return direct
    try:
        base = scenarios_dir()
    except DataNotFoundError:
        return None
    for candidate in (base / name_or_path, base / f"{name_or_path}.toml"):
        if candidate.exists():
            return candidate
    return None

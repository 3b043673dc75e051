"""Where shootdown finds its data: experiments, profiles and scenarios.

The repository keeps ``experiments/``, ``profiles/`` and ``scenarios/`` at its root. The package
finds them, in this order:

1. ``$SHOOTDOWN_HOME`` when set (a directory holding those three folders);
2. an ancestor of the installed package directory that contains ``experiments/seeds`` — this is
   the repository itself for in-repo (``PYTHONPATH=python``) and editable installs. The search
   stops at a ``site-packages``/``dist-packages`` directory so an installed copy never picks up
   an unrelated checkout that happens to contain it;
3. the copy shipped inside the wheel at ``shootdown/_data/`` (see ``python/_build``).

:func:`resolve_experiment` and :func:`resolve_scenario` accept a path or the name of a shipped
file; :func:`list_experiments`, :func:`list_profiles` and :func:`list_scenarios` read what ships
(``shootdown list``) from the TOML files alone, without the native module.
"""

from __future__ import annotations

import difflib
import os
import sys
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Tuple, Union

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python < 3.11 (a dependency there)
    import tomli as tomllib

__all__ = [
    "ENV_HOME",
    "DataNotFoundError",
    "data_root",
    "experiments_dir",
    "seeds_dir",
    "profiles_dir",
    "scenarios_dir",
    "resolve_scenario",
    "shipped_experiments",
    "resolve_experiment",
    "LIST_KINDS",
    "list_experiments",
    "list_profiles",
    "list_scenarios",
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


def shipped_experiments() -> List[Path]:
    """Every experiment file under ``<data_root>/experiments`` (any depth): the seeds' first,
    then the others, each group sorted by path relative to that directory."""
    base = experiments_dir()

    def order(path: Path) -> Tuple[bool, str]:
        rel = path.relative_to(base).as_posix()
        return (not rel.startswith("seeds/"), rel)

    return sorted(base.rglob("*.toml"), key=order)


def _config_error(message: str) -> Exception:
    from ._bridge import ConfigError  # the extension's class when it is built

    return ConfigError(message)


def resolve_experiment(name_or_path: Union[str, "os.PathLike[str]"]) -> Path:
    """Resolve an experiment given as a path or as the name of a shipped experiment.

    A path that names an existing file wins. Otherwise the argument is looked up under
    ``<data_root>/experiments``: as a relative path there (``seeds/seed002-madv-dontneed``, with
    or without ``.toml``), then as the file name or stem of any experiment file at any depth
    (``seed002-madv-dontneed``).

    Raises:
        ConfigError: nothing matches (one line, naming close matches), or a name matches
            several shipped files.
    """
    text = os.fspath(name_or_path)
    direct = Path(text).expanduser()
    if direct.is_file():
        return direct
    problem = "is a directory, not an experiment file" if direct.is_dir() else None
    try:
        base = experiments_dir()
        files = shipped_experiments() if base.is_dir() else []
    except DataNotFoundError:
        base, files = None, []
    if problem is None and base is not None and text and not Path(text).is_absolute():
        for candidate in (base / text, base / f"{text}.toml"):
            if candidate.is_file():
                return candidate
        matches = [f for f in files if text in (f.stem, f.name)]
        if len(matches) == 1:
            return matches[0]
        if len(matches) > 1:
            shown = ", ".join(f.relative_to(base).as_posix() for f in matches)
            raise _config_error(
                f"{text}: experiment: ambiguous name, matches {shown} (give the path)"
            )
    if problem is not None:
        raise _config_error(f"{text}: experiment: {problem}")
    reason = f"{text}: experiment: no such file or shipped experiment"
    close = difflib.get_close_matches(
        Path(text).stem, sorted({f.stem for f in files}), n=3, cutoff=0.6
    )
    if close:
        reason += f"; did you mean {' or '.join(close)}?"
    raise _config_error(reason + " (see `shootdown list experiments`)")


# --------------------------------------------------------------------------- listing

#: What ``shootdown list`` can list, in its order.
LIST_KINDS = ("experiments", "profiles", "scenarios")


def _read_toml(path: Path) -> Dict[str, Any]:
    """The TOML table of a data file; ``{"_error": reason}`` when it cannot be read."""
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except (OSError, tomllib.TOMLDecodeError) as exc:
        return {"_error": " ".join(str(exc).split())}


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _table(data: Mapping[str, Any], key: str) -> Dict[str, Any]:
    value = data.get(key)
    return value if isinstance(value, dict) else {}


def list_experiments() -> List[Dict[str, Any]]:
    """The shipped experiments: ``{"kind", "name" (file stem: what the commands accept),
    "seed", "title", "profile", "path"}`` each, in :func:`shipped_experiments` order."""
    out = []
    for f in shipped_experiments():
        data = _read_toml(f)
        exp = _table(data, "experiment")
        seed = exp.get("seed")
        out.append(
            {
                "kind": "experiment",
                "name": f.stem,
                "seed": str(seed) if seed is not None else None,
                "title": _text(exp.get("title")) or _error_text(data),
                "profile": _text(exp.get("profile")) or None,
                "path": str(f),
            }
        )
    return out


def _error_text(data: Mapping[str, Any]) -> str:
    return f"(unreadable: {data['_error']})" if "_error" in data else ""


def list_profiles() -> List[Dict[str, Any]]:
    """The shipped machine profiles: ``{"kind", "name", "description", "inherits", "path"}``
    each, sorted by name."""
    out = []
    for f in sorted(profiles_dir().glob("*.toml")):
        data = _read_toml(f)
        prof = _table(data, "profile")
        out.append(
            {
                "kind": "profile",
                "name": f.stem,
                "description": _text(prof.get("description")) or _error_text(data),
                "inherits": _text(prof.get("inherits")) or None,
                "path": str(f),
            }
        )
    return out


def list_scenarios() -> List[Dict[str, Any]]:
    """The checker's shipped scenarios: ``{"kind", "name", "description", "mutants" (how many),
    "path"}`` each, sorted by name. Read from the TOML files, so this works without the native
    module (``shootdown check --list`` shows the mutants themselves)."""
    out = []
    for f in sorted(scenarios_dir().glob("*.toml")):
        data = _read_toml(f)
        section = _table(data, "scenario")
        description = next(
            (
                _text(d.get(k))
                for d in (data, section)
                for k in ("description", "title")
                if _text(d.get(k))
            ),
            _error_text(data),
        )
        mutants = data.get("mutants")
        out.append(
            {
                "kind": "scenario",
                "name": f.stem,
                "description": description,
                "mutants": len(mutants) if isinstance(mutants, list) else 0,
                "path": str(f),
            }
        )
    return out

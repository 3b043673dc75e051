"""Where the data root is found: $SHOOTDOWN_HOME, an ancestor checkout, the wheel's copy."""

from __future__ import annotations

from pathlib import Path

import pytest

from shootdown import paths


def make_tree(base: Path) -> Path:
    (base / "experiments" / "seeds").mkdir(parents=True)
    return base


def test_env_wins(tmp_path: Path) -> None:
    pkg = make_tree(tmp_path / "repo") / "python" / "shootdown"
    pkg.mkdir(parents=True)
    home = tmp_path / "elsewhere"
    assert paths.data_root(package_dir=pkg, environ={"SHOOTDOWN_HOME": str(home)}) == home.resolve()


def test_ancestor_checkout(tmp_path: Path) -> None:
    repo = make_tree(tmp_path / "repo")
    pkg = repo / "python" / "shootdown"
    pkg.mkdir(parents=True)
    assert paths.data_root(package_dir=pkg, environ={}) == repo.resolve()


def test_shipped_copy_when_installed(tmp_path: Path) -> None:
    # an installed package inside a venv that lives in a checkout: the search stops at
    # site-packages, so the wheel's own copy is used, not the checkout around the venv
    repo = make_tree(tmp_path / "repo")
    pkg = repo / ".venv" / "lib" / "python3.11" / "site-packages" / "shootdown"
    (pkg / "_data" / "experiments" / "seeds").mkdir(parents=True)
    assert paths.data_root(package_dir=pkg, environ={}) == (pkg / "_data").resolve()


def test_nothing_found(tmp_path: Path) -> None:
    pkg = tmp_path / "site-packages" / "shootdown"
    pkg.mkdir(parents=True)
    with pytest.raises(paths.DataNotFoundError, match="SHOOTDOWN_HOME"):
        paths.data_root(package_dir=pkg, environ={})


def test_empty_env_is_ignored(tmp_path: Path) -> None:
    repo = make_tree(tmp_path / "repo")
    pkg = repo / "python" / "shootdown"
    pkg.mkdir(parents=True)
    assert paths.data_root(package_dir=pkg, environ={"SHOOTDOWN_HOME": ""}) == repo.resolve()


def test_this_checkout_is_found(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SHOOTDOWN_HOME", raising=False)
    root = paths.data_root()
    assert (root / "experiments" / "seeds").is_dir()


def test_resolve_scenario(data_home: Path, tmp_path: Path) -> None:
    assert paths.resolve_scenario("lazy-switch") == data_home / "scenarios" / "lazy-switch.toml"
    explicit = data_home / "scenarios" / "pv-flush.toml"
    assert paths.resolve_scenario(str(explicit)) == explicit
    assert paths.resolve_scenario("nope") is None

"""Where the data root is found: $SHOOTDOWN_HOME, an ancestor checkout, the wheel's copy."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import shootdown
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


def test_resolve_experiment(data_home: Path, tmp_path: Path, monkeypatch) -> None:
    seeds = data_home / "experiments" / "seeds"
    # by stem, by file name, by path relative to experiments/
    assert paths.resolve_experiment("000-sysbench") == seeds / "000-sysbench.toml"
    assert paths.resolve_experiment("000-sysbench.toml") == seeds / "000-sysbench.toml"
    assert paths.resolve_experiment("seeds/002-dontneed") == seeds / "002-dontneed.toml"
    # a file that exists wins over a shipped experiment of the same name
    monkeypatch.chdir(tmp_path)
    (tmp_path / "000-sysbench").write_text("")
    assert paths.resolve_experiment("000-sysbench") == Path("000-sysbench")
    # close matches are named; the error is one line
    with pytest.raises(shootdown.ConfigError) as info:
        paths.resolve_experiment("000-sysbnch")
    assert str(info.value) == (
        "000-sysbnch: experiment: no such file or shipped experiment; did you mean "
        "000-sysbench? (see `shootdown list experiments`)"
    )
    with pytest.raises(shootdown.ConfigError, match="no such file or shipped experiment \\(see"):
        paths.resolve_experiment("zzz")
    with pytest.raises(shootdown.ConfigError, match="is a directory"):
        paths.resolve_experiment(tmp_path)
    # one name, two shipped files: ambiguous
    (data_home / "experiments" / "examples").mkdir()
    (data_home / "experiments" / "examples" / "000-sysbench.toml").write_text("")
    with pytest.raises(shootdown.ConfigError, match="ambiguous name, matches"):
        paths.resolve_experiment("000-sysbench.toml")


def test_resolve_experiment_without_data(tmp_path: Path, monkeypatch) -> None:
    def no_data() -> Path:
        raise paths.DataNotFoundError("none")

    monkeypatch.setattr(paths, "data_root", no_data)
    with pytest.raises(shootdown.ConfigError, match="x.toml: experiment: no such file"):
        paths.resolve_experiment(tmp_path / "x.toml")


def test_listings_read_the_toml_files(data_home: Path) -> None:
    (data_home / "scenarios" / "lazy-switch.toml").write_text(
        'description = "a lazy CPU"\n[[mutants]]\nname = "m1"\n[[mutants]]\nname = "m2"\n'
    )
    (data_home / "profiles" / "broken.toml").write_text("[profile\n")
    exps = paths.list_experiments()
    assert [(e["name"], e["seed"], e["title"]) for e in exps] == [
        ("000-sysbench", "000", "sysbench fileio rndwr (fake)"),
        ("002-dontneed", "002", "MADV_DONTNEED + migrate (fake)"),
    ]
    profiles = {p["name"]: p for p in paths.list_profiles()}
    assert profiles["test-profile"]["description"] == "fake"
    assert profiles["broken"]["description"].startswith("(unreadable: ")
    scenarios = {s["name"]: s for s in paths.list_scenarios()}
    assert scenarios["lazy-switch"]["description"] == "a lazy CPU"
    assert scenarios["lazy-switch"]["mutants"] == 2
    assert scenarios["pv-flush"]["mutants"] == 0


def test_the_shipped_data_lists(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SHOOTDOWN_HOME", raising=False)
    names = [e["name"] for e in paths.list_experiments()]
    assert names[0].startswith("seed000") and "seed002-madv-dontneed" in names
    assert all(e["title"] for e in paths.list_experiments())
    assert all(p["description"] for p in paths.list_profiles())
    scenarios = {s["name"]: s for s in paths.list_scenarios()}
    assert scenarios["lazy_munmap"]["mutants"] >= 2 and scenarios["lazy_munmap"]["description"]


def test_shipped_profiles_are_exported_once(data_home: Path, monkeypatch) -> None:
    from shootdown import _bridge

    monkeypatch.setenv(_bridge.ENV_SHIPPED_PROFILES, "")
    monkeypatch.delenv(_bridge.ENV_SHIPPED_PROFILES)  # restored (unset) after the test
    monkeypatch.setattr(_bridge, "_shipped_profiles_exported", False)
    _bridge.export_shipped_profiles()
    assert os.environ[_bridge.ENV_SHIPPED_PROFILES] == str(data_home / "profiles")
    # never overrides what the user set
    monkeypatch.setenv(_bridge.ENV_SHIPPED_PROFILES, "/mine")
    monkeypatch.setattr(_bridge, "_shipped_profiles_exported", False)
    _bridge.export_shipped_profiles()
    assert os.environ[_bridge.ENV_SHIPPED_PROFILES] == "/mine"
    # no data root: nothing happens
    monkeypatch.delenv(_bridge.ENV_SHIPPED_PROFILES)
    monkeypatch.setattr(_bridge, "_shipped_profiles_exported", False)

    def no_data() -> Path:
        raise paths.DataNotFoundError("none")

    monkeypatch.setattr(paths, "data_root", no_data)
    _bridge.export_shipped_profiles()
    assert _bridge.ENV_SHIPPED_PROFILES not in os.environ

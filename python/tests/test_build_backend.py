"""The PEP 517 wrapper that stages the data directories into the wheel."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("maturin")

_BACKEND = Path(__file__).resolve().parents[1] / "_build" / "shootdown_build.py"


def load_backend():
    spec = importlib.util.spec_from_file_location("shootdown_build", _BACKEND)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_hooks_are_exported() -> None:
    backend = load_backend()
    for hook in (
        "build_wheel",
        "build_sdist",
        "build_editable",
        "get_requires_for_build_wheel",
        "prepare_metadata_for_build_wheel",
    ):
        assert callable(getattr(backend, hook))


def test_staged_data_copies_and_cleans_up(tmp_path: Path) -> None:
    backend = load_backend()
    for name in ("experiments/seeds", "profiles", "scenarios"):
        (tmp_path / name).mkdir(parents=True)
    (tmp_path / "experiments/seeds/000.toml").write_text("a")
    (tmp_path / "profiles/p.toml").write_text("b")
    (tmp_path / "experiments/seeds/__pycache__").mkdir()
    (tmp_path / "python/shootdown").mkdir(parents=True)
    target = tmp_path / "python/shootdown/_data"
    with backend.staged_data(tmp_path) as staged:
        assert staged == target
        assert (target / "experiments/seeds/000.toml").read_text() == "a"
        assert (target / "profiles/p.toml").read_text() == "b"
        assert (target / "scenarios").is_dir()
        assert not (target / "experiments/seeds/__pycache__").exists()
    assert not target.exists()


def test_existing_data_is_left_alone(tmp_path: Path) -> None:
    backend = load_backend()
    target = tmp_path / "python/shootdown/_data"
    target.mkdir(parents=True)
    (target / "keep").write_text("x")
    with backend.staged_data(tmp_path) as staged:
        assert staged is None
    assert (target / "keep").exists()

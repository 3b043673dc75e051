"""Sweeps: grid expansion, TOML spelling, the resumable cache, the Ray backend."""

from __future__ import annotations

import importlib
import json
import sys
import types

import pytest

import shootdown
from shootdown.sweep import Raw, expand_grid, summarize_sweep, sweep, toml_literal

# ``shootdown.sweep`` is the function; the module is reached through the import system.
sweep_mod = importlib.import_module("shootdown.sweep")

GRID = {"workload.fake_noise": [0.0, 2.0], "variants.after.options.fake_factor": [1.1, 0.9]}


def test_toml_literal() -> None:
    assert toml_literal(True) == "true"
    assert toml_literal(8) == "8"
    assert toml_literal(0.5) == "0.5"
    assert toml_literal("concurrent") == '"concurrent"'
    assert toml_literal([1, "a"]) == '[1, "a"]'
    assert toml_literal({"pti": False, "a b": 1}) == '{ pti = false, "a b" = 1 }'
    assert toml_literal(Raw("{ x = 1 }")) == "{ x = 1 }"
    assert toml_literal(float("inf")) == "inf"
    with pytest.raises(TypeError):
        toml_literal(object())


def test_expand_grid_order() -> None:
    combos = expand_grid({"a": [1, 2], "b": ["x", "y"]})
    assert combos == [
        {"a": 1, "b": "x"},
        {"a": 1, "b": "y"},
        {"a": 2, "b": "x"},
        {"a": 2, "b": "y"},
    ]
    with pytest.raises(TypeError):
        expand_grid({"a": "abc"})


def test_sweep_runs_then_resumes_from_cache(fake_native, seed000, tmp_path) -> None:
    cache = tmp_path / "cache"
    first = sweep(seed000, GRID, cache_dir=cache, quick=True, threads=2)
    n_points = 4 * 8
    assert len(first) == n_points and not first["cached"].any()
    assert sorted(fake_native.indices_run()) == sorted(list(range(8)) * 4)
    assert len(list(cache.rglob("*.json"))) == n_points
    sets_seen = {tuple(args[1]) for fn, args in fake_native.calls if fn == "run_points"}
    assert ("workload.fake_noise=0.0", "variants.after.options.fake_factor=1.1") in sets_seen

    fake_native.calls.clear()
    seen = []
    second = sweep(
        seed000,
        GRID,
        cache_dir=cache,
        quick=True,
        threads=2,
        progress=lambda d, t: seen.append((d, t)),
    )
    assert [fn for fn, _ in fake_native.calls if fn == "run_points"] == []  # zero points recomputed
    assert second["cached"].all()
    assert second["value"].tolist() == first["value"].tolist()
    assert seen == [(n_points, n_points)]
    assert list(second.columns[:3]) == [
        "combo",
        "workload.fake_noise",
        "variants.after.options.fake_factor",
    ]


def test_sweep_resumes_after_interruption(fake_native, seed000, tmp_path) -> None:
    cache = tmp_path / "cache"
    real_run = fake_native.run_points
    calls = {"n": 0}

    def flaky(*args):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return real_run(*args)

    fake_native.run_points = flaky
    with pytest.raises(KeyboardInterrupt):
        sweep(seed000, GRID, cache_dir=cache, quick=True, threads=1)  # chunks of 2 points
    assert len(list(cache.rglob("*.json"))) == 4
    fake_native.run_points = real_run
    fake_native.calls.clear()
    out = sweep(seed000, GRID, cache_dir=cache, quick=True, threads=1)
    assert len(fake_native.indices_run()) == 4 * 8 - 4
    assert int(out["cached"].sum()) == 4


def test_cache_key_changes_with_inputs(fake_native, seed000, tmp_path) -> None:
    cache = tmp_path / "cache"
    sweep(seed000, {"workload.fake_noise": [0.0]}, cache_dir=cache, quick=True)
    # a larger grid computes only the new combination
    fake_native.calls.clear()
    sweep(seed000, {"workload.fake_noise": [0.0, 3.0]}, cache_dir=cache, quick=True)
    assert len(fake_native.indices_run()) == 8
    # non-quick is another key
    fake_native.calls.clear()
    sweep(seed000, {"workload.fake_noise": [0.0]}, cache_dir=cache, quick=False)
    assert len(fake_native.indices_run()) == 24
    # editing the experiment file invalidates its points
    seed000.write_text(seed000.read_text() + "\n# edited\n")
    fake_native.calls.clear()
    sweep(seed000, {"workload.fake_noise": [0.0]}, cache_dir=cache, quick=True)
    assert len(fake_native.indices_run()) == 8
    # so does editing the profile
    profile = seed000.parents[2] / "profiles" / "test-profile.toml"
    profile.write_text(profile.read_text() + "\n# edited\n")
    fake_native.calls.clear()
    sweep(seed000, {"workload.fake_noise": [0.0]}, cache_dir=cache, quick=True)
    assert len(fake_native.indices_run()) == 8
    # and so does rebuilding the extension with other code (same version string)
    extension = tmp_path / "_native.so"
    extension.write_bytes(b"build 1")
    fake_native.__file__ = str(extension)
    fake_native.calls.clear()
    sweep(seed000, {"workload.fake_noise": [0.0]}, cache_dir=cache, quick=True)
    assert len(fake_native.indices_run()) == 8
    fake_native.calls.clear()
    sweep(seed000, {"workload.fake_noise": [0.0]}, cache_dir=cache, quick=True)
    assert fake_native.indices_run() == []
    extension.write_bytes(b"build 2, longer")
    fake_native.calls.clear()
    sweep(seed000, {"workload.fake_noise": [0.0]}, cache_dir=cache, quick=True)
    assert len(fake_native.indices_run()) == 8


def test_profile_chain_is_hashed(tmp_path) -> None:
    (tmp_path / "profiles").mkdir()
    (tmp_path / "profiles" / "child.toml").write_text(
        '[profile]\nname = "child"\ninherits = "base"\n'
    )
    (tmp_path / "profiles" / "base.toml").write_text('[profile]\nname = "base"\n')
    exp = tmp_path / "experiments" / "e.toml"
    exp.parent.mkdir()
    exp.write_text("")
    hashes = sweep_mod._profile_hashes(exp, "child")
    assert len(hashes) == 2 and all(len(h) == 64 for h in hashes)
    assert sweep_mod._profile_hashes(exp, "ghost") == ["missing:ghost"]


def test_corrupt_cache_entry_is_recomputed(fake_native, seed000, tmp_path) -> None:
    cache = tmp_path / "cache"
    sweep(seed000, {}, cache_dir=cache, quick=True)
    victim = sorted(cache.rglob("*.json"))[0]
    victim.write_text("{not json")
    fake_native.calls.clear()
    sweep(seed000, {}, cache_dir=cache, quick=True)
    assert len(fake_native.indices_run()) == 1
    assert json.loads(victim.read_text())["provenance"]["quick"] is True


def test_summarize_sweep(fake_native, seed000, tmp_path) -> None:
    frame = sweep(seed000, GRID, cache_dir=tmp_path / "c", quick=True)
    summary = summarize_sweep(frame)
    assert len(summary) == 4 * 4
    up = summary[(summary["variants.after.options.fake_factor"] == 1.1) & ~summary["baseline"]]
    assert (up["change_pct"] > 5).all()


def test_ray_backend_missing(fake_native, seed000, tmp_path, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    with pytest.raises(ImportError, match=r"shootdown\[dist\]"):
        sweep(seed000, GRID, backend="ray", cache_dir=tmp_path / "c", quick=True)


def test_bad_backend(fake_native, seed000, tmp_path) -> None:
    with pytest.raises(ValueError, match="backend"):
        sweep(seed000, GRID, backend="dask", cache_dir=tmp_path / "c")


def fake_ray_module() -> types.ModuleType:
    ray = types.ModuleType("ray")
    state = {"init": 0, "tasks": 0}

    class Ref:
        def __init__(self, value):
            self.value = value

    class RemoteFunction:
        def __init__(self, fn, opts):
            self.fn, self.opts = fn, opts

        def remote(self, *args):
            state["tasks"] += 1
            return Ref(self.fn(*args))

    ray.is_initialized = lambda: state["init"] > 0
    ray.init = lambda **kw: state.__setitem__("init", state["init"] + 1)
    ray.remote = lambda **opts: lambda fn: RemoteFunction(fn, opts)
    ray.wait = lambda refs, num_returns=1: (refs[:num_returns], refs[num_returns:])
    ray.get = lambda ref: ref.value
    ray.state = state
    return ray


def test_ray_backend_with_a_fake_ray(fake_native, seed000, tmp_path, monkeypatch) -> None:
    ray = fake_ray_module()
    monkeypatch.setitem(sys.modules, "ray", ray)
    local = sweep(seed000, GRID, cache_dir=tmp_path / "local", quick=True)
    out = sweep(seed000, GRID, backend="ray", cache_dir=tmp_path / "ray", quick=True, chunk_size=3)
    assert ray.state["init"] == 1 and ray.state["tasks"] == 4 * 3  # 8 points per combo, chunks of 3
    assert out["value"].tolist() == local["value"].tolist()
    fake_native.calls.clear()
    again = sweep(seed000, GRID, backend="ray", cache_dir=tmp_path / "ray", quick=True)
    assert again["cached"].all() and fake_native.indices_run() == []


def test_sweep_is_exported() -> None:
    assert shootdown.sweep is sweep and shootdown.summarize_sweep is summarize_sweep
    assert sweep_mod.sweep is sweep

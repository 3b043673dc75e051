"""Sweeps: grid expansion, TOML spelling, the resumable cache, the Ray backend."""

from __future__ import annotations

import importlib
import json
import logging
import math
import re
import sys
import types
from pathlib import Path

import pytest

import shootdown
from shootdown.sweep import (
    Raw,
    expand_grid,
    parse_grid,
    split_values,
    summarize_sweep,
    sweep,
    toml_literal,
)

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


def test_cache_key_follows_the_plans_inputs(fake_native, seed000, tmp_path, monkeypatch) -> None:
    """The key covers every file the plan says a run reads (issue 17): an inherited profile
    found next to the experiment, a profile switched by the grid, profile_override values."""
    home = seed000.parents[2]
    (home / "profiles" / "base.toml").write_text('[profile]\nname = "base"\n')
    child = home / "profiles" / "child.toml"
    child.write_text('[profile]\nname = "child"\ninherits = "base"\n')
    cache = tmp_path / "cache"
    grid = {
        "experiment.profile": ["test-profile", "child"],
        "profile_override.cost.invlpg": [120, 240],
    }

    def cached_by_profile() -> dict:
        fake_native.calls.clear()
        frame = sweep(seed000, grid, cache_dir=cache, quick=True)
        return {
            (p, int(v)): bool(c.all())
            for (p, v), c in frame.groupby(list(grid))["cached"]  # type: ignore[misc]
        }

    first = cached_by_profile()
    assert not any(first.values())
    plans = sweep(seed000, grid, cache_dir=cache, quick=True).attrs["plans"]
    assert plans[2]["experiment"]["profile"] == "child + override(cost.invlpg)"
    assert [Path(i["path"]).name for i in plans[2]["inputs"]] == [
        seed000.name,
        "child.toml",
        "base.toml",
    ]
    assert all(cached_by_profile().values())

    # Editing the inherited profile recomputes only the combinations that read it.
    (home / "profiles" / "base.toml").write_text('[profile]\nname = "base"\n# edited\n')
    assert cached_by_profile() == {
        ("test-profile", 120): True,
        ("test-profile", 240): True,
        ("child", 120): False,
        ("child", 240): False,
    }
    # A profile_override grid value is part of the key: a new value runs, the old ones do not.
    grid["profile_override.cost.invlpg"] = [120, 360]
    assert cached_by_profile() == {
        ("test-profile", 120): True,
        ("test-profile", 360): False,
        ("child", 120): True,
        ("child", 360): False,
    }
    # A profile of the same name in $SHOOTDOWN_PROFILES is searched first: other inputs.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "child.toml").write_text('[profile]\nname = "child"\n# another machine\n')
    monkeypatch.setenv("SHOOTDOWN_PROFILES", str(elsewhere))
    assert cached_by_profile() == {
        ("test-profile", 120): True,
        ("test-profile", 360): True,
        ("child", 120): False,
        ("child", 360): False,
    }


def test_no_inputs_in_the_plan_means_no_cache(fake_native, seed000, tmp_path) -> None:
    """An older native module without ``inputs``: nothing is cached or served from a cache."""
    real_plan = fake_native.plan

    def plan_without_inputs(*args):
        plan = json.loads(real_plan(*args))
        del plan["inputs"]
        return json.dumps(plan)

    fake_native.plan = plan_without_inputs
    cache = tmp_path / "cache"
    sweep(seed000, {}, cache_dir=cache, quick=True)
    fake_native.calls.clear()
    again = sweep(seed000, {}, cache_dir=cache, quick=True)
    assert not again["cached"].any() and len(fake_native.indices_run()) == 8
    assert not list(cache.rglob("*.json"))


def test_sweep_accepts_a_shipped_name(fake_native, data_home, tmp_path) -> None:
    frame = sweep("000-sysbench", {}, cache_dir=tmp_path / "c", quick=True)
    assert len(frame) == 8


def test_parse_grid() -> None:
    assert parse_grid(["experiment.rows=[8,16],[32]", "w.k = 1, 2 ,x"]) == {
        "experiment.rows": ["[8,16]", "[32]"],
        "w.k": ["1", "2", "x"],
    }
    assert all(isinstance(v, Raw) for v in parse_grid(["a=1"])["a"])
    assert split_values('"a,b",{ x = [1, 2], y = \'c,d\' },"q\\",r"') == [
        '"a,b"',
        "{ x = [1, 2], y = 'c,d' }",
        '"q\\",r"',
    ]
    for spec, reason in (
        ("a", "expected KEY=V1,V2"),
        ("=1", "empty key"),
        ("a..b=1", "empty key"),
        ("a=", "a: no values"),
        ("a=1,,2", "a: an empty value"),
        ("a=1,", "a: an empty value"),
        ("a=[1,2", "a: missing ']'"),
        ("a=1]", "a: unbalanced ']'"),
        ("a={x=[1}", "a: unbalanced '}'"),
        ('a="x', "a: unterminated"),
    ):
        with pytest.raises(shootdown.ConfigError, match=re.escape(f"{spec}: --grid: {reason}")):
            parse_grid([spec])
    with pytest.raises(shootdown.ConfigError, match="a given twice"):
        parse_grid(["a=1", "a=2"])


def test_corrupt_cache_entry_is_recomputed(fake_native, seed000, tmp_path) -> None:
    cache = tmp_path / "cache"
    sweep(seed000, {}, cache_dir=cache, quick=True)
    victim = sorted(cache.rglob("*.json"))[0]
    victim.write_text("{not json")
    fake_native.calls.clear()
    sweep(seed000, {}, cache_dir=cache, quick=True)
    assert len(fake_native.indices_run()) == 1
    assert json.loads(victim.read_text())["provenance"]["quick"] is True


def entries_by_index(cache: Path) -> dict:
    """The cache's entry files by their point's index (a sweep of one combination)."""
    return {json.loads(f.read_text())["result"]["index"]: f for f in cache.rglob("*.json")}


def set_result(field: str, value):
    def edit(entry: dict) -> dict:
        entry["result"][field] = value
        return entry

    return edit


def from_entry(edit):
    return lambda text: json.dumps(edit(json.loads(text)))


# (test id, how the entry's text is damaged, what the warning says)
INVALID_ENTRIES = [
    ("result-empty", from_entry(lambda e: {**e, "result": {}}), "result: missing field(s) index,"),
    (
        "result-string",
        from_entry(lambda e: {**e, "result": "x"}),
        "result: expected an object (a point result), got a string",
    ),
    ("truncated", lambda text: text[: len(text) // 2], "not JSON ("),
    (
        "number-as-string",
        from_entry(set_result("value", "1234.5")),
        'result.value: expected a number or null, got a string "1234.5"',
    ),
    (
        "counter-as-string",
        from_entry(set_result("counters", {"nr_tlb_remote_flush": "13"})),
        "result.counters.nr_tlb_remote_flush: expected a number, got a string",
    ),
    (
        "integer-as-float",
        from_entry(set_result("steps", 1003.5)),
        "result.steps: expected an integer, got a number 1003.5",
    ),
    (
        "rust-field-wrong",
        from_entry(set_result("uses_checked", "7")),
        'result.uses_checked: expected an integer, got a string "7"',
    ),
    ("violations-not-strings", from_entry(set_result("violations", [1])), "result.violations"),
    ("row-as-list", from_entry(set_result("row", [1])), "result.row: expected a number or a"),
    ("another-points-result", from_entry(set_result("index", 4)), "result.index: 4, but the"),
    (  # point 3 is row 1, variant "after", repetition 1
        "another-variant",
        from_entry(set_result("variant", "before")),
        'result.variant: "before", but the entry\'s point has "after"',
    ),
    (
        "key-mismatch",
        from_entry(lambda e: {**e, "key": "0" * 64}),
        "is not the file's key",
    ),
    (
        "provenance-edited",
        from_entry(lambda e: {**e, "provenance": {**e["provenance"], "quick": False}}),
        "provenance: not this point's",
    ),
    (
        "no-result",
        from_entry(lambda e: {"key": e["key"], "provenance": e["provenance"]}),
        "result: missing",
    ),
    (
        "an-array",
        lambda text: "[1, 2]",
        "expected a JSON object (key, provenance, result), got an array",
    ),
    ("empty-file", lambda text: "", "not JSON ("),
    ("binary", lambda text: "\udcff\udcfe\x00garbage", "not UTF-8 text"),
]


@pytest.mark.parametrize(
    "damage, reason", [c[1:] for c in INVALID_ENTRIES], ids=[c[0] for c in INVALID_ENTRIES]
)
def test_invalid_cache_entry_is_recomputed_with_a_warning(
    fake_native, seed000, tmp_path, caplog, damage, reason
) -> None:
    """An entry that is not a point result of its point is recomputed, with one warning line
    naming its file and why, and overwritten with the good result (issue: sweep cache)."""
    cache = tmp_path / "cache"
    first = sweep(seed000, {}, cache_dir=cache, quick=True)
    victim = entries_by_index(cache)[3]
    good = json.loads(victim.read_text())
    damaged = damage(victim.read_text())
    victim.write_bytes(damaged.encode("utf-8", "surrogateescape"))
    fake_native.calls.clear()
    caplog.clear()
    with caplog.at_level("WARNING", logger="shootdown.sweep"):
        again = sweep(seed000, {}, cache_dir=cache, quick=True)
    assert fake_native.indices_run() == [3]  # that point only
    assert again["cached"].tolist() == [i != 3 for i in range(8)]
    assert again["value"].tolist() == first["value"].tolist()
    warnings = [r.getMessage() for r in caplog.records if r.name == "shootdown.sweep"]
    assert len(warnings) == 1, warnings
    assert "\n" not in warnings[0]
    assert warnings[0].startswith(f"shootdown: warning: sweep cache entry {victim} is invalid (")
    assert reason in warnings[0] and warnings[0].endswith("): recomputing it")
    assert json.loads(victim.read_text()) == good  # overwritten with the good result
    # ... and served from the cache from now on, without a word.
    fake_native.calls.clear()
    caplog.clear()
    with caplog.at_level("WARNING", logger="shootdown.sweep"):
        assert sweep(seed000, {}, cache_dir=cache, quick=True)["cached"].all()
    assert fake_native.indices_run() == [] and not caplog.records


def test_cache_entry_with_nulls_and_extra_fields_is_used(fake_native, seed000, tmp_path, caplog):
    """What the native core may write is valid: a NaN written as null, an integral float
    row, fields the front end does not read (the Rust core's ``stop``, ``uses_checked``)."""
    cache = tmp_path / "cache"
    sweep(seed000, {}, cache_dir=cache, quick=True)
    victim = entries_by_index(cache)[3]
    entry = json.loads(victim.read_text())
    entry["result"].update(
        value=None, wall_s=None, row=float(entry["result"]["row"]), stop="done", uses_checked=7
    )
    entry["result"]["counters"]["unreported"] = None
    victim.write_text(json.dumps(entry))
    fake_native.calls.clear()
    with caplog.at_level("WARNING", logger="shootdown.sweep"):
        frame = sweep(seed000, {}, cache_dir=cache, quick=True)
    assert frame["cached"].all() and fake_native.indices_run() == [] and not caplog.records
    assert math.isnan(frame.loc[frame["index"] == 3, "value"].iloc[0])


def test_sweep_command_warns_in_one_line_on_an_invalid_entry(
    runner, fake_native, seed000, tmp_path
) -> None:
    """`shootdown sweep` over a damaged cache: one warning line on stderr naming the file (the
    logger's last-resort output: the CLI configures no logging), no traceback, exit 0."""
    from shootdown.cli import app

    cache = tmp_path / "cache"
    args = ["sweep", str(seed000), "--quick", "--cache", str(cache), "-f", "json"]
    assert runner.invoke(app, args).exit_code == 0
    entries = entries_by_index(cache)
    entries[0].write_text('{"key": "x", "result": {}}')
    entries[5].write_text(entries[5].read_text().replace('"value": ', '"value": "oops", "x": '))
    fake_native.calls.clear()
    root = logging.getLogger()
    saved = root.handlers[:]
    root.handlers.clear()  # as outside pytest: no handler, so Python's last resort (stderr)
    try:
        res = runner.invoke(app, args)
    finally:
        root.handlers[:] = saved
    assert res.exit_code == 0, res.stderr
    assert "Traceback" not in res.stderr
    lines = [ln for ln in res.stderr.splitlines() if "warning" in ln]
    assert lines == [
        f'shootdown: warning: sweep cache entry {entries[0]} is invalid (key: "x" is not the '
        "file's key (another point's entry?)): recomputing it",
        f"shootdown: warning: sweep cache entry {entries[5]} is invalid (result.value: expected "
        'a number or null, got a string "oops"): recomputing it',
    ]
    assert "6 of 8 points from the cache" in res.stderr
    assert sorted(fake_native.indices_run()) == [0, 5]


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
    state = {"init": 0, "tasks": 0, "up": False, "shutdown": 0}

    class Ref:
        def __init__(self, value):
            self.value = value

    class RemoteFunction:
        def __init__(self, fn, opts):
            self.fn, self.opts = fn, opts

        def remote(self, *args):
            state["tasks"] += 1
            return Ref(self.fn(*args))

    def init(**kw):
        state.update(init=state["init"] + 1, up=True, kwargs=kw)

    def shutdown():
        state.update(shutdown=state["shutdown"] + 1, up=False)

    ray.is_initialized = lambda: state["up"]
    ray.init = init
    ray.shutdown = shutdown
    ray.remote = lambda **opts: lambda fn: RemoteFunction(fn, opts)
    ray.wait = lambda refs, num_returns=1: (refs[:num_returns], refs[num_returns:])
    ray.get = lambda ref: ref.value
    ray.state = state
    return ray


def test_ray_backend_with_a_fake_ray(fake_native, seed000, tmp_path, monkeypatch) -> None:
    ray = fake_ray_module()
    monkeypatch.setitem(sys.modules, "ray", ray)
    local = sweep(seed000, GRID, cache_dir=tmp_path / "local", quick=True)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    out = sweep(seed000, GRID, backend="ray", cache_dir=tmp_path / "ray", quick=True, chunk_size=3)
    assert ray.state["init"] == 1 and ray.state["tasks"] == 4 * 3  # 8 points per combo, chunks of 3
    # A private local instance, stopped when done.
    assert ray.state["kwargs"] == {"address": "local"} and ray.state["shutdown"] == 1
    assert out["value"].tolist() == local["value"].tolist()
    fake_native.calls.clear()
    again = sweep(seed000, GRID, backend="ray", cache_dir=tmp_path / "ray", quick=True)
    assert again["cached"].all() and fake_native.indices_run() == []
    assert ray.state["init"] == 1  # nothing left to run: Ray was not started


def test_sweep_is_exported() -> None:
    assert shootdown.sweep is sweep and shootdown.summarize_sweep is summarize_sweep
    assert sweep_mod.sweep is sweep

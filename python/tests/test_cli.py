"""The ``shootdown`` command line, with the fake native module."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import shootdown
from shootdown.cli import app
from shootdown.records import RECORD_COLUMNS


def invoke(runner, *args: str):
    return runner.invoke(app, [str(a) for a in args])


def one_error_line(result) -> str:
    assert result.exit_code == 2, (result.exit_code, result.stdout, result.stderr)
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("shootdown: error: ")
    assert "Traceback" not in result.stderr and result.stdout == ""
    return lines[0]


def test_reproduce_json_is_exactly_one_array(runner, fake_native, data_home) -> None:
    result = invoke(runner, "reproduce", "--quick", "--format", "json")
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)  # the whole of stdout is one JSON document
    assert isinstance(data, list) and len(data) == 2 * 2 + 1 * 2
    assert all(list(r) == list(RECORD_COLUMNS) for r in data)
    assert {r["seed"] for r in data} == {"000", "002"}
    assert result.stdout.lstrip().startswith("[") and result.stdout.rstrip().endswith("]")
    assert "NaN" not in result.stdout


def test_reproduce_ids_and_table_default(runner, fake_native, data_home) -> None:
    result = invoke(runner, "reproduce", "000", "--quick")
    assert result.exit_code == 0  # even with a direction MISMATCH in the table
    assert result.stdout.startswith("seed 000 · ")
    assert "✗ MISMATCH" in result.stdout and "seed 002" not in result.stdout


def test_reproduce_csv_to_file(runner, fake_native, data_home, tmp_path) -> None:
    out = tmp_path / "r.csv"
    result = invoke(runner, "reproduce", "002", "--quick", "--format", "csv", "--out", out)
    assert result.exit_code == 0 and result.stdout == ""
    assert out.read_text().splitlines()[0] == ",".join(RECORD_COLUMNS)
    assert f"wrote {out}" in result.stderr


def test_unknown_option(runner, fake_native) -> None:
    line = one_error_line(invoke(runner, "reproduce", "--bogus"))
    assert "--bogus" in line


def test_bad_choice(runner, fake_native) -> None:
    line = one_error_line(invoke(runner, "reproduce", "--format", "xml"))
    assert "--format" in line


def test_missing_file(runner, fake_native, tmp_path) -> None:
    line = one_error_line(invoke(runner, "run", tmp_path / "missing.toml"))
    assert line == (
        f"shootdown: error: {tmp_path / 'missing.toml'}: experiment: no such file or shipped "
        "experiment (see `shootdown list experiments`)"
    )


def test_config_error_line(runner, fake_native, seed000) -> None:
    line = one_error_line(invoke(runner, "run", seed000, "--set", "nosuch.key=1"))
    assert line == f"shootdown: error: {seed000}: nosuch.key: unknown key"


def test_unknown_seed_id(runner, fake_native, data_home) -> None:
    line = one_error_line(invoke(runner, "reproduce", "123"))
    assert line.endswith(": 123: no seed experiment has this seed or name")


def test_run_formats_and_side_outputs(runner, fake_native, seed000, tmp_path) -> None:
    res = invoke(runner, "run", seed000, "--quick", "--set", "workload.fake_noise=0.0")
    assert res.exit_code == 0 and res.stdout.startswith("seed 000 · ")
    assert fake_native.calls[0][1][1] == ["workload.fake_noise=0.0"]

    res = invoke(runner, "run", seed000, "--quick", "--format", "json")
    assert len(json.loads(res.stdout)) == 4

    res = invoke(runner, "run", seed000, "--quick", "--format", "json", "--points")
    pts = json.loads(res.stdout)
    assert len(pts) == 8 and "c.nr_tlb_remote_flush" in pts[0] and pts[0]["violations"] == []

    trace = tmp_path / "t.json"
    res = invoke(runner, "run", seed000, "--quick", "--format", "csv", "--trace", trace)
    assert res.exit_code == 0 and trace.exists()
    assert res.stdout.splitlines()[0] == ",".join(RECORD_COLUMNS)


def test_run_plot(runner, fake_native, seed000, tmp_path) -> None:
    pytest.importorskip("matplotlib")
    png = tmp_path / "p.png"
    res = invoke(runner, "run", seed000, "--quick", "--plot", png)
    assert res.exit_code == 0 and png.read_bytes()[:4] == b"\x89PNG"


def test_run_warns_about_violations(runner, fake_native, seed000) -> None:
    res = invoke(
        runner, "run", seed000, "--quick", "--set", "variants.after.options.fake_violation=true"
    )
    assert res.exit_code == 0
    assert "warning: 4 invariant violation(s)" in res.stderr


def test_check_exit_codes_and_text(runner, fake_native, data_home) -> None:
    ok = invoke(runner, "check", "lazy-switch")
    assert ok.exit_code == 0 and ok.stdout.startswith("verdict: verified")

    bad = invoke(
        runner, "check", "lazy-switch", "--mutant", "no-tlb-gen-check", "--memory-model", "tso"
    )
    assert bad.exit_code == 1
    lines = bad.stdout.splitlines()
    assert lines[0] == "verdict: violation (INV-STALE)"
    assert lines[2].startswith("states: 42  transitions: 99  seconds:")
    assert lines[4] == "   1. cpu1  switch_mm_irqs_off: set bit in mm_cpumask(mm1)"
    assert lines[6] == "  10. cpu1  use stale translation of VA 0x1000"
    assert fake_native.calls[-1][1][2] == "tso"

    bound = invoke(runner, "check", "lazy-switch", "--max-states", "5")
    assert bound.exit_code == 3

    js = invoke(
        runner,
        "check",
        str(data_home / "scenarios" / "pv-flush.toml"),
        "--mutant",
        "m",
        "--format",
        "json",
    )
    assert js.exit_code == 1 and json.loads(js.stdout)["verdict"] == "violation"

    sampled = invoke(
        runner, "check", "pv-flush", "--sample", "100", "--seed", "7", "--strategy", "pct"
    )
    assert sampled.exit_code == 0 and fake_native.calls[-1][1][4:] == (100, 7, "pct", True)

    plain = invoke(runner, "check", "lazy-switch", "--no-symmetry")
    assert plain.exit_code == 0 and fake_native.calls[-1][1][7] is False


def test_check_errors(runner, fake_native, data_home) -> None:
    assert "no such scenario" in one_error_line(invoke(runner, "check", "nope"))
    assert "unknown mutant" in one_error_line(
        invoke(runner, "check", "pv-flush", "--mutant", "bogus")
    )
    assert "SCENARIO" in one_error_line(invoke(runner, "check"))
    one_error_line(invoke(runner, "check", "pv-flush", "--memory-model", "arm"))
    # Integers out of range: one line naming the option, never an OverflowError.
    for args, option in (
        (("--seed", "-1", "--sample", "3"), "seed: must be an integer between 0 and"),
        (("--max-states", str(2**64)), "max_states: must be an integer between 1 and"),
        (("--sample", str(2**70)), "sample: must be an integer between 1 and"),
        (("--max-states", "0"), "Invalid value for '--max-states'"),
    ):
        assert option in one_error_line(invoke(runner, "check", "pv-flush", *args)), args


def test_out_of_range_threads(runner, fake_native, seed000) -> None:
    line = one_error_line(invoke(runner, "run", seed000, "--quick", "--threads", "-3"))
    assert "Invalid value for '--threads'" in line, line
    line = one_error_line(invoke(runner, "run", seed000, "--quick", "--threads", str(2**64)))
    assert "threads: must be an integer between 1 and 65536" in line, line
    with pytest.raises(shootdown.ConfigError, match="seed: must be an integer"):
        shootdown.check("pv-flush", seed=2**64)


def test_check_list(runner, fake_native, data_home) -> None:
    text = invoke(runner, "check", "--list")
    assert text.exit_code == 0 and text.stdout.splitlines()[0].startswith("lazy-switch")
    js = invoke(runner, "check", "--list", "--format", "json")
    assert [s["scenario"] for s in json.loads(js.stdout)] == ["lazy-switch", "pv-flush"]


def test_bench_and_trace(runner, fake_native, seed000, tmp_path) -> None:
    res = invoke(runner, "bench", seed000)
    assert res.exit_code == 0 and res.stdout.splitlines()[0] == "steps/s: 246,912"
    res = invoke(runner, "bench", seed000, "--format", "json")
    assert json.loads(res.stdout)["steps"] == 123456

    out = tmp_path / "trace.json"
    res = invoke(runner, "trace", seed000, "--row", "8", "--variant", "after", "--out", out)
    assert res.exit_code == 0 and out.exists()
    assert fake_native.calls[-1][1][3:5] == (3, "after")
    assert "no row 5" in one_error_line(
        invoke(runner, "trace", seed000, "--row", "5", "--out", out)
    )
    assert "--out" in one_error_line(invoke(runner, "trace", seed000))
    traced = [c for c in fake_native.calls if c[0] == "trace"]
    assert traced[-1][1][6] == 2.0  # the default window
    assert traced[-1][1][7] is None  # starting before the first shootdown
    res = invoke(runner, "trace", seed000, "--from", "1.5", "--duration", "3", "--out", out)
    assert res.exit_code == 0, res.output
    traced = [c for c in fake_native.calls if c[0] == "trace"]
    assert traced[-1][1][6:] == (3.0, 1.5)
    bad_from = invoke(runner, "trace", seed000, "--from", "-1", "--out", out)
    assert "from_ms" in one_error_line(bad_from)
    res = invoke(runner, "trace", seed000, "--out", out, "--duration", "50")
    assert res.exit_code == 0 and fake_native.calls[-1][1][6] == 50.0
    line = one_error_line(invoke(runner, "trace", seed000, "--out", out, "--duration", "0"))
    assert "duration_ms: must be a number of ms in (0, 3600000] (got 0.0)" in line


def test_version_info_and_help(runner, fake_native, data_home) -> None:
    assert invoke(runner, "--version").stdout.startswith("shootdown ")
    info = invoke(runner, "info")
    assert info.exit_code == 0 and f"data: {data_home}" in info.stdout
    assert invoke(runner, "--help").exit_code == 0
    bare = invoke(runner)
    assert bare.exit_code == 0 and "reproduce" in bare.stdout


def test_native_missing_is_one_line(runner, monkeypatch, seed000) -> None:
    from shootdown import _bridge

    def boom():
        raise _bridge.NativeUnavailableError(
            "the Rust extension shootdown._native is not available"
        )

    monkeypatch.setattr("shootdown._bridge.native", boom)
    line = one_error_line(invoke(runner, "run", seed000))
    assert "shootdown._native" in line


def test_console_script_entry_point(fake_native, data_home, capsys) -> None:
    from shootdown.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["reproduce", "002", "--quick", "--format", "json"])
    assert exc.value.code == 0
    assert json.loads(capsys.readouterr().out)[0]["seed"] == "002"
    with pytest.raises(SystemExit) as exc:
        main(["run", str(Path("/nonexistent/x.toml"))])
    assert exc.value.code == 2
    assert capsys.readouterr().err.startswith(
        "shootdown: error: /nonexistent/x.toml: experiment: no such file"
    )


def test_progress_bar_only_on_a_tty_and_for_several_chunks(monkeypatch) -> None:
    import io

    from shootdown import cli

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr(cli.sys, "stderr", io.StringIO())
    with cli._progress(True, 2, "x") as bar:
        assert bar is None  # not a terminal
    monkeypatch.setattr(cli.sys, "stderr", Tty())
    with cli._progress(False, 2, "x") as bar:
        assert bar is None  # e.g. --format json
    with cli._progress(True, 2, "x") as bar:
        assert bar is not None
        bar(0, 4)  # a single chunk (2 × threads): no bar
        assert bar.progress is None
    with cli._progress(True, 2, "x") as bar:
        bar(0, 40)
        assert bar.progress is not None
        bar(4, 40)
        assert bar.progress.tasks[0].completed == 4


def test_outputs_fail_before_the_run(runner, fake_native, seed000, tmp_path, monkeypatch) -> None:
    missing = tmp_path / "no-such-dir" / "x.csv"
    line = one_error_line(invoke(runner, "run", seed000, "--quick", "--out", missing))
    assert "--out: directory" in line and "does not exist (create it first: mkdir -p" in line
    line = one_error_line(invoke(runner, "reproduce", "--quick", "--out", missing))
    assert "--out: directory" in line
    line = one_error_line(invoke(runner, "trace", seed000, "--out", missing))
    assert "--out: directory" in line
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name in ("pyarrow", "matplotlib") else real(name, *a),
    )
    line = one_error_line(
        invoke(runner, "run", seed000, "--quick", "--parquet", tmp_path / "p.parquet")
    )
    assert "--parquet: writing Parquet needs pyarrow: pip install 'shootdown[parquet]'" in line
    line = one_error_line(invoke(runner, "run", seed000, "--quick", "--plot", tmp_path / "p.png"))
    assert "--plot: plotting needs matplotlib: pip install 'shootdown[plot]'" in line
    # Nothing ran.
    assert not [c for c in fake_native.calls if c[0] in ("run_points", "trace")]


def test_commands_take_a_shipped_experiment_by_name(
    runner, fake_native, data_home, tmp_path, monkeypatch
) -> None:
    monkeypatch.chdir(tmp_path)  # any directory
    res = invoke(runner, "run", "000-sysbench", "--quick")
    assert res.exit_code == 0 and res.stdout.startswith("seed 000 · "), res.stderr
    shipped = str(data_home / "experiments" / "seeds" / "000-sysbench.toml")
    assert fake_native.calls[0][1][0] == shipped
    assert invoke(runner, "bench", "000-sysbench.toml").exit_code == 0
    res = invoke(runner, "trace", "seeds/000-sysbench", "--out", tmp_path / "t.json")
    assert res.exit_code == 0 and fake_native.calls[-1][1][0] == shipped
    line = one_error_line(invoke(runner, "profile", "000-sysbnch"))
    assert line == (
        "shootdown: error: 000-sysbnch: experiment: no such file or shipped experiment; "
        "did you mean 000-sysbench? (see `shootdown list experiments`)"
    )


def test_list(runner, data_home, tmp_path, monkeypatch) -> None:
    # No native module needed: the data files are read directly.
    from shootdown import _bridge

    def boom():
        raise _bridge.NativeUnavailableError("not built")

    monkeypatch.setattr("shootdown._bridge.native", boom)
    monkeypatch.chdir(tmp_path)
    (data_home / "scenarios" / "pv-flush.toml").write_text(
        'description = "PV flush"\n[[mutants]]\nname = "k1"\n'
    )
    res = invoke(runner, "list")
    assert res.exit_code == 0, res.stderr
    assert res.stdout.splitlines() == [
        "experiments (shootdown run NAME, sweep NAME, trace NAME, …):",
        "  000-sysbench  000  sysbench fileio rndwr (fake)",
        "  002-dontneed  002  MADV_DONTNEED + migrate (fake)",
        "",
        "profiles (experiment.profile = NAME):",
        "  test-profile  fake",
        "",
        "scenarios (shootdown check NAME):",
        "  lazy-switch  0 mutants",
        "  pv-flush     1 mutant   PV flush",
    ]
    res = invoke(runner, "list", "profiles")
    assert res.stdout == "test-profile  fake\n"
    res = invoke(runner, "list", "experiments", "--format", "json")
    data = json.loads(res.stdout)
    assert [(d["kind"], d["name"], d["seed"]) for d in data] == [
        ("experiment", "000-sysbench", "000"),
        ("experiment", "002-dontneed", "002"),
    ]
    every = json.loads(invoke(runner, "list", "-f", "json").stdout)
    assert {d["kind"] for d in every} == {"experiment", "profile", "scenario"}
    assert "--format" in one_error_line(invoke(runner, "list", "-f", "xml"))
    assert "nonsense" in one_error_line(invoke(runner, "list", "nonsense"))


def test_sweep_command(runner, fake_native, seed000, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    args = [
        "sweep",
        "000-sysbench",
        "--quick",
        "--grid",
        "workload.fake_noise=0.0,2.0",
        "-g",
        "variants.after.options.fake_factor=1.1,0.9",
        "--set",
        "experiment.quick_rows=[1]",
    ]
    res = invoke(runner, *args)
    assert res.exit_code == 0, res.stderr
    assert "0 of 16 points from the cache in .shootdown-cache" in res.stderr
    assert (tmp_path / ".shootdown-cache").is_dir()  # the default cache, in this directory
    lines = res.stdout.splitlines()
    assert lines[0] == (
        "seed 000 · sysbench fileio rndwr (fake) · events/10s · 4 combinations (2 × 2) · quick"
    )
    assert lines[2].split() == [
        "workload.fake_noise",
        "variants.after.options.fake_factor",
        "threads",
        "variant",
        "n",
        "avg",
        "(stdev)",
        "change",
    ]
    assert lines[4].split() == ["0.0", "1.1", "1", "tip-jun28", "2", "1000", "(0)"]
    assert lines[5].split() == ["0.0", "1.1", "1", "+patch-set", "2", "1100", "(0)", "+10.0%"]
    assert len(lines) == 4 + 4 * 2

    res = invoke(runner, *args, "--format", "json")
    assert "16 of 16 points from the cache" in res.stderr
    data = json.loads(res.stdout)
    assert len(data) == 8 and data[0]["workload.fake_noise"] == 0.0  # a number, not "0.0"
    assert data[1]["change_pct"] == pytest.approx(10.0)

    out = tmp_path / "s.csv"
    res = invoke(runner, *args, "--format", "csv", "--out", out, "--cache", tmp_path / "other")
    assert res.exit_code == 0 and "0 of 16 points from the cache" in res.stderr
    assert (
        out.read_text()
        .splitlines()[0]
        .startswith("combo,workload.fake_noise,variants.after.options.fake_factor,row,variant")
    )

    # Values are TOML split at top-level commas; the fake records what reached --set.
    fake_native.calls.clear()
    res = invoke(
        runner, "sweep", seed000, "--quick", "-g", "experiment.quick_rows=[1,8],[8]", "-f", "json"
    )
    assert res.exit_code == 0, res.stderr
    planned = [c[1][1] for c in fake_native.calls if c[0] == "plan"]
    assert planned == [["experiment.quick_rows=[1,8]"], ["experiment.quick_rows=[8]"]]
    assert {str(r["experiment.quick_rows"]) for r in json.loads(res.stdout)} == {"[1, 8]", "[8]"}


def test_sweep_title_names_a_modifying_set(runner, fake_native, seed000, tmp_path) -> None:
    res = invoke(
        runner,
        "sweep",
        seed000,
        "--quick",
        "--grid",
        "workload.fake_noise=0.0",
        "--set",
        "experiment.quick_rows=[1]",
        "--set",
        "variants.after.options.fake_factor=1.2",
        "--cache",
        tmp_path / "c",
    )
    assert res.exit_code == 0, res.stderr
    title = res.stdout.splitlines()[0]
    # Like run's: the labels describe the file's variants, so the change is named; the row
    # selection is not a change.
    assert title.endswith(
        "1 combination (1) · quick (modified: --set variants.after.options.fake_factor=1.2)"
    ), title


def test_sweep_errors_are_one_line(runner, fake_native, seed000, tmp_path) -> None:
    cache = ["--cache", str(tmp_path / "c")]
    for grid, reason in (
        ("workload.fake_noise", "--grid: expected KEY=V1,V2"),
        ("workload.fake_noise=", "--grid: workload.fake_noise: no values"),
        ("workload.fake_noise=1,,2", "--grid: workload.fake_noise: an empty value"),
        ("experiment.rows=[1,2", "--grid: experiment.rows: missing ']'"),
    ):
        line = one_error_line(invoke(runner, "sweep", seed000, "--grid", grid, *cache))
        assert line == f"shootdown: error: {grid}: {reason}" or reason in line, line
    line = one_error_line(invoke(runner, "sweep", seed000, "-g", "nosuch.key=1", *cache))
    assert line == f"shootdown: error: {seed000}: nosuch.key: unknown key"
    line = one_error_line(invoke(runner, "sweep", seed000, "--backend", "dask", *cache))
    assert "--backend" in line
    assert not fake_native.indices_run()


def test_progress_bars_also_for_json(runner, fake_native, seed000, tmp_path, monkeypatch) -> None:
    from contextlib import contextmanager

    from shootdown import cli

    monkeypatch.chdir(tmp_path)  # the sweep's default cache

    seen = []

    @contextmanager
    def recorder(enabled, threads, description):
        seen.append(enabled)
        yield None

    monkeypatch.setattr(cli, "_progress", recorder)
    for command in (["run", seed000], ["reproduce"], ["sweep", seed000]):
        res = invoke(runner, *command, "--quick", "--format", "json")
        assert res.exit_code == 0, res.stderr
        json.loads(res.stdout)
    assert seen == [True, True, True]


def test_progress_bar_counts_only_the_work_left() -> None:
    from shootdown import cli

    bar = cli._LazyBar(4, "sweep")
    bar(38, 40)  # a sweep with 38 points cached: 2 to run, one chunk
    assert bar.progress is None

"""Figures (``shootdown.plot`` and ``shootdown plot``), with the fake native module."""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

import pandas as pd
import pytest
from conftest import requires_native

import shootdown
from shootdown import _bridge, plot
from shootdown.cli import app
from shootdown.records import RECORD_COLUMNS

pytest.importorskip("matplotlib")


def invoke(runner, *args):
    return runner.invoke(app, [str(a) for a in args])


def one_error_line(result) -> str:
    assert result.exit_code == 2, (result.exit_code, result.stdout, result.stderr)
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("shootdown: error: "), result.stderr
    assert "Traceback" not in result.stderr
    return lines[0]


def ran(fake) -> bool:
    return any(fn == "run_points" for fn, _ in fake.calls)


@pytest.fixture
def records(fake_native, data_home) -> pd.DataFrame:
    """Quick records of the two fake seeds: 000 (2 rows, 2 reps, published stdevs) and 002
    (1 row, 1 rep, published values without stdevs)."""
    return shootdown.reproduce(quick=True)


def texts(fig) -> list:
    return [t.get_text() for t in fig.findobj(lambda a: hasattr(a, "get_text"))]


def caption(fig, start: str) -> str:
    """The caption that starts with ``start``, its line breaks made spaces."""
    return " ".join(next(t for t in texts(fig) if t.startswith(start)).split())


def legend(ax) -> list:
    """The legend entries of a panel: on the axes, or under it (narrow panels)."""
    found = ax.get_legend() or next(iter(ax.figure.legends), None)
    assert found is not None, "no legend"
    return [t.get_text() for t in found.get_texts()]


def error_bar_lengths(ax) -> list:
    """Half-lengths of the vertical error bars drawn on ``ax``, left to right."""
    from matplotlib.container import ErrorbarContainer

    out = []
    for c in ax.containers:
        if isinstance(c, ErrorbarContainer):
            for seg in c.lines[2][0].get_segments():
                out.append((seg[0][0], abs(seg[1][1] - seg[0][1]) / 2))
    return [h for _, h in sorted(out)]


# --------------------------------------------------------------------------- numbers


def test_change_se_pct() -> None:
    se = plot.change_se_pct(200.0, 4.0, 4, 6.0, 9)
    assert se == pytest.approx(math.sqrt(16 / 4 + 36 / 9) / 200 * 100)
    assert math.isnan(plot.change_se_pct(200.0, None, 3, 1.0, 3))  # n = 1: no stdev
    assert math.isnan(plot.change_se_pct(0.0, 1.0, 3, 1.0, 3))  # zero baseline
    assert math.isnan(plot.change_se_pct(float("nan"), 1.0, 3, 1.0, 3))
    assert math.isnan(plot.change_se_pct(200.0, 1.0, 0, 1.0, 3))


# --------------------------------------------------------------------------- the change figure


def test_change_figure_panels_bars_and_labels(records) -> None:
    fig = plot.change_figure(records)
    axes = [ax for ax in fig.get_axes() if ax.get_visible()]
    assert len(axes) == 2  # one panel per experiment
    titles = [t for t in texts(fig) if t.startswith("seed ")]
    assert titles[0].startswith("seed 000 · seed000-test\nsysbench fileio rndwr (fake)")
    assert titles[1].startswith("seed 002 · seed002-test")
    ax0, ax2 = axes
    assert ax0.get_ylabel() == "change vs tip-jun28 (%)\nhigher is better"
    assert ax2.get_ylabel() == "change vs unpatched (%)\nlower is better"
    assert ax0.get_xlabel() == "threads (count)"
    assert [t.get_text() for t in ax0.get_xticklabels()] == ["1", "8"]
    # A zero line, and a bar per (row, side): simulated and published.
    assert any(list(line.get_ydata()) == [0, 0] for line in ax0.get_lines())
    bars = [p for c in ax0.containers if hasattr(c, "patches") for p in c.patches]
    assert len(bars) == 4
    heights = sorted(round(b.get_height(), 6) for b in bars)
    recs = records[~records["baseline"] & (records["seed"] == "000")]
    expected = sorted(
        round(v, 6) for v in list(recs["change_pct"]) + list(recs["published_change_pct"])
    )
    assert heights == expected
    assert legend(ax0) == [
        "+patch-set: simulated, n = 2",
        "+patch-set: published, n not recorded",
    ]
    text = caption(fig, "Bars: change")
    assert "±1 standard error of the difference" in text
    assert "√(s_b²/n_b + s_v²/n_v) / |mean_b| × 100" in text
    assert "its error bars take n = 1" in text


def test_change_error_bars_are_standard_errors(records) -> None:
    fig = plot.change_figure(records, experiment="000")
    (ax,) = [ax for ax in fig.get_axes() if ax.get_visible()]
    recs = {(r["row"], r["variant"]): r for r in shootdown.records.to_dicts(records)}
    expected = []
    for row in (1, 8):
        b, v = recs[(row, "before")], recs[(row, "after")]
        sim = math.sqrt(b["stdev"] ** 2 / b["n"] + v["stdev"] ** 2 / v["n"])
        pub = math.hypot(b["published_stdev"], v["published_stdev"])  # n unknown: n = 1
        expected += [sim / b["simulated"] * 100, pub / b["published"] * 100]
    assert error_bar_lengths(ax) == pytest.approx(expected)


def test_published_n_when_the_records_have_it(records) -> None:
    with_n = records.copy()
    with_n["published_n"] = 5
    fig = plot.change_figure(with_n, experiment="000")
    (ax,) = [ax for ax in fig.get_axes() if ax.get_visible()]
    assert legend(ax)[1] == "+patch-set: published, n = 5"
    recs = {(r["row"], r["variant"]): r for r in shootdown.records.to_dicts(records)}
    b, v = recs[(1, "before")], recs[(1, "after")]
    pub = math.sqrt((b["published_stdev"] ** 2 + v["published_stdev"] ** 2) / 5)
    assert error_bar_lengths(ax)[1] == pytest.approx(pub / b["published"] * 100)
    text = caption(fig, "Bars: change")
    assert "n = 1, the widest" not in text


def test_missing_values_are_drawn_gracefully(records) -> None:
    # Seed 002: one repetition (no simulated stdev) and published values without stdev.
    fig = plot.change_figure(records, experiment="002")
    (ax,) = [ax for ax in fig.get_axes() if ax.get_visible()]
    assert error_bar_lengths(ax) == []
    assert legend(ax) == ["patched: simulated, n = 1", "patched: published, no stdev given"]
    # A published cell missing in one row: that row says n/p; NaN changes draw no bar.
    edited = records.copy()
    row8 = (edited["seed"] == "000") & (edited["row"] == 8)
    edited.loc[row8, ["published", "published_stdev", "published_change_pct"]] = math.nan
    edited.loc[(edited["seed"] == "000") & (edited["row"] == 1), "change_pct"] = math.nan
    fig = plot.change_figure(edited, experiment="000")
    (ax,) = [ax for ax in fig.get_axes() if ax.get_visible()]
    assert "n/p" in [t.get_text() for t in ax.texts]
    bars = [p for c in ax.containers if hasattr(c, "patches") for p in c.patches]
    assert len(bars) == 2  # row 1 published, row 8 simulated
    text = caption(fig, "Bars: change")
    assert "n/p: not published" in text
    # A variant never published, and an experiment with one variant only.
    unpublished = records.copy()
    unpublished[["published", "published_stdev", "published_change_pct"]] = math.nan
    fig = plot.change_figure(unpublished, experiment="000")
    (ax,) = [ax for ax in fig.get_axes() if ax.get_visible()]
    assert legend(ax) == ["+patch-set: simulated, n = 2 (not published)"]
    alone = records[records["baseline"]]
    fig = plot.change_figure(alone, experiment="000")
    assert "one variant only: no change to draw" in texts(fig)


def test_percent_axis_has_no_offset_and_a_real_minus(records) -> None:
    fig = plot.change_figure(records, experiment="002")
    fig.canvas.draw()
    (ax,) = [ax for ax in fig.get_axes() if ax.get_visible()]
    labels = [t.get_text() for t in ax.get_yticklabels() if t.get_text()]
    assert "0" in labels and any(t.startswith("\u2212") for t in labels), labels
    assert ax.yaxis.get_offset_text().get_text() == ""


# --------------------------------------------------------------------------- the values figure


def test_values_figure_has_plain_numbers(records) -> None:
    big = records.copy()
    for col in ("simulated", "stdev", "published", "published_stdev"):
        big[col] = big[col] * 1000  # millions, like sysbench's events
    fig = plot.values_figure(big, experiment="000")
    fig.canvas.draw()
    (ax,) = [ax for ax in fig.get_axes() if ax.get_visible()]
    assert ax.get_ylabel() == "events (events/10s)\nhigher is better"
    assert ax.yaxis.get_offset_text().get_text() == ""  # no "1e6"
    labels = [t.get_text() for t in ax.get_yticklabels() if t.get_text()]
    assert any("," in t for t in labels) and not any("e" in t for t in labels), labels
    assert legend(ax) == [
        "tip-jun28: simulated, n = 2",
        "tip-jun28: published",
        "+patch-set: simulated, n = 2",
        "+patch-set: published",
    ]
    text = caption(fig, "Filled markers")
    assert "±1 sample standard deviation" in text


def test_unknown_kind_and_nothing_to_plot(records, tmp_path) -> None:
    with pytest.raises(ValueError, match="kind must be one of change, values"):
        plot.figure(records, kind="pie")
    with pytest.raises(ValueError, match="no records of nope to plot"):
        plot.plot_records(records, tmp_path / "x.svg", experiment="nope")


# --------------------------------------------------------------------------- files


def png_dpi(path: Path) -> float:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    at = data.index(b"pHYs")
    x_per_m, _, unit = struct.unpack(">IIB", data[at + 4 : at + 13])
    assert unit == 1
    return x_per_m * 0.0254


def test_formats_by_suffix_and_reproducible_files(records, tmp_path) -> None:
    svg = plot.plot_records(records, tmp_path / "a.svg")
    assert svg.read_text().lstrip().startswith("<?xml") and "<dc:date>" not in svg.read_text()
    again = plot.plot_records(records, tmp_path / "b.svg")
    assert again.read_bytes() == svg.read_bytes()  # same records, same file
    pdf = plot.plot_records(records, tmp_path / "a.pdf", kind="values")
    assert pdf.read_bytes()[:5] == b"%PDF-" and b"CreationDate" not in pdf.read_bytes()
    assert b"/Type3" not in pdf.read_bytes()  # TrueType (Type 42) fonts, not Type 3
    png = plot.plot_records(records, tmp_path / "a.png")
    assert png_dpi(png) == pytest.approx(plot.PNG_DPI, abs=0.5)


def test_plot_experiment_keeps_working(records, tmp_path) -> None:
    out = plot.plot_experiment(records, tmp_path / "old.png")
    assert out.read_bytes()[:4] == b"\x89PNG"


def test_check_figure_path(tmp_path, monkeypatch) -> None:
    plot.check_figure_path(tmp_path / "ok.svg")
    with pytest.raises(shootdown.ConfigError, match=r"--out: directory .* does not exist"):
        plot.check_figure_path(tmp_path / "missing" / "x.svg")
    with pytest.raises(shootdown.ConfigError, match=r"must end in \.svg, \.pdf or \.png"):
        plot.check_figure_path(tmp_path / "x.txt")
    with pytest.raises(shootdown.ConfigError, match="must end in"):
        plot.check_figure_path(tmp_path / "no-suffix")


# --------------------------------------------------------------------------- records files


def test_load_records_round_trip(records, tmp_path) -> None:
    path = tmp_path / "r.json"
    path.write_text(shootdown.records.to_json(records))
    loaded = plot.load_records(path)
    assert list(loaded.columns) == list(RECORD_COLUMNS)
    assert loaded["change_pct"].equals(records["change_pct"])
    assert loaded["row"].tolist() == records["row"].tolist()
    a, b = tmp_path / "from-run.svg", tmp_path / "from-json.svg"
    plot.plot_records(records, a)
    plot.plot_records(loaded, b)
    assert a.read_bytes() == b.read_bytes()


@pytest.mark.parametrize(
    "content, message",
    [
        ("{not json", "not JSON"),
        ('{"a": 1}', "expected a JSON array of records"),
        ("[]", "no records"),
        ('[{"index": 0, "rep": 0, "value": 1.0}]', "per-run points (run --points)"),
        ('[{"experiment": "x", "row": 1}]', "not records: missing key(s) variant, baseline"),
    ],
)
def test_load_records_errors(tmp_path, content, message) -> None:
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(
        shootdown.ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")
    ):
        plot.load_records(path)
    with pytest.raises(shootdown.ConfigError, match="no such file"):
        plot.load_records(tmp_path / "missing.json")


# --------------------------------------------------------------------------- the command


def test_plot_command_runs_the_seeds(runner, fake_native, data_home, tmp_path) -> None:
    out = tmp_path / "all.svg"
    res = invoke(runner, "plot", "--quick", "--out", out)
    assert res.exit_code == 0, res.stderr
    assert res.stdout == "" and f"wrote {out}" in res.stderr
    assert out.read_text().lstrip().startswith("<?xml")
    # The same figure from the records `reproduce --format json` wrote: identical bytes.
    recs = tmp_path / "r.json"
    assert invoke(runner, "reproduce", "--quick", "--format", "json", "--out", recs).exit_code == 0
    fake_native.calls.clear()
    again = tmp_path / "again.svg"
    res = invoke(runner, "plot", "--from-json", recs, "--out", again)
    assert res.exit_code == 0, res.stderr
    assert not ran(fake_native)  # nothing re-run
    assert again.read_bytes() == out.read_bytes()


def test_plot_command_ids_files_and_kinds(runner, fake_native, data_home, seed000, tmp_path):
    png = tmp_path / "v.png"
    res = invoke(runner, "plot", "002", "--quick", "--kind", "values", "--out", png)
    assert res.exit_code == 0, res.stderr
    assert png_dpi(png) == pytest.approx(300, abs=0.5)
    runs = [args for fn, args in fake_native.calls if fn == "run_points"]
    assert runs and all(args[0].endswith("002-dontneed.toml") for args in runs)

    fake_native.calls.clear()
    pdf = tmp_path / "f.pdf"
    res = invoke(
        runner, "plot", seed000, "--quick", "--set", "workload.fake_noise=0.0", "--out", pdf
    )
    assert res.exit_code == 0, res.stderr
    runs = [args for fn, args in fake_native.calls if fn == "run_points"]
    assert runs and all(args[1] == ["workload.fake_noise=0.0"] for args in runs)
    assert pdf.read_bytes()[:5] == b"%PDF-"


def test_plot_command_from_json_selects_experiments(runner, fake_native, records, tmp_path):
    recs = tmp_path / "r.json"
    recs.write_text(shootdown.records.to_json(records))
    one = tmp_path / "one.svg"
    assert invoke(runner, "plot", "002", "--from-json", recs, "--out", one).exit_code == 0
    expected = tmp_path / "expected.svg"
    plot.plot_records(records, expected, experiment="002")
    assert one.read_bytes() == expected.read_bytes()
    line = one_error_line(invoke(runner, "plot", "007", "--from-json", recs, "--out", one))
    assert line.endswith(f"{recs}: 007: no records of this seed or experiment")
    line = one_error_line(invoke(runner, "plot", "--from-json", recs, "--quick", "--out", one))
    assert "--from-json draws records already computed" in line
    points = tmp_path / "points.json"
    points.write_text(json.dumps([{"index": 0, "rep": 0, "value": 1.0}]))
    line = one_error_line(invoke(runner, "plot", "--from-json", points, "--out", one))
    assert "per-run points (run --points)" in line
    line = one_error_line(invoke(runner, "plot", "--from-json", tmp_path / "no.json", "--out", one))
    assert line == f"shootdown: error: {tmp_path / 'no.json'}: no such file"


def test_plot_command_fails_before_running(
    runner, fake_native, data_home, tmp_path, monkeypatch
) -> None:
    line = one_error_line(invoke(runner, "plot", "--quick", "--out", tmp_path / "nope" / "f.svg"))
    assert "--out: directory" in line and "mkdir -p" in line
    line = one_error_line(invoke(runner, "plot", "--quick", "--out", tmp_path / "f.txt"))
    assert "--out: the file name must end in .svg, .pdf or .png" in line
    assert "--out" in one_error_line(invoke(runner, "plot", "--quick"))
    line = one_error_line(
        invoke(runner, "plot", "--quick", "--set", "a=1", "--out", tmp_path / "f.svg")
    )
    assert "--set applies to experiment files" in line
    line = one_error_line(
        invoke(runner, "plot", "--quick", "--kind", "pie", "--out", tmp_path / "f.svg")
    )
    assert "--kind" in line
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "matplotlib" else real(name, *a),
    )
    monkeypatch.setattr(plot, "_supported_suffixes", lambda: (_ for _ in ()).throw(ImportError()))
    line = one_error_line(invoke(runner, "plot", "--quick", "--out", tmp_path / "f.svg"))
    assert "--out: plotting needs matplotlib: pip install 'shootdown[plot]'" in line
    line = one_error_line(
        invoke(
            runner,
            "run",
            data_home / "experiments" / "seeds" / "000-sysbench.toml",
            "--quick",
            "--plot",
            tmp_path / "f.svg",
        )
    )
    assert "--plot: plotting needs matplotlib" in line
    assert not ran(fake_native)


def test_run_plot_draws_the_change_figure(runner, fake_native, seed000, tmp_path) -> None:
    svg = tmp_path / "run.svg"
    res = invoke(runner, "run", seed000, "--quick", "--plot", svg)
    assert res.exit_code == 0, res.stderr
    expected = tmp_path / "expected.svg"
    plot.plot_records(shootdown.to_records(shootdown.run(seed000, quick=True)), expected)
    assert svg.read_bytes() == expected.read_bytes()
    line = one_error_line(invoke(runner, "run", seed000, "--quick", "--plot", tmp_path / "p.txt"))
    assert "--plot: the file name must end in .svg, .pdf or .png" in line


@requires_native
def test_plot_a_real_seed(runner, tmp_path, monkeypatch) -> None:
    """The real extension and data: string rows, three variants, one not published."""
    monkeypatch.setattr(_bridge, "_override", None)
    monkeypatch.delenv("SHOOTDOWN_HOME", raising=False)
    png = tmp_path / "madv.png"
    res = invoke(runner, "plot", "seed002-madv-dontneed", "--quick", "--out", png)
    assert res.exit_code == 0, res.stderr
    assert png_dpi(png) == pytest.approx(300, abs=0.5)

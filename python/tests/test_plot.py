"""Figures (``shootdown.plot`` and ``shootdown plot``), with the fake native module."""

from __future__ import annotations

import json
import math
import random
import re
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


# --------------------------------------------------------------------------- the default kind


def by_variant(records: pd.DataFrame, seed: str = "000") -> pd.DataFrame:
    """``records`` with one seed's tables laid out a line per variant (as seed 004's)."""
    out = records.copy()
    out.loc[out["seed"] == seed, "layout"] = "variants_as_rows"
    return out


def with_variants(records: pd.DataFrame, others: int, seed: str = "002") -> pd.DataFrame:
    """``records`` with one seed's non-baseline variant copied into ``others`` variants
    (``v1``, ``v2`` …, each a little lower), drawn without running the model."""
    mine = records[records["seed"] == seed]
    base, other = mine[mine["baseline"]], mine[~mine["baseline"]].iloc[[0]]
    copies = []
    for k in range(1, others + 1):
        c = other.copy()
        c["variant"], c["label"] = f"v{k}", f"variant {k}"
        c["simulated"] = c["simulated"] * (1 - 0.05 * k)
        copies.append(c)
    rest = records[records["seed"] != seed]
    return pd.concat([rest, base, *copies], ignore_index=True)


def panel_kinds(fig) -> list:
    """ "change" or "values" for each panel, by its y label."""
    axes = [ax for ax in fig.get_axes() if ax.get_visible()]
    return ["change" if ax.get_ylabel().startswith("change vs") else "values" for ax in axes]


def test_auto_kind_per_experiment(records) -> None:
    """``auto`` (the default): values for a table of variants (variants_as_rows) or more than
    four variants besides the baseline, change otherwise."""
    assert plot.AUTO_MAX_CHANGE_VARIANTS == 4
    two_variants = {"seed000-test": "change", "seed002-test": "change"}
    assert plot.auto_kinds(records) == two_variants
    assert plot.auto_kinds(by_variant(records)) == {
        "seed000-test": "values",
        "seed002-test": "change",
    }
    assert plot.auto_kinds(by_variant(records), experiment="000") == {"seed000-test": "values"}
    assert plot.auto_kinds(with_variants(records, 4))["seed002-test"] == "change"
    assert plot.auto_kinds(with_variants(records, 5))["seed002-test"] == "values"
    # The figure follows, a panel each; an explicit kind still wins.
    assert panel_kinds(plot.figure(records, kind="auto")) == ["change", "change"]
    mixed = plot.figure(by_variant(records), kind="auto")
    assert panel_kinds(mixed) == ["values", "change"]
    text = caption(mixed, "Bars: change")  # the caption of each kind drawn
    assert "standard deviation. Filled markers: simulated mean" in text
    assert panel_kinds(plot.figure(by_variant(records), kind="change")) == ["change", "change"]
    assert panel_kinds(plot.figure(records, kind="values")) == ["values", "values"]
    many = plot.figure(with_variants(records, 6), kind="auto")
    assert panel_kinds(many) == ["change", "values"]


def test_auto_draws_as_the_kind_it_chooses(records, tmp_path) -> None:
    auto = plot.plot_records(records, tmp_path / "auto.svg", kind="auto")
    change = plot.plot_records(records, tmp_path / "change.svg")  # the library's default
    assert auto.read_bytes() == change.read_bytes()  # two variants each: the change figure
    table = by_variant(records)[lambda f: f["seed"] == "000"]
    auto = plot.plot_records(table, tmp_path / "auto-004.svg", kind="auto")
    values = plot.plot_records(table, tmp_path / "values-004.svg", kind="values")
    assert auto.read_bytes() == values.read_bytes()


def test_values_of_a_table_of_variants(records) -> None:
    """A table with a line per variant (seed 004): the variants on the x axis in the table's
    order, a colour per row with the row key as the legend's title, a log axis when the
    values span decades, a zero and an unpublished cell said at the axis' foot."""
    table = by_variant(records)
    fig = plot.values_figure(table, experiment="000")
    fig.canvas.draw()
    (ax,) = [ax for ax in fig.get_axes() if ax.get_visible()]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["tip-jun28", "+patch-set"]
    assert all(t.get_rotation() == 30 for t in ax.get_xticklabels())
    assert ax.get_xlabel() == "variant"
    found = ax.get_legend() or next(iter(ax.figure.legends))  # two variants: a narrow panel
    assert found.get_title().get_text() == "threads"
    assert [t.get_text() for t in found.get_texts()] == [
        "1: simulated, n = 2",
        "1: published",
        "8: simulated, n = 2",
        "8: published",
    ]
    # Values within a decade (the fake's published ones are a thousand times larger): linear.
    unpublished = table.copy()
    unpublished[["published", "published_stdev"]] = math.nan
    fig = plot.values_figure(unpublished, experiment="000")
    (ax,) = [ax for ax in fig.get_axes() if ax.get_visible()]
    assert ax.get_yscale() == "linear" and ax.get_ylim()[0] == 0.0
    assert legend(ax) == ["1: simulated, n = 2", "8: simulated, n = 2"]
    # One row: the x label names it, the legend has the two sides only.
    one_row = table[(table["seed"] == "000") & (table["row"] == 8)].copy()
    one_row.loc[one_row["variant"] == "after", "simulated"] /= 1000  # three decades
    one_row.loc[one_row["variant"] == "before", "simulated"] = 0.0
    one_row.loc[one_row["variant"] == "after", ["published", "published_stdev"]] = math.nan
    fig = plot.values_figure(one_row)
    (ax,) = [ax for ax in fig.get_axes() if ax.get_visible()]
    assert ax.get_xlabel() == "variant (threads = 8)"
    assert legend(ax) == ["simulated, n = 2", "published"]
    assert ax.get_yscale() == "log"
    assert ax.get_ylabel() == "events (events/10s)\nhigher is better, log scale"
    assert sorted(t.get_text() for t in ax.texts) == ["0", "n/p"]
    text = caption(fig, "Filled markers")
    assert "0 at the foot of a log axis: a value of zero" in text and "n/p: not published" in text


def test_values_of_many_variants_have_a_compact_legend(records) -> None:
    fig = plot.values_figure(with_variants(records, 6), experiment="002")
    (ax,) = [ax for ax in fig.get_axes() if ax.get_visible()]
    entries = legend(ax)
    assert entries[0] == "unpatched (n = 1)" and entries[-2:] == [
        "filled: simulated",
        "open: published",
    ]
    assert len(entries) == 7 + 2
    assert next(iter(fig.get_axes()[0].figure.legends))._ncols == 2  # under the narrow panel


def test_unknown_kind_and_nothing_to_plot(records, tmp_path) -> None:
    with pytest.raises(ValueError, match="kind must be one of change, values or auto"):
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
        ("", "not JSON"),
        ("[" * 100000, "not JSON"),
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


def good_record() -> dict:
    return {
        "experiment": "x",
        "row": 1,
        "variant": "a",
        "baseline": True,
        "n": 2,
        "simulated": 1.0,
        "stdev": 0.1,
    }


@pytest.mark.parametrize(
    "key, value, message",
    [
        ("simulated", "1.5", '[0].simulated: expected a number or null, got a string "1.5"'),
        ("stdev", [1], "[0].stdev: expected a number or null, got an array [1]"),
        ("n", "two", '[0].n: expected an integer or null, got a string "two"'),
        ("n", 2.5, "[0].n: expected an integer or null, got a number 2.5"),
        ("baseline", "yes", '[0].baseline: expected true or false or null, got a string "yes"'),
        ("row", {"a": 1}, '[0].row: expected a number, a string or null, got an object {"a": 1}'),
        ("published_n", True, "[0].published_n: expected a number or null, got a boolean true"),
        ("layout", 3, "[0].layout: expected a string or null, got a number 3"),
    ],
)
def test_load_records_checks_types(tmp_path, key, value, message) -> None:
    path = tmp_path / "edited.json"
    path.write_text(json.dumps([good_record(), {**good_record(), "variant": "b", key: value}]))
    with pytest.raises(shootdown.ConfigError) as err:
        plot.load_records(path)
    assert str(err.value) == f"{path}: {message.replace('[0]', '[1]')}"
    path.write_text(json.dumps([{**good_record(), key: value}]))
    with pytest.raises(shootdown.ConfigError, match=re.escape(message)):
        plot.load_records(path)


def test_load_records_of_a_binary_file(tmp_path) -> None:
    path = tmp_path / "random.json"
    path.write_bytes(bytes([0x9F, 0x00, 0xFF, 0xC3]) + random.Random(4).randbytes(256))
    with pytest.raises(shootdown.ConfigError, match="not JSON: not UTF-8 text .* a binary file"):
        plot.load_records(path)


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


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_plot_command_from_json_of_random_bytes(runner, tmp_path, seed) -> None:
    """Any file given to --from-json: one error line, exit 2, never a traceback."""
    path = tmp_path / "random.bin"
    path.write_bytes(random.Random(seed).randbytes(4096))
    line = one_error_line(invoke(runner, "plot", "--from-json", path, "--out", tmp_path / "f.png"))
    assert line.startswith(f"shootdown: error: {path}: not JSON")
    assert not (tmp_path / "f.png").exists()


def test_plot_command_from_json_of_edited_files(runner, records, tmp_path) -> None:
    edited = json.loads(shootdown.records.to_json(records))
    edited[2]["simulated"] = "fast"
    path = tmp_path / "edited.json"
    path.write_text(json.dumps(edited))
    line = one_error_line(invoke(runner, "plot", "--from-json", path, "--out", tmp_path / "f.png"))
    assert line == (
        f'shootdown: error: {path}: [2].simulated: expected a number or null, got a string "fast"'
    )
    validation = tmp_path / "validation.json"
    case = {"case": "c", "op": "munmap", "pages": 1, "siblings": "x", "mode": "busy"}
    case.update(real_us="slow", sim_us=1.0, fitted=True)
    validation.write_text(json.dumps({"kind": "validation", "cases": [case]}))
    line = one_error_line(
        invoke(runner, "plot", "--from-json", validation, "--out", tmp_path / "v.png")
    )
    assert (
        line
        == f"shootdown: error: {validation}: cases[0].siblings: expected an integer, got str 'x'"
    )


def test_plot_command_kind_auto(runner, fake_native, records, tmp_path) -> None:
    """--kind defaults to auto: seed 000 laid out a line per variant is drawn as values,
    seed 002 as changes; --kind change draws both as changes."""
    path = tmp_path / "r.json"
    path.write_text(shootdown.records.to_json(by_variant(records)))
    default, auto = tmp_path / "default.svg", tmp_path / "auto.svg"
    assert invoke(runner, "plot", "--from-json", path, "--out", default).exit_code == 0
    res = invoke(runner, "plot", "--from-json", path, "--kind", "auto", "--out", auto)
    assert res.exit_code == 0, res.stderr
    expected = plot.plot_records(plot.load_records(path), tmp_path / "expected.svg", kind="auto")
    assert default.read_bytes() == auto.read_bytes() == expected.read_bytes()
    change = tmp_path / "change.svg"
    res = invoke(runner, "plot", "--from-json", path, "--kind", "change", "--out", change)
    assert res.exit_code == 0, res.stderr
    expected = plot.plot_records(plot.load_records(path), tmp_path / "e2.svg", kind="change")
    assert change.read_bytes() == expected.read_bytes() != default.read_bytes()
    res = invoke(runner, "plot", "--help")
    assert "auto" in " ".join(res.stdout.split())


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

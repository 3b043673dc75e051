"""A pure-Python stand-in for ``shootdown._native`` implementing the JSON contract.

It reads experiment files with ``tomllib`` (only the keys the front end cares about), applies
``--set`` overrides, expands points and produces deterministic fake measurements:

    value = (1000 + 100 × row_position) × variant.options.fake_factor
            + workload.fake_noise × ((seed % 5) - 2)

so tests can make a variant go up (``fake_factor > 1``), down (``< 1``) or stay flat (``1``).
Every call is recorded in ``calls`` as ``(function, args)``.

Like the Rust core it finds the experiment's profile in ``$SHOOTDOWN_PROFILES``, then in
``profiles/`` beside the experiment and its ancestors, then in ``$SHOOTDOWN_SHIPPED_PROFILES``,
follows ``inherits``, and lists the files read in the plan's ``inputs`` and the overrides
applied in its ``sets`` (as given, in order). The profile's contents do not change the fake
measurements; ``experiment.rng_seed`` only shows in the plan, as in the Rust one.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

import shootdown

_TOP_KEYS = {
    "experiment",
    "topology",
    "workload",
    "quick",
    "variants",
    "published",
    "profile_override",
}


def _err(path: str, key: str, reason: str) -> Exception:
    # Like the native ConfigError: an empty key is left out.
    return shootdown.ConfigError(f"{path}: {key}: {reason}" if key else f"{path}: {reason}")


def _read(path: Path, inputs: List[Dict[str, str]]) -> str:
    """The text of a file the run reads, recorded in ``inputs`` as the Rust core does."""
    data = path.read_bytes()
    inputs.append({"path": str(path), "sha256": hashlib.sha256(data).hexdigest()})
    return data.decode("utf-8")


def _load(path: str, sets: List[str], inputs: List[Dict[str, str]]) -> Dict[str, Any]:
    try:
        data = tomllib.loads(_read(Path(path), inputs))
    except FileNotFoundError:
        raise _err(path, "", "no such file") from None
    except tomllib.TOMLDecodeError as exc:
        raise _err(path, "", f"invalid TOML: {exc}") from None
    for item in sets:
        if "=" not in item:
            raise _err(path, item, "expected KEY=VALUE")
        key, value = item.split("=", 1)
        parts = key.strip().split(".")
        if parts[0] not in _TOP_KEYS:
            raise _err(path, key, "unknown key")
        try:
            parsed = tomllib.loads(f"v = {value}")["v"]
        except tomllib.TOMLDecodeError:
            # Like the Rust core: a bare word is a string, a broken array/table/string is not.
            if value.lstrip().startswith(("[", "{", '"', "'")):
                raise _err(path, key, f"--set: invalid TOML value {value.strip()}") from None
            parsed = value.strip()
        node = data
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = parsed
        if parts[0] == "workload" and len(parts) == 2:  # an explicit --set wins over [quick]
            data.get("quick", {}).get("workload", {}).pop(parts[1], None)
    for key in data:
        if key not in _TOP_KEYS:
            raise _err(path, key, "unknown key")
    return data


def _profile_dirs(experiment: str) -> List[Path]:
    dirs = []
    if os.environ.get("SHOOTDOWN_PROFILES"):
        dirs.append(Path(os.environ["SHOOTDOWN_PROFILES"]))
    dirs.extend(p / "profiles" for p in Path(experiment).resolve().parents)
    if os.environ.get("SHOOTDOWN_SHIPPED_PROFILES"):
        dirs.append(Path(os.environ["SHOOTDOWN_SHIPPED_PROFILES"]))
    return dirs


def _load_profile(experiment: str, data: Dict[str, Any], inputs: List[Dict[str, str]]) -> str:
    """Read the experiment's profile and its ``inherits`` chain; return the name the plan
    shows (with the ``profile_override`` keys, as the Rust core does)."""
    name = data["experiment"].get("profile", "test-profile")
    dirs = _profile_dirs(experiment)
    current: Optional[str] = name
    seen: List[str] = []
    while current is not None:
        if current in seen:
            raise _err(experiment, "profile.inherits", f"cycle through '{current}'")
        seen.append(current)
        found = next(
            (d / f"{current}.toml" for d in dirs if (d / f"{current}.toml").is_file()), None
        )
        if found is None:
            raise _err(experiment, "experiment.profile", f"no profile '{current}'")
        profile = tomllib.loads(_read(found, inputs)).get("profile", {})
        current = profile.get("inherits")
    override = data.get("profile_override") or {}
    keys = [f"{k}.{n}" for k, table in override.items() for n in table]
    return f"{name} + override({', '.join(keys)})" if keys else name


def _seed(name: str, index: int) -> int:
    h = 1469598103934665603
    for ch in f"{name}:{index}":
        h = ((h ^ ord(ch)) * 1099511628211) % (1 << 63)
    return h


class FakeNative:
    """Implements plan/run_points/trace/check/check_list/bench like the Rust module."""

    def __init__(self) -> None:
        self.calls: List[Tuple[str, tuple]] = []

    @property
    def ConfigError(self) -> type:  # noqa: N802 - mirrors the module attribute
        return shootdown.ConfigError

    # -- helpers
    def _expand(
        self, path: str, sets: List[str], quick: bool
    ) -> Tuple[Dict[str, Any], Dict[str, Any]]:
        inputs: List[Dict[str, str]] = []
        data = _load(path, sets, inputs)
        profile = _load_profile(path, data, inputs)
        exp = data["experiment"]
        if quick:
            for k, v in data.get("quick", {}).get("workload", {}).items():
                data.setdefault("workload", {})[k] = v
        rows = exp.get("quick_rows", exp["rows"]) if quick else exp["rows"]
        reps = exp.get("quick_repetitions", exp["repetitions"]) if quick else exp["repetitions"]
        variants = [{"name": n, "label": v.get("label", n)} for n, v in data["variants"].items()]
        points = []
        for row in rows:
            for v in variants:
                for rep in range(reps):
                    index = len(points)
                    points.append(
                        {
                            "index": index,
                            "row": row,
                            "variant": v["name"],
                            "rep": rep,
                            "seed": _seed(exp["name"], index),
                        }
                    )
        known = {(json.dumps(r), v["name"]) for r in rows for v in variants}
        published = [
            {
                "row": c["row"],
                "variant": c["variant"],
                "value": float(c["value"]),
                "stdev": c.get("stdev"),
            }
            for c in data.get("published", [])
            if (json.dumps(c["row"]), c["variant"]) in known
        ]
        plan = {
            "experiment": {
                "name": exp["name"],
                "seed": exp.get("seed"),
                "title": exp.get("title", ""),
                "profile": profile,
                "metric": exp.get("metric", "events"),
                "unit": exp.get("unit", "events"),
                "row_key": exp.get("row_key", "threads"),
                "higher_is_better": exp.get("higher_is_better", True),
                "repetitions": reps,
                "path": path,
                "rng_seed": exp.get("rng_seed", 1),
            },
            "variants": variants,
            "rows": rows,
            "published": published,
            "points": points,
            "inputs": inputs,
            "sets": list(sets),
        }
        return plan, data

    # -- the contract
    def plan(self, path: str, sets: List[str], quick: bool) -> str:
        self.calls.append(("plan", (path, list(sets), quick)))
        return json.dumps(self._expand(path, sets, quick)[0])

    def run_points(
        self, path: str, sets: List[str], quick: bool, indices: List[int], threads: int
    ) -> str:
        self.calls.append(("run_points", (path, list(sets), quick, list(indices), threads)))
        plan, data = self._expand(path, sets, quick)
        by_index = {p["index"]: p for p in plan["points"]}
        rows = plan["rows"]
        noise = float(data.get("workload", {}).get("fake_noise", 1.0))
        out = []
        for i in indices:
            if i not in by_index:
                raise _err(path, "index", f"no point {i}")
            p = by_index[i]
            options = data["variants"][p["variant"]].get("options", {})
            factor = float(options.get("fake_factor", 1.0))
            base = 1000.0 + 100.0 * rows.index(p["row"])
            value = base * factor + noise * ((p["seed"] % 5) - 2)
            violations = ["INV-STALE: fake violation"] if options.get("fake_violation") else []
            out.append(
                {
                    "index": i,
                    "row": p["row"],
                    "variant": p["variant"],
                    "rep": p["rep"],
                    "value": value,
                    "sim_ns": 1.0e7,
                    "steps": 1000 + i,
                    "wall_s": 0.001,
                    "counters": {"nr_tlb_remote_flush": 10 + i, "tlb_shootdown_ipis": 2 * i},
                    "violations": violations,
                }
            )
        return json.dumps(out)

    def trace(
        self,
        path: str,
        sets: List[str],
        quick: bool,
        row_index: int,
        variant: str,
        out_path: str,
        max_ms: float = 2.0,
        from_ms: Optional[float] = None,
    ) -> None:
        self.calls.append(
            ("trace", (path, list(sets), quick, row_index, variant, out_path, max_ms, from_ms))
        )
        self._expand(path, sets, quick)
        Path(out_path).write_text(
            json.dumps({"traceEvents": [{"name": variant, "ph": "i", "ts": row_index}]})
        )

    def check(
        self,
        scenario: str,
        mutant: Optional[str],
        memory_model: str,
        max_states: Optional[int],
        sample: Optional[int],
        seed: int,
        strategy: str,
        symmetry: bool = True,
        sets: Optional[List[str]] = None,
    ) -> str:
        self.calls.append(
            (
                "check",
                (scenario, mutant, memory_model, max_states, sample, seed, strategy, symmetry),
            )
        )
        if not Path(scenario).exists():
            raise _err(scenario, "", "no such file")
        if mutant == "bogus":
            raise _err(scenario, "mutant", "unknown mutant bogus")
        name = Path(scenario).stem
        if mutant:
            verdict, inv = "violation", "INV-STALE"
            steps = [
                {
                    "step": 1,
                    "actor": "cpu1",
                    "text": "switch_mm_irqs_off: set bit in mm_cpumask(mm1)",
                },
                {"step": 2, "actor": "cpu0", "text": "flush_tlb_mm_range: read mm_cpumask(mm1)"},
                {"step": 10, "actor": "cpu1", "text": "use stale translation of VA 0x1000"},
            ]
        elif max_states is not None and max_states < 10:
            verdict, inv, steps = "bound-reached", None, []
        else:
            verdict, inv, steps = "verified", None, []
        return json.dumps(
            {
                "scenario": name,
                "mutant": mutant,
                "memory_model": memory_model,
                "verdict": verdict,
                "invariant": inv,
                "states": 42,
                "transitions": 99,
                "seconds": 0.01,
                "max_states": 5_000_000 if max_states is None else max_states,
                "counterexample": steps,
            }
        )

    def check_list(self, scenarios_dir: str) -> str:
        self.calls.append(("check_list", (scenarios_dir,)))
        out = []
        for f in sorted(Path(scenarios_dir).glob("*.toml")):
            out.append(
                {
                    "scenario": f.stem,
                    "description": f"scenario {f.stem}",
                    "mutants": [
                        {
                            "name": "no-tlb-gen-check",
                            "bug": "N3",
                            "description": "skip the tlb_gen check",
                        }
                    ],
                }
            )
        return json.dumps(out)

    def bench(self, path: str, sets: List[str], quick: bool) -> str:
        self.calls.append(("bench", (path, list(sets), quick)))
        self._expand(path, sets, quick)
        return json.dumps(
            {
                "steps": 123456,
                "wall_s": 0.5,
                "sim_ns": 1.0e7,
                "steps_per_s": 246912.0,
                "sim_s_per_wall_s": 0.02,
            }
        )

    # -- test helpers
    def indices_run(self) -> List[int]:
        """All point indices passed to run_points so far."""
        return [i for fn, args in self.calls if fn == "run_points" for i in args[3]]

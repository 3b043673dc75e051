"""Where a result comes from: the provenance columns of every records and points frame.

Every output of a run (records, points frames, sweep frames; as DataFrames, JSON, CSV or
Parquet) says what produced it, so a number can be traced back and re-run:

* ``experiment_path``: the experiment file the run read (as the plan gives it);
* ``profile``: the machine profile's name as the plan shows it (``NAME + override(KEYS)`` when
  a ``[profile_override]`` applies);
* ``sets``: the ``--set KEY=VALUE`` overrides applied, in order, joined with ``"; "`` (``""``
  for none) — one flat string, so CSV and Parquet keep it;
* ``quick``: whether the quick configuration ran (``None`` when the plan does not say);
* ``repetitions``: the repetitions per (row, variant) the plan asked for;
* ``rng_seed``: the experiment's base RNG seed as the plan gives it (every run's seed is
  mixed from it, the row's value and the repetition);
* ``version``: the package version and a digest of the built model (:func:`model_version`);
* ``inputs_sha256``: a short digest of the bytes of every file the run read
  (:func:`inputs_digest`);
* ``modified``: whether the ``--set`` overrides changed the configuration being compared
  (:func:`modifying_sets`); a modified run is a study, not a reproduction of the published
  numbers, and its direction verdicts are not judged.
"""

from __future__ import annotations

import functools
import hashlib
import os
from pathlib import Path
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence

from ._bridge import native
from ._version import __version__

__all__ = [
    "PROVENANCE_COLUMNS",
    "SELECTION_KEYS",
    "LABEL_KEYS",
    "SETS_SEPARATOR",
    "model_version",
    "inputs_digest",
    "experiment_path",
    "base_rng_seed",
    "set_key",
    "join_sets",
    "split_sets",
    "modifying_sets",
    "is_modified",
    "plan_provenance",
]

#: The provenance columns, in order, as :func:`plan_provenance` returns them.
PROVENANCE_COLUMNS = (
    "experiment_path",
    "profile",
    "sets",
    "quick",
    "repetitions",
    "rng_seed",
    "version",
    "inputs_sha256",
    "modified",
)

#: ``--set`` keys that only choose which rows, how many repetitions and which random numbers
#: run: the configuration stays the one the published numbers were measured on.
SELECTION_KEYS = frozenset(
    {
        "experiment.rows",
        "experiment.quick_rows",
        "experiment.repetitions",
        "experiment.quick_repetitions",
        "experiment.rng_seed",
    }
)

#: ``--set`` keys that only rename what is shown: they change no number.
LABEL_KEYS = frozenset(
    {
        "experiment.name",
        "experiment.seed",
        "experiment.title",
        "experiment.metric",
        "experiment.unit",
        "experiment.higher_is_better",
    }
)

#: How the ``sets`` column joins the overrides.
SETS_SEPARATOR = "; "

_DIGEST_CHARS = 16


# --------------------------------------------------------------------------- the model


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _file_sha256(path: str) -> str:
    try:
        st = os.stat(path)
    except OSError:
        return "unreadable"
    return _file_sha256_at(path, st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=8)
def _file_sha256_at(path: str, mtime_ns: int, size: int) -> str:
    """SHA-256 of a file, memoized per (path, mtime, size): hashed once per build."""
    try:
        return _sha256(Path(path).read_bytes())
    except OSError:
        return "unreadable"


def model_version() -> str:
    """The model's identity: ``<package version>+native.<sha16>``, the first 16 hex digits
    of the SHA-256 of the built extension file, so that a rebuild with changed model code is
    another version (``+native.<native version>.<sha16>`` when the extension reports a version
    other than the package's; the bare package version when the extension does not load)."""
    try:
        module = native()
    except ImportError:
        return __version__
    native_version = getattr(module, "__version__", None)
    path = getattr(module, "__file__", None)
    build = _file_sha256(str(path))[:_DIGEST_CHARS] if path else None
    parts = [str(native_version)] if native_version not in (None, __version__) else []
    if build is not None:
        parts.append(build)
    return f"{__version__}+native.{'.'.join(parts)}" if parts else __version__


# --------------------------------------------------------------------------- inputs


def _inputs(plan: Mapping[str, Any]) -> Optional[List[Mapping[str, Any]]]:
    inputs = plan.get("inputs")
    return list(inputs) if isinstance(inputs, list) else None


def inputs_digest(plan: Mapping[str, Any]) -> Optional[str]:
    """The first 16 hex digits of the SHA-256 of the plan's input digests (``inputs[*].sha256``,
    in order: the experiment file, then each profile file of its ``inherits`` chain, one per
    line). It depends on the bytes read, not on where the files are; ``None`` when the plan
    does not list its inputs."""
    inputs = _inputs(plan)
    if inputs is None:
        return None
    text = "\n".join(str(i["sha256"]) for i in inputs)
    return _sha256(text.encode())[:_DIGEST_CHARS]


def experiment_path(plan: Mapping[str, Any]) -> Optional[str]:
    """The experiment file of a plan (``experiment.path``, else the first input)."""
    path = plan.get("experiment", {}).get("path")
    if path:
        return str(path)
    inputs = _inputs(plan)
    return str(inputs[0]["path"]) if inputs else None


def base_rng_seed(plan: Mapping[str, Any]) -> Optional[int]:
    """The experiment's base RNG seed, as the plan gives it (``experiment.rng_seed``, after
    any ``--set``); ``None`` for a hand-made plan that does not say."""
    seed = plan.get("experiment", {}).get("rng_seed")
    if isinstance(seed, bool) or not isinstance(seed, int):
        return None
    return seed


# --------------------------------------------------------------------------- overrides


def set_key(item: str) -> str:
    """The dotted key of a ``KEY=VALUE`` override, normalized (``variants."a".x`` →
    ``variants.a.x``)."""
    key = str(item).split("=", 1)[0]
    return ".".join(seg.strip().strip("\"'") for seg in key.split("."))


def join_sets(sets: Iterable[str]) -> str:
    """The ``sets`` column: the overrides joined with :data:`SETS_SEPARATOR`."""
    return SETS_SEPARATOR.join(str(s) for s in sets)


def _unclosed(text: str) -> bool:
    """True when ``text`` ends inside a TOML string or an array/inline table."""
    depth, quote, i = 0, None, 0
    while i < len(text):
        ch = text[i]
        if quote is not None:
            if ch == "\\" and quote == '"':
                i += 1
            elif ch == quote:
                quote = None
        elif ch in "\"'":
            quote = ch
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        i += 1
    return quote is not None or depth > 0


def split_sets(text: Optional[str]) -> List[str]:
    """The overrides of a ``sets`` column (the inverse of :func:`join_sets`): a separator
    inside a quoted string or brackets, or before a piece without ``=``, belongs to the
    value."""
    if not text:
        return []
    out: List[str] = []
    for piece in str(text).split(SETS_SEPARATOR):
        if out and ("=" not in piece or _unclosed(out[-1])):
            out[-1] += SETS_SEPARATOR + piece
        else:
            out.append(piece)
    return out


def modifying_sets(sets: Sequence[str]) -> List[str]:
    """The overrides that change the configuration being compared: every key but the
    selection keys (:data:`SELECTION_KEYS`: rows, repetitions, RNG seed) and the labels
    (:data:`LABEL_KEYS`). So any key under ``variants``, ``workload``, ``quick``, ``topology``,
    ``host``, ``profile_override`` or ``published``, and ``experiment.profile`` or
    ``experiment.row_key``, modifies it."""
    return [s for s in sets if set_key(s) not in SELECTION_KEYS | LABEL_KEYS]


def is_modified(sets: Sequence[str]) -> bool:
    """True when :func:`modifying_sets` finds any override."""
    return bool(modifying_sets(sets))


def plan_provenance(plan: Mapping[str, Any]) -> Dict[str, Any]:
    """The provenance columns (:data:`PROVENANCE_COLUMNS`) of a plan's results.

    ``sets`` and ``quick`` are the ones :func:`shootdown.plan` records in the plan (``""`` and
    ``None`` when a hand-made plan lacks them).
    """
    exp = plan.get("experiment", {})
    sets = [str(s) for s in plan.get("sets") or []]
    quick = plan.get("quick")
    reps = exp.get("repetitions")
    return {
        "experiment_path": experiment_path(plan),
        "profile": exp.get("profile", ""),
        "sets": join_sets(sets),
        "quick": None if quick is None else bool(quick),
        "repetitions": None if reps is None else int(reps),
        "rng_seed": base_rng_seed(plan),
        "version": model_version(),
        "inputs_sha256": inputs_digest(plan),
        "modified": is_modified(sets),
    }

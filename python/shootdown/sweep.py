"""Parameter sweeps with a resumable on-disk cache, run locally or on a Ray cluster.

:func:`sweep` expands a grid of ``--set`` values into combinations, plans each combination and
runs its points. Every finished point is stored at once as one JSON file under ``cache_dir``,
named by the SHA-256 of its provenance key:

* the experiment file's bytes (as a SHA-256),
* the SHA-256 of every file the run reads, as the native plan lists them in ``inputs`` (the
  experiment file and each profile file of its ``inherits`` chain, in order) — so the key
  follows whichever profile files the Rust core actually found, wherever they are;
* the profile's name as the plan shows it (with any ``profile_override`` keys),
* the ``--set`` overrides (in order, the grid's included) and the ``quick`` flag,
* the point's index in the plan,
* the model's version (:func:`shootdown.provenance.model_version`: the package version and a
  digest of the built extension file, so a rebuild with changed model code starts a fresh
  cache).

A run is a pure function of that key, so re-running a sweep — after an interruption, or with
a larger grid — loads finished points from the cache and computes only the missing ones. A
native module whose plan has no ``inputs`` cannot say which files a run reads: its points are
then always computed and never cached.

Every entry read is checked against :data:`ENTRY_SCHEMA` before it is used: an object whose
``key`` is its file's key, whose ``provenance`` is the point's, and whose ``result`` is a point
result (every field of :class:`shootdown.schema.PointResult`, with its JSON type) of that very
point (index, row, variant, repetition). An entry that fails — not UTF-8 or not JSON (a
truncated file), another shape, a field of the wrong type (a number edited into a string) — is
recomputed and overwritten, with one warning line naming the file and the reason, logged to
the ``shootdown.sweep`` logger (on stderr when logging is not configured, as in the CLI).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import math
import os
import re
import secrets
import sys
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

import pandas as pd

from . import api
from ._bridge import ConfigError, native
from .provenance import model_version, plan_provenance
from .records import constant_column, points_frame, row_key, summarize
from .schema import Plan, PlannedPoint, PointResult

__all__ = [
    "Raw",
    "toml_literal",
    "split_values",
    "parse_grid",
    "expand_grid",
    "point_key",
    "ENTRY_SCHEMA",
    "ENTRY_OPTIONAL",
    "sweep",
    "summarize_sweep",
    "RayClusterError",
]

_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")

_log = logging.getLogger(__name__)


class Raw(str):
    """A grid value given as literal TOML text (``Raw("{ a = 1 }")``), passed through as is."""


def toml_literal(value: Any) -> str:
    """The TOML spelling of a Python value for ``--set KEY=VALUE``.

    ``bool``, ``int``, ``float``, ``str`` (quoted), lists/tuples (arrays), dicts (inline
    tables) and :class:`Raw` (verbatim).
    """
    if isinstance(value, Raw):
        return str(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_literal(v) for v in value) + "]"
    if isinstance(value, Mapping):
        items = []
        for k, v in value.items():
            key = k if _BARE_KEY.match(str(k)) else json.dumps(str(k))
            items.append(f"{key} = {toml_literal(v)}")
        return "{ " + ", ".join(items) + " }" if items else "{}"
    if hasattr(value, "item"):  # numpy scalar
        return toml_literal(value.item())
    raise TypeError(f"cannot write {value!r} as a TOML value")


def split_values(text: str) -> List[str]:
    """Split ``V1,V2,…`` at its top-level commas: a comma inside ``[]``, ``{}`` or a quoted
    string does not split (``[8,16],[32]`` is two values). Values are stripped.

    Raises:
        ValueError: unbalanced brackets or an unterminated string.
    """
    parts: List[str] = []
    current: List[str] = []
    closers: List[str] = []
    quote: Optional[str] = None
    i = 0
    while i < len(text):
        ch = text[i]
        current.append(ch)
        if quote is not None:
            if ch == "\\" and quote == '"' and i + 1 < len(text):
                current.append(text[i + 1])
                i += 1
            elif ch == quote:
                quote = None
        elif ch in "\"'":
            quote = ch
        elif ch in "[{":
            closers.append("]" if ch == "[" else "}")
        elif ch in "]}":
            if not closers or closers.pop() != ch:
                raise ValueError(f"unbalanced '{ch}'")
        elif ch == "," and not closers:
            current.pop()
            parts.append("".join(current).strip())
            current = []
        i += 1
    if quote is not None:
        raise ValueError(f"unterminated {quote}-quoted string")
    if closers:
        raise ValueError(f"missing '{closers[-1]}'")
    parts.append("".join(current).strip())
    return parts


def parse_grid(specs: Sequence[str]) -> Dict[str, List[Raw]]:
    """A grid from ``--grid KEY=V1,V2,…`` options: each value is TOML text (a bare word is a
    string, as for ``--set``), split by :func:`split_values` and kept as :class:`Raw`.

    Raises:
        ConfigError: a spec without ``=``, an empty key or value, unbalanced brackets or
            quotes, or a key given twice (one line, ``SPEC: --grid: REASON``).
    """
    grid: Dict[str, List[Raw]] = {}
    for spec in specs:
        if "=" not in spec:
            raise ConfigError(f"{spec}: --grid: expected KEY=V1,V2,... (no '=')")
        key, text = (part.strip() for part in spec.split("=", 1))
        if not key or any(not seg.strip() for seg in key.split(".")):
            raise ConfigError(f"{spec}: --grid: empty key or key segment")
        if key in grid:
            raise ConfigError(f"{spec}: --grid: {key} given twice (list all its values in one)")
        try:
            values = split_values(text)
        except ValueError as exc:
            raise ConfigError(f"{spec}: --grid: {key}: {exc}") from None
        if any(not v for v in values):
            where = "no values" if values == [""] else "an empty value (two commas in a row?)"
            raise ConfigError(f"{spec}: --grid: {key}: {where}")
        grid[key] = [Raw(v) for v in values]
    return grid


def expand_grid(grid: Mapping[str, Sequence[Any]]) -> List[Dict[str, Any]]:
    """All combinations of a grid ``{key: [values...]}`` (last key varies fastest)."""
    keys = list(grid)
    for k in keys:
        if isinstance(grid[k], (str, bytes)) or not hasattr(grid[k], "__iter__"):
            raise TypeError(f"grid[{k!r}] must be a list of values")
    return [dict(zip(keys, combo)) for combo in itertools.product(*(list(grid[k]) for k in keys))]


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _input_digests(the_plan: Plan) -> Optional[List[str]]:
    """SHA-256 of every file the plan's runs read (``plan["inputs"]``, in order), or ``None``
    when the native plan does not list them."""
    inputs = the_plan.get("inputs")
    if not isinstance(inputs, list):
        return None
    return [str(i["sha256"]) for i in inputs]


def point_key(provenance: Mapping[str, Any]) -> str:
    """The cache key of one point: SHA-256 of its canonical provenance JSON."""
    return _sha256(json.dumps(provenance, sort_keys=True, separators=(",", ":")).encode())


@dataclass
class _Combo:
    number: int
    values: Dict[str, Any]
    sets: List[str]
    plan: Plan
    keys: Dict[int, str] = field(default_factory=dict)
    provenance: Dict[int, Dict[str, Any]] = field(default_factory=dict)
    results: Dict[int, PointResult] = field(default_factory=dict)
    cached: Dict[int, bool] = field(default_factory=dict)

    def missing(self) -> List[int]:
        return [p["index"] for p in self.plan["points"] if p["index"] not in self.results]


# --------------------------------------------------------------------------- cache entries

# JSON types, by the names a reason gives them.
_INT = "an integer"
_NUMBER_OR_NULL = "a number or null"
_STRING = "a string"
_ROW = "a number or a string"
_STRINGS = "an array of strings"
_COUNTERS = "an object of numbers"

#: What a cache entry's ``result`` holds: each field of a point result (as the native
#: ``run_points`` returns it, :class:`shootdown.schema.PointResult`) and its JSON type. The
#: floats may be ``null`` (serde writes a NaN so). The Rust core's other fields
#: (:data:`ENTRY_OPTIONAL`) are checked when present; unknown fields are kept as they are.
ENTRY_SCHEMA: Dict[str, str] = {
    "index": _INT,
    "row": _ROW,
    "variant": _STRING,
    "rep": _INT,
    "value": _NUMBER_OR_NULL,
    "sim_ns": _NUMBER_OR_NULL,
    "steps": _INT,
    "wall_s": _NUMBER_OR_NULL,
    "counters": _COUNTERS,
    "violations": _STRINGS,
}

#: Fields a point result may have (the Rust core's, unread by the front end), and their types.
ENTRY_OPTIONAL: Dict[str, str] = {"stop": _STRING, "uses_checked": _INT}


def _json_type(value: Any) -> str:
    """The JSON name of a parsed value's type, for a reason."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__  # pragma: no cover - json.load makes nothing else


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _type_ok(kind: str, value: Any) -> bool:
    if kind == _INT:
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == _NUMBER_OR_NULL:
        return value is None or _is_number(value)
    if kind == _STRING:
        return isinstance(value, str)
    if kind == _ROW:
        return isinstance(value, str) or _is_number(value)
    if kind == _STRINGS:
        return isinstance(value, list) and all(isinstance(v, str) for v in value)
    if kind == _COUNTERS:
        return isinstance(value, dict) and all(v is None or _is_number(v) for v in value.values())
    raise AssertionError(kind)  # pragma: no cover


def _shown(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 40 else text[:37] + "..."


def _result_problem(result: Any, point: Mapping[str, Any]) -> Optional[str]:
    """Why ``result`` is not a point result of ``point`` (``None``: it is one)."""
    if not isinstance(result, dict):
        return f"result: expected an object (a point result), got {_json_type(result)}"
    missing = [name for name in ENTRY_SCHEMA if name not in result]
    if missing:
        return f"result: missing field(s) {', '.join(missing)}"
    present = {n: k for n, k in ENTRY_OPTIONAL.items() if n in result}
    for name, kind in {**ENTRY_SCHEMA, **present}.items():
        value = result[name]
        if not _type_ok(kind, value):
            if kind == _COUNTERS and isinstance(value, dict):
                bad = next(k for k, v in value.items() if not (v is None or _is_number(v)))
                return (
                    f"result.counters.{bad}: expected a number, got "
                    f"{_json_type(value[bad])} {_shown(value[bad])}"
                )
            return f"result.{name}: expected {kind}, got {_json_type(value)} {_shown(value)}"
    for name in ("index", "variant", "rep"):
        if result[name] != point[name]:
            return (
                f"result.{name}: {_shown(result[name])}, but the entry's point has "
                f"{_shown(point[name])}"
            )
    if row_key(result["row"]) != row_key(point["row"]):
        return (
            f"result.row: {_shown(result['row'])}, but the entry's point has {_shown(point['row'])}"
        )
    return None


def _entry_problem(
    entry: Any, key: str, provenance: Mapping[str, Any], point: PlannedPoint
) -> Optional[str]:
    """Why a parsed cache entry cannot stand for the point (``None``: it can)."""
    if not isinstance(entry, dict):
        return f"expected a JSON object (key, provenance, result), got {_json_type(entry)}"
    if "key" not in entry:
        return "key: missing"
    if entry["key"] != key:
        return f"key: {_shown(entry['key'])} is not the file's key (another point's entry?)"
    if "provenance" not in entry:
        return "provenance: missing"
    if entry["provenance"] != dict(provenance):
        return "provenance: not this point's (edited?)"
    if "result" not in entry:
        return "result: missing"
    return _result_problem(entry["result"], point)


class _Cache:
    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def path(self, key: str) -> Path:
        return self.directory / key[:2] / f"{key}.json"

    def load(
        self, key: str, provenance: Mapping[str, Any], point: PlannedPoint
    ) -> Optional[PointResult]:
        """The cached result of a point, or ``None``: no entry, or an invalid one (a warning
        naming the file and the reason; the point is then recomputed and its entry
        overwritten)."""
        target = self.path(key)
        try:
            data = target.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            self._invalid(target, f"cannot read it ({exc.strerror or exc})")
            return None
        try:
            entry = json.loads(data.decode("utf-8"))
        except UnicodeDecodeError:
            self._invalid(target, "not UTF-8 text (a binary file?)")
            return None
        except ValueError as exc:  # json.JSONDecodeError, or a number too large for Python
            self._invalid(target, f"not JSON ({exc})")
            return None
        except RecursionError:
            self._invalid(target, "not JSON (nested too deeply)")
            return None
        problem = _entry_problem(entry, key, provenance, point)
        if problem is not None:
            self._invalid(target, problem)
            return None
        return entry["result"]  # type: ignore[no-any-return]

    @staticmethod
    def _invalid(target: Path, reason: str) -> None:
        _log.warning(
            "shootdown: warning: sweep cache entry %s is invalid (%s): recomputing it",
            target,
            " ".join(reason.split()),
        )

    def store(self, key: str, provenance: Mapping[str, Any], result: PointResult) -> None:
        target = self.path(key)
        target.parent.mkdir(parents=True, exist_ok=True)
        entry = {"key": key, "provenance": dict(provenance), "result": result}
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".tmp-", suffix=".json")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump(entry, fh)
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


def _run_chunk(
    path: str, sets: List[str], quick: bool, indices: List[int], threads: int
) -> List[Any]:
    """Run a chunk of points (module-level so Ray can ship it to workers)."""
    return json.loads(native().run_points(path, sets, quick, indices, threads))


def _import_ray() -> Any:
    try:
        import ray  # type: ignore[import-not-found]
    except ImportError as exc:
        raise ImportError(
            "backend='ray' needs Ray: pip install 'shootdown[dist]' (or use backend='local')"
        ) from exc
    return ray


class RayClusterError(ConfigError):
    """The Ray cluster a sweep was pointed at refused it (a missing or wrong auth token) or did
    not answer. A :class:`ConfigError`, so the CLI prints it as one line and exits 2."""


# Ray's token authentication (Ray >= 2.52) is configured by the environment only, read by Ray's
# C++ core in every process (driver, GCS, raylet, workers): RAY_AUTH_MODE ("token" or
# "disabled"), and the token from RAY_AUTH_TOKEN, else the file RAY_AUTH_TOKEN_PATH names,
# else ~/.ray/auth_token. A ray.init() that starts a local instance with RAY_AUTH_MODE unset
# turns token mode on, warns, and writes a new ~/.ray/auth_token when it finds no token.
_AUTH_MODE = "RAY_AUTH_MODE"
_AUTH_TOKEN = "RAY_AUTH_TOKEN"
_AUTH_TOKEN_PATH = "RAY_AUTH_TOKEN_PATH"
_AUTH_FIX = (
    "run with RAY_AUTH_MODE=token and the cluster's token in RAY_AUTH_TOKEN or in a file named by "
    "RAY_AUTH_TOKEN_PATH (default ~/.ray/auth_token); `ray get-auth-token` on the head node "
    "prints it"
)


@contextmanager
def _environ(changes: Mapping[str, Optional[str]]) -> Iterator[None]:
    """Set (``None``: remove) environment variables for the duration, then restore them."""

    def apply(values: Mapping[str, Optional[str]]) -> None:
        for k, v in values.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v

    saved = {k: os.environ.get(k) for k in changes}
    try:
        apply(changes)
        yield
    finally:
        apply(saved)


def _reload_ray_auth() -> None:
    """Make this process's Ray re-read the auth variables: its config caches the mode and its
    token loader the token (what Ray's own tests do after changing them; config first)."""
    try:
        from ray._raylet import AuthenticationTokenLoader, Config  # type: ignore
    except ImportError:  # a Ray without token authentication (< 2.52)
        return
    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()


@contextmanager
def _quiet_stderr() -> Iterator[None]:
    """Send file descriptor 2 to /dev/null for the duration: Ray's C++ core logs a failed
    connection attempt there itself, past Python's ``sys.stderr``."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):  # no usable fd 2: nothing to quiet
        yield
        return
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _token_source() -> str:
    """Which token this process sends, as Ray's loader picks it."""
    mode = (os.environ.get(_AUTH_MODE) or "").lower()
    try:
        from ray._raylet import AuthenticationMode, get_authentication_mode  # type: ignore

        token_mode = get_authentication_mode() == AuthenticationMode.TOKEN
    except ImportError:
        token_mode = mode == "token"
    if not token_mode:
        return f"{_AUTH_MODE} is {mode or 'unset'}, so no token was sent"
    if os.environ.get(_AUTH_TOKEN):
        return f"the token sent came from {_AUTH_TOKEN}"
    if os.environ.get(_AUTH_TOKEN_PATH):
        return f"the token sent came from {_AUTH_TOKEN_PATH}={os.environ[_AUTH_TOKEN_PATH]}"
    return "the token sent came from ~/.ray/auth_token"


def _is_auth_error(ray: Any, exc: BaseException) -> bool:
    auth_error = getattr(getattr(ray, "exceptions", None), "AuthenticationError", None)
    seen = 0
    cur: Optional[BaseException] = exc
    while cur is not None and seen < 10:
        if auth_error is not None and isinstance(cur, auth_error):
            return True
        if "InvalidAuthToken" in str(cur) or "AuthenticationError" in str(cur):
            return True
        cur = cur.__cause__ or cur.__context__
        seen += 1
    return False


def _auth_failure(address: str, exc: BaseException) -> RayClusterError:
    """One line for an auth error of Ray: the cluster refused the token, or this process has
    none to send (token mode with no token, or an unreadable ``RAY_AUTH_TOKEN_PATH``)."""
    text = " ".join(str(getattr(exc, "message", None) or exc).split())
    if "InvalidAuthToken" in text or "Authentication token is missing or incorrect" in text:
        what = f"the Ray cluster at {address} refused this sweep's authentication"
        why = _token_source()
    else:  # Ray's own first sentence says which source failed
        what = f"no usable auth token for the Ray cluster at {address}"
        why = text.split(". ")[0].rstrip(".")
    return RayClusterError(f"{what} ({why}): {_AUTH_FIX}")


def _check_token(ray: Any, address: str) -> None:
    """In token mode, the token must be there before anything connects: Ray's C++ core ends
    the process (no exception) when RAY_AUTH_TOKEN_PATH names a missing or empty file."""
    try:
        from ray._private.authentication.authentication_token_setup import (  # type: ignore
            ensure_token_if_auth_enabled,
        )
    except ImportError:
        return
    try:
        ensure_token_if_auth_enabled(None, create_token_if_missing=False)
    except Exception as exc:
        if _is_auth_error(ray, exc):
            raise _auth_failure(address, exc) from None
        raise


def _probe_cluster(ray: Any, address: str) -> None:
    """Fail fast, in one line, when the cluster at ``address`` (``host:port`` of its GCS)
    refuses this process's token or does not answer: ``ray.init`` would retry for 20 s and log
    every attempt."""
    if address.startswith("ray://"):  # Ray Client: no GCS to ask
        return
    try:
        from ray._private import services  # type: ignore
        from ray._raylet import GcsClient  # type: ignore

        gcs = services.canonicalize_bootstrap_address(address)
    except Exception:  # an older or newer Ray: ray.init's own errors will do
        return
    if gcs is None:
        return
    try:
        with _quiet_stderr():
            GcsClient(address=gcs)
    except Exception as exc:
        if _is_auth_error(ray, exc):
            raise _auth_failure(address, exc) from None
        rpc_error = getattr(getattr(ray, "exceptions", None), "RpcError", None)
        if rpc_error is not None and isinstance(exc, rpc_error):
            raise RayClusterError(
                f"no Ray cluster answered at {address} ({' '.join(str(exc).split())}): check "
                "the address (the head node's host:port, `ray start --head` prints it) and "
                "that the cluster runs"
            ) from None
        return  # anything else: ray.init says what it is


@contextmanager
def _ray_session(address: Optional[str]) -> Iterator[Any]:
    """Ray, connected for the sweep: as it is when this process already called ``ray.init``;
    else connected to ``address`` (or ``$RAY_ADDRESS``) with the cluster's own auth settings
    from the environment; else a private local instance. What the sweep connected or started
    it disconnects or stops at the end.

    The private instance runs in token mode with a token made for it, passed to its processes
    in ``RAY_AUTH_TOKEN`` only: nothing is read from or written to ``~/.ray``, and Ray prints no
    warning. (``RAY_AUTH_MODE`` set to anything but ``token`` is respected.) It writes what any
    local Ray writes: its session (logs, sockets) under Ray's temp dir, ``$RAY_TMPDIR/ray``,
    by default ``/tmp/ray``.
    """
    ray = _import_ray()
    if ray.is_initialized():
        yield ray
        return
    target = address or os.environ.get("RAY_ADDRESS") or None
    if target is None:
        changes: Dict[str, Optional[str]] = {}
        if (os.environ.get(_AUTH_MODE) or "token").lower() == "token":
            changes = {
                _AUTH_MODE: "token",
                _AUTH_TOKEN: secrets.token_hex(32),
                _AUTH_TOKEN_PATH: None,
            }
        try:
            with _environ(changes):
                _reload_ray_auth()
                ray.init(address="local")
                try:
                    yield ray
                finally:
                    ray.shutdown()
        finally:
            _reload_ray_auth()  # back to the restored environment's settings
        return
    _reload_ray_auth()  # the environment as it is now, not as Ray first read it
    if target != "auto":  # "auto" turns token mode on inside ray.init: nothing to check yet
        _check_token(ray, target)
        _probe_cluster(ray, target)
    try:
        ray.init(address=target)
    except Exception as exc:
        if _is_auth_error(ray, exc):
            raise _auth_failure(target, exc) from None
        raise
    try:
        yield ray
    finally:
        ray.shutdown()


def sweep(
    path: api.PathLike,
    grid: Mapping[str, Sequence[Any]],
    backend: str = "local",
    cache_dir: api.PathLike = ".shootdown-cache",
    sets: Sequence[str] = (),
    quick: bool = False,
    threads: Optional[int] = None,
    progress: Optional[api.ProgressCallback] = None,
    chunk_size: Optional[int] = None,
    address: Optional[str] = None,
) -> pd.DataFrame:
    """Run an experiment over every combination of ``grid``, resuming from ``cache_dir``.

    Args:
        path: the experiment file, or a shipped experiment's name (see :func:`shootdown.plan`).
        grid: ``{"dotted.key": [values...]}``, e.g.
            ``{"profile_override.cost.ipi_latency_same_socket": [600, 1200],
            "variants.after.options.smp_call": ["concurrent"]}``. Python values are written as
            TOML (strings quoted); use :class:`Raw` for literal TOML.
        backend: ``"local"`` (threads inside Rust) or ``"ray"`` (one Ray task per chunk of
            points). Ray as this process already initialised it; else the cluster at
            ``address`` (or ``$RAY_ADDRESS``), authenticated as Ray's environment says
            (``RAY_AUTH_MODE``, ``RAY_AUTH_TOKEN`` / ``RAY_AUTH_TOKEN_PATH`` /
            ``~/.ray/auth_token``); else a private local instance that writes nothing under
            the home directory. What the sweep started or connected it stops or disconnects
            when done. See ``docs/ray.md``.
        cache_dir: directory of the point cache (created as needed).
        sets: overrides applied before the grid's.
        quick: the experiment's quick configuration.
        threads: local: worker threads (default: available CPUs); ray: threads (and CPUs
            reserved) per task (default 1).
        progress: ``progress(done, total)`` over all points; cached points count as done.
        chunk_size: points per native call / Ray task (default ``2 × threads``).
        address: ray: the cluster to run on, as ``ray.init(address=...)`` takes it
            (``host:port`` of the head node, ``"auto"`` for the latest ``ray start`` on this
            machine, ``ray://host:port``); default ``$RAY_ADDRESS``, else a local instance.

    Returns:
        A points frame (as :func:`shootdown.run`) over all combinations, with ``combo`` (the
        combination's number), one column per grid key holding its value, and ``cached``
        (True if the point came from the cache). The provenance columns are each
        combination's own: its ``sets`` end with the grid's values, and ``modified`` says
        whether they changed the configuration. ``attrs["plans"]`` maps combo → plan; see
        :func:`summarize_sweep`.
    """
    if backend not in ("local", "ray"):
        raise ValueError(f"backend must be 'local' or 'ray', not {backend!r}")
    experiment = Path(api._experiment_file(path))
    exp_sha = _sha256(experiment.read_bytes())
    version = model_version()
    cache = _Cache(Path(cache_dir))

    combos: List[_Combo] = []
    for number, values in enumerate(expand_grid(grid) if grid else [{}]):
        combo_sets = list(api._sets(sets)) + [f"{k}={toml_literal(v)}" for k, v in values.items()]
        the_plan = api.plan(experiment, combo_sets, quick)
        combo = _Combo(number, values, combo_sets, the_plan)
        profile = the_plan["experiment"].get("profile", "")
        inputs = _input_digests(the_plan)
        for point in the_plan["points"]:
            prov = {
                "experiment_sha256": exp_sha,
                "inputs_sha256": inputs,
                "profile": profile,
                "sets": combo_sets,
                "quick": bool(quick),
                "index": int(point["index"]),
                "version": version,
            }
            key = point_key(prov)
            combo.keys[point["index"]] = key
            combo.provenance[point["index"]] = prov
            hit = cache.load(key, prov, point) if inputs is not None else None
            if hit is not None:
                combo.results[point["index"]] = hit
                combo.cached[point["index"]] = True
        combos.append(combo)

    total = sum(len(c.plan["points"]) for c in combos)
    done = sum(len(c.results) for c in combos)
    if progress is not None:
        progress(done, total)

    def finish(combo: _Combo, results: List[PointResult]) -> None:
        nonlocal done
        for r in results:
            idx = int(r["index"])
            if combo.provenance[idx]["inputs_sha256"] is not None:
                cache.store(combo.keys[idx], combo.provenance[idx], r)
            combo.results[idx] = r
            combo.cached[idx] = False
        done += len(results)
        if progress is not None:
            progress(done, total)

    if backend == "local":
        threads = api._threads(experiment, threads)
        size = chunk_size or max(1, 2 * threads)
        for combo in combos:
            missing = combo.missing()
            for start in range(0, len(missing), size):
                part = missing[start : start + size]
                finish(combo, _run_chunk(str(experiment), combo.sets, bool(quick), part, threads))
    else:
        _sweep_ray(experiment, combos, bool(quick), threads or 1, chunk_size, finish, address)

    frames = []
    for combo in combos:
        results = [combo.results[p["index"]] for p in combo.plan["points"]]
        frame = points_frame(combo.plan, results)
        frame.insert(0, "combo", combo.number)
        for pos, (k, v) in enumerate(combo.values.items(), start=1):
            frame.insert(pos, k, pd.Series([v] * len(frame), dtype=object, index=frame.index))
        frame["cached"] = [combo.cached.get(int(i), False) for i in frame["index"]]
        frames.append(frame)
    out = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    out.attrs = {
        "plans": {c.number: c.plan for c in combos},
        "grid": {k: list(v) for k, v in grid.items()},
    }
    return out


def _sweep_ray(
    experiment: Path,
    combos: List[_Combo],
    quick: bool,
    threads: int,
    chunk_size: Optional[int],
    finish: Callable[[_Combo, List[PointResult]], None],
    address: Optional[str] = None,
) -> None:
    size = chunk_size or max(1, 2 * threads)
    chunks = [
        (combo, missing[start : start + size])
        for combo in combos
        for missing in [combo.missing()]
        for start in range(0, len(missing), size)
    ]
    if not chunks:  # everything came from the cache: no cluster needed
        _import_ray()
        return
    with _ray_session(address) as ray:
        remote = ray.remote(num_cpus=threads)(_run_chunk)
        pending: Dict[Any, _Combo] = {}
        for combo, part in chunks:
            pending[remote.remote(str(experiment), combo.sets, quick, part, threads)] = combo
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            for ref in ready:
                finish(pending.pop(ref), ray.get(ref))


def summarize_sweep(frame: pd.DataFrame) -> pd.DataFrame:
    """:func:`shootdown.summarize` of every combination of a :func:`sweep` frame, with the
    ``combo`` and grid columns in front and the combination's provenance columns
    (:data:`shootdown.provenance.PROVENANCE_COLUMNS`) at the end."""
    plans: Dict[int, Plan] = frame.attrs.get("plans", {})
    grid_keys: Tuple[str, ...] = tuple(frame.attrs.get("grid", {}))
    parts = []
    for number, group in frame.groupby("combo", sort=True):
        combo = int(number)  # type: ignore[call-overload,arg-type]
        summary = summarize(group, plans[combo])
        summary.insert(0, "combo", combo)
        for pos, key in enumerate(grid_keys, start=1):
            summary.insert(pos, key, pd.Series([group[key].iloc[0]] * len(summary), dtype=object))
        for key, value in plan_provenance(plans[combo]).items():
            summary[key] = constant_column(value, len(summary), summary.index)
        parts.append(summary)
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()

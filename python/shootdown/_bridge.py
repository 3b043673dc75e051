"""Access to the Rust extension ``shootdown._native``.

Every call into Rust goes through :func:`native`, so the package imports (and its pure-Python
parts work) even when the extension is not built, and tests can substitute a fake with
:func:`set_native_override`. The extension speaks JSON strings; :func:`call` decodes them.

Before the real extension is first handed out, ``$SHOOTDOWN_SHIPPED_PROFILES`` is set (unless
already set) to the package's ``profiles/`` directory: the Rust core searches it after
``$SHOOTDOWN_PROFILES`` and the ``profiles/`` directories above the experiment, so an experiment
copied out of the data tree still finds the shipped machine profiles.
"""

from __future__ import annotations

import importlib
import json
import os
from typing import Any, Optional

__all__ = [
    "ENV_SHIPPED_PROFILES",
    "ConfigError",
    "HostError",
    "NativeUnavailableError",
    "native",
    "call",
    "set_native_override",
]

#: Environment variable naming the shipped profiles directory (read by the Rust core).
ENV_SHIPPED_PROFILES = "SHOOTDOWN_SHIPPED_PROFILES"

try:  # pragma: no cover - depends on whether the extension is built
    from shootdown._native import ConfigError  # type: ignore[import-not-found]
except ImportError:  # pragma: no cover

    class ConfigError(ValueError):  # type: ignore[no-redef]
        """A bad experiment, profile, scenario or option.

        The message is one line, ``FILE: KEY: REASON``. (This Python stand-in is used only when
        the extension is not built; normally it is ``shootdown._native.ConfigError``.)
        """


try:  # pragma: no cover - depends on whether the extension is built
    from shootdown._native import HostError  # type: ignore[import-not-found]
except ImportError:  # pragma: no cover

    class HostError(RuntimeError):  # type: ignore[no-redef]
        """This machine cannot run a measurement (not Linux, one CPU, affinity refused…).

        (The stand-in used when the extension is not built, or is older than this package.)
        """


class NativeUnavailableError(ImportError):
    """The Rust extension ``shootdown._native`` is not built or failed to load."""


_override: Optional[Any] = None
_shipped_profiles_exported = False


def set_native_override(module: Optional[Any]) -> Optional[Any]:
    """Use ``module`` instead of ``shootdown._native`` (``None`` restores it); returns the old one.

    Meant for tests: the object needs the functions of the native contract
    (``plan``, ``run_points``, ``trace``, ``check``, ``check_list``, ``bench``).
    """
    global _override
    old, _override = _override, module
    return old


def export_shipped_profiles() -> None:
    """Set ``$SHOOTDOWN_SHIPPED_PROFILES`` to ``<data_root>/profiles`` unless it is already set
    (once per process; nothing happens when no data root is found)."""
    global _shipped_profiles_exported
    if _shipped_profiles_exported:
        return
    _shipped_profiles_exported = True
    from . import paths

    try:
        os.environ.setdefault(ENV_SHIPPED_PROFILES, str(paths.profiles_dir()))
    except paths.DataNotFoundError:
        pass


def native() -> Any:
    """Return the extension module (or the override installed by tests)."""
    if _override is not None:
        return _override
    try:
        module = importlib.import_module("shootdown._native")
    except ImportError as exc:
        raise NativeUnavailableError(
            "the Rust extension shootdown._native is not available "
            f"({exc}); build it with `pip install .` or `maturin develop --release`"
        ) from exc
    export_shipped_profiles()
    return module


def call(function: str, *args: Any) -> Any:
    """Call ``shootdown._native.<function>(*args)`` and decode its JSON answer (``None`` stays)."""
    answer = getattr(native(), function)(*args)
    if answer is None:
        return None
    return json.loads(answer)

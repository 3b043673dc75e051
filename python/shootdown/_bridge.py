"""Access to the Rust extension ``shootdown._native``.

Every call into Rust goes through :func:`native`, so the package imports (and its pure-Python
parts work) even when the extension is not built, and tests can substitute a fake with
:func:`set_native_override`. The extension speaks JSON strings; :func:`call` decodes them.
"""

from __future__ import annotations

import importlib
import json
from typing import Any, Optional

__all__ = ["ConfigError", "NativeUnavailableError", "native", "call", "set_native_override"]

try:  # pragma: no cover - depends on whether the extension is built
    from shootdown._native import ConfigError  # type: ignore[import-not-found]
except ImportError:  # pragma: no cover

    class ConfigError(ValueError):  # type: ignore[no-redef]
        """A bad experiment, profile, scenario or option.

        The message is one line, ``FILE: KEY: REASON``. (This Python stand-in is used only when
        the extension is not built; normally it is ``shootdown._native.ConfigError``.)
        """


class NativeUnavailableError(ImportError):
    """The Rust extension ``shootdown._native`` is not built or failed to load."""


_override: Optional[Any] = None


def set_native_override(module: Optional[Any]) -> Optional[Any]:
    """Use ``module`` instead of ``shootdown._native`` (``None`` restores it); returns the old one.

    Meant for tests: the object needs the functions of the native contract
    (``plan``, ``run_points``, ``trace``, ``check``, ``check_list``, ``bench``).
    """
    global _override
    old, _override = _override, module
    return old


def native() -> Any:
    """Return the extension module (or the override installed by tests)."""
    if _override is not None:
        return _override
    try:
        return importlib.import_module("shootdown._native")
    except ImportError as exc:
        raise NativeUnavailableError(
            "the Rust extension shootdown._native is not available "
            f"({exc}); build it with `pip install .` or `maturin develop --release`"
        ) from exc


def call(function: str, *args: Any) -> Any:
    """Call ``shootdown._native.<function>(*args)`` and decode its JSON answer (``None`` stays)."""
    answer = getattr(native(), function)(*args)
    if answer is None:
        return None
    return json.loads(answer)

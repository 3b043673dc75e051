"""Every document a doc or a source comment names is in the clone: Markdown links, and paths
like ``docs/design/kernel-model.md`` in code, profiles and scenarios (the design notes and the
bug catalog ship in ``docs/``)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: The reference material beside the clone, which a user's clone does not have.
OUTSIDE = "../" + "shared"

_LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
_PATH = re.compile(r"(?<![\w./-])((?:\.\./)*(?:docs/)?(?:design|bugs|figures)?/?[\w.-]+\.md)\b")


def _tracked(*patterns: str) -> list[Path]:
    out = subprocess.run(
        ["git", "ls-files", *patterns], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    return [ROOT / p for p in out.split()]


def _resolves(name: str, near: Path) -> bool:
    """A name resolves beside the file that names it, at the root, or in ``docs/`` and its
    design-note and catalog directories (the notes name each other by bare file name)."""
    bases = (near.parent, ROOT, ROOT / "docs", ROOT / "docs" / "design", ROOT / "docs" / "bugs")
    return any((base / name).exists() for base in bases)


def test_markdown_links_resolve() -> None:
    missing = []
    for doc in _tracked("*.md"):
        for m in _LINK.finditer(doc.read_text(encoding="utf-8")):
            target = m.group(1)
            if "://" in target or target.startswith("mailto:") or not target.strip("."):
                continue  # a URL, or `f(...)` in prose
            if not (doc.parent / target).exists():
                missing.append(f"{doc.relative_to(ROOT)}: {target}")
    assert not missing, missing


def test_named_documents_are_in_the_clone() -> None:
    missing = []
    for f in _tracked("*.rs", "*.md", "*.py", "*.toml", "*.sh"):
        text = f.read_text(encoding="utf-8", errors="replace")
        assert OUTSIDE not in text, f"{f.relative_to(ROOT)} points outside the clone"
        for m in _PATH.finditer(text):
            name = m.group(1)
            if not _resolves(name, f):
                missing.append(f"{f.relative_to(ROOT)}: {name}")
    assert not missing, sorted(set(missing))

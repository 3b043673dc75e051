#!/usr/bin/env bash
# Every test: the Rust workspace (unit, property, integration tests of each crate, including the
# explorer's pinned verdicts) and the Python package (API, CLI, end-to-end `reproduce --quick`).
# Installs what it needs (the package with its test extras) into the current Python.
set -euo pipefail
cd "$(dirname "$0")/.."
echo "== cargo test (Rust workspace)"
cargo test --workspace --exclude shootdown-py --quiet
echo "== cargo test (the engine with its phase-timing feature, and a machine's run under it)"
cargo test -p shootdown-engine --features phase-timing --quiet
cargo test -p shootdown-experiments --features phase-timing --test phase_timing --quiet
echo "== pip install .[test] (builds the extension with maturin)"
python3 -m pip install --quiet '.[test]'
echo "== pytest (Python package)"
python3 -m pytest -q python/tests

#!/usr/bin/env bash
# The edit -> check loop for writing mutants and model changes: rebuild the checker from the
# source tree in the fast-check cargo profile (no LTO, incremental) and check a scenario, with
# the arguments of `shootdown check` (SCENARIO as a path, --mutant, --memory-model, --max-states,
# --strategy, --format json, --no-symmetry ...). No reinstall of the Python package is needed.
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1-}" in
    "" | -h | --help)
        cat <<'USAGE'
usage: scripts/fast-check.sh SCENARIO.toml [--mutant NAME] [--memory-model sc|tso]
                             [--max-states N] [--strategy auto|bfs|dfs|parallel|random|pct]
                             [--sample N --seed S] [--format text|json] [--no-symmetry]

Rebuilds crates/shootdown-checker's `check` example in the `fast-check` profile (release
optimisation, no LTO, 16 codegen units, incremental) and runs it. After a one-line edit of a
model file (crates/shootdown-linux/src/...), the rebuild and check take 11-22 s on 2 cores
instead of a release reinstall's minutes, and the search runs as fast as `shootdown check`'s
(docs/performance.md, "The edit → check loop").

example:
  scripts/fast-check.sh scenarios/madvise_nested.toml --mutant tlb_finish_mmu_ignores_nested
USAGE
        [ -n "${1-}" ] && exit 0 || exit 2
        ;;
esac
exec cargo run --quiet --profile fast-check -p shootdown-checker --example check -- "$@"

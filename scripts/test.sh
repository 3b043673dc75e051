#!/usr/bin/env bash
# Every test: the Rust workspace (unit, property, integration tests of each crate, including the
# explorer's pinned verdicts) and the Python package (API, CLI, end-to-end `reproduce --quick`).
# Installs what it needs (the package with its test extras) into the current Python.
# `scripts/test.sh --help` says what it runs.
set -euo pipefail
cd "$(dirname "$0")/.."

usage() {
    cat <<'EOF'
usage: scripts/test.sh [-h | --help]

Runs every test of the project, one suite after the other, from the repository root:

  1. cargo test -p CRATE, for each member of the Rust workspace (Cargo.toml's
     [workspace] members, in order) but shootdown-py, the Python extension,
     which pytest tests through the installed package;
  2. cargo test -p shootdown-engine --features phase-timing, and the
     phase_timing test of shootdown-experiments under that feature;
  3. python3 -m pip install '.[test]' (builds the extension with maturin,
     installs the package and its test extras into the current Python);
  4. python3 -m pytest -q python/tests.

Each suite prints a header line "== COMMAND" before its output. The first
suite that fails stops the script, which exits with that suite's status; the
last two lines are always a summary of every suite ("summary: cargo
shootdown-engine ok, ..., pytest ok"; a failed suite says FAILED, one never
started "not run") and the same as counts ("suites: 11 passed, 0 failed,
0 skipped").

options:
  -h, --help  print this help and exit without running anything
EOF
}

case "${1-}" in
    -h | --help)
        usage
        exit 0
        ;;
    "") ;;
    *)
        echo "scripts/test.sh: unknown argument: $1 (try --help)" >&2
        exit 2
        ;;
esac
if [ $# -gt 1 ]; then
    echo "scripts/test.sh: too many arguments (try --help)" >&2
    exit 2
fi

# The Rust packages to test: each workspace member's [package] name, in Cargo.toml's order.
EXCLUDED="shootdown-py" # the PyO3 extension: tested through the Python package
workspace_packages() {
    local member
    awk '
        /^\[/ { in_ws = ($0 == "[workspace]") }
        in_ws && /^members *= *\[/ { in_members = 1 }
        in_members {
            line = $0
            while (match(line, /"[^"]+"/)) {
                print substr(line, RSTART + 1, RLENGTH - 2)
                line = substr(line, RSTART + RLENGTH)
            }
            if ($0 ~ /\]/) { in_members = 0 }
        }
    ' Cargo.toml | while read -r member; do
        if [ ! -f "$member/Cargo.toml" ]; then
            echo "scripts/test.sh: workspace member $member has no Cargo.toml" >&2
            exit 2
        fi
        awk '
            /^\[/ { in_pkg = ($0 == "[package]") }
            in_pkg && /^name *= *"/ { sub(/^name *= *"/, ""); sub(/".*/, ""); print; exit }
        ' "$member/Cargo.toml"
    done
}
all_packages=$(workspace_packages) # set -e: a member without a Cargo.toml stops here
packages=()
for pkg in $all_packages; do
    [ "$pkg" = "$EXCLUDED" ] || packages+=("$pkg")
done
if [ ${#packages[@]} -eq 0 ]; then
    echo "scripts/test.sh: no workspace members found in Cargo.toml" >&2
    exit 2
fi

# Every suite by its name in the summary, in the order they run.
names=()
for pkg in "${packages[@]}"; do
    names+=("cargo $pkg")
done
names+=(
    "cargo shootdown-engine[phase-timing]"
    "cargo shootdown-experiments[phase-timing]"
    "pip install"
    "pytest"
)

results=() # "NAME ok" for each suite passed, in order
current="" # the suite running now
summary() {
    local status=$1 line="" i
    for i in "${!names[@]}"; do
        if [ "$i" -lt ${#results[@]} ]; then
            line+="${results[$i]}, "
        elif [ "${names[$i]}" = "$current" ]; then
            line+="$current FAILED (exit $status), "
        else
            line+="${names[$i]} not run, "
        fi
    done
    echo "summary: ${line%, }"
    # The same as counts, in the plain closing form test runners' readers know.
    local failed=0
    [ "$status" -ne 0 ] && failed=1
    echo "suites: ${#results[@]} passed, $failed failed, $((${#names[@]} - ${#results[@]} - failed)) skipped"
}
trap 'status=$?; summary "$status"; exit "$status"' EXIT

# suite NAME HEADER COMMAND...: print "== HEADER", run COMMAND (set -e stops the script when it
# fails: the EXIT trap then prints the summary so far).
suite() {
    local name=$1 header=$2
    shift 2
    current=$name
    echo "== $header"
    "$@"
    results+=("$name ok")
    current=""
}

for pkg in "${packages[@]}"; do
    suite "cargo $pkg" "cargo test -p $pkg" cargo test -p "$pkg" --quiet
done
# The engine with its phase-timing feature, and a machine's run under it.
suite "cargo shootdown-engine[phase-timing]" \
    "cargo test -p shootdown-engine --features phase-timing" \
    cargo test -p shootdown-engine --features phase-timing --quiet
suite "cargo shootdown-experiments[phase-timing]" \
    "cargo test -p shootdown-experiments --features phase-timing --test phase_timing" \
    cargo test -p shootdown-experiments --features phase-timing --test phase_timing --quiet
suite "pip install" "pip install .[test] (builds the extension with maturin)" \
    python3 -m pip install --quiet '.[test]'
suite "pytest" "pytest (Python package)" \
    python3 -m pytest -q python/tests

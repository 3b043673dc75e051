#![allow(dead_code)]
use shootdown_checker::*;
use std::path::{Path, PathBuf};

pub fn scenarios() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scenarios")
}

pub fn scenario(name: &str) -> PathBuf {
    scenarios().join(format!("{name}.toml"))
}

/// `check NAME` breadth-first (a shortest counterexample), bounded at 5 M states.
pub fn run(name: &str, mutant: Option<&str>, mm: &str) -> CheckResult {
    run_with(name, mutant, mm, "bfs")
}

/// `check NAME --strategy STRATEGY`, bounded at 5 M states.
pub fn run_with(name: &str, mutant: Option<&str>, mm: &str, strategy: &str) -> CheckResult {
    check(
        &scenario(name),
        mutant,
        mm,
        Some(5_000_000),
        None,
        0,
        strategy,
        true,
        &[],
    )
    .unwrap_or_else(|e| panic!("{e}"))
}

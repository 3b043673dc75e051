#![allow(dead_code)]
use shootdown_checker::*;
use std::path::{Path, PathBuf};

pub fn scenarios() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scenarios")
}

pub fn scenario(name: &str) -> PathBuf {
    scenarios().join(format!("{name}.toml"))
}

pub fn run(name: &str, mutant: Option<&str>, mm: &str) -> CheckResult {
    check(
        &scenario(name),
        mutant,
        mm,
        Some(5_000_000),
        None,
        0,
        "bfs",
        true,
        &[],
    )
    .unwrap_or_else(|e| panic!("{e}"))
}

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

/// A row of a "Results" table (docs/checker.md, docs/designs.md).
#[derive(Debug)]
pub struct DocRow {
    pub scenario: String,
    /// None for a fixed protocol (`— (fixed)`) or a finding (`— (as written)`).
    pub mutant: Option<String>,
    /// A finding: the protocol as written violates an invariant (`— (as written)`).
    pub finding: bool,
    pub memory_models: Vec<String>,
    pub steps: Option<usize>,
    pub states: Option<u64>,
    /// False when its count is marked as measured once, not pinned (`†`).
    pub pinned: bool,
}

/// The rows of the "Results" tables: docs/checker.md's, and docs/designs.md's for the flush
/// designs since the seeds.
pub fn docs_results_rows() -> Vec<DocRow> {
    let head = "| scenario | mutant | bug | memory model | verdict | invariant | steps | states | seconds |";
    let mut rows = Vec::new();
    for file in ["checker.md", "designs.md"] {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../docs")
            .join(file);
        let doc = std::fs::read_to_string(path).unwrap();
        let start = doc
            .find(head)
            .unwrap_or_else(|| panic!("docs/{file}: the Results table"));
        rows.extend(
            doc[start..]
                .lines()
                .skip(2)
                .take_while(|l| l.starts_with('|'))
                .map(doc_row),
        );
    }
    assert!(rows.len() > 40, "{} rows", rows.len());
    rows
}

/// One line of a Results table.
fn doc_row(l: &str) -> DocRow {
    let c: Vec<&str> = l.trim_matches('|').split('|').map(str::trim).collect();
    let num = |s: &str| {
        s.trim_end_matches('†')
            .replace(',', "")
            .trim()
            .parse::<u64>()
            .ok()
    };
    DocRow {
        scenario: c[0].split(' ').next().unwrap().to_string(),
        mutant: (!c[1].starts_with('—')).then(|| c[1].to_string()),
        finding: c[1].contains("as written"),
        memory_models: c[3].split(" / ").map(str::to_string).collect(),
        steps: num(c[6]).map(|n| n as usize),
        states: num(c[7]),
        pinned: !c[7].ends_with('†'),
    }
}

/// The one-line error `check NAME --set SET` gives (a value or a mix of options refused).
pub fn set_error(name: &str, set: &str) -> String {
    check(
        &scenario(name),
        None,
        "sc",
        None,
        None,
        0,
        "bfs",
        true,
        &[set.to_string()],
    )
    .unwrap_err()
    .to_string()
}

/// `check NAME --strategy bfs --set KEY=VALUE…` (a kernel version's form of the scenario).
pub fn run_set(name: &str, mutant: Option<&str>, mm: &str, sets: &[&str]) -> CheckResult {
    let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
    check(
        &scenario(name),
        mutant,
        mm,
        None,
        None,
        0,
        "bfs",
        true,
        &sets,
    )
    .unwrap_or_else(|e| panic!("{e}"))
}

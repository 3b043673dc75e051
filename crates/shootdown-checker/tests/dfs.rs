//! Depth-first verification reaches the verdicts breadth-first search does (pinned in
//! `verify.rs` and `mutants.rs`): the fixed protocols of the smaller scenarios verify, the
//! documented findings and every declared mutant (in the memory model it is declared for) are
//! violations of the expected invariant.
mod common;
use common::*;
use shootdown_checker::check;

fn dfs(name: &str, mutant: Option<&str>, mm: &str) -> shootdown_checker::CheckResult {
    check(&scenario(name), mutant, mm, 5_000_000, None, 0, "dfs", true)
        .unwrap_or_else(|e| panic!("{e}"))
}

/// Fixed protocols that verify breadth-first in under 150,000 states (`verify.rs`).
const SMALL_VERIFIED: &[(&str, &str)] = &[
    ("batch_unmap", "tso"),
    ("lazy_munmap", "tso"),
    ("switch_mm_flush", "tso"),
    ("switch_mm_flush_v5", "sc"),
    ("flush_catchup", "tso"),
    ("pv_tlb_flush", "tso"),
    ("madvise_nested", "tso"),
    ("reclaim_madvise", "tso"),
    ("khugepaged_collapse", "tso"),
    ("thp_zap", "sc"),
    ("kvm_fast_invalidate", "sc"),
    ("kvm_tdp_zap_roots", "tso"),
    ("kvm_mtrr_cd_toggle", "tso"),
    ("kvm_mtrr_cd_toggle_shared", "tso"),
    ("kvm_noncoherent_fault", "tso"),
];

#[test]
fn depth_first_verdicts_equal_breadth_first_ones() {
    let mut bad = Vec::new();
    for &(sc, mm) in SMALL_VERIFIED {
        let d = dfs(sc, None, mm);
        if (d.verdict.as_str(), d.strategy.as_str()) != ("verified", "dfs") {
            bad.push(format!("{sc} ({mm}): dfs {}", d.verdict));
        }
    }
    let infos = shootdown_checker::list(&scenarios()).unwrap();
    let mut mutants = 0;
    for info in &infos {
        if let Some(f) = &info.finding {
            let d = dfs(&info.scenario, None, "sc");
            if d.invariant.as_deref() != Some(f.expect.as_str()) {
                bad.push(format!(
                    "{} (finding): dfs {:?}",
                    info.scenario, d.invariant
                ));
            }
        }
        for m in &info.mutants {
            let mm = m.memory_model.as_str();
            let d = dfs(&info.scenario, Some(&m.name), mm);
            mutants += 1;
            if d.verdict != "violation" || d.invariant != m.expect || d.counterexample.is_empty() {
                bad.push(format!(
                    "{} --mutant {} ({mm}): dfs {} {:?}",
                    info.scenario, m.name, d.verdict, d.invariant
                ));
            }
        }
    }
    assert!(mutants >= 24, "{mutants}");
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

//! Sampling (random walk, PCT) finds the mutants too, deterministically per seed, and shortens
//! the schedule it reports.
mod common;
use common::*;
use shootdown_checker::check;

#[test]
fn random_and_pct_find_the_partial_flush_mutant() {
    for strat in ["random", "pct"] {
        let p = scenario("flush_catchup");
        let a = check(
            &p,
            Some("partial_flush_when_full_owed"),
            "sc",
            Some(1_000_000),
            Some(5000),
            7,
            strat,
            true,
            &[],
        )
        .unwrap();
        assert_eq!(a.verdict, "violation", "{strat}");
        assert_eq!(a.invariant.as_deref(), Some("INV-STALE"));
        assert_eq!(a.strategy, strat);
        // Shortened, but never shorter than the BFS shortest counterexample (47 steps).
        assert!(
            a.counterexample.len() >= 47 && a.counterexample.len() < 200,
            "{}",
            a.counterexample.len()
        );
        let b = check(
            &p,
            Some("partial_flush_when_full_owed"),
            "sc",
            Some(1_000_000),
            Some(5000),
            7,
            strat,
            true,
            &[],
        )
        .unwrap();
        assert_eq!(
            a.counterexample, b.counterexample,
            "{strat}: deterministic per seed"
        );
        assert_eq!(a.states, b.states);
    }
}

#[test]
fn sampling_the_fixed_protocol_finds_nothing_and_proves_nothing() {
    let r = check(
        &scenario("switch_mm_flush"),
        None,
        "tso",
        Some(1_000_000),
        Some(300),
        1,
        "pct",
        true,
        &[],
    )
    .unwrap();
    assert_eq!(r.verdict, "bound-reached");
    assert!(r.states > 0);
}

#[test]
fn sampling_finds_tso_only_bug() {
    let r = check(
        &scenario("switch_mm_flush"),
        Some("switch_mm_no_barrier"),
        "tso",
        Some(1_000_000),
        Some(20000),
        3,
        "random",
        true,
        &[],
    )
    .unwrap();
    assert_eq!(r.verdict, "violation");
    assert_eq!(r.invariant.as_deref(), Some("INV-STALE"));
}

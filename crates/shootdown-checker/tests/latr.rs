//! LATR under the explorer (`scenarios/latr.toml`): the forms the scenario's own pins
//! (`verify.rs`, `mutants.rs`) do not cover — the artifact's default configuration, which frees
//! the page when madvise returns (found under SC and TSO), the seeded mutant under TSO, and the
//! same scenario without LATR (IPIs), which verifies.

mod common;
use common::run_set as run;

#[test]
fn latr_without_lazy_free_frees_a_page_a_cpu_still_maps() {
    for (mm, states) in [("sc", 4350), ("tso", 5426)] {
        let r = run("latr", None, mm, &["options.latr=latr"]);
        assert_eq!(r.invariant.as_deref(), Some("INV-FREEPAGE"), "{mm}");
        assert_eq!((r.counterexample.len(), r.states), (14, states), "{mm}");
    }
}

#[test]
fn the_seeded_mutant_is_found_under_tso_too() {
    let r = run("latr", Some("latr_drain_clears_whole_mask"), "tso", &[]);
    assert_eq!(r.invariant.as_deref(), Some("INV-STALE"));
    assert_eq!((r.counterexample.len(), r.states), (15, 8551));
}

#[test]
fn without_latr_the_scenario_verifies_on_ipis() {
    let r = run("latr", None, "sc", &["options.latr=off"]);
    assert_eq!(
        (r.verdict.as_str(), r.states, r.transitions),
        ("verified", 161863, 482825)
    );
}

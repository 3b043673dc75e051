//! Global ASIDs and INVLPGB (v6.15+) under the explorer (`scenarios/global_asid*.toml`): the
//! forms the scenarios' own pins (`verify.rs`, `mutants.rs`) do not cover — TSO for the seeded
//! mutants, the v6.15–v6.17 switch without 83b0177a6c48's barrier, and each scenario on a
//! kernel without broadcast flushes (IPIs only), which verifies too.

mod common;
use common::run_set as run;

#[test]
fn the_seeded_mutants_are_found_under_tso_too() {
    for (sc, m, inv, steps, states) in [
        (
            "global_asid",
            "broadcast_skips_tlbsync",
            "INV-STALE",
            74,
            9944,
        ),
        (
            "global_asid",
            "asid_transition_cleared_early",
            "INV-STALE",
            52,
            3913,
        ),
        (
            "global_asid_switch",
            "asid_transition_cleared_early",
            "INV-STALE",
            62,
            35198,
        ),
        (
            "global_asid_freed_tables",
            "invlpgb_final_only",
            "INV-PTFREE",
            80,
            79572,
        ),
    ] {
        let r = run(sc, Some(m), "tso", &[]);
        assert_eq!(r.invariant.as_deref(), Some(inv), "{sc} {m}");
        assert_eq!(
            (r.counterexample.len(), r.states),
            (steps, states),
            "{sc} {m}"
        );
    }
}

#[test]
fn the_v6_17_switch_without_its_barrier_verifies_with_global_asids() {
    let r = run(
        "global_asid_switch",
        None,
        "tso",
        &["options.lazy_tlb=v6_17"],
    );
    assert_eq!(
        (r.verdict.as_str(), r.states, r.transitions),
        ("verified", 138312, 349361)
    );
}

#[test]
fn without_broadcast_flushes_every_scenario_verifies_on_ipis() {
    for (sc, states, transitions) in [
        ("global_asid", 3648, 6708),
        ("global_asid_freed_tables", 14715, 33388),
        ("global_asid_switch", 22366, 42297),
        // The same state space as kernel_global's: IPIs to every CPU.
        ("kernel_global_invlpgb", 315, 630),
    ] {
        let r = run(sc, None, "sc", &["options.broadcast_tlb_flush=false"]);
        assert_eq!(
            (r.verdict.as_str(), r.states, r.transitions),
            ("verified", states, transitions),
            "{sc}"
        );
    }
}

#[test]
fn the_counterexamples_tell_the_story() {
    // The transition's end without a look: cpu1 keeps its dynamic ASID, the next broadcast
    // flushes only the global PCID, and cpu1 hits its stale entry.
    let r = run(
        "global_asid",
        Some("asid_transition_cleared_early"),
        "sc",
        &[],
    );
    let all: Vec<&str> = r.counterexample.iter().map(|s| s.text.as_str()).collect();
    for says in [
        "consider_global_asid(mm): 2 CPUs run it: use_global_asid = 6, asid_transition = true",
        "broadcast_tlb_flush: 1 INVLPGB(s) of global ASID 6",
        "finish_asid_transition: asid_transition(mm) = false",
        "TLBSYNC: this CPU's INVLPGBs are done everywhere",
    ] {
        assert!(all.iter().any(|t| t.contains(says)), "{says}: {all:#?}");
    }
    // Without TLBSYNC the flush returns with its INVLPGB in flight.
    let r = run("global_asid", Some("broadcast_skips_tlbsync"), "sc", &[]);
    let all: Vec<&str> = r.counterexample.iter().map(|s| s.text.as_str()).collect();
    assert!(
        all.iter().any(|t| t.contains("return without TLBSYNC")),
        "{all:#?}"
    );
    assert!(
        all.iter()
            .any(|t| t.contains("move to the mm's global ASID")),
        "{all:#?}"
    );
}

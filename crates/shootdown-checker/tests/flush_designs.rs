//! Early acknowledgement, in-context PTI user flushes and Shoot4U under the explorer
//! (`scenarios/early_ack.toml`, `pti_deferred_user_flush.toml`, `shoot4u.toml`): the forms the
//! scenarios' own pins (`verify.rs`, `mutants.rs`) do not cover — the RFC as posted, whose
//! initiator does not wait for the acknowledgement (found under SC and TSO), the seeded
//! mutants under TSO, and the same scenarios without the designs, which verify.

mod common;
use common::run_set as run;

#[test]
fn the_rfc_as_posted_returns_before_the_target_acknowledged() {
    for (mm, states) in [("sc", 1662), ("tso", 2184)] {
        let r = run("early_ack", None, mm, &["options.early_ack=rfc_v2"]);
        assert_eq!(r.invariant.as_deref(), Some("INV-STALE"), "{mm}");
        assert_eq!((r.counterexample.len(), r.states), (19, states), "{mm}");
        let text: Vec<&str> = r.counterexample.iter().map(|s| s.text.as_str()).collect();
        assert!(
            text.iter().any(|t| t.contains("wait = 0")),
            "{}",
            text.join("\n")
        );
    }
}

#[test]
fn the_seeded_mutants_are_found_under_tso_too() {
    for (sc, m, inv, steps, states) in [
        (
            "early_ack",
            "early_ack_nmi_unchecked",
            "INV-STALE",
            24,
            4356,
        ),
        ("shoot4u", "shoot4u_no_wait", "INV-STALE", 16, 434),
        (
            "pti_deferred_user_flush",
            "deferred_user_flush_merge_ignores_start",
            "INV-STALE",
            58,
            12947,
        ),
    ] {
        let r = run(sc, Some(m), "tso", &[]);
        assert_eq!(r.invariant.as_deref(), Some(inv), "{sc}/{m}");
        assert_eq!(
            (r.counterexample.len(), r.states),
            (steps, states),
            "{sc}/{m}"
        );
    }
}

#[test]
fn without_the_designs_the_scenarios_verify() {
    for (sc, set, states, transitions) in [
        ("early_ack", "options.early_ack=off", 4037, 9235),
        ("shoot4u", "options.shoot4u=false", 708, 1679),
        (
            "pti_deferred_user_flush",
            "options.pti_user_flush=immediate",
            6083,
            12107,
        ),
    ] {
        let r = run(sc, None, "sc", &[set]);
        assert_eq!(
            (r.verdict.as_str(), r.states, r.transitions),
            ("verified", states, transitions),
            "{sc}"
        );
    }
}

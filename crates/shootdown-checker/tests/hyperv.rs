//! The Hyper-V enlightened TLB flush on KVM (`scenarios/hv_tlb_flush.toml`,
//! `hv_tlb_flush_lazy.toml`): the forms the scenarios' own pins (`verify.rs`, `mutants.rs`) do
//! not cover — v5.10's hypercall, which kicks the target vCPU and does not wait (the bug
//! 1ebfaa11ebb5 fixed), found under SC and TSO in both; v4.18's, which waits, verifies; the
//! seeded mutants under TSO.

mod common;
use common::run_set as run;

#[test]
fn before_1ebfaa11ebb5_the_hypercall_returns_before_the_kicked_vcpu_left_the_guest() {
    for (mm, states) in [("sc", 1024), ("tso", 1312)] {
        let r = run("hv_tlb_flush", None, mm, &["options.hv_tlb_flush=v5_10"]);
        assert_eq!(r.invariant.as_deref(), Some("INV-STALE"), "{mm}");
        assert_eq!((r.counterexample.len(), r.states), (19, states), "{mm}");
        let text: Vec<&str> = r.counterexample.iter().map(|s| s.text.as_str()).collect();
        for says in [
            "kvm_make_request(KVM_REQ_TLB_FLUSH_GUEST, vcpu1)",
            "no wait (no KVM_REQUEST_WAIT)",
        ] {
            assert!(text.iter().any(|t| t.contains(says)), "{says}: {text:#?}");
        }
    }
}

#[test]
fn the_first_form_waits_and_verifies_and_the_seeded_mutant_is_found_under_tso() {
    for (mm, states, transitions) in [("sc", 1200, 2665), ("tso", 1641, 4122)] {
        let r = run("hv_tlb_flush", None, mm, &["options.hv_tlb_flush=v4_18"]);
        assert_eq!(
            (r.verdict.as_str(), r.states, r.transitions),
            ("verified", states, transitions),
            "{mm}"
        );
    }
    let r = run("hv_tlb_flush", Some("vcpu_request_mode_first"), "tso", &[]);
    assert_eq!(r.invariant.as_deref(), Some("INV-STALE"));
    assert_eq!((r.counterexample.len(), r.states), (22, 1850));
    let r = run(
        "hv_tlb_flush_lazy",
        Some("hv_flush_skips_lazy_freed_tables"),
        "tso",
        &[],
    );
    assert_eq!(r.invariant.as_deref(), Some("INV-PTFREE"));
    assert_eq!((r.counterexample.len(), r.states), (15, 64));
}

#[test]
fn before_1ebfaa11ebb5_a_page_table_is_freed_under_a_lazy_vcpu_still_in_the_guest() {
    for (mm, states) in [("sc", 206), ("tso", 254)] {
        let r = run(
            "hv_tlb_flush_lazy",
            None,
            mm,
            &["options.hv_tlb_flush=v5_10"],
        );
        assert_eq!(r.invariant.as_deref(), Some("INV-PTFREE"), "{mm}");
        assert_eq!((r.counterexample.len(), r.states), (20, states), "{mm}");
    }
}

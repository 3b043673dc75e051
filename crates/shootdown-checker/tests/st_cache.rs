//! The host's cache of the steal-time area (`scenarios/kvm_steal_time_cache.toml`): mainline's
//! hva cache verifies (pinned in `verify.rs`, its seeded mutant in `mutants.rs`); v5.6–v5.15's
//! pfn cache writes a page the host reclaimed (7e2175ebd695's use-after-free).

mod common;
use common::run_set as run;

#[test]
fn before_7e2175ebd695_the_host_writes_a_reclaimed_page() {
    for (mm, steps, states) in [("sc", 19, 3228), ("tso", 19, 3920)] {
        let r = run(
            "kvm_steal_time_cache",
            None,
            mm,
            &["options.steal_time_map=v5_6"],
        );
        assert_eq!(r.invariant.as_deref(), Some("INV-PFNCACHE"), "{mm}");
        assert_eq!((r.counterexample.len(), r.states), (steps, states), "{mm}");
        let all: Vec<&str> = r.counterexample.iter().map(|s| s.text.as_str()).collect();
        for says in [
            "kvm_cache_gfn_to_pfn(st of vcpu0): gfn 0x300 -> pfn 0x100300",
            "invalidate_range_start returns: the host may free the pages",
            "kvm_steal_time_set_preempted(vcpu0): st[0].preempted = PREEMPTED",
        ] {
            assert!(all.iter().any(|t| t.contains(says)), "{says}: {all:#?}");
        }
    }
}

#[test]
fn the_seeded_mutant_is_found_under_tso_too() {
    let r = run(
        "kvm_steal_time_cache",
        Some("steal_time_cache_ignores_generation"),
        "tso",
        &[],
    );
    assert_eq!(r.invariant.as_deref(), Some("INV-PFNCACHE"));
    assert_eq!((r.counterexample.len(), r.states), (47, 137234));
    assert!(r
        .detail
        .as_deref()
        .unwrap()
        .contains("through its mapping of memslot 1, whose deletion has returned"));
}

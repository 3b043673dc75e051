//! NX huge pages under the explorer (`scenarios/kvm_nx_recovery.toml`, `kvm_nx_split.toml`):
//! the recovery worker's flush in its v5.10 form (before 048f49809c52) and today's, and both
//! scenarios in the shadow MMU's v5.x form (`tdp_mmu = false`). The TDP MMU's fixed forms are
//! pinned in `verify.rs`, the seeded mutant in `mutants.rs`.

mod common;
use common::run_set as run;

#[test]
fn before_048f49809c52_the_recovery_frees_a_split_table_unflushed() {
    // kvm_recover_nx_lpages ignored kvm_tdp_mmu_zap_gfn_range's "flush needed" and freed the
    // table at once: vcpu0's paging-structure cache still points to it.
    for (mm, steps, states) in [("sc", 41, 6416), ("tso", 41, 10010)] {
        let r = run(
            "kvm_nx_recovery",
            None,
            mm,
            &["options.nx_recovery_flush=v5_10"],
        );
        assert_eq!(r.invariant.as_deref(), Some("INV-PTFREE"), "{mm}");
        assert_eq!((r.counterexample.len(), r.states), (steps, states), "{mm}");
        let texts: Vec<&str> = r.counterexample.iter().map(|s| s.text.as_str()).collect();
        assert!(
            texts
                .iter()
                .any(|t| t.contains("kvm_tdp_mmu_zap_sp: unlink split EPT page")),
            "{texts:?}"
        );
        assert!(
            texts
                .iter()
                .any(|t| t.contains("EPT violation (fetch gfn 0x200)")),
            "{texts:?}"
        );
    }
}

#[test]
fn the_shadow_mmu_forms_verify_and_the_split_mutant_is_found() {
    // The shadow MMU's recovery commits its invalid list (a flush, then the free) in every
    // version, so v5.10's form verifies there too.
    for (sc, sets, mm, states) in [
        ("kvm_nx_recovery", &[][..], "sc", 201555),
        ("kvm_nx_recovery", &[][..], "tso", 289102),
        (
            "kvm_nx_recovery",
            &["options.nx_recovery_flush=v5_10"][..],
            "sc",
            201555,
        ),
        ("kvm_nx_split", &[][..], "sc", 280032),
        ("kvm_nx_split", &[][..], "tso", 434183),
    ] {
        let mut all = vec!["options.tdp_mmu=false"];
        all.extend_from_slice(sets);
        let r = run(sc, None, mm, &all);
        assert_eq!(
            (r.verdict.as_str(), r.states),
            ("verified", states),
            "{sc} {sets:?} ({mm})"
        );
    }
    for (mm, steps, states) in [("sc", 20, 4306), ("tso", 20, 5308)] {
        let r = run(
            "kvm_nx_split",
            Some("huge_spte_split_skips_flush"),
            mm,
            &["options.tdp_mmu=false"],
        );
        assert_eq!(r.invariant.as_deref(), Some("INV-FLUSH-OWED"), "{mm}");
        assert_eq!((r.counterexample.len(), r.states), (steps, states), "{mm}");
    }
}

#[test]
fn without_the_mitigation_the_v5_10_recovery_has_nothing_to_free() {
    // nx_huge_pages = false: the 2 MiB SPTE is executable, the fetch maps nothing new, no table
    // is tracked, and the v5.10 recovery zaps nothing.
    let r = run(
        "kvm_nx_recovery",
        None,
        "sc",
        &[
            "options.nx_huge_pages=false",
            "options.nx_recovery_flush=v5_10",
        ],
    );
    assert_eq!(r.verdict, "verified");
}

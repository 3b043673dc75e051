//! The TDP MMU's GFN-range zap in its forms before v5.18 (`options.tdp_zap`,
//! `scenarios/kvm_tdp_zap_tables.toml`, `kvm_tdp_zap_all_yield.toml`): whole tables removed,
//! flushed for and freed at once (v5.10) or after an RCU grace period (v5.12+), and v5.15's
//! top-level-only walk of a zap of everything. The scenarios' own forms are pinned in
//! `verify.rs`, their seeded mutants in `mutants.rs`.

mod common;
use common::run_set as run;

fn texts(r: &shootdown_checker::CheckResult) -> Vec<&str> {
    r.counterexample.iter().map(|s| s.text.as_str()).collect()
}

#[test]
fn every_form_of_the_zap_verifies_where_tables_are_removed() {
    // v5.10 frees at once after the flush, v5.12/v5.15 call_rcu after it, mainline removes no
    // table: each is safe against vcpu0's paging-structure cache. The whole-table forms explore
    // more states than the leaf-only walk: the removed table's flush runs inside the walk, its
    // IPIs interleaving with vcpu0, before the walk's own flush at the end.
    for (form, sc, tso) in [
        ("v5_10", 3657, 4515),
        ("v5_12", 3657, 4515),
        ("v5_15", 3657, 4515),
    ] {
        for (mm, states) in [("sc", sc), ("tso", tso)] {
            let set = format!("options.tdp_zap={form}");
            let r = run("kvm_tdp_zap_tables", None, mm, &[&set]);
            assert_eq!(
                (r.verdict.as_str(), r.states),
                ("verified", states),
                "{form} {mm}"
            );
        }
    }
    let r = run(
        "kvm_tdp_zap_tables",
        None,
        "sc",
        &["options.tdp_zap=mainline"],
    );
    assert_eq!((r.verdict.as_str(), r.states), ("verified", 1773));
}

#[test]
fn a_deferred_flush_frees_the_table_at_the_end_of_the_roots_rcu_section() {
    // bb95dfb9e2df without bd29677952fa, in both RCU forms: the counterexample shows the
    // call_rcu without a flush, the grace period ending at rcu_read_unlock, and vcpu0's walk.
    for form in ["v5_12", "v5_15"] {
        let set = format!("options.tdp_zap={form}");
        let r = run(
            "kvm_tdp_zap_tables",
            Some("tdp_removed_pt_defers_flush"),
            "sc",
            &[&set],
        );
        assert_eq!(r.invariant.as_deref(), Some("INV-PTFREE"), "{form}");
        let t = texts(&r);
        assert!(
            t.iter().any(|t| t.contains("the flush left to the caller")),
            "{t:?}"
        );
        assert!(
            t.iter().any(|t| t.contains("the grace period ends")),
            "{t:?}"
        );
    }
    // v5.10 frees without RCU after handle_changed_spte's own flush: the mutant's code never
    // runs there, which the checker says rather than calling the form verified.
    let r = run(
        "kvm_tdp_zap_tables",
        Some("tdp_removed_pt_defers_flush"),
        "sc",
        &["options.tdp_zap=v5_10"],
    );
    assert_eq!(r.verdict, "unreached");
}

#[test]
fn the_advanced_iterator_skips_the_entry_it_yielded_at_only_in_the_top_level_walk() {
    let r = run(
        "kvm_tdp_zap_all_yield",
        Some("tdp_iter_advances_after_restart"),
        "tso",
        &[],
    );
    assert_eq!(r.invariant.as_deref(), Some("INV-MEMTYPE"));
    assert_eq!((r.counterexample.len(), r.states), (25, 1344));
    let t = texts(&r);
    assert!(
        t.iter()
            .any(|t| t.contains("tdp_iter_restart, then tdp_iter_next")),
        "{t:?}"
    );
    assert!(t.iter().all(|t| !t.trim_end().ends_with(':')), "{t:?}");
    // v5.12's walk steps down to 4 KiB even for a zap of everything: the mutated restart is
    // v5.15's and never runs here.
    let r = run(
        "kvm_tdp_zap_all_yield",
        Some("tdp_iter_advances_after_restart"),
        "sc",
        &["options.tdp_zap=v5_12"],
    );
    assert_eq!(r.verdict, "unreached");
}

#[test]
fn patch_12s_read_lock_zap_needs_the_leaf_only_walk() {
    let e = common::set_error("kvm_tdp_zap_tables", "options.zap_gfn_range_lock=read");
    assert!(
        e.contains("options.tdp_zap") && e.contains("patch 12"),
        "{e}"
    );
}

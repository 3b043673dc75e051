//! The `mm_cpumask` forms since v6.12 under the explorer (`scenarios/lazy_cpumask_switch.toml`,
//! `switch_mm_flush.toml`): v6.12 clears the bit at a switch (`is_lazy`), v6.13 keeps it
//! (209954cbc7d0) and v6.14 skips CPUs running another mm (6db2526c1d69); until v6.18
//! (83b0177a6c48) nothing ordered a switch's stores before its `tlb_gen` load when the bit was
//! already set. Mainline's fixed form is pinned in `verify.rs`.

mod common;
use common::run_set as run;

#[test]
fn before_83b0177a6c48_a_switch_into_a_kept_bit_misses_a_flush_under_tso() {
    // v6.13: the flusher's tlb_is_not_lazy() reads cpu0's is_lazy before cpu0's store of false
    // is visible, while cpu0 reads the old tlb_gen: cpu0 reuses its PCID unflushed. v6.17's
    // should_flush_tlb() reads the same is_lazy first.
    for (lazy_tlb, states) in [("v6_13", 3344), ("v6_17", 3268)] {
        let set = format!("options.lazy_tlb={lazy_tlb}");
        let r = run("lazy_cpumask_switch", None, "tso", &[&set]);
        assert_eq!(r.invariant.as_deref(), Some("INV-STALE"), "{lazy_tlb}");
        assert_eq!(
            (r.counterexample.len(), r.states),
            (43, states),
            "{lazy_tlb}"
        );
        let texts: Vec<&str> = r.counterexample.iter().map(|s| s.text.as_str()).collect();
        assert!(
            texts
                .iter()
                .any(|t| t.contains("already in mm_cpumask(mm1): no barrier")),
            "{texts:?}"
        );
        assert!(
            texts.iter().any(|t| t.contains("is_lazy = true): skip")),
            "{texts:?}"
        );
        // Sequential consistency has no store buffer: the same code verifies.
        let r = run("lazy_cpumask_switch", None, "sc", &[&set]);
        assert_eq!(r.verdict, "verified", "{lazy_tlb}");
    }
    // v6.12 clears the bit when it switches away, and sets it again with a locked operation.
    let r = run(
        "lazy_cpumask_switch",
        None,
        "tso",
        &["options.lazy_tlb=is_lazy"],
    );
    assert_eq!((r.verdict.as_str(), r.states), ("verified", 2863));
}

#[test]
fn v6_17_is_the_seeded_switch_mm_no_barrier_mutant() {
    // switch_mm_flush's seeded mutant drops the same barrier from mainline: v6.17's form is
    // found by the same counterexample.
    let r = run("switch_mm_flush", None, "tso", &["options.lazy_tlb=v6_17"]);
    assert_eq!(r.invariant.as_deref(), Some("INV-STALE"));
    assert_eq!((r.counterexample.len(), r.states), (26, 2223));
    let m = run("switch_mm_flush", Some("switch_mm_no_barrier"), "tso", &[]);
    let text = |r: &shootdown_checker::CheckResult| -> Vec<String> {
        r.counterexample.iter().map(|s| s.text.clone()).collect()
    };
    assert_eq!(text(&r), text(&m));
}

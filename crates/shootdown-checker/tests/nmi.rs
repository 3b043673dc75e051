//! perf NMIs under the explorer (`scenarios/nmi_uaccess.toml`, `kthread_use_mm.toml`): the
//! kernel's forms before and after `nmi_uaccess_okay()` (4012e77a903d, v4.19), and of
//! `kthread_use_mm()` before and after 38cf307c1f20 (v5.8).

mod common;
use common::run_set as run_on;

fn run(mutant: Option<&str>, mm: &str, sets: &[&str]) -> shootdown_checker::CheckResult {
    run_on("nmi_uaccess", mutant, mm, sets)
}

#[test]
fn before_v4_19_an_nmi_reads_the_previous_task_through_the_next_mm() {
    for (mm, states) in [("sc", 68), ("tso", 72)] {
        let r = run(None, mm, &["options.nmi_uaccess_okay=false"]);
        assert_eq!(r.verdict, "violation", "{mm}");
        assert_eq!(r.invariant.as_deref(), Some("INV-CTX"), "{mm}");
        assert_eq!((r.counterexample.len(), r.states), (10, states), "{mm}");
        let texts: Vec<&str> = r.counterexample.iter().map(|s| s.text.as_str()).collect();
        assert!(texts[8].contains("CR3 <- mm2"), "{texts:?}");
        assert!(
            texts[9]
                .starts_with("NMI: perf_callchain_user: __get_user of mm1's user stack page 0x10"),
            "{texts:?}"
        );
    }
}

#[test]
fn with_the_check_a_mid_switch_nmi_reads_nothing() {
    // v4.19+: the NMIs the explorer delivers mid-switch find loaded_mm != current->mm.
    let r = run(None, "sc", &[]);
    assert_eq!(r.verdict, "verified");
    // With the NMI on cpu1 instead, whose only switch comes from its idle task (no mm), the
    // mutated switch runs and no NMI reads through the window it opens.
    let r = run(
        Some("loaded_mm_switching_omitted"),
        "sc",
        &["nmi.0.count=1", "nmi.0.cpu=1"],
    );
    assert_eq!(r.verdict, "verified");
}

#[test]
fn before_v4_19_an_nmi_in_kthread_use_mm_reads_through_the_old_cr3() {
    // kthread_use_mm sets current->mm before its switch_mm_irqs_off: the v4.18 handler reads
    // the borrowed mm's page through init_mm's page tables.
    let r = run_on(
        "kthread_use_mm",
        None,
        "sc",
        &["options.nmi_uaccess_okay=false"],
    );
    assert_eq!(r.invariant.as_deref(), Some("INV-CTX"));
    assert_eq!((r.counterexample.len(), r.states), (4, 20));
    assert!(r.counterexample[2]
        .text
        .contains("current->mm = active_mm = mm1"));
}

#[test]
fn an_nmi_during_text_poke_reads_through_poking_mm_unless_checked() {
    // poking_mm is loaded while current is the patching task: v4.18's handler reads the task's
    // stack through poking_mm's page tables.
    let r = run_on("text_poke", None, "sc", &["options.nmi_uaccess_okay=false"]);
    assert_eq!(r.invariant.as_deref(), Some("INV-CTX"));
    assert_eq!((r.counterexample.len(), r.states), (9, 200));
    assert!(r.counterexample[8].text.contains("through CR3 = poking_mm"));
    // The v4.19 check on v4.14's switch_mm (no LOADED_MM_SWITCHING before the CR3 write): the
    // check alone is not the fix, the NMI passes it in the window and reads the same way.
    let r = run_on("text_poke", None, "sc", &["options.lazy_tlb=tlb_gen"]);
    assert_eq!(r.invariant.as_deref(), Some("INV-CTX"));
    assert!(r
        .counterexample
        .last()
        .unwrap()
        .text
        .contains("nmi_uaccess_okay(); __get_user"));
}

#[test]
fn use_mm_with_interrupts_on_is_no_race_on_x86() {
    // Before v5.8 an IPI may arrive between use_mm's active_mm assignment and switch_mm
    // (38cf307c1f20): x86's flush_tlb_func reads cpu_tlbstate.loaded_mm, not active_mm, so the
    // scenario still verifies, with more interleavings.
    for (mm, states) in [("sc", 10153), ("tso", 23435)] {
        let r = run_on("kthread_use_mm", None, mm, &["options.kthread_use_mm=v5_7"]);
        assert_eq!((r.verdict.as_str(), r.states), ("verified", states), "{mm}");
    }
}

#[test]
fn before_v4_19_an_nmi_during_an_efi_call_reads_through_efi_mm() {
    for (mm, states) in [("sc", 144), ("tso", 176)] {
        let r = run_on("efi_runtime", None, mm, &["options.nmi_uaccess_okay=false"]);
        assert_eq!(r.invariant.as_deref(), Some("INV-CTX"), "{mm}");
        assert_eq!((r.counterexample.len(), r.states), (8, states), "{mm}");
        assert!(
            r.counterexample[7].text.contains("through CR3 = efi_mm"),
            "{:?}",
            r.counterexample[7]
        );
    }
}

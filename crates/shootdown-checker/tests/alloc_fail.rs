//! Allocation failure injected where the kernel handles it (`options.alloc_fail`,
//! `scenarios/kvm_tdp_fault_enomem.toml`): the fault's `mmu_topup_memory_caches()` fails once
//! on vcpu1, the fault returns -ENOMEM before `mmu_lock`, and `KVM_RUN` is entered again. The
//! fixed form and the seeded mutant are pinned in `verify.rs` and `mutants.rs`.

mod common;
use common::run_set as run;

#[test]
fn the_failed_fault_returns_before_the_lock_and_the_retry_maps() {
    // Without the injection the scenario has fewer states: the failure and the second exit
    // are interleavings of their own.
    let r = run(
        "kvm_tdp_fault_enomem",
        None,
        "sc",
        &["options.alloc_fail=none"],
    );
    assert_eq!((r.verdict.as_str(), r.states), ("verified", 6582));
    // The shadow MMU's fault tops up first too.
    let r = run(
        "kvm_tdp_fault_enomem",
        None,
        "sc",
        &["options.tdp_mmu=false"],
    );
    assert_eq!(r.verdict, "verified");
}

#[test]
fn the_mutants_counterexample_shows_the_lock_kept_and_the_writer_waiting() {
    let r = run(
        "kvm_tdp_fault_enomem",
        Some("topup_failure_skips_read_unlock"),
        "sc",
        &[],
    );
    assert_eq!(r.invariant.as_deref(), Some("X4-DEADLOCK"));
    let t: Vec<&str> = r.counterexample.iter().map(|s| s.text.as_str()).collect();
    assert!(
        t.iter()
            .any(|t| t.contains("-ENOMEM; return (still holding it for read)")),
        "{t:?}"
    );
    assert!(
        t.iter()
            .any(|t| t.contains("the VMM calls KVM_RUN again (srcu_read_lock)")),
        "{t:?}"
    );
}

#[test]
fn a_bad_alloc_fail_value_is_one_line_naming_the_key() {
    for (v, why) in [
        ("mmu_topup:1", "unknown value 'mmu_topup'"),
        ("mmu_topup_memory_caches", "name the vCPUs"),
        ("mmu_topup_memory_caches:x", "'x' is not a vCPU index"),
        ("none:0", "takes no vCPUs"),
        ("mmu_topup_memory_caches:0,40", "vcpu40 does not exist"),
    ] {
        let e = common::set_error("kvm_tdp_fault_enomem", &format!("options.alloc_fail={v}"));
        assert!(
            e.contains("options.alloc_fail") && e.contains(why) && !e.contains('\n'),
            "{v}: {e}"
        );
    }
}

//! Shadow paging (`options.ept = false`; `scenarios/kvm_shadow.toml`,
//! `scenarios/kvm_shadow_pv_flush.toml`, `scenarios/kvm_shadow_notifier.toml`): unsync guest
//! page tables synced by the guest's INVLPG, by the host's flush on the guest's behalf after a
//! PV flush (A6, b53e84eed08b), and by a CR3 reload while an MMU notifier reclaims a frame
//! (`tlbs_dirty`). The verdicts and state counts are pinned in `verify.rs` and `mutants.rs`;
//! here what the counterexamples show, what hides A6, v5.15's form of the sync, and the options
//! shadow paging rejects.

mod common;
use common::run_set as run;

/// `kvm_shadow_pv_flush` with a thread of the process as the initiator instead of kswapd.
const THREAD_INITIATOR: [&str; 2] = [
    r#"tasks=[{ name = "writer", cpu = 0, mm = "guest", program = [{ mprotect = { start = 0x10, npages = 1, writable = false } }, "exit"] }, { name = "reader", cpu = 1, mm = "guest", program = [{ touch = { vpn = 0x10, write = true } }, { touch = { vpn = 0x10, write = true } }, "exit"] }]"#,
    r#"setup=[{ cpu = 0, until = "user:writer" }, { cpu = 1, until = "user:reader" }]"#,
];

#[test]
fn a_pv_flush_that_only_flushes_the_hardware_tlb_leaves_the_stale_spte() {
    for mm in ["sc", "tso"] {
        let r = run(
            "kvm_shadow_pv_flush",
            Some("flush_tlb_guest_skips_sync"),
            mm,
            &[],
        );
        assert_eq!(r.invariant.as_deref(), Some("INV-STALE"), "{mm}");
        let t: Vec<&str> = r.counterexample.iter().map(|s| s.text.as_str()).collect();
        // The PV flush skips the preempted vcpu1, which then enters without a sync and fills
        // its TLB from the SPTE built before kswapd's unmap.
        let skipped = t.iter().position(|s| s.contains("vcpu1 skipped"));
        let entry = t.iter().position(|s| s.contains("no kvm_mmu_sync_roots"));
        let fill = t
            .iter()
            .rposition(|s| s.contains("walk the shadow page tables"));
        assert!(
            skipped.is_some() && entry > skipped && fill > entry,
            "{mm}: {t:?}"
        );
    }
}

#[test]
fn the_initiators_own_invlpg_hides_a6_in_either_guest_flush_order() {
    // A thread of the process flushes its own TLB: the INVLPG exits, and kvm_mmu_invlpg syncs
    // the shadow page both vCPUs share before vcpu1 can enter (b53e84eed08b: Linux guests hid
    // the bug while they flushed locally first; the model finds it hidden after 4ce94eabac16
    // too).
    for smp in ["remote_then_local", "concurrent"] {
        let smp_call = format!("options.smp_call={smp}");
        let sets = [THREAD_INITIATOR[0], THREAD_INITIATOR[1], smp_call.as_str()];
        let r = run(
            "kvm_shadow_pv_flush",
            Some("flush_tlb_guest_skips_sync"),
            "sc",
            &sets,
        );
        assert_eq!(r.verdict, "verified", "{smp}");
    }
}

#[test]
fn an_invlpg_that_leaves_the_unsync_page_is_found_after_mprotect_returns() {
    let r = run("kvm_shadow", Some("shadow_invlpg_skips_sync"), "sc", &[]);
    assert_eq!(r.invariant.as_deref(), Some("INV-STALE"));
    let t: Vec<&str> = r.counterexample.iter().map(|s| s.text.as_str()).collect();
    let left = t
        .iter()
        .filter(|s| s.contains("FNAME(invlpg) leaves it"))
        .count();
    assert_eq!(left, 2, "both vCPUs' INVLPGs: {t:?}");
}

#[test]
fn the_notifier_that_ignores_tlbs_dirty_frees_a_page_vcpu1_still_translates() {
    for mm in ["sc", "tso"] {
        let r = run(
            "kvm_shadow_notifier",
            Some("notifier_ignores_tlbs_dirty"),
            mm,
            &[],
        );
        assert_eq!(r.invariant.as_deref(), Some("INV-STALE"), "{mm}");
        let t: Vec<&str> = r.counterexample.iter().map(|s| s.text.as_str()).collect();
        // vcpu0's CR3 reload syncs the page: the SPTE of 0x10 is dropped with only
        // tlbs_dirty++, and the prefetched, never-accessed 0x12 is kept without a flush; the
        // notifier's rmap walk then finds nothing, and vcpu1 hits its old TLB entry.
        let sync = t
            .iter()
            .position(|s| s.contains("1 SPTE(s) kept, 2 dropped: kvm->tlbs_dirty += 2, no flush"));
        let ignored = t
            .iter()
            .position(|s| s.contains("zaps 0 SPTE(s); kvm->tlbs_dirty = 2 is not looked at"));
        let returned = t
            .iter()
            .position(|s| s.contains("invalidate_range_start returns"));
        assert!(
            sync.is_some() && ignored > sync && returned > ignored,
            "{mm}: {t:?}"
        );
        assert!(t.last().unwrap().contains("TLB hit"), "{mm}: {t:?}");
    }
}

#[test]
fn v5_15s_sync_flushes_the_dropped_spte_itself() {
    // f81602958c11: FNAME(sync_page) flushes every vCPU for a dropped SPTE, so the notifier
    // has nothing left to settle (and the tlbs_dirty mutant never runs).
    for (mm, states, transitions) in [("sc", 792011, 2261208), ("tso", 1247909, 3941419)] {
        let r = run(
            "kvm_shadow_notifier",
            None,
            mm,
            &["options.shadow_sync_flush=remote"],
        );
        assert_eq!(
            (r.verdict.as_str(), r.states, r.transitions),
            ("verified", states, transitions),
            "{mm}"
        );
    }
}

#[test]
fn a_fault_prefetches_its_present_neighbours_without_the_accessed_bit() {
    let r = run(
        "kvm_shadow_notifier",
        Some("notifier_ignores_tlbs_dirty"),
        "sc",
        &[],
    );
    let all: Vec<&str> = r
        .setup
        .iter()
        .chain(&r.counterexample)
        .map(|s| s.text.as_str())
        .collect();
    // Pages 0x10..0x12 are mapped: the fault of 0x10 prefetches 0x11 and 0x12 and stops at
    // 0x13, which is not present.
    assert!(
        all.iter()
            .any(|s| s.contains("FNAME(pte_prefetch): 2 neighbour(s), not accessed")),
        "{all:?}"
    );
}

#[test]
fn options_that_need_ept_are_one_line_errors() {
    for (set, key) in [
        ("options.tdp_mmu=true", "options.tdp_mmu"),
        ("options.pml=true", "options.pml"),
        ("kvm.smm=true", "kvm.smm"),
        (
            "kvm.prefault=[{ start = 0x10, npages = 1 }]",
            "kvm.prefault",
        ),
        (
            r#"kvm.threads=[{ name = "qemu", program = [{ memslot_delete = { id = 0 } }, "exit"] }]"#,
            "kvm.threads",
        ),
    ] {
        let e = common::set_error("kvm_shadow", set);
        assert!(
            e.contains(key) && e.contains("options.ept = false") && !e.contains('\n'),
            "{set}: {e}"
        );
    }
}

#[test]
fn a_kswapd_reclaim_needs_a_kernel_thread_and_names_its_mm() {
    let e = common::set_error(
        "kvm_shadow_pv_flush",
        r#"tasks=[{ name = "kswapd", cpu = 0, program = [{ reclaim_unmap = { start = 0x10, npages = 1 } }, "exit"] }, { name = "reader", cpu = 1, mm = "guest", program = ["exit"] }]"#,
    );
    assert!(e.contains("names the mm") && !e.contains('\n'), "{e}");
}

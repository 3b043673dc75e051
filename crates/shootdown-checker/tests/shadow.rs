//! Shadow paging (`options.ept = false`; `scenarios/kvm_shadow.toml`,
//! `scenarios/kvm_shadow_pv_flush.toml`): unsync guest page tables synced by the guest's INVLPG,
//! and by the host's flush on the guest's behalf after a PV flush (A6, b53e84eed08b). The
//! verdicts and state counts are pinned in `verify.rs` and `mutants.rs`; here what the
//! counterexamples show, what hides A6, and the options shadow paging rejects.

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
fn options_that_need_ept_are_one_line_errors() {
    for (set, key) in [
        ("options.tdp_mmu=true", "options.tdp_mmu"),
        ("options.pml=true", "options.pml"),
        ("kvm.smm=true", "kvm.smm"),
        (
            "kvm.prefault=[{ start = 0x10, npages = 1 }]",
            "kvm.prefault",
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

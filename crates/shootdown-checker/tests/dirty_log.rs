//! Dirty logging and the lockless fast page fault (`scenarios/kvm_dirty_log.toml`): the VMM
//! harvests a logged memslot twice with `KVM_GET_DIRTY_LOG` around an MMU-notifier
//! invalidation while a vCPU writes the page three times, its writes after a harvest fixed by
//! `fast_page_fault`; and its PML form (`scenarios/kvm_pml.toml`: EPT A/D bits, harvests that
//! clear D, writes the CPU logs). The TDP MMU forms and their mutants are pinned in
//! `verify.rs` and `mutants.rs`; here the legacy MMU's, and what the counterexamples show.

mod common;
use common::run_set as run;

#[test]
fn the_legacy_mmu_verifies_under_sc_and_tso_with_and_without_manual_protect() {
    for (sc, mm, states) in [
        ("kvm_dirty_log", "sc", 57287),
        ("kvm_dirty_log", "tso", 78922),
        ("kvm_dirty_log_manual", "sc", 15866),
        ("kvm_dirty_log_manual", "tso", 23961),
        ("kvm_pml", "sc", 31612),
        ("kvm_pml", "tso", 48931),
        ("kvm_dirty_log_enable", "sc", 4313),
        ("kvm_dirty_log_enable", "tso", 6752),
        ("kvm_dirty_log_initially_set", "sc", 16318),
        ("kvm_dirty_log_initially_set", "tso", 25339),
    ] {
        let r = run(sc, None, mm, &["options.tdp_mmu=false"]);
        assert_eq!(
            (r.verdict.as_str(), r.states),
            ("verified", states),
            "{sc} {mm}"
        );
    }
}

#[test]
fn a_clear_without_manual_protect_is_a_one_line_error() {
    let e = common::set_error(
        "kvm_dirty_log_manual",
        "options.manual_dirty_log_protect=false",
    );
    assert!(
        e.contains("kvm.threads[0].program[1]")
            && e.contains("manual_dirty_log_protect")
            && !e.contains('\n'),
        "{e}"
    );
}

#[test]
fn a_harvest_without_its_flush_loses_a_write_in_both_mmus() {
    for (tdp, len) in [("true", 57), ("false", 47)] {
        let r = run(
            "kvm_dirty_log",
            Some("get_dirty_log_skips_flush"),
            "sc",
            &[&format!("options.tdp_mmu={tdp}")],
        );
        assert_eq!(
            r.invariant.as_deref(),
            Some("INV-DIRTYLOG"),
            "tdp_mmu={tdp}"
        );
        assert_eq!(r.counterexample.len(), len, "tdp_mmu={tdp}");
        let t: Vec<&str> = r.counterexample.iter().map(|s| s.text.as_str()).collect();
        // The write after the first harvest hits the TLB entry the missing flush left.
        let harvest = t
            .iter()
            .position(|s| s.contains("KVM_MMU_UNLOCK; no flush"));
        let hit = t.iter().rposition(|s| s.contains("TLB hit"));
        assert!(harvest.is_some() && hit > harvest, "{t:?}");
    }
}

#[test]
fn a_plain_store_in_the_fast_path_resurrects_the_zapped_spte_in_both_mmus() {
    for tdp in ["true", "false"] {
        let r = run(
            "kvm_dirty_log",
            Some("fast_pf_plain_store"),
            "sc",
            &[&format!("options.tdp_mmu={tdp}")],
        );
        assert_eq!(r.invariant.as_deref(), Some("INV-STALE"), "tdp_mmu={tdp}");
        let t: Vec<&str> = r.counterexample.iter().map(|s| s.text.as_str()).collect();
        assert!(
            t.iter()
                .any(|s| s.contains("a plain store over what changed")),
            "{t:?}"
        );
    }
}

#[test]
fn a_dirty_log_of_a_slot_that_does_not_log_is_a_one_line_error() {
    let e = common::set_error(
        "kvm_dirty_log",
        "kvm.memslots=[{ id = 0, base = 0x0, npages = 0x400 }]",
    );
    assert!(
        e.contains("kvm.threads[0].program[0].id")
            && e.contains("does not log dirty pages")
            && !e.contains('\n'),
        "{e}"
    );
}

#[test]
fn a_plain_write_under_the_write_lock_loses_the_bit_set_without_it() {
    // A4 (ba3a6120a4e7): W set by fast_page_fault (A/D bits off), D set by the CPU (PML).
    for (sc, bit) in [
        ("kvm_dirty_log", "the W bit fast_page_fault set"),
        ("kvm_pml", "the D bit the CPU set"),
    ] {
        let r = run(sc, Some("tdp_mmu_write_spte_plain"), "sc", &[]);
        assert_eq!(r.invariant.as_deref(), Some("INV-AD"), "{sc}");
        let t: Vec<&str> = r.counterexample.iter().map(|s| s.text.as_str()).collect();
        let last = t.last().unwrap();
        assert!(
            last.contains("zap the leaf SPTE") && last.contains(bit),
            "{sc}: {last}"
        );
        // The bit was set after the zap's iterator reached the leaf's table, before its write.
        let reach = t
            .iter()
            .rposition(|s| s.contains("level 2: a table: step down"))
            .unwrap();
        let set = if sc == "kvm_pml" {
            "A/D assist sets D"
        } else {
            "cmpxchg64 sets W"
        };
        let setter = t.iter().rposition(|s| s.contains(set)).unwrap();
        assert!(reach < setter, "{sc}: {t:?}");
    }
    // The legacy MMU writes with xchg when an SPTE has volatile bits: the mutant's code is
    // not there.
    let r = run(
        "kvm_pml",
        Some("tdp_mmu_write_spte_plain"),
        "sc",
        &["options.tdp_mmu=false"],
    );
    assert_eq!(r.verdict, "unreached");
}

#[test]
fn with_pml_the_write_after_a_harvest_is_logged_and_drained_at_an_exit() {
    // A harvest clears D; vcpu0's write sets it again and logs the gfn; an exit drains it.
    let r = run("kvm_pml", Some("pml_make_spte_skips_mark"), "sc", &[]);
    assert_eq!(r.invariant.as_deref(), Some("INV-DIRTYLOG"));
    let t: Vec<&str> = r.counterexample.iter().map(|s| s.text.as_str()).collect();
    assert!(
        t.iter()
            .any(|s| s.contains("kvm_mmu_clear_dirty_pt_masked: 1 SPTE(s) cleaned")),
        "{t:?}"
    );
    assert!(
        t.iter()
            .any(|s| s.contains("kvm_arch_sync_dirty_log: kvm_vcpu_kick(vcpu0)")),
        "{t:?}"
    );
    let e = common::set_error("kvm_pml", "options.ept_ad=false");
    assert!(
        e.contains("options.pml") && e.contains("ept_ad") && !e.contains('\n'),
        "{e}"
    );
}

#[test]
fn logging_turned_on_without_a_flush_misses_the_writes_of_an_aged_page_in_both_mmus() {
    // A5 (b64d740ea7dd): aging left the SPTE read-only (access-tracked) without a flush, so
    // turning logging on changed no SPTE and, with the old code, flushed nothing.
    for tdp in ["true", "false"] {
        let r = run(
            "kvm_dirty_log_enable",
            Some("enable_dirty_log_flush_if_wrprot"),
            "sc",
            &[&format!("options.tdp_mmu={tdp}")],
        );
        assert_eq!(
            r.invariant.as_deref(),
            Some("INV-DIRTYLOG"),
            "tdp_mmu={tdp}"
        );
        assert_eq!(r.counterexample.len(), 26, "tdp_mmu={tdp}");
        let t: Vec<&str> = r.counterexample.iter().map(|s| s.text.as_str()).collect();
        let pos = |pat: &str| t.iter().position(|s| s.contains(pat));
        let aged = pos("R/W/X cleared").expect("aged");
        let on = pos("no SPTE changed; KVM_MMU_UNLOCK; no flush").expect("no flush");
        let hit = t
            .iter()
            .rposition(|s| s.contains("TLB hit"))
            .expect("a TLB hit");
        assert!(aged < on && on < hit, "tdp_mmu={tdp}: {t:?}");
    }
}

#[test]
fn initially_set_needs_manual_protect_and_a_clear_bitmap_loses_the_writes() {
    let e = common::set_error(
        "kvm_dirty_log_initially_set",
        "options.manual_dirty_log_protect=false",
    );
    assert!(
        e.contains("options.dirty_log_initially_set")
            && e.contains("manual_dirty_log_protect")
            && !e.contains('\n'),
        "{e}"
    );
    // Without the all-set bitmap nothing is write-protected and nothing reported: the
    // first KVM_CLEAR_DIRTY_LOG returns without the page vcpu0 wrote.
    let r = run(
        "kvm_dirty_log_initially_set",
        Some("initially_set_bitmap_clear"),
        "sc",
        &[],
    );
    assert_eq!(r.invariant.as_deref(), Some("INV-DIRTYLOG"));
    let t: Vec<&str> = r.counterexample.iter().map(|s| s.text.as_str()).collect();
    assert!(
        t.iter()
            .any(|s| s.contains("initially-all-set: nothing to write-protect")),
        "{t:?}"
    );
    assert!(
        t.last()
            .unwrap()
            .contains("KVM_CLEAR_DIRTY_LOG returned without gfn 0x20"),
        "{t:?}"
    );
}

#[test]
fn turning_logging_on_twice_changes_nothing_the_second_time() {
    // __kvm_set_memory_region(): the same flags again is "Nothing to change": the bitmap
    // and what the VMM is owed stay, so the A5 window is still found behind the second call.
    let twice = "kvm.threads=[{ name = \"qemu\", program = [{ clear_young = { gfn = 0x200 } }, { enable_dirty_log = { id = 0 } }, { enable_dirty_log = { id = 0 } }, { get_dirty_log = { id = 0 } }, \"exit\"] }]";
    let r = run("kvm_dirty_log_enable", None, "sc", &[twice]);
    assert_eq!(r.verdict, "verified");
    let r = run(
        "kvm_dirty_log_enable",
        Some("enable_dirty_log_flush_if_wrprot"),
        "sc",
        &[twice],
    );
    assert_eq!(r.invariant.as_deref(), Some("INV-DIRTYLOG"));
    let t: Vec<&str> = r.counterexample.iter().map(|s| s.text.as_str()).collect();
    assert!(
        t.iter()
            .any(|s| s.contains("logs dirty pages already: nothing to change")),
        "{t:?}"
    );
}

//! Every listed mutant is found, with the expected invariant and a shortest counterexample of
//! pinned length; state counts are pinned too (exploration is deterministic).
mod common;
use common::*;

/// (scenario, mutant, catalog bug, memory model, invariant, counterexample steps, states)
type Pinned = (
    &'static str,
    &'static str,
    Option<&'static str>,
    &'static str,
    &'static str,
    usize,
    u64,
);
const MUTANTS: &[Pinned] = &[
    (
        "free_page_reuse",
        "free_pages_before_flush",
        None,
        "sc",
        "INV-FREEPAGE",
        4,
        10,
    ),
    (
        "kernel_global",
        "flush_tlb_kernel_range_skips_lazy",
        None,
        "sc",
        "INV-STALE",
        15,
        349,
    ),
    (
        "mremap_truncate",
        "move_ptes_flushes_new_range",
        None,
        "sc",
        "INV-FREEPAGE",
        56,
        8867,
    ),
    (
        "mremap_truncate",
        "truncate_frees_mapped_pages",
        None,
        "sc",
        "INV-FREEPAGE",
        3,
        9,
    ),
    (
        "migrate_vma_madvise",
        "migrate_vma_skips_collect_flush",
        None,
        "sc",
        "INV-FREEPAGE",
        6,
        21,
    ),
    (
        "pfnmap_revoke",
        "pfnmap_zap_skips_flush",
        None,
        "sc",
        "INV-SYSRET",
        10,
        57,
    ),
    (
        "kvm_tdp_notifier",
        "tdp_notifier_skips_flush",
        None,
        "sc",
        "INV-FLUSH-OWED",
        20,
        3462,
    ),
    (
        "kvm_nx_split",
        "huge_spte_split_skips_flush",
        None,
        "sc",
        "INV-FLUSH-OWED",
        35,
        23964,
    ),
    (
        "global_asid",
        "broadcast_skips_tlbsync",
        None,
        "sc",
        "INV-STALE",
        71,
        4997,
    ),
    (
        "global_asid",
        "asid_transition_cleared_early",
        None,
        "sc",
        "INV-STALE",
        51,
        2414,
    ),
    (
        "global_asid_switch",
        "asid_transition_cleared_early",
        None,
        "sc",
        "INV-STALE",
        60,
        18299,
    ),
    (
        "kernel_global_invlpgb",
        "broadcast_skips_tlbsync",
        None,
        "sc",
        "INV-STALE",
        10,
        120,
    ),
    (
        "global_asid_freed_tables",
        "invlpgb_final_only",
        None,
        "sc",
        "INV-PTFREE",
        77,
        34998,
    ),
    (
        "kvm_steal_time_cache",
        "steal_time_cache_ignores_generation",
        None,
        "sc",
        "INV-PFNCACHE",
        47,
        99584,
    ),
    (
        "kvm_smm",
        "smm_change_keeps_root",
        None,
        "sc",
        "INV-ADDR-SPACE",
        5,
        40,
    ),
    (
        "kvm_smm",
        "smm_fault_uses_as0",
        None,
        "sc",
        "INV-ADDR-SPACE",
        21,
        9060,
    ),
    (
        "early_ack",
        "early_ack_nmi_unchecked",
        None,
        "sc",
        "INV-STALE",
        23,
        3089,
    ),
    (
        "early_ack_freed_tables",
        "early_ack_freed_tables",
        None,
        "sc",
        "INV-PTFREE",
        23,
        151,
    ),
    (
        "pti_deferred_user_flush",
        "deferred_user_flush_merge_ignores_start",
        None,
        "sc",
        "INV-STALE",
        56,
        9292,
    ),
    (
        "shoot4u",
        "shoot4u_no_wait",
        None,
        "sc",
        "INV-STALE",
        16,
        374,
    ),
    (
        "hv_tlb_flush",
        "vcpu_request_mode_first",
        None,
        "sc",
        "INV-STALE",
        22,
        1470,
    ),
    (
        "hv_tlb_flush_lazy",
        "hv_flush_skips_lazy_freed_tables",
        None,
        "sc",
        "INV-PTFREE",
        15,
        60,
    ),
    (
        "latr",
        "latr_drain_clears_whole_mask",
        None,
        "sc",
        "INV-STALE",
        15,
        7097,
    ),
    (
        "kvm_smm",
        "sp_role_ignores_smm",
        None,
        "sc",
        "INV-ADDR-SPACE",
        13,
        1520,
    ),
    (
        "efi_runtime",
        "efi_leave_mm_restores_cr3",
        None,
        "sc",
        "INV-STALE",
        27,
        2218,
    ),
    (
        "text_poke",
        "text_poke_skips_flush",
        None,
        "sc",
        "INV-SYSRET",
        30,
        6541,
    ),
    (
        "kthread_use_mm",
        "kthread_unuse_mm_drops_lazy_ref",
        None,
        "sc",
        "INV-PTFREE",
        42,
        12085,
    ),
    (
        "nmi_uaccess",
        "loaded_mm_switching_omitted",
        None,
        "sc",
        "INV-CTX",
        10,
        68,
    ),
    (
        "ple_pv_flush",
        "ple_yield_marks_preempted",
        None,
        "sc",
        "INV-STALE",
        51,
        19335,
    ),
    (
        "kvm_tdp_zap_roots",
        "tdp_zap_yield_drops_prior_flush",
        Some("K12"),
        "sc",
        "INV-FLUSH-OWED",
        39,
        1339,
    ),
    (
        "kvm_tdp_zap_tables",
        "tdp_removed_pt_defers_flush",
        None,
        "sc",
        "INV-PTFREE",
        24,
        347,
    ),
    (
        "kvm_tdp_fault_enomem",
        "topup_failure_skips_read_unlock",
        None,
        "sc",
        "X4-DEADLOCK",
        66,
        9595,
    ),
    (
        "kvm_dirty_log",
        "get_dirty_log_skips_flush",
        None,
        "sc",
        "INV-DIRTYLOG",
        57,
        12436,
    ),
    (
        "kvm_dirty_log",
        "fast_pf_plain_store",
        None,
        "sc",
        "INV-STALE",
        52,
        19100,
    ),
    (
        "kvm_dirty_log",
        "tdp_mmu_write_spte_plain",
        Some("A4"),
        "sc",
        "INV-AD",
        41,
        7862,
    ),
    (
        "kvm_pml",
        "tdp_mmu_write_spte_plain",
        Some("A4"),
        "sc",
        "INV-AD",
        41,
        15246,
    ),
    (
        "kvm_pml",
        "pml_make_spte_skips_mark",
        None,
        "sc",
        "INV-DIRTYLOG",
        71,
        48415,
    ),
    (
        "kvm_pml",
        "get_dirty_log_skips_flush",
        None,
        "sc",
        "INV-DIRTYLOG",
        58,
        31604,
    ),
    (
        "kvm_dirty_log_enable",
        "enable_dirty_log_flush_if_wrprot",
        Some("A5"),
        "sc",
        "INV-DIRTYLOG",
        26,
        618,
    ),
    (
        "kvm_dirty_log_initially_set",
        "initially_set_bitmap_clear",
        None,
        "sc",
        "INV-DIRTYLOG",
        39,
        1328,
    ),
    (
        "kvm_shadow",
        "shadow_invlpg_skips_sync",
        None,
        "sc",
        "INV-STALE",
        34,
        2685,
    ),
    (
        "kvm_shadow_pv_flush",
        "flush_tlb_guest_skips_sync",
        Some("A6"),
        "sc",
        "INV-STALE",
        23,
        6664,
    ),
    (
        "kvm_shadow_notifier",
        "notifier_ignores_tlbs_dirty",
        None,
        "sc",
        "INV-STALE",
        21,
        7588,
    ),
    (
        "kvm_tdp_zap_all_yield",
        "tdp_iter_advances_after_restart",
        Some("K15"),
        "sc",
        "INV-MEMTYPE",
        25,
        1138,
    ),
    (
        "kvm_noncoherent_fault",
        "zap_gfn_range_no_invalidate",
        Some("K14"),
        "sc",
        "INV-MEMTYPE",
        32,
        2626,
    ),
    (
        "khugepaged_collapse",
        "flush_tlb_range_without_freed_tables",
        Some("A1"),
        "sc",
        "INV-PTFREE",
        18,
        19,
    ),
    (
        "thp_zap",
        "zap_huge_pmd_not_gathered",
        None,
        "sc",
        "INV-FREEPAGE",
        5,
        15,
    ),
    (
        "madvise_nested",
        "tlb_finish_mmu_ignores_nested",
        Some("A2"),
        "sc",
        "INV-SYSRET",
        12,
        138,
    ),
    (
        "reclaim_madvise",
        "no_flush_tlb_batched_pending",
        Some("A3"),
        "sc",
        "INV-SYSRET",
        8,
        48,
    ),
    (
        "lazy_munmap",
        "free_tables_before_flush",
        Some("N1"),
        "sc",
        "INV-PTFREE",
        5,
        6,
    ),
    (
        "lazy_munmap",
        "lazy_ignores_freed_tables",
        Some("N3"),
        "sc",
        "INV-PTFREE",
        18,
        38,
    ),
    (
        "switch_mm_flush",
        "should_flush_ignores_switching",
        Some("N5"),
        "sc",
        "INV-STALE",
        26,
        1180,
    ),
    (
        "batch_unmap",
        "batch_flush_gen_zero",
        Some("N8"),
        "sc",
        "INV-STALE",
        22,
        395,
    ),
    (
        "switch_mm_flush",
        "inc_tlb_gen_after_ipis",
        Some("O1"),
        "sc",
        "INV-STALE",
        26,
        962,
    ),
    (
        "switch_mm_flush_v5",
        "inc_tlb_gen_after_ipis",
        Some("O1"),
        "sc",
        "INV-STALE",
        22,
        639,
    ),
    (
        "symmetric_flushers",
        "inc_tlb_gen_after_ipis",
        Some("O1"),
        "sc",
        "INV-STALE",
        52,
        27413,
    ),
    (
        "smp_call_concurrent",
        "inc_tlb_gen_after_ipis",
        Some("O1"),
        "sc",
        "INV-STALE",
        37,
        73067,
    ),
    (
        "switch_mm_flush_v5",
        "switch_mm_gen_before_cpumask",
        None,
        "sc",
        "INV-STALE",
        22,
        770,
    ),
    (
        "switch_mm_flush",
        "switch_mm_gen_before_cpumask",
        None,
        "tso",
        "INV-STALE",
        26,
        2229,
    ),
    (
        "flush_catchup",
        "partial_flush_when_full_owed",
        None,
        "sc",
        "INV-STALE",
        49,
        46651,
    ),
    (
        "switch_mm_flush",
        "switch_mm_no_barrier",
        None,
        "tso",
        "INV-STALE",
        26,
        2223,
    ),
    (
        "pv_tlb_flush",
        "pv_set_preempted_clobbers_flush",
        Some("K1"),
        "sc",
        "INV-STALE",
        19,
        682,
    ),
    (
        "pv_tlb_flush",
        "pv_record_steal_time_nonatomic",
        Some("K2"),
        "sc",
        "INV-STALE",
        19,
        910,
    ),
    (
        "kvm_mmio_wrap",
        "memslots_updated_after_gen",
        Some("K6"),
        "sc",
        "INV-MMIO",
        40,
        3988,
    ),
    (
        "kvm_mmio_generation",
        "mmio_cache_in_progress",
        Some("K7"),
        "sc",
        "INV-MMIO",
        19,
        12021,
    ),
    (
        "kvm_slot_zap",
        "remote_flush_or_zap_inverted",
        Some("K10"),
        "sc",
        "INV-FLUSH-OWED",
        24,
        5592,
    ),
    (
        "kvm_slot_zap",
        "remote_flush_or_zap_flush_first",
        None,
        "sc",
        "INV-SLOT",
        60,
        299333,
    ),
    (
        "kvm_zap_yield",
        "slot_zap_rmap_break_without_flush",
        None,
        "sc",
        "INV-FLUSH-OWED",
        20,
        4080,
    ),
];

/// Scenarios where the protocol as the kernel wrote it violates an invariant (documented
/// findings): (scenario, memory model, invariant, counterexample steps, states).
const FINDINGS: &[(&str, &str, &str, usize, u64)] = &[
    ("kvm_mmio_wrap", "sc", "INV-MMIO", 55, 9269),
    // In SMM, the MMIO cache is validated against address space 0's generation.
    ("kvm_smm_mmio", "sc", "INV-MMIO", 32, 1091),
    ("kvm_smm_mmio", "tso", "INV-MMIO", 34, 2201),
    // Seed 004's patch 9 as posted (docs/design/kernel-model.md §5.2's suspected window), alone and with
    // patch 10, under both memory models.
    ("kvm_mtrr_zap_list", "sc", "INV-MEMTYPE", 57, 11264),
    ("kvm_mtrr_zap_list", "tso", "INV-MEMTYPE", 59, 16602),
    ("kvm_mtrr_zap_list_fine", "sc", "INV-MEMTYPE", 54, 7762),
    ("kvm_mtrr_zap_list_fine", "tso", "INV-MEMTYPE", 56, 11442),
];

#[test]
fn every_mutant_is_found_with_a_pinned_counterexample() {
    let mut failures = Vec::new();
    for &(sc, m, _bug, mm, inv, steps, states) in MUTANTS {
        let r = run(sc, Some(m), mm);
        let got = (
            r.verdict.as_str(),
            r.invariant.as_deref().unwrap_or("-"),
            r.counterexample.len(),
            r.states,
        );
        if got != ("violation", inv, steps, states) {
            failures.push(format!(
                "{sc} --mutant {m} ({mm}): got {got:?}, want {:?}",
                ("violation", inv, steps, states)
            ));
        }
        // Steps are numbered 1..n, every one names an actor (a CPU, a vCPU or a host thread
        // of the scenario), the last one names the invariant.
        let threads = host_threads(sc);
        for (i, s) in r.counterexample.iter().enumerate() {
            assert_eq!(s.step, i + 1);
            assert!(
                s.actor.starts_with("cpu")
                    || s.actor.starts_with("vcpu")
                    || threads.contains(&s.actor),
                "{s:?}"
            );
            // Every step says what it did, not only where it is: a frame's or a task's name
            // alone (`switch_mm_irqs_off`, `worker (kthread)`) is a step with no text.
            // (A host thread's own op, with no frame under it, is its text alone.)
            let host_op = threads.contains(&s.actor) && s.text.contains('(');
            if !(s.text.contains(": ")
                || host_op
                || s.text.starts_with("take CALL_FUNCTION IPI")
                || s.text.starts_with("store buffer drains"))
            {
                failures.push(format!(
                    "{sc}/{m}: step {} says nothing: {:?}",
                    s.step, s.text
                ));
            }
        }
        if let Some(last) = r.counterexample.last() {
            assert!(last.text.contains(inv), "{sc}/{m}: last step {last:?}");
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The names of the scenario's `[[kvm.threads]]`.
fn host_threads(sc: &str) -> Vec<String> {
    let s = shootdown_checker::Scenario::load(&scenario(sc)).unwrap();
    s.file
        .kvm
        .map(|k| k.threads.into_iter().map(|t| t.name).collect())
        .unwrap_or_default()
}

#[test]
fn documented_findings_are_found_in_the_unmutated_protocol() {
    let infos = shootdown_checker::list(&scenarios()).unwrap();
    for &(sc, mm, inv, steps, states) in FINDINGS {
        let r = run(sc, None, mm);
        assert_eq!(
            (
                r.verdict.as_str(),
                r.invariant.as_deref(),
                r.counterexample.len(),
                r.states
            ),
            ("violation", Some(inv), steps, states),
            "{sc} ({mm})"
        );
        let info = infos.iter().find(|i| i.scenario == sc).unwrap();
        assert_eq!(info.finding.as_ref().map(|f| f.expect.as_str()), Some(inv));
    }
    // Every scenario that declares a finding is pinned here.
    for info in &infos {
        if info.finding.is_some() {
            assert!(
                FINDINGS.iter().any(|f| f.0 == info.scenario),
                "{}",
                info.scenario
            );
        }
    }
}

#[test]
fn kvm_counterexamples_tell_the_story() {
    // K6: the generation is stored before the wrap's zap; the walk finds the stale SPTE.
    let r = run("kvm_mmio_wrap", Some("memslots_updated_after_gen"), "sc");
    let all: Vec<&str> = r.counterexample.iter().map(|s| s.text.as_str()).collect();
    let all = all.join("\n");
    let store = all.find("slots->generation = 4").expect(&all);
    let check = all
        .find("check_mmio_spte: generation 4 matches")
        .expect(&all);
    assert!(store < check, "{all}");
    // K7: the MMIO cache entry made mid-update still hits during the update.
    let r = run("kvm_mmio_generation", Some("mmio_cache_in_progress"), "sc");
    let all: Vec<&str> = r.counterexample.iter().map(|s| s.text.as_str()).collect();
    let all = all.join("\n");
    assert!(
        all.contains("vcpu_cache_mmio_info(gfn 0x300, gen 0 | IN_PROGRESS)"),
        "{all}"
    );
    assert!(all.contains("mmio_info_in_cache(gfn 0x300): hit"), "{all}");
    // K10: the zap bails out of the flush-or-zap with the pages neither flushed nor freed.
    let r = run("kvm_slot_zap", Some("remote_flush_or_zap_inverted"), "sc");
    assert_eq!(r.counterexample.last().unwrap().actor, "qemu");
    assert!(r.detail.as_deref().unwrap().contains("mmu_lock released"));
}

#[test]
fn every_catalog_mutant_and_both_extra_mutants_are_covered() {
    let names: Vec<&str> = MUTANTS.iter().map(|m| m.1).collect();
    for (n, _) in shootdown_linux::options::MUTANT_NAMES {
        assert!(names.contains(n), "mutant {n} has no pinned scenario");
    }
    for bug in [
        "N1", "N3", "N5", "N8", "O1", "K1", "K2", "K6", "K7", "K10", "K12", "K14", "K15", "A1",
        "A2", "A3", "A4", "A5", "A6",
    ] {
        assert!(MUTANTS.iter().any(|m| m.2 == Some(bug)), "{bug}");
    }
}

#[test]
fn scenario_files_list_the_mutants_the_tests_pin() {
    // Every (scenario, mutant) pinned here is declared by its scenario with the same
    // expectation, and every declared mutant with an `expect` is pinned here.
    let infos = shootdown_checker::list(&scenarios()).unwrap();
    for &(sc, m, bug, mm, inv, _, _) in MUTANTS {
        let info = infos
            .iter()
            .find(|i| i.scenario == sc)
            .unwrap_or_else(|| panic!("{sc}"));
        let mi = info
            .mutants
            .iter()
            .find(|x| x.name == m)
            .unwrap_or_else(|| panic!("{sc}: {m}"));
        assert_eq!(mi.bug.as_deref(), bug, "{sc}/{m}");
        assert_eq!(mi.memory_model, mm, "{sc}/{m}");
        assert_eq!(mi.expect.as_deref(), Some(inv), "{sc}/{m}");
    }
    for info in &infos {
        for mi in &info.mutants {
            // The 3-CPU catch-up scenario is pinned by an #[ignore]d test (minutes).
            if mi.expect.is_some() && info.scenario != "flush_catchup_3cpu" {
                assert!(
                    MUTANTS
                        .iter()
                        .any(|x| x.0 == info.scenario && x.1 == mi.name),
                    "{}/{} is declared but not pinned",
                    info.scenario,
                    mi.name
                );
            }
        }
    }
}

#[test]
fn sc_only_mutants_need_tso() {
    // The store-buffer bugs hide under sequential consistency.
    for m in ["switch_mm_no_barrier", "switch_mm_gen_before_cpumask"] {
        let r = run("switch_mm_flush", Some(m), "sc");
        assert_eq!(r.verdict, "verified", "{m}");
    }
}

#[test]
fn counterexample_reads_in_kernel_terms() {
    let r = run(
        "switch_mm_flush",
        Some("should_flush_ignores_switching"),
        "sc",
    );
    let text: Vec<&str> = r.counterexample.iter().map(|s| s.text.as_str()).collect();
    let all = text.join("\n");
    assert!(all.contains("loaded_mm = LOADED_MM_SWITCHING"), "{all}");
    assert!(all.contains("should_flush_tlb(cpu1) = false"), "{all}");
    assert!(all.contains("NOFLUSH"), "{all}");
    let t = r.to_text();
    assert!(t.starts_with("verdict: violation (INV-STALE)\n"), "{t}");
    assert!(t.contains("   1. cpu"), "{t}");
}

#[test]
fn cve_2019_3016_counterexamples_tell_the_story() {
    // K1: the second vcpu_put rewrites the byte the guest had set FLUSH_TLB in.
    let r = run(
        "pv_tlb_flush",
        Some("pv_set_preempted_clobbers_flush"),
        "sc",
    );
    let all: Vec<&str> = r.counterexample.iter().map(|s| s.text.as_str()).collect();
    let all = all.join("\n");
    assert!(all.contains("vcpu1 skipped"), "{all}");
    assert!(
        all.contains("st[1].preempted = PREEMPTED (was 0x3)"),
        "{all}"
    );
    assert!(
        all.contains("xchg(st[1].preempted, 0) = 0x1, no flush"),
        "{all}"
    );
    assert!(r.counterexample.iter().any(|s| s.actor == "vcpu1"));
    // K2: the guest's cmpxchg lands between the host's read and its write-back.
    let r = run("pv_tlb_flush", Some("pv_record_steal_time_nonatomic"), "sc");
    let all: Vec<&str> = r.counterexample.iter().map(|s| s.text.as_str()).collect();
    let all = all.join("\n");
    let read = all.find("host copy.preempted = 0x1").expect(&all);
    let cas = all.find("succeeds: vcpu1 skipped").expect(&all);
    let back = all.find("st[1].preempted = 0 (was 0x3)").expect(&all);
    assert!(read < cas && cas < back, "{all}");
    // Both are found under TSO too, with the same shortest length.
    for m in [
        "pv_set_preempted_clobbers_flush",
        "pv_record_steal_time_nonatomic",
    ] {
        let r = run("pv_tlb_flush", Some(m), "tso");
        assert_eq!(
            (r.verdict.as_str(), r.counterexample.len()),
            ("violation", 19),
            "{m}"
        );
    }
}

#[test]
fn ple_yield_counterexample_tells_the_story() {
    // vcpu1's PLE exit marks it preempted and yields to the preempted vcpu0, but stays; vcpu0,
    // run again, skips vcpu1's IPI for the flag; vcpu1 never passes record_steal_time.
    let r = run("ple_pv_flush", Some("ple_yield_marks_preempted"), "sc");
    let all: Vec<&str> = r.counterexample.iter().map(|s| s.text.as_str()).collect();
    let all = all.join("\n");
    let exit = all
        .find("PLE exit (vcpu1): handle_pause; kvm_steal_time_set_preempted(vcpu1): st[1].preempted = PREEMPTED")
        .expect(&all);
    let stays = all
        .find("kvm_vcpu_on_spin yields to vcpu0; schedule() returns")
        .expect(&all);
    let skip = all.find("succeeds: vcpu1 skipped").expect(&all);
    assert!(exit < stays && stays < skip, "{all}");
    assert!(!all.contains("record_steal_time: xchg(st[1]"), "{all}");
    // Found under TSO too, one step longer: a buffered store must drain before the flag is
    // read.
    let t = run("ple_pv_flush", Some("ple_yield_marks_preempted"), "tso");
    assert_eq!(
        (t.verdict.as_str(), t.counterexample.len()),
        ("violation", 52)
    );
}

/// A counterexample starts after the scenario's setup, which runs with the mutant on: the
/// report prints those steps first, every one with its text.
#[test]
fn counterexamples_print_the_setup_steps_they_start_from() {
    let r = run(
        "reclaim_madvise",
        Some("no_flush_tlb_batched_pending"),
        "sc",
    );
    assert_eq!(r.verdict, "violation");
    // cpu0 to the reclaim task, cpu1 to the user task, then its first touch.
    assert!(r.setup.len() >= 3, "{:?}", r.setup);
    assert!(r.setup.iter().all(|s| !s.text.trim().is_empty()));
    assert!(
        r.setup.iter().any(|s| s.text.contains("fill TLB")),
        "{:?}",
        r.setup
    );
    let text = r.to_text();
    let setup_at = text.find("setup (deterministic").expect(&text);
    let cex_at = text.find("counterexample:").expect(&text);
    assert!(setup_at < cex_at, "{text}");
    // Every step of every pinned mutant's counterexample and setup has a text.
    for &(sc, m, _, mm, _, _, _) in MUTANTS {
        let r = run(sc, Some(m), mm);
        for s in r.setup.iter().chain(&r.counterexample) {
            assert!(!s.text.trim().is_empty(), "{sc}/{m}: blank step {s:?}");
        }
    }
}

#[test]
fn docs_results_table_shows_the_pinned_counterexamples() {
    // docs/checker.md's "Results" table: each mutant (and finding) row shows the steps and
    // states pinned here, or marks its count as measured once, not pinned (†).
    let mut bad = Vec::new();
    for row in docs_results_rows() {
        for mm in &row.memory_models {
            let pin = match (&row.mutant, row.finding) {
                (Some(m), _) => MUTANTS
                    .iter()
                    .find(|p| p.0 == row.scenario && p.1 == m && p.3 == mm)
                    .map(|p| (p.5, p.6)),
                (None, true) => FINDINGS
                    .iter()
                    .find(|p| p.0 == row.scenario && p.1 == mm)
                    .map(|p| (p.3, p.4)),
                (None, false) => continue,
            };
            match (pin, row.steps, row.states) {
                (Some((s, n)), Some(ds), Some(dn)) if (s, n) == (ds, dn) && row.pinned => {}
                (None, _, _) if !row.pinned => {}
                (p, ds, dn) => bad.push(format!(
                    "{} {:?} ({mm}): docs {ds:?} steps / {dn:?} states{}, pinned {p:?}",
                    row.scenario,
                    row.mutant,
                    if row.pinned { "" } else { "†" }
                )),
            }
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

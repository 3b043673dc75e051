//! The fixed protocols verify exhaustively, with pinned state and transition counts, under
//! sequential consistency and x86-TSO. `flush_catchup` is the 2 CPUs × 2 pages × 2 concurrent
//! flushes configuration; the `smp_call_*` scenarios have 3 CPUs.
mod common;
use common::*;

/// (scenario, memory model, states, transitions)
const VERIFIED: &[(&str, &str, u64, u64)] = &[
    ("batch_unmap", "sc", 532, 952),
    ("batch_unmap", "tso", 1016, 2382),
    ("lazy_munmap", "sc", 85, 137),
    ("lazy_munmap", "tso", 167, 370),
    ("switch_mm_flush", "sc", 1297, 2490),
    ("switch_mm_flush", "tso", 2559, 6375),
    ("switch_mm_flush_v5", "sc", 1275, 2447),
    ("switch_mm_flush_v5", "tso", 2455, 6099),
    ("flush_catchup", "sc", 32345, 68444),
    ("flush_catchup", "tso", 46297, 110687),
    ("pv_tlb_flush", "sc", 1379, 3228),
    ("pv_tlb_flush", "tso", 1451, 3427),
    ("madvise_nested", "sc", 120973, 258780),
    ("madvise_nested", "tso", 167912, 400527),
    ("reclaim_madvise", "sc", 8914, 18836),
    ("reclaim_madvise", "tso", 13321, 32060),
    ("khugepaged_collapse", "sc", 49, 58),
    ("khugepaged_collapse", "tso", 96, 179),
    ("thp_zap", "sc", 10211, 19760),
    ("thp_zap", "tso", 16831, 39577),
    // A flush IPI waiting out an lru_lock section (interrupts off).
    ("lru_lock_flush", "sc", 2034, 4155),
    ("lru_lock_flush", "tso", 3762, 9526),
    // A freed frame, reused by a fault, while another CPU cached its page (INV-FREEPAGE).
    ("free_page_reuse", "sc", 774, 1366),
    ("free_page_reuse", "tso", 1339, 3066),
    // perf NMIs reading the user stack while a CPU switches mms (INV-CTX).
    ("nmi_uaccess", "sc", 464, 934),
    ("nmi_uaccess", "tso", 1807, 5519),
    // Global kernel mappings and flush_tlb_kernel_range.
    ("kernel_global", "sc", 315, 630),
    ("kernel_global", "tso", 710, 1792),
    // VMAs: mremap against truncate (CVE-2018-18281's race), migrate_vma against madvise,
    // a driver revoking a VM_PFNMAP mapping.
    ("mremap_truncate", "sc", 6388, 12449),
    ("mremap_truncate", "tso", 13027, 32117),
    ("migrate_vma_madvise", "sc", 3694, 7182),
    ("migrate_vma_madvise", "tso", 6705, 15915),
    ("pfnmap_revoke", "sc", 12489, 25879),
    ("pfnmap_revoke", "tso", 17527, 40899),
    // The TDP MMU's MMU notifier (write lock, roots of both address spaces) against faults.
    ("kvm_tdp_notifier", "sc", 38335, 107738),
    ("kvm_tdp_notifier", "tso", 51674, 161263),
    // An EFI runtime call on efi_mm while another thread zaps, with a perf NMI around it.
    ("efi_runtime", "sc", 4761, 11073),
    ("efi_runtime", "tso", 8998, 24912),
    // text_poke through poking_mm, a temporary mm, with a user flush and an NMI around it.
    ("text_poke", "sc", 120079, 266414),
    ("text_poke", "tso", 182263, 463288),
    // A kernel thread borrowing an mm (kthread_use_mm) while its owner zaps and exits.
    ("kthread_use_mm", "sc", 9913, 23344),
    ("kthread_use_mm", "tso", 23103, 68379),
    // PLE exits and directed yield while a PV flush waits on a preempted vCPU.
    ("ple_pv_flush", "sc", 9554, 19654),
    ("ple_pv_flush", "tso", 10350, 22001),
    // A CPU switching back into an mm whose cpumask still holds its bit (v6.13+'s lazy
    // mm_cpumask) while another CPU flushes (83b0177a6c48's barrier).
    ("lazy_cpumask_switch", "sc", 1475, 2867),
    ("lazy_cpumask_switch", "tso", 3012, 7384),
    // Symmetry reduction (cpu0 and cpu1 interchangeable).
    ("symmetric_flushers", "sc", 62533, 133544),
    ("symmetric_flushers", "tso", 87030, 207213),
];

const THREE_CPUS_SC: &[(&str, &str, u64, u64)] = &[
    ("smp_call_concurrent", "sc", 371566, 1132216),
    ("smp_call_remote_then_local", "sc", 201642, 558570),
];
const THREE_CPUS_TSO: &[(&str, &str, u64, u64)] =
    &[("smp_call_remote_then_local", "tso", 604131, 2213137)];
const CONCURRENT_TSO: &[(&str, &str, u64, u64)] =
    &[("smp_call_concurrent", "tso", 1112842, 4393951)];
const KVM_MMU_SC: &[(&str, &str, u64, u64)] = &[
    ("kvm_slot_zap", "sc", 977317, 2598999),
    ("kvm_mmio_generation", "sc", 211029, 551465),
    ("kvm_zap_yield", "sc", 182989, 443394),
    ("kvm_fast_invalidate", "sc", 13902, 24489),
];
const KVM_MMU_TSO: &[(&str, &str, u64, u64)] = &[
    ("kvm_mmio_generation", "tso", 569615, 1986920),
    ("kvm_zap_yield", "tso", 348902, 1037249),
    ("kvm_fast_invalidate", "tso", 26445, 63166),
];
const TDP_MMU: &[(&str, &str, u64, u64)] = &[
    ("kvm_tdp_zap_roots", "sc", 11311, 20974),
    ("kvm_tdp_zap_roots", "tso", 15523, 33343),
    ("kvm_mtrr_cd_toggle", "sc", 11123, 20358),
    ("kvm_mtrr_cd_toggle", "tso", 15185, 32082),
    ("kvm_mtrr_cd_toggle_shared", "sc", 15059, 28618),
    ("kvm_mtrr_cd_toggle_shared", "tso", 20071, 43506),
    ("kvm_noncoherent_fault", "sc", 2938, 5382),
    ("kvm_noncoherent_fault", "tso", 3891, 8116),
    ("kvm_tdp_zap_tables", "sc", 3657, 6865),
    ("kvm_tdp_zap_tables", "tso", 4515, 9416),
    ("kvm_tdp_zap_all_yield", "sc", 16231, 30829),
    ("kvm_tdp_zap_all_yield", "tso", 19810, 40972),
    ("kvm_tdp_fault_enomem", "sc", 7574, 14246),
    ("kvm_tdp_fault_enomem", "tso", 10982, 24424),
    ("kvm_dirty_log", "sc", 64358, 123213),
    ("kvm_dirty_log", "tso", 78837, 161862),
    ("kvm_dirty_log_manual", "sc", 16129, 30900),
    ("kvm_dirty_log_manual", "tso", 22100, 47672),
    ("kvm_pml", "sc", 36451, 72022),
    ("kvm_pml", "tso", 49973, 110750),
    ("kvm_dirty_log_enable", "sc", 4339, 8173),
    ("kvm_dirty_log_enable", "tso", 6028, 12896),
    ("kvm_dirty_log_initially_set", "sc", 16548, 31687),
    ("kvm_dirty_log_initially_set", "tso", 23325, 51134),
];
/// Shadow paging (EPT off): the guest's INVLPG syncing an unsync page (`kvm_shadow`), and the
/// host's flush after a PV flush syncing it (`kvm_shadow_pv_flush`). More in `tests/shadow.rs`.
const SHADOW: &[(&str, &str, u64, u64)] = &[
    ("kvm_shadow", "sc", 3329, 6415),
    ("kvm_shadow", "tso", 5703, 14044),
    ("kvm_shadow_pv_flush", "sc", 14955, 30596),
    ("kvm_shadow_pv_flush", "tso", 18253, 41412),
];
/// Shadow paging and an MMU notifier, in the `tlbs_dirty` era: the reclaim of a frame a sync
/// dropped without a flush (`kvm_shadow_notifier`; v5.15's form in `tests/shadow.rs`).
const SHADOW_NOTIFIER: &[(&str, &str, u64, u64)] = &[
    ("kvm_shadow_notifier", "sc", 1063706, 3040799),
    ("kvm_shadow_notifier", "tso", 1651107, 5206511),
];
/// NX huge pages with the TDP MMU: the recovery worker against a fetch's split and a reader
/// (`kvm_nx_recovery`), and the split's flush against a reclaim of the frame beside it
/// (`kvm_nx_split`). The shadow MMU's forms: `tests/nx_huge_pages.rs`.
const NX_HUGE_PAGES: &[(&str, &str, u64, u64)] = &[
    ("kvm_nx_recovery", "sc", 228411, 645702),
    ("kvm_nx_recovery", "tso", 324633, 1013206),
    ("kvm_nx_split", "sc", 629902, 1804153),
    ("kvm_nx_split", "tso", 864732, 2733268),
];
/// SMM (the shadow MMU): a vCPU entering and leaving SMM around SMRAM, against a normal-mode
/// vCPU and a reclaim (`kvm_smm`). The TDP MMU's form: `tests/smm.rs`.
const SMM: &[(&str, &str, u64, u64)] = &[
    ("kvm_smm", "sc", 232126, 630651),
    ("kvm_smm", "tso", 349681, 1046233),
];
/// The steal-time cache (mainline's hva cache) against a reclaim of its page and the deletion
/// of its memslot (`kvm_steal_time_cache`). The v5.6 form: `tests/st_cache.rs`.
const STEAL_TIME_CACHE: &[(&str, &str, u64, u64)] = &[
    ("kvm_steal_time_cache", "sc", 350627, 618270),
    ("kvm_steal_time_cache", "tso", 629579, 1514845),
];
/// Global ASIDs and INVLPGB (v6.15+): an mm's transition to its global ASID against a CPU
/// running it (`global_asid`), against a CPU switching back into it (`global_asid_switch`),
/// a page-table page freed under a broadcast with a lazy CPU (`global_asid_freed_tables`),
/// and a kernel range flushed by broadcast (`kernel_global_invlpgb`).
const GLOBAL_ASID: &[(&str, &str, u64, u64)] = &[
    ("global_asid", "sc", 3521, 6119),
    ("global_asid", "tso", 7246, 17629),
    ("global_asid_switch", "sc", 34418, 63370),
    ("global_asid_switch", "tso", 78441, 197220),
    ("global_asid_freed_tables", "sc", 33585, 76172),
    ("global_asid_freed_tables", "tso", 79583, 242842),
    // flush_tlb_kernel_range() by INVLPGB (Global entries included), no IPIs.
    ("kernel_global_invlpgb", "sc", 121, 220),
    ("kernel_global_invlpgb", "tso", 308, 791),
];
/// LATR (a research design, `latr.rs`) with `LAZY_MEM_FREE`: a madvise's flush saved for two
/// other CPUs' ticks while they keep using the page (`latr`).
const LATR: &[(&str, &str, u64, u64)] = &[
    ("latr", "sc", 319188, 966340),
    ("latr", "tso", 695518, 2552850),
];
/// Amit et al.'s designs after the concurrent flushes (research designs, `smp.rs`, `tlb.rs`):
/// early acknowledgement against perf's NMI (`early_ack`) and with a page-table page freed
/// under a lazy CPU (`early_ack_freed_tables`), and in-context PTI user flushes with two
/// deferred ranges to merge (`pti_deferred_user_flush`); Shoot4U's host-side flush of a
/// preemptible vCPU (`shoot4u`).
const FLUSH_DESIGNS: &[(&str, &str, u64, u64)] = &[
    ("early_ack", "sc", 5553, 12833),
    ("early_ack", "tso", 8949, 24177),
    ("early_ack_freed_tables", "sc", 85, 137),
    ("early_ack_freed_tables", "tso", 167, 370),
    ("pti_deferred_user_flush", "sc", 6414, 12742),
    ("pti_deferred_user_flush", "tso", 9887, 22602),
    // Shoot4U (VEE'16): the host flushes a preemptible target vCPU through a host IPI.
    ("shoot4u", "sc", 581, 1352),
    ("shoot4u", "tso", 633, 1505),
];
/// The Hyper-V enlightened flush on KVM (v6.3+, `hv_tlb_flush`): a flush request of a
/// preemptible target vCPU, kicked and waited for while it is in the guest; a lazy target
/// under a flush that frees a page table.
const HYPERV: &[(&str, &str, u64, u64)] = &[
    ("hv_tlb_flush", "sc", 1200, 2665),
    ("hv_tlb_flush", "tso", 1641, 4122),
    ("hv_tlb_flush_lazy", "sc", 240, 601),
    ("hv_tlb_flush_lazy", "tso", 269, 702),
];
const SLOT_ZAP_TSO: &[(&str, &str, u64, u64)] = &[("kvm_slot_zap", "tso", 2150463, 7346267)];
const PV_3VCPU_TSO: &[(&str, &str, u64, u64)] = &[("pv_tlb_flush_3vcpu", "tso", 507932, 2698951)];

/// Verified in `three_cpu_catchup_verifies_and_its_mutant_is_found` (#[ignore]d: minutes); its
/// transitions are not compared there.
const THREE_CPU_CATCHUP: &[(&str, &str, u64, u64)] = &[("flush_catchup_3cpu", "sc", 11_718_293, 0)];

/// Every pinned verification above, for the docs' results table.
const ALL: &[&[(&str, &str, u64, u64)]] = &[
    VERIFIED,
    THREE_CPUS_SC,
    THREE_CPUS_TSO,
    CONCURRENT_TSO,
    KVM_MMU_SC,
    KVM_MMU_TSO,
    TDP_MMU,
    SHADOW,
    SHADOW_NOTIFIER,
    NX_HUGE_PAGES,
    SMM,
    STEAL_TIME_CACHE,
    GLOBAL_ASID,
    LATR,
    FLUSH_DESIGNS,
    HYPERV,
    SLOT_ZAP_TSO,
    PV_3VCPU_TSO,
    THREE_CPU_CATCHUP,
];

fn verify(list: &[(&str, &str, u64, u64)]) {
    let mut bad = Vec::new();
    for &(sc, mm, states, transitions) in list {
        let r = run(sc, None, mm);
        let got = (r.verdict.as_str(), r.states, r.transitions);
        if got != ("verified", states, transitions) {
            bad.push(format!(
                "{sc} ({mm}): got {got:?}, want {:?}",
                ("verified", states, transitions)
            ));
        }
        assert!(r.counterexample.is_empty());
        assert!(r.invariant.is_none());
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

#[test]
fn fixed_protocols_verify_two_cpus() {
    verify(VERIFIED);
}

#[test]
fn fixed_protocols_verify_three_cpus_sc() {
    verify(THREE_CPUS_SC);
}

#[test]
fn fixed_protocols_verify_three_cpus_tso() {
    verify(THREE_CPUS_TSO);
}

#[test]
fn fixed_concurrent_smp_call_verifies_three_cpus_tso() {
    verify(CONCURRENT_TSO);
}

/// The KVM MMU scenarios: memslot DELETE with the slot-only zap racing two vCPUs' faults
/// (`kvm_slot_zap`), a memslot CREATE over a frame two vCPUs reach as MMIO
/// (`kvm_mmio_generation`), and the slot-only zap's lock break racing an MMU-notifier
/// invalidation (`kvm_zap_yield`: one vCPU and two host threads; two vCPUs exceed 6M states),
/// v5.0's fast invalidate breaking the lock between batches of obsolete pages while the vCPU
/// reloads (`kvm_fast_invalidate`).
#[test]
fn fixed_kvm_mmu_verifies_sc() {
    verify(KVM_MMU_SC);
}

#[test]
fn fixed_kvm_mmio_and_zap_yield_verify_tso() {
    verify(KVM_MMU_TSO);
}

/// Seed 004's TDP MMU: a zap over two roots with a fault contending (`kvm_tdp_zap_roots`),
/// two vCPUs clearing CR0.CD at once with Base2's write-lock zaps and with patch 12's read-lock
/// zaps, and a non-coherent device's assignment racing a fault (`kvm_noncoherent_fault`).
#[test]
fn fixed_tdp_mmu_and_memtype_zaps_verify() {
    verify(TDP_MMU);
}

#[test]
fn fixed_nx_huge_pages_verify() {
    verify(NX_HUGE_PAGES);
}

#[test]
fn fixed_shadow_paging_verifies() {
    verify(SHADOW);
}

#[test]
fn fixed_shadow_paging_under_an_mmu_notifier_verifies() {
    verify(SHADOW_NOTIFIER);
}

#[test]
fn fixed_smm_verifies() {
    verify(SMM);
}

#[test]
fn fixed_steal_time_cache_verifies() {
    verify(STEAL_TIME_CACHE);
}

#[test]
fn fixed_global_asids_verify() {
    verify(GLOBAL_ASID);
}

#[test]
fn fixed_latr_verifies() {
    verify(LATR);
}

#[test]
fn fixed_flush_designs_verify() {
    verify(FLUSH_DESIGNS);
}

#[test]
fn hyperv_flush_verifies() {
    verify(HYPERV);
}

#[test]
fn fixed_kvm_slot_zap_verifies_tso() {
    verify(SLOT_ZAP_TSO);
}

#[test]
fn state_bound_reports_bound_reached() {
    let r = shootdown_checker::check(
        &scenario("flush_catchup"),
        None,
        "sc",
        Some(1000),
        None,
        0,
        "bfs",
        true,
        &[],
    )
    .unwrap();
    assert_eq!(r.verdict, "bound-reached");
    assert_eq!(r.states, 1000);
    assert!(r.counterexample.is_empty());
}

#[test]
fn exploration_is_deterministic() {
    for (sc, m, mm) in [
        ("flush_catchup", None, "tso"),
        ("flush_catchup", Some("partial_flush_when_full_owed"), "sc"),
        ("switch_mm_flush", Some("switch_mm_no_barrier"), "tso"),
    ] {
        let a = run(sc, m, mm);
        let b = run(sc, m, mm);
        assert_eq!(
            (a.states, a.transitions, &a.verdict),
            (b.states, b.transitions, &b.verdict)
        );
        assert_eq!(a.counterexample, b.counterexample);
    }
}

#[test]
fn json_has_the_documented_fields() {
    let r = run("lazy_munmap", Some("lazy_ignores_freed_tables"), "sc");
    let v: serde_json::Value = serde_json::from_str(&r.to_json()).unwrap();
    for k in [
        "scenario",
        "mutant",
        "memory_model",
        "verdict",
        "invariant",
        "states",
        "transitions",
        "seconds",
        "counterexample",
    ] {
        assert!(v.get(k).is_some(), "missing {k}");
    }
    assert_eq!(v["scenario"], "lazy_munmap");
    assert_eq!(v["mutant"], "lazy_ignores_freed_tables");
    assert_eq!(v["memory_model"], "sc");
    assert_eq!(v["verdict"], "violation");
    assert_eq!(v["invariant"], "INV-PTFREE");
    let ce = v["counterexample"].as_array().unwrap();
    assert_eq!(ce[0]["step"], 1);
    assert!(ce[0]["actor"].as_str().unwrap().starts_with("cpu"));
    assert!(ce[0]["text"].is_string());
    let fixed = run("lazy_munmap", None, "tso");
    let v: serde_json::Value = serde_json::from_str(&fixed.to_json()).unwrap();
    assert_eq!(v["verdict"], "verified");
    assert!(v["invariant"].is_null());
    assert!(v["mutant"].is_null());
}

/// The 3-CPU, 2-page, 2-concurrent-flush configuration: 9,262,813 states under SC (~5 min in
/// release); too slow for the default suite. Run with `cargo test --release -- --ignored`.
#[test]
#[ignore]
fn three_cpu_catchup_verifies_and_its_mutant_is_found() {
    let r = run_big("flush_catchup_3cpu", None, "sc");
    assert_eq!(
        (r.verdict.as_str(), r.states),
        ("verified", THREE_CPU_CATCHUP[0].2)
    );
    let r = run_big(
        "flush_catchup_3cpu",
        Some("partial_flush_when_full_owed"),
        "sc",
    );
    assert_eq!(r.verdict, "violation");
    assert_eq!(r.invariant.as_deref(), Some("INV-STALE"));
}

fn run_big(name: &str, mutant: Option<&str>, mm: &str) -> shootdown_checker::CheckResult {
    shootdown_checker::check(
        &scenario(name),
        mutant,
        mm,
        Some(50_000_000),
        None,
        0,
        "bfs",
        true,
        &[],
    )
    .unwrap()
}

/// KVM PV TLB flush with the CVE-2019-3016 fixes: 3 target vCPUs x 2 flush rounds under x86-TSO,
/// the host preempting, resuming and ioctl-putting every target at any point (unbounded).
#[test]
fn fixed_pv_tlb_flush_verifies_three_targets_two_rounds_tso() {
    verify(PV_3VCPU_TSO);
}

#[test]
fn docs_results_table_shows_the_pinned_verifications() {
    // docs/checker.md's "Results" table: each fixed-protocol row shows the states pinned here,
    // or marks its count as measured once, not pinned (†).
    let mut bad = Vec::new();
    for row in docs_results_rows() {
        if row.mutant.is_some() || row.finding {
            continue;
        }
        for mm in &row.memory_models {
            let pin = ALL
                .iter()
                .flat_map(|l| l.iter())
                .find(|p| p.0 == row.scenario && p.1 == mm);
            match (pin, row.states) {
                (Some(p), Some(s)) if p.2 == s && row.pinned => {}
                (None, _) if !row.pinned => {}
                (p, s) => bad.push(format!(
                    "{} ({mm}): docs {s:?}{}, pinned {:?}",
                    row.scenario,
                    if row.pinned { "" } else { "†" },
                    p.map(|p| p.2)
                )),
            }
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

//! The design comparisons (`experiments/designs/`): will-it-scale's `tlb_flush2` and
//! `tlb_flush3` and `pthread_mmap` on the 2-socket EPYC 7763 profile, sysbench on DAX under PTI,
//! ebizzy in overcommitted VMs. The oracle watches every run; the tests pin what each design
//! changes in the mechanism (who is interrupted, who acknowledges, what is deferred), not its
//! throughput.

use shootdown_experiments::{load, run_points};
use std::path::{Path, PathBuf};

fn shipped(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../experiments/designs")
        .join(format!("{name}.toml"))
}

/// Per variant of the experiment (quick, with `sets`): its value and the named counters, in
/// order; the oracle found nothing in any run.
fn quick_points(name: &str, sets: &[&str], keys: &[&str]) -> Vec<(String, f64, Vec<u64>)> {
    let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
    let exp = load(&shipped(name), &sets).unwrap();
    let all: Vec<usize> = (0..exp.points(true).len()).collect();
    let r = run_points(&exp, true, &all, 1).unwrap();
    r.iter()
        .map(|p| {
            assert!(p.violations.is_empty(), "{}: {:?}", p.variant, p.violations);
            let c = |k: &str| p.counters.get(k).copied().unwrap_or(0);
            (
                p.variant.clone(),
                p.value,
                keys.iter().map(|k| c(k)).collect(),
            )
        })
        .collect()
}

/// Per variant of the experiment at 8 threads (quick): (iterations/s, flush IPIs received,
/// INVLPGBs, LATR's saved flushes, LATR's ticks, early acknowledgements).
fn at_8_threads(name: &str) -> Vec<(String, f64, u64, u64, u64, u64, u64)> {
    let keys = [
        "tlb_shootdowns",
        "tlb.invlpgb",
        "tlb.latr_saved",
        "tlb.latr_ticks",
        "smp.early_acks",
    ];
    quick_points(name, &["experiment.quick_rows=[8]"], &keys)
        .into_iter()
        .map(|(v, x, c)| (v, x, c[0], c[1], c[2], c[3], c[4]))
        .collect()
}

#[test]
fn tlb_flush2_threads_broadcast_and_latr_replace_the_ipis() {
    let r = at_8_threads("will-it-scale-tlb-flush2");
    assert_eq!(r.len(), 6);
    for (variant, value, ipis, invlpgb, saved, ticks, acks) in &r {
        assert!(*value > 0.0, "{variant}");
        // Only the early-ack variant acknowledges early: every IPI flush it takes that frees
        // no page table (overlapping madvises' nested gathers do free: synchronous).
        if variant == "early_ack" {
            assert!(
                *acks > 0 && acks <= ipis,
                "{variant}: {acks} early acks, {ipis} IPIs"
            );
        } else {
            assert_eq!(*acks, 0, "{variant}");
        }
        if variant == "latr" {
            // Every madvise's flush is saved (until the ring of 256 fills between two ticks:
            // then IPIs); each other CPU drains at its ticks.
            assert!(*saved > 256, "{variant}: {saved} saved");
            assert!(*ticks >= 7, "{variant}: {ticks} ticks");
            assert_eq!(*invlpgb, 0);
            continue;
        }
        assert_eq!((*saved, *ticks), (0, 0), "{variant}");
        if variant == "v6_15" {
            // After the global ASID is assigned, flushes are INVLPGB + TLBSYNC: the IPIs left
            // are the first flushes' and the ASID transition's.
            assert!(*invlpgb > 100, "{variant}: {invlpgb} INVLPGBs");
            assert!(*ipis * 10 < r[0].2, "{variant}: {ipis} IPIs vs {}", r[0].2);
        } else {
            assert_eq!(*invlpgb, 0, "{variant}");
            assert!(
                *ipis > 1000,
                "{variant}: every madvise IPIs the other 7 threads"
            );
        }
    }
}

#[test]
fn tlb_flush3_threads_runs_every_design() {
    let r = at_8_threads("will-it-scale-tlb-flush3");
    assert_eq!(r.len(), 6);
    assert!(r.iter().all(|p| p.1 > 0.0), "{r:?}");
    assert!(r[3].3 > 100, "{r:?}");
    assert!(r[4].4 > 256, "{r:?}");
    // tlb_flush3's overlapping madvises flush with freed_tables (mainline's nested gather):
    // early acknowledgement never applies, and the run is v6.14's, IPI for IPI.
    assert_eq!(r[5].0, "early_ack");
    assert_eq!(r[5].6, 0, "{r:?}");
    assert_eq!((r[5].1, r[5].2), (r[2].1, r[2].2), "{r:?}");
}

#[test]
fn sysbench_under_pti_acknowledges_early_and_defers_user_ranges() {
    let keys = [
        "tlb_shootdowns",
        "smp.early_acks",
        "tlb.user_flush_deferred",
    ];
    let r = quick_points(
        "sysbench-dax-flush-designs",
        &["experiment.quick_rows=[8]"],
        &keys,
    );
    let names: Vec<&str> = r.iter().map(|p| p.0.as_str()).collect();
    assert_eq!(names, ["v5_13", "early_ack", "in_context", "both"]);
    for (variant, value, c) in &r {
        assert!(*value > 0.0 && c[0] > 1000, "{variant}: {c:?}");
        let early = variant == "early_ack" || variant == "both";
        let deferred = variant == "in_context" || variant == "both";
        // Every IPI flush is acknowledged early (DAX writeback frees no page table).
        assert_eq!(c[1], if early { c[0] } else { 0 }, "{variant}: {c:?}");
        assert_eq!(c[2] > 0, deferred, "{variant}: {c:?}");
    }
}

#[test]
fn ebizzy_guests_flush_through_pv_shoot4u_or_hyperv() {
    let keys = [
        "call_function_ipis",
        "kvm.pv_tlb_flush_skipped",
        "smp.early_acks",
        "kvm.shoot4u_hypercalls",
        "kvm.hv_flush_hypercalls",
    ];
    let r = quick_points(
        "ebizzy-overcommit-designs",
        &["experiment.quick_rows=[2]", "quick.workload.measure_ms=5"],
        &keys,
    );
    let names: Vec<&str> = r.iter().map(|p| p.0.as_str()).collect();
    assert_eq!(
        names,
        [
            "ipis",
            "pv_flush",
            "early_ack",
            "pv_flush_early_ack",
            "shoot4u",
            "hv_flush"
        ]
    );
    for (variant, value, c) in &r {
        assert!(*value > 0.0, "{variant}");
        assert_eq!(c[2] > 0, variant.contains("early_ack"), "{variant}: {c:?}");
        // Every remote flush of Shoot4U and of the Hyper-V flush is a hypercall.
        assert_eq!(c[3] > 0, variant == "shoot4u", "{variant}: {c:?}");
        assert_eq!(c[4] > 0, variant == "hv_flush", "{variant}: {c:?}");
    }
    assert!(r[1].2[1] > 0, "PV flush skips preempted vCPUs: {:?}", r[1]);
}

#[test]
fn pthread_mmap_munmaps_free_page_tables_which_latr_holds_and_early_ack_leaves_synchronous() {
    let keys = ["tlb_shootdowns", "tlb.latr_saved", "smp.early_acks"];
    let r = quick_points(
        "pthread-mmap-designs",
        &["experiment.quick_rows=[8]"],
        &keys,
    );
    let names: Vec<&str> = r.iter().map(|p| p.0.as_str()).collect();
    assert_eq!(names, ["v6_14", "v6_15", "latr", "early_ack"]);
    let (v614, latr, early) = (&r[0], &r[2], &r[3]);
    assert!(v614.2[0] > 0, "{v614:?}");
    // LATR saves every munmap's flush: no IPI.
    assert!(latr.2[1] > 0 && latr.2[0] == 0, "{latr:?}");
    // Every flush frees page tables: no early acknowledgement, v6.14's run to the digit.
    assert_eq!(early.2[2], 0, "{early:?}");
    assert_eq!((early.1, early.2[0]), (v614.1, v614.2[0]), "{early:?}");
}

#[test]
fn hackbench_switches_mms_without_a_flush_so_v6_14s_trim_changes_nothing() {
    let keys = [
        "context_switches",
        "sched.wakeup_preemptions",
        "tlb_shootdowns",
        "nr_tlb_remote_flush",
    ];
    // The full run's 100 loops: the quick 20 end before any receiver has lag to preempt with.
    let sets = ["experiment.quick_rows=[1]", "quick.workload.loops=100"];
    let r = quick_points("hackbench-designs", &sets, &keys);
    let names: Vec<&str> = r.iter().map(|p| p.0.as_str()).collect();
    assert_eq!(names, ["v6_12", "v6_13", "v6_14"]);
    for (variant, value, c) in &r {
        assert!(*value > 0.0, "{variant}");
        // Receivers sleep and wake: every CPU switches between processes, and EEVDF lets some
        // woken receivers preempt. Nobody unmaps anything.
        assert!(c[0] > 100 && c[1] > 0, "{variant}: {c:?}");
        assert_eq!((c[2], c[3]), (0, 0), "{variant}: {c:?}");
    }
    // v6.14 trims mm_cpumask only inside a flush: with none, its run is v6.13's to the digit.
    assert_eq!((r[1].1, &r[1].2), (r[2].1, &r[2].2));
}

#[test]
fn ipi_benchmark_broadcasts_with_pv_send_ipi_exit_once_per_call_instead_of_once_per_cluster() {
    let keys = ["call_function_ipis", "kvm.exits", "events"];
    let r = quick_points(
        "ipi-benchmark-designs",
        &["experiment.quick_rows=[64]"],
        &keys,
    );
    let names: Vec<&str> = r.iter().map(|p| p.0.as_str()).collect();
    assert_eq!(
        names,
        [
            "cluster",
            "pv_send_ipi",
            "cluster_posted",
            "pv_send_ipi_posted"
        ]
    );
    let calls = r[0].2[2];
    for (variant, value, c) in &r {
        assert!(*value > 0.0, "{variant}");
        // Every call interrupts the 63 other vCPUs.
        assert_eq!(c[0], 63 * calls, "{variant}: {c:?}");
    }
    // 63 targets in 4 x2APIC clusters of 16: four exiting ICR writes per call, or one
    // hypercall; with or without posted interrupts the difference is the same.
    assert_eq!(r[0].2[1] - r[1].2[1], 3 * calls, "{r:?}");
    assert_eq!(r[2].2[1] - r[3].2[1], 3 * calls, "{r:?}");
    // Posted interrupts deliver to running vCPUs without an exit, so fewer exits.
    assert!(r[2].2[1] < r[0].2[1], "{r:?}");
}

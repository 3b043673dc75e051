//! The design comparisons (`experiments/designs/`): will-it-scale's `tlb_flush2` and
//! `tlb_flush3` on the 2-socket EPYC 7763 profile. The oracle watches every run; the tests pin
//! what each design changes in the mechanism (who is interrupted), not its throughput.

use shootdown_experiments::{load, run_points};
use std::path::{Path, PathBuf};

fn shipped(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../experiments/designs")
        .join(format!("{name}.toml"))
}

/// Per variant of the experiment at 8 threads (quick): (iterations/s, flush IPIs received,
/// INVLPGBs, LATR's saved flushes, LATR's ticks).
fn at_8_threads(name: &str) -> Vec<(String, f64, u64, u64, u64, u64)> {
    let exp = load(&shipped(name), &["experiment.quick_rows=[8]".to_string()]).unwrap();
    let all: Vec<usize> = (0..exp.points(true).len()).collect();
    let r = run_points(&exp, true, &all, 1).unwrap();
    r.iter()
        .map(|p| {
            assert!(p.violations.is_empty(), "{}: {:?}", p.variant, p.violations);
            let c = |k: &str| p.counters.get(k).copied().unwrap_or(0);
            (
                p.variant.clone(),
                p.value,
                c("tlb_shootdowns"),
                c("tlb.invlpgb"),
                c("tlb.latr_saved"),
                c("tlb.latr_ticks"),
            )
        })
        .collect()
}

#[test]
fn tlb_flush2_threads_broadcast_and_latr_replace_the_ipis() {
    let r = at_8_threads("will-it-scale-tlb-flush2");
    assert_eq!(r.len(), 5);
    for (variant, value, ipis, invlpgb, saved, ticks) in &r {
        assert!(*value > 0.0, "{variant}");
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
    assert_eq!(r.len(), 5);
    assert!(r.iter().all(|p| p.1 > 0.0), "{r:?}");
    assert!(r[3].3 > 100, "{r:?}");
    assert!(r[4].4 > 256, "{r:?}");
}

//! Built with `phase-timing` (`scripts/test.sh` runs this file so), a timed run of the Linux
//! machine counts every step once in the driver's phases and once in a class named after the
//! kernel function on top of the CPU's stack.
#![cfg(feature = "phase-timing")]

mod common;

use shootdown_engine::phases::{self, UNCLASSIFIED};
use shootdown_experiments::run_point;

#[test]
fn every_step_is_counted_once_by_its_kind() {
    let exp = common::short_sysbench();
    let p = exp.points(false).into_iter().next().unwrap();
    phases::take();
    let r = run_point(&exp, &p, false).unwrap();
    let t = phases::take().expect("built with phase-timing");
    assert_eq!(t.steps, r.steps);
    assert_eq!(t.classes.iter().map(|c| c.steps).sum::<u64>(), r.steps);
    let kinds: Vec<_> = t.classes.iter().map(|c| c.class).collect();
    // sysbench's munmap flushes every other CPU: the sender walks, the targets take the IPI.
    for k in [
        "flush_tlb_mm_range",
        "smp_call_function_many_cond",
        "call_function_interrupt",
        "flush_tlb_func",
    ] {
        assert!(kinds.contains(&k), "no {k} steps among {kinds:?}");
    }
    // Most steps are a CPU's, and so have a kind.
    let unclassified = t.classes.iter().find(|c| c.class == UNCLASSIFIED);
    assert!(
        unclassified.map_or(0, |c| c.steps) * 10 < r.steps,
        "{kinds:?}"
    );
}

//! Results are identical whatever the number of worker threads, and across repeated runs.

use shootdown_experiments::{load, run_points};
use std::path::Path;

#[test]
fn same_results_on_one_and_two_threads() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let exp = load(
        &root.join("experiments/seeds/seed002-madv-dontneed.toml"),
        &["workload.iterations=200".into()],
    )
    .unwrap();
    let idx: Vec<usize> = (0..exp.points(true).len()).collect();
    let a = run_points(&exp, true, &idx, 1).unwrap();
    let b = run_points(&exp, true, &idx, 2).unwrap();
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(&b) {
        assert_eq!(x.value.to_bits(), y.value.to_bits());
        assert_eq!(x.steps, y.steps);
        assert_eq!(x.counters, y.counters);
        assert_eq!(x.sim_ns.to_bits(), y.sim_ns.to_bits());
    }
}

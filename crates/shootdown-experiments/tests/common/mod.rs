//! What several test files load.

use shootdown_experiments::{load, Experiment};
use std::path::Path;

/// Seed 000's sysbench (no mitigations) cut short: its 4-thread row, one repetition, 0.2 ms of
/// warm-up and 0.5 ms measured — every flush path of the native machine in a fraction of a
/// second.
pub fn short_sysbench() -> Experiment {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    load(
        &root.join("experiments/seeds/seed000-sysbench-no-mitigations.toml"),
        &[
            "experiment.rows=[4]".into(),
            "experiment.repetitions=1".into(),
            "workload.warmup_ms=0.2".into(),
            "workload.measure_ms=0.5".into(),
        ],
    )
    .unwrap()
}

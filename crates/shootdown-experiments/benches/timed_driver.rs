//! Criterion benchmark of the timed driver on the seeds' workloads. Throughput is reported in
//! model steps; `shootdown bench FILE` gives the same figures for any experiment.
//!
//! `cargo bench -p shootdown-experiments --bench timed_driver`

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use shootdown_experiments::{load, run_point};
use std::path::Path;

fn bench_case(c: &mut Criterion, name: &str, file: &str, sets: &[&str]) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
    let exp = load(&root.join(file), &sets).expect("experiment loads");
    let point = exp.points(false).into_iter().next().expect("a point");
    // Runs are deterministic: the step count of one run is the count of every run.
    let first = run_point(&exp, &point, false).expect("runs");
    eprintln!(
        "{name}: {} steps, {:.3} ms simulated, {:.2} Msteps/s, {:.4} simulated s per wall s",
        first.steps,
        first.sim_ns / 1e6,
        first.steps as f64 / first.wall_s / 1e6,
        first.sim_ns / 1e9 / first.wall_s
    );
    let mut g = c.benchmark_group("timed_driver");
    g.sample_size(10);
    g.throughput(Throughput::Elements(first.steps));
    g.bench_function(name, |b| {
        b.iter(|| run_point(&exp, &point, false).expect("runs"))
    });
    g.finish();
}

fn benches(c: &mut Criterion) {
    bench_case(
        c,
        "sysbench_48_threads_mitigations",
        "experiments/seeds/seed000-sysbench-mitigations.toml",
        &["experiment.rows=[48]", "workload.measure_ms=2"],
    );
    bench_case(
        c,
        "madv_dontneed_pingpong",
        "experiments/seeds/seed002-madv-dontneed.toml",
        &["workload.iterations=2000"],
    );
}

criterion_group!(timed, benches);
criterion_main!(timed);

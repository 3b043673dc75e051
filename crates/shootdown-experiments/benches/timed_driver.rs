//! Criterion benchmark of the timed driver on the seeds' workloads. Throughput is reported in
//! model steps; `shootdown bench FILE` gives the same figures for any experiment.
//!
//! `cargo bench -p shootdown-experiments --bench timed_driver`
//!
//! The `sysbench_cpus_*` cases widen seed 000's machine (2 sockets × N cores × 2 threads, one
//! sysbench thread per CPU) to show how the cost of a step grows with the number of CPUs
//! (issue 16): 64 and 1024 CPUs for 2 ms simulated, 4096 CPUs for 1.2 ms (about 30 M steps a
//! run; the whole 12 ms row is `shootdown bench` in docs/performance.md). The allocator is
//! the one the shipped binaries use (mimalloc).

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use shootdown_experiments::{load, run_point};
use std::path::Path;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

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
    for (cores, warmup, measure) in [(16, "1", "1"), (256, "1", "1"), (1024, "1", "0.2")] {
        let cpus = cores * 4;
        let (cores_set, rows) = (
            format!("topology.cores_per_socket={cores}"),
            format!("experiment.rows=[{cpus}]"),
        );
        bench_case(
            c,
            &format!("sysbench_cpus_{cpus}"),
            "experiments/seeds/seed000-sysbench-no-mitigations.toml",
            &[
                &cores_set,
                &rows,
                &format!("workload.warmup_ms={warmup}"),
                &format!("workload.measure_ms={measure}"),
            ],
        );
    }
    bench_case(
        c,
        "madv_dontneed_pingpong",
        "experiments/seeds/seed002-madv-dontneed.toml",
        &["workload.iterations=2000"],
    );
}

criterion_group!(timed, benches);
criterion_main!(timed);

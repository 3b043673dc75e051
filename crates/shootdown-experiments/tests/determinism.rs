//! Results are identical whatever the number of worker threads, and across repeated runs.

mod common;

use shootdown_experiments::{load, profile_points, run_points};
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

/// Profiling observes a run without changing it: same value, steps and counters as the plain
/// run, and its per-function exclusive times account for every CPU moment of the window.
#[test]
fn profiling_does_not_perturb_the_run_and_accounts_for_all_cpu_time() {
    let exp = common::short_sysbench();
    let idx: Vec<usize> = (0..exp.points(false).len()).collect();
    let plain = run_points(&exp, false, &idx, 1).unwrap();
    let profiled = profile_points(&exp, false, &idx, 2).unwrap();
    assert_eq!(plain.len(), profiled.len());
    for (x, p) in plain.iter().zip(&profiled) {
        let y = &p.point;
        assert_eq!(x.value.to_bits(), y.value.to_bits());
        assert_eq!(x.steps, y.steps);
        assert_eq!(x.counters, y.counters);
        let prof = &p.profile;
        let excl: u64 = prof.functions.values().map(|f| f.exclusive.0).sum();
        assert_eq!(excl + prof.outside.0, prof.total.0);
        // 48 CPUs × (end − 0.2 ms): the window the metric measures.
        assert_eq!(
            prof.total.0,
            48 * (y.sim_ns * 1000.0) as u64 - 48 * 200_000_000
        );
        assert!(p.events > 0);
        for f in [
            "flush_tlb_mm_range",
            "smp_call_function_many_cond",
            "user",
            "idle",
        ] {
            assert!(prof.functions[f].exclusive.0 > 0, "{f} has no time");
        }
        // Each flush is one call of flush_tlb_mm_range and one of smp_call_function_many_cond
        // (up to the flushes of the 4 threads that straddle the start of the window).
        let calls = |f: &str| prof.functions[f].calls;
        let (a, b) = (
            calls("flush_tlb_mm_range"),
            calls("smp_call_function_many_cond"),
        );
        assert!(a > 100 && a.abs_diff(b) <= 4, "{a} flushes, {b} smp calls");
    }
}

/// A row's numbers do not depend on which other rows run with it: the `--quick` list, the full
/// list and the row alone give bit-identical results for that row.
#[test]
fn a_row_gives_the_same_result_whatever_rows_run_with_it() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let file = root.join("experiments/seeds/seed002-madv-dontneed.toml");
    let run_row = |rows: &str, row: &str| {
        let exp = load(
            &file,
            &[
                "workload.iterations=100".into(),
                format!("experiment.rows={rows}"),
            ],
        )
        .unwrap();
        let points = exp.points(false);
        let idx: Vec<usize> = points
            .iter()
            .filter(|p| p.row == serde_json::json!(row))
            .map(|p| p.index)
            .collect();
        let seeds: Vec<u64> = idx.iter().map(|&i| points[i].seed).collect();
        let out = run_points(&exp, false, &idx, 1).unwrap();
        let values: Vec<u64> = out.iter().map(|r| r.value.to_bits()).collect();
        (seeds, values)
    };
    let alone = run_row(r#"["b"]"#, "b");
    let second = run_row(r#"["a", "b"]"#, "b");
    let reordered = run_row(r#"["b", "a"]"#, "b");
    assert_eq!(alone, second);
    assert_eq!(alone, reordered);
    // Different rows get different seeds.
    assert_ne!(run_row(r#"["a", "b"]"#, "a").0, alone.0);
}

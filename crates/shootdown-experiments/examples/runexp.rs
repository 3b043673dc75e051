//! `cargo run --release --example runexp -- FILE [--quick] [--set K=V]...`: run an experiment and
//! print one line per (row, variant): mean value, reps, steps/s. A developer's tool; users use
//! `shootdown run`.
fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let path = std::path::PathBuf::from(&args[0]);
    let quick = args.iter().any(|a| a == "--quick");
    let sets: Vec<String> = args
        .windows(2)
        .filter(|w| w[0] == "--set")
        .map(|w| w[1].clone())
        .collect();
    let exp = match shootdown_experiments::load(&path, &sets) {
        Ok(e) => e,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(2)
        }
    };
    let pts = exp.points(quick);
    let idx: Vec<usize> = (0..pts.len()).collect();
    let t0 = std::time::Instant::now();
    let res = shootdown_experiments::run_points(&exp, quick, &idx, 0).unwrap_or_else(|e| {
        eprintln!("error: {e}");
        std::process::exit(2)
    });
    let mut steps = 0u64;
    for r in &res {
        steps += r.steps;
        println!(
            "{:>8} {:>10} rep{} value={:>12.3} steps={:>9} wall={:.2}s stop={} ipis={} remote_flush={} shootdowns={} leave_mm={} viol={:?}\n",
            r.row.to_string(), r.variant, r.rep, r.value, r.steps, r.wall_s, r.stop,
            r.counters["call_function_ipis"], r.counters["nr_tlb_remote_flush"], r.counters["tlb_shootdowns"], r.counters["leave_mm"], r.violations);
        print!(
            "          events={} pf={} up_to_date={} local_one={} local_all={}\n",
            r.counters["events"],
            r.counters["page_faults"],
            r.counters["flush_tlb_func.up_to_date"],
            r.counters["nr_tlb_local_flush_one"],
            r.counters["nr_tlb_local_flush_all"]
        );
    }
    println!(
        "total wall {:.2}s, {:.2} Msteps/s (per core, summed)",
        t0.elapsed().as_secs_f64(),
        steps as f64 / res.iter().map(|r| r.wall_s).sum::<f64>() / 1e6
    );
}

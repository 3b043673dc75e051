//! `cargo run --release -p shootdown-experiments --example counters -- FILE [--quick] [--threads N] [--set K=V]...`:
//! run an experiment and print, per point, the metric, the published value and every non-zero
//! counter. A developer's tool for looking at what a run did.
#[path = "common/cli.rs"]
mod cli;

fn main() {
    let (exp, quick, args) = cli::load("counters FILE [--quick] [--threads N] [--set K=V]...");
    let pts = exp.points(quick);
    let idx: Vec<usize> = (0..pts.len()).collect();
    let t0 = std::time::Instant::now();
    let threads: usize = args
        .windows(2)
        .find(|w| w[0] == "--threads")
        .map(|w| w[1].parse().expect("--threads N"))
        .unwrap_or(0);
    let res = shootdown_experiments::run_points(&exp, quick, &idx, threads).unwrap_or_else(|e| {
        eprintln!("error: {e}");
        std::process::exit(2)
    });
    for r in &res {
        let published = exp
            .published
            .iter()
            .find(|c| c.row == r.row && c.variant == r.variant)
            .map(|c| format!("{:.0}", c.value))
            .unwrap_or_else(|| "-".into());
        println!(
            "row {} {:>8} rep{}: value {:.1} (published {published}) sim {:.1} ms, {} steps, wall {:.2} s, stop {}, violations {:?}",
            r.row, r.variant, r.rep, r.value, r.sim_ns / 1e6, r.steps, r.wall_s, r.stop, r.violations
        );
        let nz: Vec<String> = r
            .counters
            .iter()
            .filter(|(_, v)| **v > 0)
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        println!("    {}", nz.join(" "));
    }
    println!("total wall {:.2} s", t0.elapsed().as_secs_f64());
}

//! `cargo run --release -p shootdown-experiments --example first_point -- FILE [--quick] [--set K=V]...`:
//! run an experiment's first point once, as `shootdown bench` does (building the machine, then
//! the timed run), and print its steps and wall time. Small and free of Python, so that it runs
//! under valgrind: the instruction and cache-miss counts in `docs/performance.md` come from
//! `valgrind --tool=callgrind` or `--tool=cachegrind` on this binary.
//!
//! Built with `--features phase-timing`, it also prints the timed driver's cycles per step in
//! each phase of its loop (`shootdown_engine::phases`).

/// The allocator the shipped binaries use.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[path = "common/cli.rs"]
mod cli;

fn main() {
    let (exp, quick, _) = cli::load("first_point FILE [--quick] [--set K=V]...");
    let Some(p) = exp.points(quick).into_iter().next() else {
        eprintln!("error: {}: no points", exp.path.display());
        std::process::exit(2)
    };
    let r = shootdown_experiments::run_point(&exp, &p, quick).unwrap_or_else(|e| {
        eprintln!("error: {e}");
        std::process::exit(2)
    });
    println!(
        "row {} {}: {} steps in {:.3} wall s, {:.2} M steps/s, stop {}",
        r.row,
        r.variant,
        r.steps,
        r.wall_s,
        r.steps as f64 / r.wall_s / 1e6,
        r.stop
    );
    if let Some(p) = shootdown_engine::phases::take() {
        for phase in shootdown_engine::phases::Phase::ALL {
            println!(
                "  {:<30} {:>7.0} cycles/step",
                phase.name(),
                p.per_step(phase)
            );
        }
    }
}

//! `cargo run --release -p shootdown-experiments --example first_point -- FILE [--quick] [--set K=V]...`:
//! run an experiment's first point once, as `shootdown bench` does (building the machine, then
//! the timed run), and print its steps and wall time. Small and free of Python, so that it runs
//! under valgrind: the instruction and cache-miss counts in `docs/performance.md` come from
//! `valgrind --tool=callgrind` or `--tool=cachegrind` on this binary.
//!
//! Built with `--features phase-timing`, it also prints the timed driver's cycles per step in
//! each phase of its loop (`shootdown_engine::phases`), and the step phase's by the kind of
//! step (the kernel function on top of the CPU's stack), most cycles first.

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
        let mut classes = p.classes;
        classes.sort_by_key(|c| std::cmp::Reverse(c.cycles));
        let all: u64 = classes.iter().map(|c| c.cycles).sum();
        println!("  step by kind: share of steps, cycles per step, share of step cycles");
        for c in classes {
            println!(
                "    {:<34} {:>6.2} % {:>9.0} {:>6.2} %",
                c.class,
                100.0 * c.steps as f64 / p.steps.max(1) as f64,
                c.cycles as f64 / c.steps.max(1) as f64,
                100.0 * c.cycles as f64 / all.max(1) as f64
            );
        }
    }
}

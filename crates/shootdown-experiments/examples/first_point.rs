//! `cargo run --release -p shootdown-experiments --example first_point -- FILE [--quick] [--set K=V]...`:
//! run an experiment's first point once, as `shootdown bench` does (building the machine, then
//! the timed run), and print its steps and wall time. Small and free of Python, so that it runs
//! under valgrind: the instruction and cache-miss counts in `docs/performance.md` come from
//! `valgrind --tool=callgrind` or `--tool=cachegrind` on this binary.

/// The allocator the shipped binaries use.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(path) = args.first().map(std::path::PathBuf::from) else {
        eprintln!("usage: first_point FILE [--quick] [--set K=V]...");
        std::process::exit(2)
    };
    let quick = args.iter().any(|a| a == "--quick");
    let sets: Vec<String> = args
        .windows(2)
        .filter(|w| w[0] == "--set")
        .map(|w| w[1].clone())
        .collect();
    let exp = shootdown_experiments::load(&path, &sets).unwrap_or_else(|e| {
        eprintln!("error: {e}");
        std::process::exit(2)
    });
    let Some(p) = exp.points(quick).into_iter().next() else {
        eprintln!("error: {}: no points", path.display());
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
}

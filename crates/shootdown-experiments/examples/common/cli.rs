//! What the experiment examples share: the experiment named on their command line.

/// `FILE [--quick] [--set K=V]...` from the command line, the experiment loaded with its
/// `--set`s; on bad input, a one-line error (or `usage`) and exit status 2. Also every
/// argument, for an example's own options.
pub fn load(usage: &str) -> (shootdown_experiments::Experiment, bool, Vec<String>) {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(path) = args.first().map(std::path::PathBuf::from) else {
        eprintln!("usage: {usage}");
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
    (exp, quick, args)
}

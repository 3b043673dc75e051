//! `cargo run --release -p shootdown-checker --example check -- SCENARIO [--mutant M]
//! [--memory-model sc|tso] [--max-states N] [--set KEY=VALUE]… [--sample N --seed S --strategy random|pct]
//! [--format text|json] [--no-por] [--no-symmetry] [--threads N (parallel search)] [--list DIR]`
use shootdown_checker::*;
use std::path::Path;

/// The explorer clones and drops states by the million; mimalloc's thread-local free lists make
/// that ~25 % cheaper than glibc's malloc (docs/performance.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let get = |k: &str| {
        args.iter()
            .position(|a| a == k)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    if let Some(dir) = get("--list") {
        match list(Path::new(&dir)) {
            Ok(l) => {
                if get("--format").as_deref() == Some("json") {
                    println!("{}", serde_json::to_string_pretty(&l).unwrap());
                } else {
                    print!("{}", report::list_text(&l));
                }
            }
            Err(e) => {
                eprintln!("{e}");
                std::process::exit(2)
            }
        }
        return;
    }
    let path = args.first().expect("scenario path").clone();
    let mutant = get("--mutant");
    let mm = get("--memory-model").unwrap_or_else(|| "sc".into());
    let max: Option<u64> = get("--max-states").map(|s| s.parse().unwrap());
    let sample: Option<u64> = get("--sample").map(|s| s.parse().unwrap());
    let seed: u64 = get("--seed").map(|s| s.parse().unwrap()).unwrap_or(0);
    // The defaults of `shootdown check`: auto (depth-first, then breadth-first for a shortest
    // counterexample), random with --sample.
    let strategy = get("--strategy").unwrap_or_else(|| {
        if sample.is_some() {
            "random".into()
        } else {
            "auto".into()
        }
    });
    let sets: Vec<String> = args
        .windows(2)
        .filter(|w| w[0] == "--set")
        .map(|w| w[1].clone())
        .collect();
    let threads: Option<usize> = get("--threads").map(|s| s.parse().unwrap());
    let res = if (args.iter().any(|a| a == "--no-por" || a == "--no-symmetry") || threads.is_some())
        && sample.is_none()
    {
        let sc = Scenario::load(Path::new(&path)).unwrap_or_else(|e| {
            eprintln!("{e}");
            std::process::exit(2)
        });
        let mem = scenario::parse_memory_model(&mm).unwrap();
        check_scenario(
            &sc,
            mutant.as_deref(),
            mem,
            CheckOptions {
                max_states: max,
                por: !args.iter().any(|a| a == "--no-por"),
                symmetry: !args.iter().any(|a| a == "--no-symmetry"),
                shortest: true,
                dfs: args.iter().any(|a| a == "--dfs"),
                parallel: threads,
            },
        )
    } else {
        check(
            Path::new(&path),
            mutant.as_deref(),
            &mm,
            max,
            sample,
            seed,
            &strategy,
            true,
            &sets,
        )
    };
    match res {
        Ok(r) => {
            if get("--format").as_deref() == Some("json") {
                println!("{}", r.to_json());
            } else {
                print!("{}", r.to_text());
            }
            std::process::exit(match r.verdict.as_str() {
                "verified" => 0,
                "violation" => 1,
                _ => 3,
            });
        }
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2)
        }
    }
}

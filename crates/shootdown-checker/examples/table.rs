//! Print the verdict table of every scenario (fixed protocol under SC and TSO, and each listed
//! mutant under its memory model) as Markdown: `cargo run --release --example table [DIR]`.
use shootdown_checker::*;
use std::path::Path;

fn main() {
    let dir = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "scenarios".into());
    let skip: Vec<String> = std::env::args().skip(2).collect();
    println!("| scenario | mutant | bug | memory model | verdict | invariant | steps | states | transitions | seconds |");
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for info in list(Path::new(&dir)).unwrap() {
        if skip.contains(&info.scenario) {
            continue;
        }
        let path = Path::new(&dir).join(format!("{}.toml", info.scenario));
        let mut runs: Vec<(Option<String>, Option<String>, String)> =
            vec![(None, None, "sc".into()), (None, None, "tso".into())];
        for m in &info.mutants {
            runs.push((Some(m.name.clone()), m.bug.clone(), m.memory_model.clone()));
        }
        for (mutant, bug, mm) in runs {
            let r = check(
                &path,
                mutant.as_deref(),
                &mm,
                Some(30_000_000),
                None,
                0,
                "bfs",
                true,
                &[],
            )
            .unwrap();
            println!(
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.2} |",
                info.scenario,
                mutant.as_deref().unwrap_or("— (fixed)"),
                bug.as_deref().unwrap_or("—"),
                mm,
                r.verdict,
                r.invariant.as_deref().unwrap_or("—"),
                if r.counterexample.is_empty() {
                    "—".to_string()
                } else {
                    r.counterexample.len().to_string()
                },
                r.states,
                r.transitions,
                r.seconds
            );
        }
    }
}

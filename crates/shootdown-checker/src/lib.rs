//! # shootdown-checker
//!
//! The explorer: it runs the very step code the timed driver runs (`shootdown_linux::Machine`
//! through the engine's [`Model`] trait) but chooses itself which enabled action happens next,
//! covering every interleaving of a small scenario (depth-first on every core to verify, then
//! breadth-first for a shortest counterexample if there is one), or sampling schedules of a
//! larger one (random walk, PCT). The coherence oracle
//! inside the model reports violations (`INV-STALE`, `INV-PTFREE`, `INV-ASID`, `INV-CTX`); the
//! explorer adds deadlock (`X4-DEADLOCK`).
//!
//! * [`scenario`] — scenario files (`scenarios/*.toml`);
//! * [`explore`] — generic breadth-first exploration with state hashing, POR and symmetry hooks;
//! * [`dfs`] — depth-first verification on every core, fingerprints only;
//! * [`parallel`] — breadth-first search with each level expanded on every core;
//! * [`reduce`] — the reductions for `Machine` (local-step POR, CPU symmetry);
//! * [`sample`] — random-walk and PCT sampling;
//! * [`report`] — results, text/JSON output, scenario listing.
//!
//! See `docs/checker.md`.

pub mod bound;
pub mod catalog;
pub mod describe;
pub mod dfs;
pub mod error;
pub mod explore;
pub mod parallel;
pub mod reduce;
pub mod report;
pub mod sample;
pub mod scale;
pub mod scenario;

pub use error::CheckError;
pub use explore::{
    cancel_requested, clear_cancel, explore, request_cancel, set_progress, Exploration, Limits,
    Verdict,
};
pub use report::{list, list_json, CheckResult, FindingInfo, MutantInfo, ScenarioInfo, Step};
pub use scenario::Scenario;

use shootdown_engine::{Model, Violation};
use shootdown_linux::describe::NullEnv;
use shootdown_linux::{Action, Machine, MemoryModel};
use std::path::Path;

/// Knobs of one check beyond the public [`check`] arguments (used by tests and the bench).
#[derive(Clone, Copy, Debug)]
pub struct CheckOptions {
    /// The state bound; None: a share of the available memory ([`bound::default_max_states`],
    /// per strategy).
    pub max_states: Option<u64>,
    pub por: bool,
    /// CPU symmetry reduction over the scenario's `symmetric` groups (on by default; sound
    /// where the kernel's CPU-id order matters too, see `reduce.rs`).
    pub symmetry: bool,
    /// When POR found a violation, re-run without it (bounded by the depth found) so the
    /// counterexample is a globally shortest one.
    pub shortest: bool,
    /// Depth-first search with a fingerprint-only visited set ([`dfs`]): far less memory, a
    /// counterexample that need not be the shortest; on `parallel`'s number of threads (one
    /// if None).
    pub dfs: bool,
    /// Level-synchronous parallel breadth-first search on this many threads ([`parallel`]),
    /// or with `dfs`, depth-first search on this many; what either finds does not depend on
    /// the number.
    pub parallel: Option<usize>,
}

impl CheckOptions {
    /// The state bound of a search (`depth_first`: fingerprints only).
    pub fn bound(&self, depth_first: bool) -> u64 {
        self.max_states
            .unwrap_or_else(|| bound::default_max_states(depth_first, bound::available_memory()))
    }
}

impl Default for CheckOptions {
    fn default() -> Self {
        CheckOptions {
            max_states: None,
            por: true,
            symmetry: true,
            shortest: true,
            dfs: false,
            parallel: None,
        }
    }
}

/// Replay `path` from `init`, describing each action in kernel terms.
pub fn replay(init: &Machine, path: &[Action], violation: Option<&Violation>) -> Vec<Step> {
    let mut m = init.clone();
    let mut steps = Vec::with_capacity(path.len());
    for (i, &a) in path.iter().enumerate() {
        let actor = m.agent_name(m.agent_of(a));
        let mut text = describe::step_text(&m, a);
        let out = m.apply(a, &mut NullEnv);
        if i + 1 == path.len() {
            if let Some(v) = out.violation.as_ref().or(violation) {
                text = format!("{text}  ⇒ {}", m.name_mms(&v.to_string()));
            }
        }
        steps.push(Step {
            step: i + 1,
            actor,
            text,
        });
    }
    steps
}

/// The scenario's setup steps as numbered steps (they precede every explored path).
fn setup_steps(setup: Vec<(String, String)>) -> Vec<Step> {
    setup
        .into_iter()
        .enumerate()
        .map(|(i, (actor, text))| Step {
            step: i + 1,
            actor,
            text,
        })
        .collect()
}

fn mm_name(m: MemoryModel) -> &'static str {
    match m {
        MemoryModel::Sc => "sc",
        MemoryModel::Tso => "tso",
    }
}

/// Exhaustively explore a loaded scenario.
pub fn check_scenario(
    sc: &Scenario,
    mutant: Option<&str>,
    mem: MemoryModel,
    opts: CheckOptions,
) -> Result<CheckResult, CheckError> {
    let (init, setup) = sc.build_traced(mutant, mem)?;
    let red = reduce::MachineReduction::new(sc, opts.symmetry);
    if let Some(why) = red.asymmetry(&init) {
        return Err(CheckError::new(
            &sc.path.display().to_string(),
            "symmetric",
            why,
        ));
    }
    let mut notes = Vec::new();
    let mut run = search(&init, &red, opts);
    notes.append(&mut run.notes);
    let mut symmetric = red.symmetric();
    if run.ex.verdict == Verdict::Violation && run.ex.approximate && !cancel_requested() {
        // Found in the symmetric closure through a renamed state: check the model itself.
        let mut plain = search(&init, &reduce::MachineReduction::new(sc, false), opts);
        notes.append(&mut plain.notes);
        notes.push(format!(
            "symmetry: the violation found through a renamed state ({} states) was checked again without symmetry",
            run.states
        ));
        run = Run {
            states: run.states + plain.states,
            transitions: run.transitions + plain.transitions,
            seconds: run.seconds + plain.seconds,
            ex: plain.ex,
            bound: plain.bound,
            depth_first: plain.depth_first,
            notes: vec![],
        };
        symmetric = false;
    }
    let Run {
        ex,
        states,
        transitions,
        seconds,
        bound,
        depth_first,
        ..
    } = run;
    if opts.dfs && ex.verdict == Verdict::Violation {
        notes.push(
            "depth-first: this counterexample need not be the shortest (the default breadth-first search finds a shortest one)"
                .to_string(),
        );
    }
    if ex.verdict == Verdict::BoundReached {
        // How far it got, and what its level sizes say about the rest.
        let reach = if opts.dfs {
            format!("paths {} deep", ex.depth)
        } else {
            format!(
                "depth {}, up to {} states waiting in the frontier",
                ex.depth, ex.peak_frontier
            )
        };
        let outlook = if depth_first {
            bound::Outlook::NoLevels
        } else {
            ex.levels.outlook()
        };
        notes.push(bound::bound_note(bound, ex.states, &reach, outlook));
    }
    let mut reductions = Vec::new();
    if opts.por {
        reductions.push("por".to_string());
    }
    if symmetric {
        reductions.push("symmetry".to_string());
    }
    Ok(CheckResult {
        scenario: sc.name.clone(),
        mutant: mutant.map(str::to_string),
        bug: report::mutant_bug(mutant),
        memory_model: mm_name(mem).into(),
        verdict: ex.verdict.as_str().into(),
        invariant: ex.violation.as_ref().map(|v| v.invariant.to_string()),
        detail: ex.violation.as_ref().map(|v| init.name_mms(&v.detail)),
        states,
        transitions,
        seconds,
        counterexample: if ex.verdict == Verdict::Violation {
            replay(&init, &ex.path, ex.violation.as_ref())
        } else {
            vec![]
        },
        setup: setup_steps(setup),
        strategy: match (opts.dfs, opts.parallel) {
            (true, _) => "dfs",
            (false, Some(_)) => "parallel",
            (false, None) => "bfs",
        }
        .into(),
        reductions,
        max_states: bound,
        notes,
    })
}

/// One exhaustive search and its totals (a shortest-counterexample re-run included), and
/// what the user should know about how it went.
struct Run {
    ex: Exploration<Action>,
    states: u64,
    transitions: u64,
    seconds: f64,
    /// The state bound of the search that gave `ex`, and whether it was depth-first.
    bound: u64,
    depth_first: bool,
    notes: Vec<String>,
}

/// Explore with `red`; when partial-order reduction found a violation, re-run without it up to
/// that depth so the counterexample is a globally shortest one.
fn search(init: &Machine, red: &reduce::MachineReduction, opts: CheckOptions) -> Run {
    // Each strategy's bound, read once: the bound reported is the one searched with.
    let (dfs_bound, bfs_bound) = (opts.bound(true), opts.bound(false));
    let limits = |depth_first: bool| Limits {
        max_states: if depth_first { dfs_bound } else { bfs_bound },
        max_depth: None,
        por: opts.por,
    };
    let mut notes = Vec::new();
    let (mut states, mut transitions, mut seconds) = (0, 0, 0.0);
    let mut bound = limits(opts.dfs).max_states;
    let mut depth_first = opts.dfs;
    let breadth_first = |threads: Option<usize>| match threads {
        Some(t) => parallel::explore_parallel(init, red, limits(false), t),
        None => explore(init, red, limits(false)),
    };
    let mut ex = if opts.dfs {
        let d = dfs::explore_dfs(init, red, limits(true), opts.parallel.unwrap_or(1));
        if let dfs::DfsEnd::LocalCycle(path) = d.end {
            // The static proviso does not hold: breadth-first search's does.
            notes.push(format!(
                "depth-first: persistent singletons form a cycle after {} steps (the static proviso needs local steps to be acyclic, dfs.rs); searched breadth-first instead",
                path.len()
            ));
            states += d.ex.states;
            transitions += d.ex.transitions;
            seconds += d.ex.seconds;
            bound = limits(false).max_states;
            depth_first = false;
            breadth_first(opts.parallel)
        } else {
            d.ex
        }
    } else {
        breadth_first(opts.parallel)
    };
    states += ex.states;
    transitions += ex.transitions;
    seconds += ex.seconds;
    if ex.verdict == Verdict::Violation && opts.por && opts.shortest && ex.reduced > 0 && !opts.dfs
    {
        let again = explore(
            init,
            red,
            Limits {
                max_depth: Some(ex.path.len() as u32),
                por: false,
                ..limits(false)
            },
        );
        states += again.states;
        transitions += again.transitions;
        seconds += again.seconds;
        if again.verdict == Verdict::Violation {
            ex = again;
        }
    }
    Run {
        ex,
        states,
        transitions,
        seconds,
        bound,
        depth_first,
        notes,
    }
}

/// `shootdown check SCENARIO [--mutant NAME] [--memory-model sc|tso] [--max-states N]
/// [--sample N --seed S --strategy random|pct] [--no-symmetry] [--set KEY=VALUE]`.
///
/// `strategy` is `auto` (the default when `sample` is None: `dfs`, then `parallel` if it
/// found a violation), `dfs` (exhaustive, depth-first on every core, fingerprints only: the
/// least memory; a counterexample, not necessarily a shortest one), `parallel` (exhaustive,
/// breadth-first on every core: shortest counterexamples), `bfs` (the same on one thread), `random`
/// or `pct`. What the exhaustive ones find does not depend on the number of cores.
/// `symmetry`: reduce by the scenario's declared `symmetric` groups (the exhaustive
/// strategies). `sets`: `KEY=VALUE` overrides of the scenario's keys ([`scale`]).
#[allow(clippy::too_many_arguments)]
pub fn check(
    scenario_path: &Path,
    mutant: Option<&str>,
    memory_model: &str,
    max_states: Option<u64>,
    sample: Option<u64>,
    seed: u64,
    strategy: &str,
    symmetry: bool,
    sets: &[String],
) -> Result<CheckResult, CheckError> {
    let file = scenario_path.display().to_string();
    let sc = Scenario::load_with(scenario_path, sets)?;
    let mem = scenario::parse_memory_model(memory_model).ok_or_else(|| {
        CheckError::new(
            &file,
            "memory_model",
            format!("expected sc or tso, got '{memory_model}'"),
        )
    })?;
    if let Some(m) = mutant {
        if !shootdown_linux::options::MUTANT_NAMES
            .iter()
            .any(|(n, _)| *n == m)
        {
            let names: Vec<_> = shootdown_linux::options::MUTANT_NAMES
                .iter()
                .map(|m| m.0)
                .collect();
            return Err(CheckError::new(
                &file,
                "mutant",
                format!("unknown mutant '{m}' (known: {})", names.join(", ")),
            ));
        }
    }
    let declared = mutant.and_then(|m| sc.file.mutants.iter().find(|x| x.name == m));
    if let (Some(m), None) = (mutant, declared) {
        let names: Vec<&str> = sc.file.mutants.iter().map(|x| x.name.as_str()).collect();
        return Err(CheckError::new(
            &file,
            "mutant",
            format!(
                "'{m}' is not declared by this scenario (declared: {}); add a [[mutants]] entry to check it here",
                if names.is_empty() { "none".to_string() } else { names.join(", ") }
            ),
        ));
    }
    if max_states == Some(0) {
        return Err(CheckError::new(&file, "max_states", "must be at least 1"));
    }
    let mut notes = sc.set_notes.clone();
    if let Some(d) = declared {
        let want = d.memory_model.as_deref().unwrap_or("sc");
        if want == "tso" && mem == MemoryModel::Sc {
            notes.push(format!(
                "mutant {} is declared for TSO: its bug needs store buffering and cannot show under SC (run with --memory-model tso)",
                d.name
            ));
        }
    }
    let exhaustive = CheckOptions {
        max_states,
        symmetry,
        ..CheckOptions::default()
    };
    // A flag of this check's own, shared by every machine built from `sc`.
    let mut sc = sc;
    sc.options.mutants.track();
    let mut r = check_dispatch(&sc, &file, mutant, mem, exhaustive, sample, seed, strategy)?;
    if let Some(m) = mutant {
        if r.verdict != "violation" && !sc.options.mutants.ran() {
            // Not "the bug is harmless": its code never ran here. A finished search says so in
            // its verdict; a bounded or interrupted one keeps its own and gets the note.
            if r.verdict == "verified" {
                r.verdict = "unreached".into();
            }
            notes.push(format!(
                "mutant {m} never ran: no explored step reached its code, so this verdict says nothing about the bug (does the scenario's configuration take the mutated path? see its options and setup)"
            ));
        }
    }
    if r.verdict == "interrupted" {
        notes.push(format!(
            "interrupted after {} states in {:.1} s: nothing is proved",
            r.states, r.seconds
        ));
    }
    if r.verdict == "bound-reached" && !matches!(r.strategy.as_str(), "bfs" | "dfs" | "parallel") {
        notes.push(format!(
            "sampling never proves anything: no violation in the schedules tried ({} states)",
            r.states
        ));
    }
    notes.append(&mut r.notes);
    r.notes = notes;
    Ok(r)
}

#[allow(clippy::too_many_arguments)]
fn check_dispatch(
    sc: &Scenario,
    file: &str,
    mutant: Option<&str>,
    mem: MemoryModel,
    exhaustive: CheckOptions,
    sample: Option<u64>,
    seed: u64,
    strategy: &str,
) -> Result<CheckResult, CheckError> {
    let cores = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
    let dfs = CheckOptions {
        dfs: true,
        parallel: Some(cores),
        ..exhaustive
    };
    let parallel = CheckOptions {
        parallel: Some(cores),
        ..exhaustive
    };
    match (strategy, sample) {
        ("bfs", None) => check_scenario(sc, mutant, mem, exhaustive),
        ("dfs", None) => check_scenario(sc, mutant, mem, dfs),
        ("parallel", None) => check_scenario(sc, mutant, mem, parallel),
        ("auto" | "", None) => {
            // Verify depth-first (fingerprints only: the least memory); a violation is then
            // found again breadth-first, for a shortest counterexample.
            let first = check_scenario(sc, mutant, mem, dfs)?;
            if first.verdict != "violation" {
                return Ok(first);
            }
            let mut r = check_scenario(sc, mutant, mem, parallel)?;
            if r.verdict == "interrupted" {
                // Stopped while looking for a shorter one: the depth-first one stands.
                return Ok(first);
            }
            if r.verdict == "bound-reached" {
                // Breadth-first search needs more memory a state: within its own bound it
                // did not get as deep as the violation. The depth-first one stands.
                let mut first = first;
                first.notes.push(format!(
                    "breadth-first search for a shortest counterexample stopped at its bound ({} states): this is depth-first search's, which need not be the shortest",
                    r.max_states
                ));
                return Ok(first);
            }
            r.seconds += first.seconds;
            r.notes.insert(
                0,
                "depth-first search found a violation; the counterexample is breadth-first search's, a shortest one (its states are counted)".into(),
            );
            Ok(r)
        }
        ("auto" | "bfs" | "dfs" | "parallel", Some(_)) => Err(CheckError::new(
            file,
            "strategy",
            "--sample needs --strategy random or pct",
        )),
        ("random" | "pct", _) => {
            let n = sample.unwrap_or(1000);
            if n == 0 {
                return Err(CheckError::new(file, "sample", "must be at least 1"));
            }
            let strat = if strategy == "pct" {
                sample::Strategy::Pct { depth: 3 }
            } else {
                sample::Strategy::Random
            };
            let (init, setup) = sc.build_traced(mutant, mem)?;
            let bound = exhaustive.bound(true);
            let r = sample::sample(&init, strat, n, seed, bound);
            Ok(CheckResult {
                scenario: sc.name.clone(),
                mutant: mutant.map(str::to_string),
                bug: report::mutant_bug(mutant),
                memory_model: mm_name(mem).into(),
                verdict: if r.violation.is_some() {
                    "violation".into()
                } else if r.interrupted {
                    "interrupted".into()
                } else if r.exhausted_budget {
                    "bound-reached".into()
                } else {
                    // Sampling never proves anything: no violation in the schedules tried.
                    "bound-reached".into()
                },
                invariant: r.violation.as_ref().map(|v| v.invariant.to_string()),
                detail: r.violation.as_ref().map(|v| v.detail.clone()),
                states: r.states,
                transitions: r.transitions,
                seconds: r.seconds,
                counterexample: if r.violation.is_some() {
                    replay(&init, &r.path, r.violation.as_ref())
                } else {
                    vec![]
                },
                setup: setup_steps(setup),
                strategy: strategy.into(),
                reductions: vec![],
                max_states: bound,
                notes: vec![],
            })
        }
        (other, _) => Err(CheckError::new(
            file,
            "strategy",
            format!("expected auto, bfs, dfs, parallel, random or pct, got '{other}'"),
        )),
    }
}

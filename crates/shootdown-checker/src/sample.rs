//! Sampling for configurations too large to exhaust: random walks and PCT (probabilistic
//! concurrency testing: random agent priorities with `depth - 1` priority-change points, Burckhardt
//! et al., ASPLOS 2010). The first violation found is shortened (delta-debugging style: drop
//! chunks of actions while the rest still replays and still violates the same invariant).

use crate::explore::{deadlock, fingerprint, ExploreEnv, FpSet};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use shootdown_engine::{Model, Violation};
use std::time::Instant;

#[derive(Clone, Copy, Debug)]
pub enum Strategy {
    Random,
    /// PCT with bug depth `depth` (`depth - 1` change points).
    Pct {
        depth: u32,
    },
}

#[derive(Clone, Debug)]
pub struct SampleResult<A> {
    pub violation: Option<Violation>,
    pub path: Vec<A>,
    /// Distinct states seen.
    pub states: u64,
    pub transitions: u64,
    pub seconds: f64,
    /// Schedules run.
    pub runs: u64,
    /// Stopped because `max_states` distinct states were seen.
    pub exhausted_budget: bool,
    /// Stopped by [`crate::request_cancel`].
    pub interrupted: bool,
}

/// Longest schedule of one run.
pub const MAX_WALK: usize = 20_000;

fn run_one<M: Model, R: Rng>(
    init: &M,
    strat: Strategy,
    rng: &mut R,
    expected_len: usize,
    seen: &mut FpSet,
    transitions: &mut u64,
) -> (Option<Violation>, Vec<M::Action>) {
    let mut m = init.clone();
    let mut path = Vec::new();
    let mut en = Vec::new();
    let n = m.agents();
    // PCT: distinct priorities >= depth for every agent; change points lower them to < depth.
    let (mut prio, changes): (Vec<u32>, Vec<usize>) = match strat {
        Strategy::Random => (vec![], vec![]),
        Strategy::Pct { depth } => {
            let mut p: Vec<u32> = (0..n as u32).map(|i| i + depth).collect();
            for i in (1..n).rev() {
                let j = rng.gen_range(0..=i);
                p.swap(i, j);
            }
            let c = (1..depth)
                .map(|_| rng.gen_range(0..expected_len.max(1)))
                .collect();
            (p, c)
        }
    };
    let mut env = ExploreEnv::default();
    for step in 0..MAX_WALK {
        en.clear();
        m.enabled(&mut en);
        if en.is_empty() {
            if !m.finished() {
                return (Some(deadlock()), path);
            }
            break;
        }
        let a = match strat {
            Strategy::Random => en[rng.gen_range(0..en.len())],
            Strategy::Pct { .. } => {
                let best = en
                    .iter()
                    .map(|&a| prio[m.agent_of(a)])
                    .max()
                    .expect("nonempty");
                let mine: Vec<_> = en
                    .iter()
                    .copied()
                    .filter(|&a| prio[m.agent_of(a)] == best)
                    .collect();
                let a = mine[rng.gen_range(0..mine.len())];
                for (k, &c) in changes.iter().enumerate() {
                    if c == step {
                        prio[m.agent_of(a)] = k as u32;
                    }
                }
                a
            }
        };
        let out = m.apply(a, &mut env);
        *transitions += 1;
        path.push(a);
        if let Some(v) = out.violation.or_else(|| m.check_state()) {
            return (Some(v), path);
        }
        seen.insert(fingerprint(&m));
    }
    (None, path)
}

/// Replay `path`; Some(i, v) if action `i` violates (every action before it must be enabled).
pub fn replay_violation<M: Model>(init: &M, path: &[M::Action]) -> Option<(usize, Violation)> {
    let mut m = init.clone();
    let mut en = Vec::new();
    let mut env = ExploreEnv::default();
    for (i, &a) in path.iter().enumerate() {
        en.clear();
        m.enabled(&mut en);
        if !en.contains(&a) {
            return None;
        }
        let out = m.apply(a, &mut env);
        if let Some(v) = out.violation.or_else(|| m.check_state()) {
            return Some((i, v));
        }
    }
    en.clear();
    m.enabled(&mut en);
    if en.is_empty() && !m.finished() {
        return Some((path.len(), deadlock()));
    }
    None
}

/// Shorten a violating schedule: drop chunks (halving sizes down to single actions) while the
/// remainder still replays and violates the same invariant.
pub fn shorten<M: Model>(init: &M, path: Vec<M::Action>, invariant: &str) -> Vec<M::Action> {
    let mut best = path;
    let mut budget = 20_000usize;
    let mut chunk = (best.len() / 2).max(1);
    loop {
        let mut improved = false;
        let mut i = 0;
        while i < best.len() && budget > 0 {
            let end = (i + chunk).min(best.len());
            let mut cand: Vec<_> = best[..i].to_vec();
            cand.extend_from_slice(&best[end..]);
            budget -= 1;
            match replay_violation(init, &cand) {
                Some((k, v)) if v.invariant == invariant => {
                    cand.truncate(k + 1);
                    best = cand;
                    improved = true;
                }
                _ => i += chunk,
            }
        }
        if budget == 0 || (chunk == 1 && !improved) {
            break;
        }
        if !improved {
            chunk = (chunk / 2).max(1);
        }
    }
    best
}

/// Run up to `runs` schedules; stop at the first violation (shortened) or when `max_states`
/// distinct states have been seen.
pub fn sample<M: Model>(
    init: &M,
    strat: Strategy,
    runs: u64,
    seed: u64,
    max_states: u64,
) -> SampleResult<M::Action> {
    let t0 = Instant::now();
    let mut seen = FpSet::default();
    let mut transitions = 0u64;
    let mut expected = 64usize;
    let mut done = 0;
    let mut violation = None;
    let mut path = vec![];
    let mut exhausted_budget = false;
    let mut interrupted = false;
    for r in 0..runs {
        if crate::explore::cancel_requested() {
            interrupted = true;
            break;
        }
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ r.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let (v, p) = run_one(init, strat, &mut rng, expected, &mut seen, &mut transitions);
        done = r + 1;
        expected = expected.max(p.len());
        if let Some(v) = v {
            path = shorten(init, p, v.invariant);
            violation = Some(replay_violation(init, &path).map(|x| x.1).unwrap_or(v));
            break;
        }
        if seen.len() as u64 >= max_states {
            exhausted_budget = true;
            break;
        }
    }
    SampleResult {
        violation,
        path,
        states: seen.len() as u64,
        transitions,
        seconds: t0.elapsed().as_secs_f64(),
        runs: done,
        exhausted_budget,
        interrupted,
    }
}

//! The exhaustive explorer: breadth-first search over every interleaving of a [`Model`]'s
//! actions, with a visited set of 128-bit state fingerprints, parent pointers to rebuild the
//! counterexample, and two pluggable reductions (see [`Reduction`]):
//!
//! * **symmetry** — the fingerprint may be that of a canonical representative of the state's
//!   symmetry class (the frontier keeps the real state, so counterexamples replay exactly);
//! * **partial-order reduction** — in a state where some action forms a persistent set on its
//!   own and is invisible, only that action is expanded, under the BFS cycle proviso: the
//!   reduced expansion is used only if it leads to a *new* state, otherwise the state is expanded
//!   fully. Every cycle of the reduced graph therefore contains a fully expanded state (the
//!   "strong" proviso C3), which keeps the reduction sound for safety properties and deadlocks.
//!
//! Breadth-first order makes the first violation found a shortest one (in the reduced graph;
//! [`explore`] callers that need the globally shortest path re-run without POR up to that depth,
//! see `lib.rs`).

use shootdown_engine::{Env, Model, Violation};
use std::collections::{HashSet, VecDeque};
use std::hash::{BuildHasherDefault, Hash, Hasher};
use std::time::Instant;
use xxhash_rust::xxh3::Xxh3;

/// 128-bit XXH3 fingerprint of anything hashable (the whole model state).
pub fn fingerprint<T: Hash + ?Sized>(x: &T) -> u128 {
    let mut h = Xxh3::new();
    x.hash(&mut h);
    h.digest128()
}

/// A hasher for keys that are already uniformly distributed fingerprints.
#[derive(Default)]
pub struct IdHasher(u64);
impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ b as u64;
        }
    }
    fn write_u128(&mut self, x: u128) {
        self.0 = x as u64;
    }
}
pub type FpSet = HashSet<u128, BuildHasherDefault<IdHasher>>;

/// Model-specific reductions the explorer applies.
pub trait Reduction<M: Model> {
    /// Fingerprint of the state (of its canonical representative, under symmetry).
    fn fingerprint(&self, m: &M) -> u128 {
        fingerprint(m)
    }
    /// An enabled action that forms a persistent set on its own in `m` and cannot produce a
    /// violation — or None to expand every enabled action.
    fn persistent_singleton(&self, _m: &M, _enabled: &[M::Action]) -> Option<M::Action> {
        None
    }
}

/// No reduction at all.
pub struct NoReduction;
impl<M: Model> Reduction<M> for NoReduction {}

/// The explorer's own driver environment: costs ignored, randomness fixed at 0.
pub struct ExploreEnv;
impl Env for ExploreEnv {
    fn timed(&self) -> bool {
        false
    }
    fn now(&self) -> shootdown_engine::Time {
        shootdown_engine::Time::ZERO
    }
    fn charge(&mut self, _: shootdown_engine::Time) {}
    fn random(&mut self, _: u64) -> u64 {
        0
    }
    fn wake(&mut self, _: usize, _: shootdown_engine::Time) {}
    fn notify(&mut self) {}
    fn notify_key(&mut self, _: u64) {}
    fn tracing(&self) -> bool {
        false
    }
    fn trace(&mut self, _: shootdown_engine::trace::TraceEvent) {}
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum Verdict {
    #[serde(rename = "violation")]
    Violation,
    #[serde(rename = "verified")]
    Verified,
    #[serde(rename = "bound-reached")]
    BoundReached,
}

impl Verdict {
    pub fn as_str(&self) -> &'static str {
        match self {
            Verdict::Violation => "violation",
            Verdict::Verified => "verified",
            Verdict::BoundReached => "bound-reached",
        }
    }
}

#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Stop with `bound-reached` once this many distinct states have been stored.
    pub max_states: u64,
    /// Do not expand states deeper than this (None: unbounded).
    pub max_depth: Option<u32>,
    /// Apply the reduction's persistent singletons.
    pub por: bool,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_states: 10_000_000,
            max_depth: None,
            por: true,
        }
    }
}

/// Result of one exploration.
#[derive(Clone, Debug)]
pub struct Exploration<A> {
    pub verdict: Verdict,
    pub violation: Option<Violation>,
    /// Actions from the initial state to the violation (the last one violates).
    pub path: Vec<A>,
    /// Distinct states stored.
    pub states: u64,
    /// Actions applied.
    pub transitions: u64,
    pub seconds: f64,
    /// Deepest level reached.
    pub depth: u32,
    /// States expanded with a single (persistent, invisible) action.
    pub reduced: u64,
    /// Largest frontier (queue) length.
    pub peak_frontier: usize,
    /// Bytes of the visited set and parent table at the end (capacity-based).
    pub index_bytes: usize,
}

/// The violation reported when no action is enabled and the model is not finished.
pub fn deadlock() -> Violation {
    Violation {
        invariant: "X4-DEADLOCK",
        detail: "deadlock: no action is enabled and the workload has not finished".into(),
    }
}

fn path_to<A: Copy>(parents: &[(u32, A)], mut id: u32) -> Vec<A> {
    let mut v = Vec::new();
    while id != 0 {
        let (p, a) = parents[id as usize];
        v.push(a);
        id = p;
    }
    v.reverse();
    v
}

/// Print a live progress line (states, states/s, frontier, depth) on stderr while exploring.
/// Display only: it never changes what is explored. Off by default; the CLI turns it on when
/// stderr is a terminal.
static PROGRESS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Turn the live progress line on or off (see [`PROGRESS`]).
pub fn set_progress(on: bool) {
    PROGRESS.store(on, std::sync::atomic::Ordering::Relaxed);
}

/// The live progress line: redrawn at most every half second, erased when the search ends.
struct ProgressLine {
    on: bool,
    t0: Instant,
    last: Instant,
    shown: bool,
}

impl ProgressLine {
    fn new() -> ProgressLine {
        let now = Instant::now();
        ProgressLine {
            on: PROGRESS.load(std::sync::atomic::Ordering::Relaxed),
            t0: now,
            last: now,
            shown: false,
        }
    }

    #[inline]
    fn tick(&mut self, states: usize, frontier: usize, depth: u32) {
        if !self.on || states % 4096 != 0 {
            return;
        }
        let now = Instant::now();
        if now.duration_since(self.last).as_secs_f64() < 0.5 {
            return;
        }
        self.last = now;
        self.shown = true;
        let rate = states as f64 / now.duration_since(self.t0).as_secs_f64().max(1e-9);
        eprint!(
            "\r\x1b[Kchecking: {states} states, {rate:.0} states/s, frontier {frontier}, depth {depth}"
        );
    }
}

impl Drop for ProgressLine {
    fn drop(&mut self) {
        if self.shown {
            eprint!("\r\x1b[K");
        }
    }
}

/// Breadth-first exploration of every interleaving from `init`.
pub fn explore<M: Model, R: Reduction<M>>(
    init: &M,
    red: &R,
    limits: Limits,
) -> Exploration<M::Action> {
    let t0 = Instant::now();
    let mut visited = FpSet::default();
    // parents[id] = (parent id, action); id 0 is the initial state.
    let mut parents: Vec<(u32, M::Action)> = Vec::new();
    let mut queue: VecDeque<(u32, u32, M)> = VecDeque::new();
    let mut transitions = 0u64;
    let mut reduced = 0u64;
    let mut peak = 0usize;
    let mut depth = 0u32;
    let mut enabled = Vec::new();
    let mut env = ExploreEnv;
    let mut progress = ProgressLine::new();

    let result =
        |verdict, violation, path, states, transitions, reduced, depth, peak, ib| Exploration {
            verdict,
            violation,
            path,
            states,
            transitions,
            seconds: t0.elapsed().as_secs_f64(),
            depth,
            reduced,
            peak_frontier: peak,
            index_bytes: ib,
        };
    let index_bytes = |v: &FpSet, p: &Vec<(u32, M::Action)>| {
        v.capacity() * (std::mem::size_of::<u128>() + 1)
            + p.capacity() * std::mem::size_of::<(u32, M::Action)>()
    };

    visited.insert(red.fingerprint(init));
    enabled.clear();
    init.enabled(&mut enabled);
    let dummy = match enabled.first() {
        Some(a) => *a,
        None => {
            let v = if init.finished() {
                None
            } else {
                Some(deadlock())
            };
            let verdict = if v.is_some() {
                Verdict::Violation
            } else {
                Verdict::Verified
            };
            return result(verdict, v, vec![], 1, 0, 0, 0, 0, 0);
        }
    };
    parents.push((0, dummy));
    if let Some(v) = init.check_state() {
        return result(Verdict::Violation, Some(v), vec![], 1, 0, 0, 0, 0, 0);
    }
    queue.push_back((0, 0, init.clone()));

    while let Some((id, d, s)) = queue.pop_front() {
        depth = depth.max(d);
        progress.tick(visited.len(), queue.len(), depth);
        if limits.max_depth.is_some_and(|md| d >= md) {
            continue;
        }
        enabled.clear();
        s.enabled(&mut enabled);
        if enabled.is_empty() {
            if !s.finished() {
                let ib = index_bytes(&visited, &parents);
                return result(
                    Verdict::Violation,
                    Some(deadlock()),
                    path_to(&parents, id),
                    visited.len() as u64,
                    transitions,
                    reduced,
                    depth,
                    peak,
                    ib,
                );
            }
            continue;
        }
        // Apply `a` to a copy of `s`; a broken invariant ends the search with the path to it.
        macro_rules! successor {
            ($a:expr) => {{
                let mut t = s.clone();
                let out = t.apply($a, &mut env);
                transitions += 1;
                if let Some(v) = out.violation.or_else(|| t.check_state()) {
                    let mut p = path_to(&parents, id);
                    p.push($a);
                    let ib = index_bytes(&visited, &parents);
                    let n = visited.len() as u64;
                    return result(
                        Verdict::Violation,
                        Some(v),
                        p,
                        n,
                        transitions,
                        reduced,
                        depth,
                        peak,
                        ib,
                    );
                }
                let f = red.fingerprint(&t);
                (t, f)
            }};
        }
        // Partial-order reduction: a persistent, invisible singleton whose successor is new.
        let mut expand_all = true;
        let mut single: Option<(M::Action, M, u128)> = None;
        if limits.por {
            if let Some(a) = red.persistent_singleton(&s, &enabled) {
                let (t, f) = successor!(a);
                if !visited.contains(&f) {
                    expand_all = false;
                    single = Some((a, t, f));
                }
            }
        }
        // Store a successor; when the state bound is hit, stop with `bound-reached`.
        macro_rules! store_or_stop {
            ($a:expr, $t:expr, $f:expr) => {
                if !store(
                    &mut visited,
                    &mut parents,
                    &mut queue,
                    limits,
                    id,
                    d,
                    $a,
                    $t,
                    $f,
                ) {
                    let n = visited.len() as u64 - 1;
                    let ib = index_bytes(&visited, &parents);
                    return result(
                        Verdict::BoundReached,
                        None,
                        vec![],
                        n,
                        transitions,
                        reduced,
                        depth,
                        peak,
                        ib,
                    );
                }
            };
        }
        if !expand_all {
            reduced += 1;
            let (a, t, f) = single.take().expect("reduced");
            store_or_stop!(a, t, f);
        } else {
            for &a in enabled.iter() {
                let (t, f) = successor!(a);
                store_or_stop!(a, t, f);
            }
        }
        peak = peak.max(queue.len());
    }
    let ib = index_bytes(&visited, &parents);
    let verdict = if limits.max_depth.is_some_and(|md| depth >= md) {
        Verdict::BoundReached
    } else {
        Verdict::Verified
    };
    result(
        verdict,
        None,
        vec![],
        visited.len() as u64,
        transitions,
        reduced,
        depth,
        peak,
        ib,
    )
}

/// Record a successor; false when the state bound is exceeded.
#[allow(clippy::too_many_arguments)]
#[inline]
fn store<M, A>(
    visited: &mut FpSet,
    parents: &mut Vec<(u32, A)>,
    queue: &mut VecDeque<(u32, u32, M)>,
    limits: Limits,
    id: u32,
    d: u32,
    a: A,
    t: M,
    f: u128,
) -> bool {
    if visited.insert(f) {
        if visited.len() as u64 > limits.max_states {
            return false;
        }
        let nid = parents.len() as u32;
        parents.push((id, a));
        queue.push_back((nid, d + 1, t));
    }
    true
}

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

use crate::bound::LevelSizes;
use shootdown_engine::{Env, Interner, Model, Violation};
use std::borrow::BorrowMut;
use std::collections::{HashSet, VecDeque};
use std::hash::{BuildHasherDefault, Hash, Hasher};
use std::time::Instant;

/// 128-bit XXH3 fingerprint of anything hashable (the whole model state): the engine's
/// [`shootdown_engine::digest`], whose components remember theirs
/// ([`shootdown_engine::HashCached`]).
pub fn fingerprint<T: Hash + ?Sized>(x: &T) -> u128 {
    shootdown_engine::digest(x)
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
    /// Every enabled action that would form such a persistent set on its own, into `out` (the
    /// depth-first search chooses among them by a function of the state's class, `dfs.rs`).
    /// By default the [`Reduction::persistent_singleton`].
    fn persistent_candidates(&self, m: &M, enabled: &[M::Action], out: &mut Vec<M::Action>) {
        out.extend(self.persistent_singleton(m, enabled));
    }
    /// Renamed copies `(π(m), π(a))` of `m` and `a` to expand beside `a`, when applying `a` to
    /// `m` fixed an order over CPUs (`orders`, reported through [`Env::cpu_order`]) that the
    /// fingerprint treats as interchangeable. Their successors are what `a` does in the states
    /// the fingerprint merged with `m`; exploring them too makes the search that of the
    /// symmetric closure of the model (see `reduce.rs`). None by default.
    fn images(&self, _m: &M, _a: M::Action, _orders: &[Vec<usize>]) -> Vec<(M, M::Action)> {
        Vec::new()
    }
}

/// No reduction at all.
pub struct NoReduction;
impl<M: Model> Reduction<M> for NoReduction {}

/// The explorer's own driver environment: costs ignored, randomness fixed at 0; it keeps the
/// CPU orders a step fixed ([`Env::cpu_order`]) for the symmetry reduction.
#[derive(Default)]
pub struct ExploreEnv {
    orders: Vec<Vec<usize>>,
}

impl ExploreEnv {
    /// The CPU orders fixed since the last call.
    pub fn take_orders(&mut self) -> Vec<Vec<usize>> {
        std::mem::take(&mut self.orders)
    }
}

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
    fn cpu_order(&mut self, cpus: &[usize]) {
        self.orders.push(cpus.to_vec());
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum Verdict {
    #[serde(rename = "violation")]
    Violation,
    #[serde(rename = "verified")]
    Verified,
    #[serde(rename = "bound-reached")]
    BoundReached,
    /// Stopped by [`request_cancel`] (Ctrl-C): nothing was proved.
    #[serde(rename = "interrupted")]
    Interrupted,
}

impl Verdict {
    pub fn as_str(&self) -> &'static str {
        match self {
            Verdict::Violation => "violation",
            Verdict::Verified => "verified",
            Verdict::BoundReached => "bound-reached",
            Verdict::Interrupted => "interrupted",
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
    /// States stored that were reached through a symmetric image ([`Reduction::images`]).
    pub images: u64,
    /// The violation's path passes through a symmetric image: it is a run of the model's
    /// symmetric closure, not necessarily of the model (the caller re-checks without symmetry).
    pub approximate: bool,
    /// Breadth-first search's level sizes, for the hint at a bound (empty for depth-first).
    pub levels: LevelSizes,
}

/// Copy `src` into the reusable state `scratch` (a state, or a box of one) and return it: its
/// vectors keep their allocations (`clone_from`), so a successor that turns out to be visited,
/// most of them, costs no allocation at all. An empty `scratch` is refilled from `spare` if it
/// gives a state to copy into, else with a fresh clone.
pub(crate) fn copy_into<'a, M: Clone, B: BorrowMut<M> + From<M>>(
    scratch: &'a mut Option<B>,
    src: &M,
    spare: impl FnOnce() -> Option<B>,
) -> &'a mut M {
    let t = match scratch {
        Some(t) => t,
        None => match spare() {
            Some(t) => scratch.insert(t),
            None => return scratch.insert(B::from(src.clone())).borrow_mut(),
        },
    };
    let t = t.borrow_mut();
    t.clone_from(src);
    t
}

/// The violation reported when no action is enabled and the model is not finished.
pub fn deadlock() -> Violation {
    Violation {
        invariant: "X4-DEADLOCK",
        detail: "deadlock: no action is enabled and the workload has not finished".into(),
    }
}

/// The actions from the initial state (id 0) to state `id`, by parent pointers.
pub(crate) fn path_to<A: Copy>(parents: &[(u32, A)], mut id: u32) -> Vec<A> {
    let mut v = Vec::new();
    while id != 0 {
        let (p, a) = parents[id as usize];
        v.push(a);
        id = p;
    }
    v.reverse();
    v
}

/// Set by [`request_cancel`] (the front end's SIGINT/SIGTERM handler): every search polls it
/// (every few thousand states, and between levels, chunks and schedules) and ends with
/// [`Verdict::Interrupted`]. The caller clears it ([`clear_cancel`]) before a search: a request
/// that comes while the scenario is still loading then still counts.
static CANCEL: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Ask the running search (from any thread) to stop as soon as it polls.
pub fn request_cancel() {
    CANCEL.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// Clear a stale request before a new search.
pub fn clear_cancel() {
    CANCEL.store(false, std::sync::atomic::Ordering::Relaxed);
}

/// Whether a stop was requested.
#[inline]
pub fn cancel_requested() -> bool {
    CANCEL.load(std::sync::atomic::Ordering::Relaxed)
}

/// Print a live progress line (states, states/s, and the frontier and depth or the deepest
/// path) on stderr while exploring. Display only: it never changes what is explored. Off by default; the CLI turns it on when
/// stderr is a terminal.
static PROGRESS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Turn the live progress line on or off (see [`PROGRESS`]).
pub fn set_progress(on: bool) {
    PROGRESS.store(on, std::sync::atomic::Ordering::Relaxed);
}

/// The live progress line: redrawn at most every half second, erased when the search ends.
pub(crate) struct ProgressLine {
    on: bool,
    /// The state bound, shown beside the states stored.
    bound: u64,
    t0: Instant,
    last: Instant,
    shown: bool,
}

impl ProgressLine {
    pub(crate) fn new(bound: u64) -> ProgressLine {
        let now = Instant::now();
        ProgressLine {
            on: PROGRESS.load(std::sync::atomic::Ordering::Relaxed),
            bound,
            t0: now,
            last: now,
            shown: false,
        }
    }

    /// Called per state: looks at the clock only every 4096 states.
    #[inline]
    fn tick(&mut self, states: usize, frontier: usize, depth: u32) {
        if states % 4096 == 0 {
            self.show(states, frontier, depth);
        }
    }

    /// Redraw, unless it was drawn less than half a second ago.
    pub(crate) fn show(&mut self, states: usize, frontier: usize, depth: u32) {
        self.show_with(states, &format!("frontier {frontier}, depth {depth}"));
    }

    /// Redraw with `how` after the states and rate (the search's own measure of progress).
    pub(crate) fn show_with(&mut self, states: usize, how: &str) {
        if !self.on {
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
            "\r\x1b[Kchecking: {states} of at most {} states, {rate:.0} states/s, {how}",
            self.bound
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
    let mut b = Bfs {
        red,
        limits,
        t0: Instant::now(),
        visited: FpSet::default(),
        parents: Vec::new(),
        queue: VecDeque::new(),
        transitions: 0,
        reduced: 0,
        images: 0,
        peak: 0,
        depth: 0,
        env: ExploreEnv::default(),
        scratch: None,
        interner: Interner::default(),
        levels: LevelSizes::default(),
    };
    let (verdict, violation, path, approximate) = b.run(init);
    let states = b.visited.len() as u64 - u64::from(verdict == Verdict::BoundReached);
    let depth_bound = limits.max_depth.is_some_and(|md| b.depth >= md);
    Exploration {
        verdict: if verdict == Verdict::Verified && depth_bound {
            Verdict::BoundReached
        } else {
            verdict
        },
        violation,
        path,
        states,
        transitions: b.transitions,
        seconds: b.t0.elapsed().as_secs_f64(),
        depth: b.depth,
        reduced: b.reduced,
        peak_frontier: b.peak,
        index_bytes: b.visited.capacity() * (std::mem::size_of::<u128>() + 1)
            + b.parents.capacity() * std::mem::size_of::<(u32, M::Action)>(),
        images: b.images,
        approximate,
        levels: b.levels,
    }
}

/// A successor (built in `Bfs::scratch`): its fingerprint and the CPU orders its step fixed.
type Successor = (u128, Vec<Vec<usize>>);

/// A frontier entry: state id, depth, whether its path passes through a symmetric image, and
/// the state.
type Entry<M> = (u32, u32, bool, M);

/// How a search ended: verdict, violation, the actions to it, and whether that path passes
/// through a symmetric image.
type Ending<A> = (Verdict, Option<Violation>, Vec<A>, bool);

/// The breadth-first search's tables and counters.
struct Bfs<'r, M: Model, R> {
    red: &'r R,
    limits: Limits,
    t0: Instant,
    visited: FpSet,
    /// `parents[id] = (parent id, action)`; id 0 is the initial state.
    parents: Vec<(u32, M::Action)>,
    queue: VecDeque<Entry<M>>,
    transitions: u64,
    reduced: u64,
    images: u64,
    peak: usize,
    depth: u32,
    env: ExploreEnv,
    /// The successor being examined (reused while successors are visited: [`copy_into`]).
    scratch: Option<M>,
    /// One copy of each distinct component among the stored states ([`Interner`]).
    interner: Interner,
    levels: LevelSizes,
}

/// Why a successor was not stored: the search ends.
enum Stop<A> {
    /// A violation, with the path to it and whether that path passes through an image.
    Violation(Violation, Vec<A>, bool),
    /// The state bound.
    Bound,
}

impl<M: Model, R: Reduction<M>> Bfs<'_, M, R> {
    /// Apply `a` to a copy of `s` in `self.scratch`: the successor's fingerprint and the CPU
    /// orders the step fixed — or the violation it reports, with its path (`id`'s, then `a`).
    fn successor(
        &mut self,
        id: u32,
        alt: bool,
        s: &M,
        a: M::Action,
    ) -> Result<Successor, Stop<M::Action>> {
        let t = copy_into(&mut self.scratch, s, || None);
        let out = t.apply(a, &mut self.env);
        self.transitions += 1;
        let orders = self.env.take_orders();
        if let Some(v) = out.violation.or_else(|| t.check_state()) {
            let mut p = path_to(&self.parents, id);
            p.push(a);
            return Err(Stop::Violation(v, p, alt));
        }
        let f = self.red.fingerprint(t);
        Ok((f, orders))
    }

    /// Store the successor in `self.scratch` if it is new.
    fn store(
        &mut self,
        id: u32,
        d: u32,
        alt: bool,
        a: M::Action,
        f: u128,
    ) -> Result<(), Stop<M::Action>> {
        if self.visited.insert(f) {
            if self.visited.len() as u64 > self.limits.max_states {
                return Err(Stop::Bound);
            }
            let nid = self.parents.len() as u32;
            self.parents.push((id, a));
            self.levels.store(d + 1);
            let mut t = self.scratch.take().expect("the successor just built");
            t.intern(&self.interner);
            self.queue.push_back((nid, d + 1, alt, t));
            self.images += u64::from(alt);
        }
        Ok(())
    }

    /// Expand `s` (state `id` at depth `d`) by `a`, and by the symmetric images of `a` if
    /// the step fixed an order over interchangeable CPUs.
    fn expand(
        &mut self,
        (id, d, alt): (u32, u32, bool),
        s: &M,
        a: M::Action,
        first: Option<Successor>,
    ) -> Result<(), Stop<M::Action>> {
        let (f, orders) = match first {
            Some(x) => x,
            None => self.successor(id, alt, s, a)?,
        };
        self.store(id, d, alt, a, f)?;
        if !orders.is_empty() {
            for (is, ia) in self.red.images(s, a, &orders) {
                let (g, _) = self.successor(id, true, &is, ia)?;
                self.store(id, d, true, ia, g)?;
            }
        }
        Ok(())
    }

    fn run(&mut self, init: &M) -> Ending<M::Action> {
        let mut progress = ProgressLine::new(self.limits.max_states);
        let mut enabled = Vec::new();
        self.visited.insert(self.red.fingerprint(init));
        self.levels.store(0);
        init.enabled(&mut enabled);
        let Some(&dummy) = enabled.first() else {
            return if init.finished() {
                (Verdict::Verified, None, vec![], false)
            } else {
                (Verdict::Violation, Some(deadlock()), vec![], false)
            };
        };
        self.parents.push((0, dummy));
        if let Some(v) = init.check_state() {
            return (Verdict::Violation, Some(v), vec![], false);
        }
        self.queue.push_back((0, 0, false, init.clone()));
        while let Some((id, d, alt, s)) = self.queue.pop_front() {
            if d > self.depth {
                // A new level: the copies only the finished one held are no longer needed.
                self.interner.purge();
            }
            self.depth = self.depth.max(d);
            progress.tick(self.visited.len(), self.queue.len(), self.depth);
            if self.visited.len() % 4096 == 0 && cancel_requested() {
                return (Verdict::Interrupted, None, vec![], false);
            }
            if self.limits.max_depth.is_some_and(|md| d >= md) {
                continue;
            }
            self.levels.expand(d);
            enabled.clear();
            s.enabled(&mut enabled);
            if enabled.is_empty() {
                if !s.finished() {
                    return (
                        Verdict::Violation,
                        Some(deadlock()),
                        path_to(&self.parents, id),
                        alt,
                    );
                }
                continue;
            }
            match self.expand_state((id, d, alt), &s, &enabled) {
                Ok(()) => {}
                Err(Stop::Violation(v, p, approx)) => {
                    return (Verdict::Violation, Some(v), p, approx)
                }
                Err(Stop::Bound) => return (Verdict::BoundReached, None, vec![], false),
            }
            self.peak = self.peak.max(self.queue.len());
        }
        (Verdict::Verified, None, vec![], false)
    }

    /// Expand one state: a persistent, invisible singleton whose successor is new
    /// (partial-order reduction), else every enabled action.
    fn expand_state(
        &mut self,
        key: (u32, u32, bool),
        s: &M,
        enabled: &[M::Action],
    ) -> Result<(), Stop<M::Action>> {
        let (id, _, alt) = key;
        if self.limits.por {
            if let Some(a) = self.red.persistent_singleton(s, enabled) {
                let x = self.successor(id, alt, s, a)?;
                if !self.visited.contains(&x.0) {
                    self.reduced += 1;
                    return self.expand(key, s, a, Some(x));
                }
            }
        }
        for &a in enabled {
            self.expand(key, s, a, None)?;
        }
        Ok(())
    }
}

//! Level-synchronous parallel breadth-first search (`shootdown check --strategy parallel`):
//! the states of one depth are expanded on a pool of worker threads, which return their
//! successors' fingerprints; one thread merges those into the visited set in the order of the
//! level (the first parent of a new state wins), and the winners make the next level. What it
//! finds — the verdict, the number of states, the counterexample — does not depend on the
//! number of threads, which only decides how fast.
//!
//! Which successors a worker keeps whole: each worker expands contiguous pieces of the level
//! in order, and keeps a successor's state only if no earlier successor of the same piece had
//! its fingerprint — the merge's winner is the first occurrence in the level, so it is always
//! one of those. The rest, most successors, are dropped at once (built in one reused state,
//! as [`crate::explore`] does). A parent is freed as soon as it is expanded, so the finished
//! level shrinks while the next one grows; the last few freed become the boxes kept successors
//! are built in.
//!
//! The one difference from [`crate::explore`]: partial-order reduction's proviso (expand a
//! persistent singleton only if its successor is new) asks whether the successor was visited
//! *before this level started*, so that the answer cannot depend on which worker got there
//! first. That is still the breadth-first proviso: a successor not visited at the start of
//! level `d` lies at depth `d + 1`, so no cycle of the reduced graph closes through it without
//! a fully expanded state. Counts may therefore differ a little from the sequential search's
//! with POR (they are equal without it).

use crate::bound::LevelSizes;
use crate::explore::{
    copy_into, deadlock, path_to, Exploration, ExploreEnv, FpSet, Limits, ProgressLine, Reduction,
    Verdict,
};
use rayon::prelude::*;
use shootdown_engine::{Interner, Model, Violation};
use std::time::Instant;

/// A successor not visited before this level: the action, whether it was applied to a
/// symmetric image of the state ([`Reduction::images`]), the fingerprint, and the state if it
/// is the first of its fingerprint in the worker's piece (only such a one can win the merge).
struct Succ<M: Model> {
    action: M::Action,
    image: bool,
    fp: u128,
    state: Option<Box<M>>,
}

/// What expanding one state produced.
enum Expansion<M: Model> {
    Next(Vec<Succ<M>>),
    /// A violation: the actions after this state that reach it, and whether through an image.
    Violation(Vec<M::Action>, Violation, bool),
}

/// One state's expansion: its id and image flag, the result and the counters.
struct Expanded<M: Model> {
    id: u32,
    alt: bool,
    result: Expansion<M>,
    transitions: u64,
    reduced: bool,
}

/// A worker's tools for one contiguous piece of a level.
struct Worker<M> {
    env: ExploreEnv,
    /// The successor being built (reused while successors are dropped; boxed, so that a kept
    /// one moves into the next level as a pointer).
    scratch: Option<Box<M>>,
    /// Fingerprints of the successors kept in this piece so far.
    seen: FpSet,
    /// States of the piece already expanded, whose allocations the next kept successors
    /// reuse (`clone_from`) instead of allocating afresh.
    spare: Vec<Box<M>>,
}

/// Expanded states a worker holds on to as [`Worker::spare`]s (about one successor per state
/// is kept: a few spares cover the states that keep several).
const SPARES: usize = 4;

impl<M> Worker<M> {
    fn new() -> Self {
        Worker {
            env: ExploreEnv::default(),
            scratch: None,
            seen: FpSet::default(),
            spare: Vec::new(),
        }
    }
}

/// Expand `s` (its path through an image if `alt`) against the states visited before this
/// level. Which successors it returns depends only on `s` and `before`; which of them carry
/// their state, on what the worker kept earlier in its piece.
fn expand<M: Model, R: Reduction<M>>(
    red: &R,
    limits: Limits,
    before: &FpSet,
    interner: &Interner,
    w: &mut Worker<M>,
    (id, alt, s): (u32, bool, &M),
) -> Expanded<M> {
    let mut x = Expanded {
        id,
        alt,
        result: Expansion::Next(Vec::new()),
        transitions: 0,
        reduced: false,
    };
    if crate::explore::cancel_requested() {
        // The level ends unexpanded; the search returns `Interrupted` before the next one.
        return x;
    }
    let mut enabled = Vec::new();
    s.enabled(&mut enabled);
    if enabled.is_empty() {
        if !s.finished() {
            x.result = Expansion::Violation(vec![], deadlock(), alt);
        }
        return x;
    }
    let mut out = Vec::new();
    // Apply one action (to the state or an image of it); a violation ends the expansion.
    let mut step = |src: &M, a: M::Action, image: bool, out: &mut Vec<Succ<M>>, n: &mut u64| {
        let t = copy_into(&mut w.scratch, src, || w.spare.pop());
        let o = t.apply(a, &mut w.env);
        *n += 1;
        let orders = w.env.take_orders();
        if let Some(v) = o.violation.or_else(|| t.check_state()) {
            return Err(Expansion::Violation(vec![a], v, alt || image));
        }
        let fp = red.fingerprint(t);
        if !before.contains(&fp) {
            let state = if w.seen.insert(fp) {
                w.scratch.take().map(|mut t| {
                    t.intern(interner);
                    t
                })
            } else {
                None
            };
            out.push(Succ {
                action: a,
                image,
                fp,
                state,
            });
        }
        Ok(orders)
    };
    let n = &mut x.transitions;
    let actions: Vec<M::Action> = match limits
        .por
        .then(|| red.persistent_singleton(s, &enabled))
        .flatten()
    {
        Some(a) => {
            let mut probe = Vec::new();
            if let Err(v) = step(s, a, false, &mut probe, n) {
                x.result = v;
                return x;
            }
            if probe.is_empty() {
                enabled
            } else {
                x.reduced = true;
                out = probe;
                vec![]
            }
        }
        None => enabled,
    };
    for a in actions {
        match step(s, a, false, &mut out, n) {
            Ok(orders) if !orders.is_empty() => {
                for (is, ia) in red.images(s, a, &orders) {
                    if let Err(v) = step(&is, ia, true, &mut out, n) {
                        x.result = v;
                        return x;
                    }
                }
            }
            Ok(_) => {}
            Err(v) => {
                x.result = v;
                return x;
            }
        }
    }
    x.result = Expansion::Next(out);
    x
}

/// Explore level by level on `threads` worker threads; see the module documentation.
pub fn explore_parallel<M, R>(
    init: &M,
    red: &R,
    limits: Limits,
    threads: usize,
) -> Exploration<M::Action>
where
    M: Model + Send + Sync,
    M::Action: Send + Sync,
    R: Reduction<M> + Sync,
{
    let mut x = Levels {
        red,
        limits,
        t0: Instant::now(),
        visited: FpSet::default(),
        parents: Vec::new(),
        interner: Interner::default(),
        transitions: 0,
        reduced: 0,
        images: 0,
        peak: 0,
        depth: 0,
        over: false,
        levels: LevelSizes::default(),
    };
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads.max(1))
        .build()
        .expect("a thread pool");
    let (verdict, violation, path, approximate) = x.run(init, &pool);
    Exploration {
        verdict,
        violation,
        path,
        // A state bound stops the search with one state too many stored.
        states: x.visited.len() as u64 - u64::from(x.over),
        transitions: x.transitions,
        seconds: x.t0.elapsed().as_secs_f64(),
        depth: x.depth,
        reduced: x.reduced,
        peak_frontier: x.peak,
        index_bytes: x.visited.capacity() * (std::mem::size_of::<u128>() + 1)
            + x.parents.capacity() * std::mem::size_of::<(u32, M::Action)>(),
        images: x.images,
        approximate,
        levels: x.levels,
    }
}

/// How a search ended: verdict, violation, the actions to it, and whether that path passes
/// through a symmetric image.
type Ending<A> = (Verdict, Option<Violation>, Vec<A>, bool);

/// A level: state id, whether its path passes through an image, the state.
type Level<M> = Vec<(u32, bool, Box<M>)>;

/// The smallest piece of a level a worker expands with one [`Worker`]: large enough that the
/// duplicates among a piece's successors (the same state reached along two orders of
/// independent steps, usually from neighbouring parents) are found in the piece and not kept.
const MIN_PIECE: usize = 1 << 10;

/// The search's tables and counters.
struct Levels<'r, M: Model, R> {
    red: &'r R,
    limits: Limits,
    t0: Instant,
    visited: FpSet,
    /// `parents[id] = (parent id, action)`; id 0 is the initial state.
    parents: Vec<(u32, M::Action)>,
    /// One copy of each distinct component among the stored states ([`Interner`]): each
    /// kept successor's fresh components are interned on its worker.
    interner: Interner,
    transitions: u64,
    reduced: u64,
    images: u64,
    peak: usize,
    depth: u32,
    /// The state bound was exceeded (by one).
    over: bool,
    levels: LevelSizes,
}

impl<M, R> Levels<'_, M, R>
where
    M: Model + Send + Sync,
    M::Action: Send + Sync,
    R: Reduction<M> + Sync,
{
    fn run(&mut self, init: &M, pool: &rayon::ThreadPool) -> Ending<M::Action> {
        self.visited.insert(self.red.fingerprint(init));
        self.levels.store(0);
        let mut first = Vec::new();
        init.enabled(&mut first);
        let Some(&dummy) = first.first() else {
            return match (!init.finished()).then(deadlock) {
                Some(v) => (Verdict::Violation, Some(v), vec![], false),
                None => (Verdict::Verified, None, vec![], false),
            };
        };
        self.parents.push((0, dummy));
        if let Some(v) = init.check_state() {
            return (Verdict::Violation, Some(v), vec![], false);
        }
        let mut level: Level<M> = vec![(0, false, Box::new(init.clone()))];
        let mut progress = ProgressLine::new(self.limits.max_states);
        while !level.is_empty() {
            progress.show(self.visited.len(), level.len(), self.depth);
            if crate::explore::cancel_requested() {
                return (Verdict::Interrupted, None, vec![], false);
            }
            if self.limits.max_depth.is_some_and(|md| self.depth >= md) {
                return (Verdict::BoundReached, None, vec![], false);
            }
            self.peak = self.peak.max(level.len());
            level = match self.next_level(level, pool) {
                Ok(next) => next,
                Err(ending) => return ending,
            };
            if !level.is_empty() {
                self.depth += 1;
            }
        }
        // A stop requested while a level was expanded leaves the rest of that level
        // unexpanded (`expand`), and so its next level possibly empty: the loop then ends here
        // having proved nothing.
        if crate::explore::cancel_requested() {
            return (Verdict::Interrupted, None, vec![], false);
        }
        (Verdict::Verified, None, vec![], false)
    }

    /// Expand `level` on the pool (freeing each state once expanded), merge its successors in
    /// the level's order (the first parent of each new state wins): the next level — or how
    /// the search ends.
    fn next_level(
        &mut self,
        level: Level<M>,
        pool: &rayon::ThreadPool,
    ) -> Result<Level<M>, Ending<M::Action>> {
        let (red, limits, before, interner) =
            (self.red, self.limits, &self.visited, &self.interner);
        let mut expanded: Vec<Expanded<M>> = pool.install(|| {
            level
                .into_par_iter()
                .with_min_len(MIN_PIECE)
                .map_init(Worker::new, |w, (id, alt, s)| {
                    let x = expand(red, limits, before, interner, w, (id, alt, &s));
                    if w.spare.len() < SPARES {
                        w.spare.push(s);
                    }
                    x
                })
                .collect()
        });
        let mut next: Level<M> = Vec::new();
        let mut losers: Vec<Box<M>> = Vec::new();
        let mut ending = None;
        'merge: for x in expanded.iter_mut() {
            self.levels.expand(self.depth);
            self.transitions += x.transitions;
            self.reduced += u64::from(x.reduced);
            match &mut x.result {
                Expansion::Violation(tail, v, approximate) => {
                    let mut p = path_to(&self.parents, x.id);
                    p.append(tail);
                    ending = Some((Verdict::Violation, Some(v.clone()), p, *approximate));
                    break 'merge;
                }
                Expansion::Next(succ) => {
                    for sx in succ.drain(..) {
                        if !self.visited.insert(sx.fp) {
                            losers.extend(sx.state);
                            continue;
                        }
                        if self.visited.len() as u64 > limits.max_states {
                            self.over = true;
                            ending = Some((Verdict::BoundReached, None, vec![], false));
                            break 'merge;
                        }
                        let id = self.parents.len() as u32;
                        self.parents.push((x.id, sx.action));
                        self.levels.store(self.depth + 1);
                        let alt = x.alt || sx.image;
                        self.images += u64::from(alt);
                        let state = sx.state.expect("the first of its fingerprint in its piece");
                        next.push((id, alt, state));
                    }
                }
            }
        }
        // The states not taken are freed on the workers (most were allocated there); then
        // the copies only they and the finished level held.
        pool.install(|| {
            rayon::join(
                || losers.into_par_iter().for_each(drop),
                || expanded.into_par_iter().for_each(drop),
            )
        });
        self.interner.purge();
        match ending {
            Some(e) => Err(e),
            None => Ok(next),
        }
    }
}

//! Level-synchronous parallel breadth-first search (`shootdown check --strategy parallel`):
//! the states of one depth are expanded on a pool of worker threads, which return the
//! fingerprints of their successors; one thread merges those into the visited set in the order
//! of the level (the first parent of a new state wins); the workers then rebuild the new states
//! from their parents. What it finds — the verdict, the number of states, the counterexample —
//! does not depend on the number of threads, which only decides how fast. (Rebuilding costs one
//! more step per new state; keeping every successor until the merge, most of them already
//! visited, cost far more in allocation: the first version was 2.6× slower on one thread.)
//!
//! The one difference from [`crate::explore`]: partial-order reduction's proviso (expand a
//! persistent singleton only if its successor is new) asks whether the successor was visited
//! *before this level started*, so that the answer cannot depend on which worker got there
//! first. That is still the breadth-first proviso: a successor not visited at the start of
//! level `d` lies at depth `d + 1`, so no cycle of the reduced graph closes through it without
//! a fully expanded state. Counts may therefore differ a little from the sequential search's
//! with POR (they are equal without it).

use crate::explore::{
    copy_into, deadlock, path_to, Exploration, ExploreEnv, FpSet, Limits, ProgressLine, Reduction,
    Verdict,
};
use rayon::prelude::*;
use shootdown_engine::{Model, Violation};
use std::time::Instant;

/// A successor found by a worker: the action, which symmetric image of the state it was
/// applied to (`None`: the state itself), and the fingerprint. The state is dropped at once and
/// rebuilt later if it is new — one more step per new state, instead of keeping a copy of every
/// successor (most of them already visited) until the merge.
#[derive(Clone, Copy)]
struct Succ<A> {
    action: A,
    /// For an image: the action whose CPU orders made it, and its index in
    /// [`Reduction::images`].
    image: Option<(A, u32)>,
    fp: u128,
}

/// What expanding one state produced.
enum Expansion<A> {
    /// Successors not visited before this level.
    Next(Vec<Succ<A>>),
    /// A violation: the actions after this state that reach it, and whether through an image.
    Violation(Vec<A>, Violation, bool),
}

/// One state's expansion and its counters.
struct Expanded<A> {
    result: Expansion<A>,
    transitions: u64,
    reduced: bool,
}

/// Expand `s` (its path through an image if `alt`) against the states visited before this
/// level. What it returns depends only on `s` and `before`.
fn expand<M: Model, R: Reduction<M>>(
    red: &R,
    limits: Limits,
    before: &FpSet,
    (env, scratch): &mut (ExploreEnv, Option<M>),
    s: &M,
    alt: bool,
) -> Expanded<M::Action> {
    let mut x = Expanded {
        result: Expansion::Next(Vec::new()),
        transitions: 0,
        reduced: false,
    };
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
    let mut step = |src: &M,
                    a: M::Action,
                    image: Option<(M::Action, u32)>,
                    out: &mut Vec<Succ<M::Action>>,
                    x: &mut Expanded<M::Action>| {
        let t = copy_into(scratch, src);
        let o = t.apply(a, env);
        x.transitions += 1;
        let orders = env.take_orders();
        if let Some(v) = o.violation.or_else(|| t.check_state()) {
            return Err(Expansion::Violation(vec![a], v, alt || image.is_some()));
        }
        let fp = red.fingerprint(&t);
        if !before.contains(&fp) {
            out.push(Succ {
                action: a,
                image,
                fp,
            });
        }
        Ok(orders)
    };
    let actions: Vec<M::Action> = match limits
        .por
        .then(|| red.persistent_singleton(s, &enabled))
        .flatten()
    {
        Some(a) => {
            let mut probe = Vec::new();
            if let Err(v) = step(s, a, None, &mut probe, &mut x) {
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
        match step(s, a, None, &mut out, &mut x) {
            Ok(orders) if !orders.is_empty() => {
                for (k, (is, ia)) in red.images(s, a, &orders).into_iter().enumerate() {
                    if let Err(v) = step(&is, ia, Some((a, k as u32)), &mut out, &mut x) {
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

/// Rebuild a successor [`expand`] found (the same steps, so the same state).
fn rebuild<M: Model, R: Reduction<M>>(
    red: &R,
    env: &mut ExploreEnv,
    s: &M,
    succ: Succ<M::Action>,
) -> M {
    let (src, a) = match succ.image {
        None => (s.clone(), succ.action),
        Some((orig, k)) => {
            let mut t = s.clone();
            t.apply(orig, env);
            let orders = env.take_orders();
            let (is, ia) = red
                .images(s, orig, &orders)
                .into_iter()
                .nth(k as usize)
                .expect("the same images as when expanded");
            (is, ia)
        }
    };
    let mut t = src;
    t.apply(a, env);
    env.take_orders();
    t
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
        transitions: 0,
        reduced: 0,
        images: 0,
        peak: 0,
        depth: 0,
        over: false,
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
    }
}

/// How a search ended: verdict, violation, the actions to it, and whether that path passes
/// through a symmetric image.
type Ending<A> = (Verdict, Option<Violation>, Vec<A>, bool);

/// A level: state id, whether its path passes through an image, the state.
type Level<M> = Vec<(u32, bool, M)>;

/// The search's tables and counters.
struct Levels<'r, M: Model, R> {
    red: &'r R,
    limits: Limits,
    t0: Instant,
    visited: FpSet,
    /// `parents[id] = (parent id, action)`; id 0 is the initial state.
    parents: Vec<(u32, M::Action)>,
    transitions: u64,
    reduced: u64,
    images: u64,
    peak: usize,
    depth: u32,
    /// The state bound was exceeded (by one).
    over: bool,
}

impl<M, R> Levels<'_, M, R>
where
    M: Model + Send + Sync,
    M::Action: Send + Sync,
    R: Reduction<M> + Sync,
{
    fn run(&mut self, init: &M, pool: &rayon::ThreadPool) -> Ending<M::Action> {
        self.visited.insert(self.red.fingerprint(init));
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
        let mut level: Level<M> = vec![(0, false, init.clone())];
        let mut progress = ProgressLine::new();
        while !level.is_empty() {
            progress.show(self.visited.len(), level.len(), self.depth);
            if self.limits.max_depth.is_some_and(|md| self.depth >= md) {
                return (Verdict::BoundReached, None, vec![], false);
            }
            self.peak = self.peak.max(level.len());
            let next = match self.next_level(&level, pool) {
                Ok(next) => next,
                Err(ending) => return ending,
            };
            // Freed on the workers too: most states were allocated there.
            pool.install(|| {
                std::mem::replace(&mut level, next)
                    .into_par_iter()
                    .for_each(drop)
            });
            if !level.is_empty() {
                self.depth += 1;
            }
        }
        (Verdict::Verified, None, vec![], false)
    }

    /// Expand `level` on the pool, merge its successors in the level's order (the first
    /// parent of each new state wins), and rebuild the new states: the next level — or how
    /// the search ends.
    fn next_level(
        &mut self,
        level: &Level<M>,
        pool: &rayon::ThreadPool,
    ) -> Result<Level<M>, Ending<M::Action>> {
        let (red, limits, before) = (self.red, self.limits, &self.visited);
        let expanded: Vec<Expanded<M::Action>> = pool.install(|| {
            level
                .par_iter()
                .map_init(Default::default, |w, (_, alt, s)| {
                    expand(red, limits, before, w, s, *alt)
                })
                .collect()
        });
        let mut winners: Vec<(usize, Succ<M::Action>)> = Vec::new();
        for (i, x) in expanded.into_iter().enumerate() {
            self.transitions += x.transitions;
            self.reduced += u64::from(x.reduced);
            match x.result {
                Expansion::Violation(tail, v, approximate) => {
                    let mut p = path_to(&self.parents, level[i].0);
                    p.extend(tail);
                    return Err((Verdict::Violation, Some(v), p, approximate));
                }
                Expansion::Next(succ) => {
                    for sx in succ {
                        if !self.visited.insert(sx.fp) {
                            continue;
                        }
                        if self.visited.len() as u64 > limits.max_states {
                            self.over = true;
                            return Err((Verdict::BoundReached, None, vec![], false));
                        }
                        winners.push((i, sx));
                    }
                }
            }
        }
        // The next level is built in place on the workers (ids follow the winners' order):
        // one copy of each state, not one more to move it into the level.
        let base = self.parents.len() as u32;
        let next: Level<M> = pool.install(|| {
            winners
                .par_iter()
                .enumerate()
                .map_init(ExploreEnv::default, |env, (k, &(i, sx))| {
                    let alt = level[i].1 || sx.image.is_some();
                    (base + k as u32, alt, rebuild(red, env, &level[i].2, sx))
                })
                .collect()
        });
        self.transitions += winners.len() as u64;
        self.images += next.iter().filter(|(_, alt, _)| *alt).count() as u64;
        self.parents
            .extend(winners.iter().map(|&(i, sx)| (level[i].0, sx.action)));
        Ok(next)
    }
}

//! Depth-first verification on every core (`shootdown check --strategy dfs`, and the first pass
//! of the default strategy): the state space of [`crate::explore`]'s breadth-first search, with
//! visited states kept as fingerprints only (about 17 bytes each in the hash sets) and no
//! frontier: the only full states held are those on each worker's current path, one per level.
//!
//! **Workers.** Each worker searches depth-first from a state of a shared pool. The visited set
//! is one hash set per shard of the fingerprint space, each behind its own lock, so that two
//! workers rarely wait for each other and a set grows a shard at a time. When a worker is idle
//! and the pool is empty, a busy worker hands over half the actions still to try at the bottom
//! of its path (the largest subtrees): it applies them and puts the new successors, each with
//! the actions that reach it, into the pool. The search ends when every worker is idle and the
//! pool is empty, or at the first violation.
//!
//! **What does not depend on the number of workers.** The verdict, the number of states, of
//! transitions and of reduced states: each state is expanded once, by the worker that stored it,
//! and what an expansion explores depends only on the state. That needs the reductions to be
//! functions of the state, where breadth-first search lets them look at the visited set:
//!
//! * *Which persistent singleton.* Of the actions that would each be a persistent set on their
//!   own ([`Reduction::persistent_candidates`]), the one whose successor has the smallest
//!   fingerprint. Under symmetry that picks the same class of successor from every renaming of
//!   a state (the lowest CPU id would not), so whichever renaming a worker reached first, the
//!   classes explored are the same.
//! * *The cycle proviso.* Breadth-first search expands a singleton only if its successor is new,
//!   so that no cycle of the reduced graph ignores an action forever; which successors are new
//!   depends on the order of the search. Here the singleton is always taken (a *static*
//!   proviso), which is sound if no cycle consists of singleton steps only: the model's
//!   singletons are local steps that advance a CPU through a kernel routine
//!   ([`shootdown_linux::Machine::step_is_local`]), and a routine never returns to where it
//!   was by local steps alone. The search checks it: when a singleton's successor was already
//!   visited, it follows the chain of singletons from there until a state that has none; a
//!   state met twice on that chain is a cycle of local steps, and the search ends
//!   ([`DfsEnd::LocalCycle`]; the caller falls back to breadth-first search). Every such cycle
//!   that the reduced graph reaches is found this way: the first worker to enter it stops at a
//!   state already visited, which lies on the cycle.
//!
//! The counterexample a depth-first search finds need not be the shortest; the default strategy
//! runs breadth-first search for a shortest one when this search finds a violation (`lib.rs`).

use crate::bound::LevelSizes;
use crate::explore::{copy_into, deadlock, Exploration, ExploreEnv, FpSet, Limits, Reduction};
use crate::explore::{ProgressLine, Verdict};
use shootdown_engine::{Model, Violation};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Instant;

/// Shards of the visited set: enough that two workers seldom want the same lock, few enough
/// that each shard's table stays large (it grows, and briefly doubles, one shard at a time).
const SHARDS: usize = 64;

/// States of finished levels a worker keeps to build new states in (a path goes down one level
/// for each it comes up).
const SPARES: usize = 2;

/// Expansions between a worker's looks at whether another one is idle.
const DONATE_EVERY: u32 = 64;

/// Singleton steps followed from a visited state before the chain counts as a cycle (no
/// kernel routine of the model runs this many local steps in a row).
const MAX_LOCAL_CHAIN: usize = 4096;

/// One shard of the visited set, alone in its cache lines (two workers taking neighbouring
/// shards' locks would otherwise contend for one line).
#[repr(align(128))]
#[derive(Default)]
struct Shard(Mutex<FpSet>);

/// The visited set, sharded by fingerprint (see the module documentation).
struct Visited {
    shards: Vec<Shard>,
    /// States stored, as far as the workers have reported them ([`Worker::count`]).
    len: AtomicU64,
}

impl Visited {
    fn new() -> Self {
        Visited {
            shards: (0..SHARDS).map(|_| Shard::default()).collect(),
            len: AtomicU64::new(0),
        }
    }

    /// Store `f`; whether it is new. Its shard is chosen by bits the hash sets do not use
    /// (they hash by the low 64).
    fn insert(&self, f: u128) -> bool {
        let i = (f >> 122) as usize % SHARDS;
        self.shards[i]
            .0
            .lock()
            .expect("a visited-set shard")
            .insert(f)
    }

    /// States stored.
    fn stored(&self) -> u64 {
        self.shards
            .iter()
            .map(|s| s.0.lock().expect("a shard").len() as u64)
            .sum()
    }

    fn bytes(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.0.lock().expect("a shard").capacity() * (std::mem::size_of::<u128>() + 1))
            .sum()
    }
}

/// States a worker stores before it adds them to the shared count (one shared counter updated
/// on every state would be a cache line the workers pass back and forth).
const COUNT_BATCH: u64 = 1024;

/// A state to search from: stored already; the actions that reach it from the initial state,
/// and whether they pass through a symmetric image.
struct Item<M: Model> {
    state: M,
    path: Vec<M::Action>,
    alt: bool,
}

/// The pool of states waiting for a worker, and how many workers wait for one.
struct Pool<M: Model> {
    items: Vec<Item<M>>,
    idle: usize,
    done: bool,
}

/// How a depth-first search ended, beyond a verdict.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DfsEnd<A> {
    /// Every reachable state was visited.
    Verified,
    /// A violation: the actions that reach it, and whether they pass through an image.
    Violation(Violation, Vec<A>, bool),
    /// More states than [`Limits::max_states`].
    BoundReached,
    /// Stopped by [`crate::request_cancel`]: nothing was proved.
    Interrupted,
    /// Persistent singletons that lead, one after another, back to a state: the static
    /// proviso does not hold for this model, and the search proved nothing.
    LocalCycle(Vec<A>),
}

/// What the workers share.
struct Shared<M: Model> {
    visited: Visited,
    pool: Mutex<Pool<M>>,
    wake: Condvar,
    /// Workers waiting in the pool (read without its lock, to decide whether to hand work over).
    hungry: AtomicUsize,
    stop: AtomicBool,
    end: Mutex<Option<DfsEnd<M::Action>>>,
    threads: usize,
}

impl<M: Model> Shared<M> {
    fn lock_pool(&self) -> MutexGuard<'_, Pool<M>> {
        self.pool.lock().expect("the pool")
    }

    /// End the search (the first ending wins) and release every waiting worker.
    fn finish(&self, e: DfsEnd<M::Action>) {
        let mut end = self.end.lock().expect("the ending");
        if end.is_none() {
            *end = Some(e);
        }
        self.stop.store(true, Relaxed);
        self.lock_pool().done = true;
        self.wake.notify_all();
    }

    /// Hand states to idle workers.
    fn give(&self, items: Vec<Item<M>>) {
        if items.is_empty() {
            return;
        }
        self.lock_pool().items.extend(items);
        self.wake.notify_all();
    }

    /// The next state to search from, or None when the search is over.
    fn take(&self) -> Option<Item<M>> {
        let mut pool = self.lock_pool();
        loop {
            if pool.done {
                return None;
            }
            if let Some(it) = pool.items.pop() {
                return Some(it);
            }
            pool.idle += 1;
            self.hungry.store(pool.idle, Relaxed);
            if pool.idle == self.threads {
                pool.done = true;
                self.wake.notify_all();
                return None;
            }
            pool = self.wake.wait(pool).expect("the pool");
            pool.idle -= 1;
            self.hungry.store(pool.idle, Relaxed);
        }
    }
}

/// An action to try from a level's state: one of a full expansion, the persistent singleton
/// chosen (its successor is searched even if visited, for the proviso's check), or an action
/// of a symmetric image of the state.
enum Todo<M: Model> {
    Act(M::Action),
    Single(M::Action),
    Image(Box<M>, M::Action),
}

/// One level of a worker's current path.
struct Level<M: Model> {
    state: M,
    todo: Vec<Todo<M>>,
    via: Option<M::Action>,
    alt: bool,
}

/// A violation found from a state: the actions after it that reach it, and what broke.
type Found<A> = (Vec<A>, Violation);

/// A worker's tools and counters.
struct Worker<'s, M: Model, R> {
    sh: &'s Shared<M>,
    red: &'s R,
    limits: Limits,
    env: ExploreEnv,
    /// The successor being built (reused while successors turn out visited: [`copy_into`]).
    scratch: Option<M>,
    /// States of levels left, whose allocations the next new states are built in.
    spare: Vec<M>,
    transitions: u64,
    reduced: u64,
    images: u64,
    /// Steps taken to check the proviso (not transitions: how many depends on the order).
    chain_steps: u64,
    depth: u32,
    since_look: u32,
    /// States this worker stored and has not yet added to [`Visited::len`].
    count: u64,
    progress: Option<ProgressLine>,
}

impl<'s, M: Model, R: Reduction<M>> Worker<'s, M, R> {
    /// Apply `a` to a copy of `s` in `self.scratch`: its fingerprint and the CPU orders the
    /// step fixed, or the violation it reports.
    fn successor(&mut self, s: &M, a: M::Action) -> Result<(u128, Vec<Vec<usize>>), Violation> {
        let spare = &mut self.spare;
        let t = copy_into(&mut self.scratch, s, || spare.pop());
        let out = t.apply(a, &mut self.env);
        let orders = self.env.take_orders();
        match out.violation.or_else(|| t.check_state()) {
            Some(v) => Err(v),
            None => Ok((self.red.fingerprint(t), orders)),
        }
    }

    /// The persistent singleton of `s` among `en`, if any: of the candidates, the one whose
    /// successor has the smallest fingerprint (a function of the state's class). With several,
    /// each is applied once to compare (`probes`: counted as transitions by the caller).
    fn singleton(
        &mut self,
        s: &M,
        en: &[M::Action],
        probes: &mut u64,
    ) -> Result<Option<M::Action>, Found<M::Action>> {
        let mut cands = Vec::new();
        self.red.persistent_candidates(s, en, &mut cands);
        if cands.len() <= 1 {
            return Ok(cands.first().copied());
        }
        let mut best: Option<(u128, M::Action)> = None;
        for a in cands {
            *probes += 1;
            let (f, _) = self.successor(s, a).map_err(|v| (vec![a], v))?;
            if best.map_or(true, |(bf, _)| f < bf) {
                best = Some((f, a));
            }
        }
        Ok(best.map(|(_, a)| a))
    }

    /// The actions to try from a newly stored `s`, popped from the back: the persistent
    /// singleton, else every enabled action in breadth-first search's order. Or the violation
    /// found on the way (a deadlock, or one a probe of the singleton's candidates reports).
    fn todo(&mut self, s: &M) -> Result<Vec<Todo<M>>, Found<M::Action>> {
        let mut en = Vec::new();
        s.enabled(&mut en);
        if en.is_empty() && !s.finished() {
            return Err((vec![], deadlock()));
        }
        if self.limits.por {
            let mut probes = 0;
            let single = self.singleton(s, &en, &mut probes);
            self.transitions += probes;
            if let Some(a) = single? {
                self.reduced += 1;
                return Ok(vec![Todo::Single(a)]);
            }
        }
        Ok(en.into_iter().rev().map(Todo::Act).collect())
    }

    /// Whether the chain of persistent singletons from `from` (a visited state) meets a state
    /// twice: a cycle of singleton steps, which the static proviso must not have.
    fn local_cycle(&mut self, from: &M) -> bool {
        let mut w = from.clone();
        let mut seen = vec![self.red.fingerprint(&w)];
        let mut en = Vec::new();
        let mut probes = 0;
        loop {
            en.clear();
            w.enabled(&mut en);
            let Ok(Some(a)) = self.singleton(&w, &en, &mut probes) else {
                self.chain_steps += probes;
                return false;
            };
            w.apply(a, &mut self.env);
            self.env.take_orders();
            self.chain_steps += 1;
            let f = self.red.fingerprint(&w);
            if seen.contains(&f) || seen.len() >= MAX_LOCAL_CHAIN {
                return true;
            }
            seen.push(f);
        }
    }

    /// Try `next` from `s` (a level's state whose path passes through an image if `alt`):
    /// the successor if it is new (stored now), with its action and image flag. Images of `s`
    /// the step calls for are pushed onto `more`. `Err` ends the search.
    #[allow(clippy::type_complexity)]
    fn try_next(
        &mut self,
        s: &M,
        next: Todo<M>,
        alt: bool,
        more: &mut Vec<Todo<M>>,
    ) -> Result<Option<(M, M::Action, bool)>, DfsEnd<M::Action>> {
        let (a, alt, image, single) = match next {
            Todo::Act(a) => (a, alt, None, false),
            Todo::Single(a) => (a, alt, None, true),
            Todo::Image(s, a) => (a, true, Some(s), false),
        };
        let src = image.as_deref().unwrap_or(s);
        self.transitions += 1;
        let (f, orders) = match self.successor(src, a) {
            Ok(x) => x,
            Err(v) => return Err(DfsEnd::Violation(v, vec![a], alt)),
        };
        if !orders.is_empty() && image.is_none() {
            // An image's successor is one of the symmetric closure (the images of an image are
            // images of the level's own state: not generated again).
            for (is, ia) in self.red.images(src, a, &orders) {
                more.push(Todo::Image(Box::new(is), ia));
            }
        }
        if !self.sh.visited.insert(f) {
            if single {
                let t = self.scratch.take().expect("the successor just built");
                let cycle = self.local_cycle(&t);
                self.scratch = Some(t);
                if cycle {
                    return Err(DfsEnd::LocalCycle(vec![a]));
                }
            }
            return Ok(None);
        }
        // The shared count lags by less than a batch per worker, and only counts states
        // stored: past the bound by it, the search is past it.
        self.count += 1;
        if self.count == COUNT_BATCH {
            self.flush_count()?;
        }
        self.images += u64::from(alt);
        let t = self.scratch.take().expect("the successor just built");
        Ok(Some((t, a, alt)))
    }

    /// Add this worker's new states to the shared count: `Err` past the state bound.
    fn flush_count(&mut self) -> Result<(), DfsEnd<M::Action>> {
        let n = self.sh.visited.len.fetch_add(self.count, Relaxed) + self.count;
        self.count = 0;
        if n > self.limits.max_states {
            return Err(DfsEnd::BoundReached);
        }
        if crate::explore::cancel_requested() {
            return Err(DfsEnd::Interrupted);
        }
        Ok(())
    }

    /// Search depth-first from `item`, handing work to idle workers on the way. `Err` ends
    /// the whole search (with the path prefix still to be added by the caller).
    fn search(&mut self, item: Item<M>) -> Result<(), DfsEnd<M::Action>> {
        let Item {
            state,
            path: prefix,
            alt,
        } = item;
        let mut stack: Vec<Level<M>> = Vec::new();
        match self.todo(&state) {
            Ok(todo) => stack.push(Level {
                state,
                todo,
                via: None,
                alt,
            }),
            Err((tail, v)) => return Err(with_prefix(DfsEnd::Violation(v, tail, alt), &prefix)),
        }
        let mut more = Vec::new();
        while let Some(top) = stack.last_mut() {
            if self.sh.stop.load(Relaxed) {
                return Ok(());
            }
            let Some(next) = top.todo.pop() else {
                if let Some(done) = stack.pop() {
                    if self.spare.len() < SPARES {
                        self.spare.push(done.state);
                    }
                }
                continue;
            };
            let alt = top.alt;
            let got = {
                let top = stack.last().expect("the current level");
                self.try_next(&top.state, next, alt, &mut more)
            };
            stack
                .last_mut()
                .expect("the current level")
                .todo
                .append(&mut more);
            let (t, a, alt) = match got {
                Ok(Some(x)) => x,
                Ok(None) => continue,
                Err(e) => return Err(with_prefix(e, &path_of(&prefix, &stack))),
            };
            self.depth = self.depth.max((prefix.len() + stack.len()) as u32);
            match self.todo(&t) {
                Ok(todo) => stack.push(Level {
                    state: t,
                    todo,
                    via: Some(a),
                    alt,
                }),
                Err((tail, v)) => {
                    let e = DfsEnd::Violation(v, [&[a][..], &tail].concat(), alt);
                    return Err(with_prefix(e, &path_of(&prefix, &stack)));
                }
            }
            self.since_look += 1;
            if self.since_look >= DONATE_EVERY {
                self.since_look = 0;
                if let Some(p) = self.progress.as_mut() {
                    let states = self.sh.visited.len.load(Relaxed) as usize;
                    p.show_with(states, &format!("depth-first, deepest path {}", self.depth));
                }
                if self.sh.hungry.load(Relaxed) > 0 {
                    self.donate(&mut stack, &prefix)?;
                }
            }
        }
        Ok(())
    }

    /// Hand half the actions left at the bottom-most level that has any to the pool, as the
    /// new states they lead to.
    fn donate(
        &mut self,
        stack: &mut [Level<M>],
        prefix: &[M::Action],
    ) -> Result<(), DfsEnd<M::Action>> {
        let Some(i) = stack.iter().position(|l| !l.todo.is_empty()) else {
            return Ok(());
        };
        let path = path_of(prefix, &stack[..=i]);
        let n = stack[i].todo.len().div_ceil(2);
        // The front of the list is what this worker would have tried last.
        let mut todo: Vec<Todo<M>> = stack[i].todo.drain(..n).collect();
        let mut items = Vec::new();
        let level = &stack[i];
        while let Some(next) = todo.pop() {
            match self.try_next(&level.state, next, level.alt, &mut todo) {
                Ok(Some((state, a, alt))) => {
                    let mut p = path.clone();
                    p.push(a);
                    items.push(Item {
                        state,
                        path: p,
                        alt,
                    });
                }
                Ok(None) => {}
                Err(e) => {
                    self.sh.give(items);
                    return Err(with_prefix(e, &path));
                }
            }
        }
        self.sh.give(items);
        Ok(())
    }
}

/// The actions that reach the last of `levels`: those that reach the first (`prefix`), then
/// each level's own.
fn path_of<M: Model>(prefix: &[M::Action], levels: &[Level<M>]) -> Vec<M::Action> {
    let mut p = prefix.to_vec();
    p.extend(levels.iter().filter_map(|l| l.via));
    p
}

/// A search ending found at the end of `path`: the ending with the path in front of the
/// actions it names.
fn with_prefix<A: Copy>(e: DfsEnd<A>, path: &[A]) -> DfsEnd<A> {
    let full = |tail: Vec<A>| [path, &tail].concat();
    match e {
        DfsEnd::Violation(v, tail, alt) => DfsEnd::Violation(v, full(tail), alt),
        DfsEnd::LocalCycle(tail) => DfsEnd::LocalCycle(full(tail)),
        e => e,
    }
}

/// Totals of one worker, summed over all of them.
#[derive(Default)]
struct Totals {
    transitions: u64,
    reduced: u64,
    images: u64,
    chain_steps: u64,
    depth: u32,
}

/// The result of [`explore_dfs`]: the exploration, and how the search ended.
pub struct DfsRun<A> {
    pub ex: Exploration<A>,
    pub end: DfsEnd<A>,
    /// Steps taken only to check the static proviso (beyond `ex.transitions`).
    pub chain_steps: u64,
}

/// Explore depth-first from `init` on `threads` workers; see the module documentation.
pub fn explore_dfs<M, R>(init: &M, red: &R, limits: Limits, threads: usize) -> DfsRun<M::Action>
where
    M: Model + Send + Sync,
    M::Action: Send + Sync,
    R: Reduction<M> + Sync,
{
    let t0 = Instant::now();
    let threads = threads.max(1);
    let sh = Shared {
        visited: Visited::new(),
        pool: Mutex::new(Pool {
            items: Vec::new(),
            idle: 0,
            done: false,
        }),
        wake: Condvar::new(),
        hungry: AtomicUsize::new(0),
        stop: AtomicBool::new(false),
        end: Mutex::new(None),
        threads,
    };
    sh.visited.insert(red.fingerprint(init));
    sh.visited.len.store(1, Relaxed);
    if let Some(v) = init.check_state() {
        sh.finish(DfsEnd::Violation(v, vec![], false));
    } else {
        sh.give(vec![Item {
            state: init.clone(),
            path: vec![],
            alt: false,
        }]);
    }
    let totals = Mutex::new(Totals::default());
    std::thread::scope(|scope| {
        for i in 0..threads {
            let (sh, totals) = (&sh, &totals);
            scope.spawn(move || {
                let mut w = Worker {
                    sh,
                    red,
                    limits,
                    env: ExploreEnv::default(),
                    scratch: None,
                    spare: Vec::new(),
                    transitions: 0,
                    reduced: 0,
                    images: 0,
                    chain_steps: 0,
                    depth: 0,
                    since_look: 0,
                    count: 0,
                    progress: (i == 0).then(|| ProgressLine::new(limits.max_states)),
                };
                while let Some(item) = sh.take() {
                    if let Err(e) = w.search(item).and_then(|()| w.flush_count()) {
                        sh.finish(e);
                    }
                }
                let mut t = totals.lock().expect("the totals");
                t.transitions += w.transitions;
                t.reduced += w.reduced;
                t.images += w.images;
                t.chain_steps += w.chain_steps;
                t.depth = t.depth.max(w.depth);
            });
        }
    });
    let t = totals.into_inner().expect("the totals");
    let end = sh
        .end
        .into_inner()
        .expect("the ending")
        .unwrap_or(DfsEnd::Verified);
    let stored = sh.visited.stored();
    // A safety net: every worker adds its last states to the count, and checks it, as it ends.
    let end = match end {
        DfsEnd::Verified if stored > limits.max_states => DfsEnd::BoundReached,
        e => e,
    };
    let (verdict, violation, path, approximate) = match &end {
        DfsEnd::Verified => (Verdict::Verified, None, vec![], false),
        DfsEnd::Violation(v, p, alt) => (Verdict::Violation, Some(v.clone()), p.clone(), *alt),
        DfsEnd::BoundReached | DfsEnd::LocalCycle(_) => {
            (Verdict::BoundReached, None, vec![], false)
        }
        DfsEnd::Interrupted => (Verdict::Interrupted, None, vec![], false),
    };
    DfsRun {
        ex: Exploration {
            verdict,
            violation,
            path,
            // A bound stops the search with a few states too many stored (up to a batch per
            // worker).
            states: if matches!(end, DfsEnd::BoundReached) {
                limits.max_states
            } else {
                stored
            },
            transitions: t.transitions,
            seconds: t0.elapsed().as_secs_f64(),
            depth: t.depth,
            reduced: t.reduced,
            peak_frontier: t.depth as usize,
            index_bytes: sh.visited.bytes(),
            images: t.images,
            approximate,
            // Depth-first search has no levels.
            levels: LevelSizes::default(),
        },
        end,
        chain_steps: t.chain_steps,
    }
}

//! Depth-first verification (`shootdown check --strategy dfs`): the same state space as the
//! breadth-first search of [`crate::explore`], in a fraction of its memory. Visited states are
//! kept as fingerprints only (16 bytes each in the hash set) and the only full states held are
//! those on the current path, one per level — where breadth-first search keeps its whole
//! frontier and a parent entry per state. What it gives up: a violation it finds is *a*
//! counterexample, not necessarily the shortest (breadth-first search is the default for
//! that), and the states it visits under partial-order reduction may differ in number (the
//! reduction's proviso — expand a persistent singleton only if its successor is new — depends
//! on what has been visited, so on the order; it stays sound: a state whose reduced successor
//! was already visited, which closes every cycle, is expanded fully). Verdicts agree; tests
//! check that on every scenario and mutant.

use crate::explore::{
    copy_into, deadlock, Exploration, ExploreEnv, FpSet, Limits, Reduction, Verdict,
};
use shootdown_engine::{Model, Violation};
use std::time::Instant;

/// One level of the current path: its state, the actions still to try from it (taken from
/// the back), the action that led to it, and whether the path to it passes through a
/// symmetric image ([`Reduction::images`]).
struct Level<M: Model> {
    state: M,
    todo: Vec<Todo<M>>,
    via: Option<M::Action>,
    alt: bool,
}

/// An action to try from a level's state — or from a symmetric image of it.
enum Todo<M: Model> {
    Act(M::Action),
    Image(Box<M>, M::Action),
}

/// The search's counters and visited set.
struct Search<'r, M, R> {
    red: &'r R,
    limits: Limits,
    visited: FpSet,
    transitions: u64,
    reduced: u64,
    depth: u32,
    images: u64,
    env: ExploreEnv,
    /// The successor being examined (reused while successors are visited: [`copy_into`]).
    scratch: Option<M>,
}

/// A violation found from a state: the actions that reach it, and what broke.
type Found<A> = (Vec<A>, Violation);

/// How a search ended: its verdict, and for a violation what broke, the actions to it and
/// whether they pass through a symmetric image.
type Ending<A> = (Verdict, Option<Violation>, Vec<A>, bool);

impl<M: Model, R: Reduction<M>> Search<'_, M, R> {
    /// Apply `a` to a copy of `s` in `self.scratch`: its fingerprint and the CPU orders the
    /// step fixed, or the violation it reports.
    fn successor(&mut self, s: &M, a: M::Action) -> Result<(u128, Vec<Vec<usize>>), Violation> {
        let t = copy_into(&mut self.scratch, s, || None);
        let out = t.apply(a, &mut self.env);
        self.transitions += 1;
        let orders = self.env.take_orders();
        match out.violation.or_else(|| t.check_state()) {
            Some(v) => Err(v),
            None => Ok((self.red.fingerprint(t), orders)),
        }
    }

    /// The actions to try from a newly visited `s`, in breadth-first search's order (popped
    /// from the back): the persistent singleton when its successor is new, else every enabled
    /// action. Or the violation found on the way — a deadlock, or one the reduction's
    /// look-ahead step reports — with the actions that reach it from `s`.
    fn todo(&mut self, s: &M) -> Result<Vec<Todo<M>>, Found<M::Action>> {
        let mut en = Vec::new();
        s.enabled(&mut en);
        if en.is_empty() && !s.finished() {
            return Err((vec![], deadlock()));
        }
        if self.limits.por {
            if let Some(a) = self.red.persistent_singleton(s, &en) {
                let (f, _) = self.successor(s, a).map_err(|v| (vec![a], v))?;
                if !self.visited.contains(&f) {
                    self.reduced += 1;
                    return Ok(vec![Todo::Act(a)]);
                }
            }
        }
        Ok(en.into_iter().rev().map(Todo::Act).collect())
    }

    fn run(&mut self, init: &M) -> Ending<M::Action> {
        self.visited.insert(self.red.fingerprint(init));
        if let Some(v) = init.check_state() {
            return (Verdict::Violation, Some(v), vec![], false);
        }
        let violation = |stack: &[Level<M>], tail: Vec<M::Action>, alt: bool, v| {
            let mut path: Vec<M::Action> = stack.iter().filter_map(|l| l.via).collect();
            path.extend(tail);
            (Verdict::Violation, Some(v), path, alt)
        };
        let mut stack = vec![];
        match self.todo(init) {
            Ok(todo) => stack.push(Level {
                state: init.clone(),
                todo,
                via: None,
                alt: false,
            }),
            Err((tail, v)) => {
                self.depth = tail.len() as u32;
                return violation(&stack, tail, false, v);
            }
        }
        while let Some(top) = stack.last_mut() {
            let Some(next) = top.todo.pop() else {
                stack.pop();
                continue;
            };
            // An image's successor is one of the symmetric closure: flag the path. (The images
            // of an image are images of the level's own state: not generated again.)
            let (a, alt, image) = match next {
                Todo::Act(a) => (a, top.alt, None),
                Todo::Image(s, a) => (a, true, Some(s)),
            };
            let s = image.as_deref().unwrap_or(&top.state);
            let (f, orders) = match self.successor(s, a) {
                Ok(x) => x,
                Err(v) => return violation(&stack, vec![a], alt, v),
            };
            if !orders.is_empty() && image.is_none() {
                let images = self.red.images(s, a, &orders);
                let top = stack.last_mut().expect("current level");
                for (is, ia) in images {
                    top.todo.push(Todo::Image(Box::new(is), ia));
                }
            }
            if !self.visited.insert(f) {
                continue;
            }
            let t = self.scratch.take().expect("the successor just built");
            if self.visited.len() as u64 > self.limits.max_states {
                return (Verdict::BoundReached, None, vec![], false);
            }
            self.images += u64::from(alt);
            self.depth = self.depth.max(stack.len() as u32);
            match self.todo(&t) {
                Ok(todo) => stack.push(Level {
                    state: t,
                    todo,
                    via: Some(a),
                    alt,
                }),
                Err((tail, v)) => {
                    let mut path = vec![a];
                    path.extend(tail);
                    return violation(&stack, path, alt, v);
                }
            }
        }
        (Verdict::Verified, None, vec![], false)
    }
}

/// Explore depth-first from `init`; see the module documentation.
pub fn explore_dfs<M: Model, R: Reduction<M>>(
    init: &M,
    red: &R,
    limits: Limits,
) -> Exploration<M::Action> {
    let t0 = Instant::now();
    let mut x = Search {
        red,
        limits,
        visited: FpSet::default(),
        transitions: 0,
        reduced: 0,
        depth: 0,
        images: 0,
        env: ExploreEnv::default(),
        scratch: None,
    };
    let (verdict, violation, path, approximate) = x.run(init);
    // A bound stops the search with one state too many stored.
    let states = x.visited.len() - usize::from(verdict == Verdict::BoundReached);
    Exploration {
        verdict,
        violation,
        path,
        states: states as u64,
        transitions: x.transitions,
        seconds: t0.elapsed().as_secs_f64(),
        depth: x.depth,
        reduced: x.reduced,
        peak_frontier: x.depth as usize,
        index_bytes: x.visited.capacity() * (std::mem::size_of::<u128>() + 1),
        images: x.images,
        approximate,
    }
}

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

use crate::explore::{deadlock, Exploration, ExploreEnv, FpSet, Limits, Reduction, Verdict};
use shootdown_engine::Model;
use std::time::Instant;

/// One level of the current path: its state, the actions still to try from it (taken from
/// the back), and the action that led to it.
struct Level<M: Model> {
    state: M,
    todo: Vec<M::Action>,
    via: Option<M::Action>,
}

/// Explore depth-first from `init`; see the module documentation.
pub fn explore_dfs<M: Model, R: Reduction<M>>(
    init: &M,
    red: &R,
    limits: Limits,
) -> Exploration<M::Action> {
    let t0 = Instant::now();
    let mut visited = FpSet::default();
    let mut transitions = 0u64;
    let mut reduced = 0u64;
    let mut depth = 0u32;
    let mut env = ExploreEnv;
    let done = |verdict, violation, path, states: usize, transitions, reduced, depth, v: &FpSet| {
        Exploration {
            verdict,
            violation,
            path,
            states: states as u64,
            transitions,
            seconds: t0.elapsed().as_secs_f64(),
            depth,
            reduced,
            peak_frontier: depth as usize,
            index_bytes: v.capacity() * (std::mem::size_of::<u128>() + 1),
        }
    };
    visited.insert(red.fingerprint(init));
    if let Some(v) = init.check_state() {
        return done(Verdict::Violation, Some(v), vec![], 1, 0, 0, 0, &visited);
    }
    // The actions to try from `s` (in the order breadth-first search tries them, popped from
    // the back), or the violation one of them reports while the reduction looks ahead.
    let mut todo_of = |s: &M,
                       visited: &FpSet,
                       transitions: &mut u64,
                       reduced: &mut u64|
     -> Result<Vec<M::Action>, (M::Action, shootdown_engine::Violation)> {
        let mut en = Vec::new();
        s.enabled(&mut en);
        if limits.por {
            if let Some(a) = red.persistent_singleton(s, &en) {
                let mut t = s.clone();
                let out = t.apply(a, &mut env);
                *transitions += 1;
                if let Some(v) = out.violation.or_else(|| t.check_state()) {
                    return Err((a, v));
                }
                if !visited.contains(&red.fingerprint(&t)) {
                    *reduced += 1;
                    return Ok(vec![a]);
                }
            }
        }
        en.reverse();
        Ok(en)
    };
    let path_of =
        |stack: &[Level<M>]| -> Vec<M::Action> { stack.iter().filter_map(|l| l.via).collect() };
    let first = match todo_of(init, &visited, &mut transitions, &mut reduced) {
        Ok(t) => t,
        Err((a, v)) => {
            return done(
                Verdict::Violation,
                Some(v),
                vec![a],
                1,
                transitions,
                0,
                1,
                &visited,
            )
        }
    };
    if first.is_empty() && !init.finished() {
        return done(
            Verdict::Violation,
            Some(deadlock()),
            vec![],
            1,
            0,
            0,
            0,
            &visited,
        );
    }
    let mut stack = vec![Level {
        state: init.clone(),
        todo: first,
        via: None,
    }];
    let mut env = ExploreEnv;
    while let Some(top) = stack.last_mut() {
        let Some(a) = top.todo.pop() else {
            stack.pop();
            continue;
        };
        let mut t = top.state.clone();
        let out = t.apply(a, &mut env);
        transitions += 1;
        if let Some(v) = out.violation.or_else(|| t.check_state()) {
            let mut p = path_of(&stack);
            p.push(a);
            let n = visited.len();
            return done(
                Verdict::Violation,
                Some(v),
                p,
                n,
                transitions,
                reduced,
                depth,
                &visited,
            );
        }
        if !visited.insert(red.fingerprint(&t)) {
            continue;
        }
        if visited.len() as u64 > limits.max_states {
            let n = visited.len() - 1;
            return done(
                Verdict::BoundReached,
                None,
                vec![],
                n,
                transitions,
                reduced,
                depth,
                &visited,
            );
        }
        depth = depth.max(stack.len() as u32);
        let todo = match todo_of(&t, &visited, &mut transitions, &mut reduced) {
            Ok(todo) => todo,
            Err((b, v)) => {
                let mut p = path_of(&stack);
                p.extend([a, b]);
                let n = visited.len();
                return done(
                    Verdict::Violation,
                    Some(v),
                    p,
                    n,
                    transitions,
                    reduced,
                    depth,
                    &visited,
                );
            }
        };
        if todo.is_empty() && !t.finished() {
            let mut p = path_of(&stack);
            p.push(a);
            let n = visited.len();
            return done(
                Verdict::Violation,
                Some(deadlock()),
                p,
                n,
                transitions,
                reduced,
                depth,
                &visited,
            );
        }
        stack.push(Level {
            state: t,
            todo,
            via: Some(a),
        });
    }
    let n = visited.len();
    done(
        Verdict::Verified,
        None,
        vec![],
        n,
        transitions,
        reduced,
        depth,
        &visited,
    )
}

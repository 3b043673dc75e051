//! Depth-first verification reaches the verdicts breadth-first search does (pinned in
//! `verify.rs` and `mutants.rs`): the fixed protocols of the smaller scenarios verify, the
//! documented findings and every declared mutant (in the memory model it is declared for) are
//! violations of the expected invariant. What it finds does not depend on the number of
//! workers; the default strategy's counterexamples are breadth-first search's; and the static
//! proviso's check finds a cycle of singleton steps.
mod common;
use common::*;
use shootdown_checker::dfs::{explore_dfs, DfsEnd, DfsRun};
use shootdown_checker::explore::{explore, Limits, Reduction, Verdict};
use shootdown_checker::reduce::MachineReduction;
use shootdown_checker::{check, Scenario};
use shootdown_engine::{Env, Model, Outcome, Time, Violation};
use shootdown_linux::{Action, MemoryModel};

fn dfs(name: &str, mutant: Option<&str>, mm: &str) -> shootdown_checker::CheckResult {
    run_with(name, mutant, mm, "dfs")
}

/// Fixed protocols that verify breadth-first in under 150,000 states (`verify.rs`).
const SMALL_VERIFIED: &[(&str, &str)] = &[
    ("batch_unmap", "tso"),
    ("lazy_munmap", "tso"),
    ("switch_mm_flush", "tso"),
    ("switch_mm_flush_v5", "sc"),
    ("flush_catchup", "tso"),
    ("pv_tlb_flush", "tso"),
    ("madvise_nested", "tso"),
    ("reclaim_madvise", "tso"),
    ("khugepaged_collapse", "tso"),
    ("thp_zap", "sc"),
    ("kvm_fast_invalidate", "sc"),
    ("kvm_tdp_zap_roots", "tso"),
    ("kvm_mtrr_cd_toggle", "tso"),
    ("kvm_mtrr_cd_toggle_shared", "tso"),
    ("kvm_noncoherent_fault", "tso"),
];

#[test]
fn depth_first_verdicts_equal_breadth_first_ones() {
    let mut bad = Vec::new();
    for &(sc, mm) in SMALL_VERIFIED {
        let d = dfs(sc, None, mm);
        if (d.verdict.as_str(), d.strategy.as_str()) != ("verified", "dfs") {
            bad.push(format!("{sc} ({mm}): dfs {}", d.verdict));
        }
    }
    let infos = shootdown_checker::list(&scenarios()).unwrap();
    let mut mutants = 0;
    for info in &infos {
        if let Some(f) = &info.finding {
            let d = dfs(&info.scenario, None, "sc");
            if d.invariant.as_deref() != Some(f.expect.as_str()) {
                bad.push(format!(
                    "{} (finding): dfs {:?}",
                    info.scenario, d.invariant
                ));
            }
        }
        for m in &info.mutants {
            let mm = m.memory_model.as_str();
            let d = dfs(&info.scenario, Some(&m.name), mm);
            mutants += 1;
            if d.verdict != "violation" || d.invariant != m.expect || d.counterexample.is_empty() {
                bad.push(format!(
                    "{} --mutant {} ({mm}): dfs {} {:?}",
                    info.scenario, m.name, d.verdict, d.invariant
                ));
            }
        }
    }
    assert!(mutants >= 24, "{mutants}");
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

fn dfs_run(name: &str, mutant: Option<&str>, mm: &str, threads: usize) -> DfsRun<Action> {
    let sc = Scenario::load(&scenario(name)).unwrap();
    let mem = if mm == "tso" {
        MemoryModel::Tso
    } else {
        MemoryModel::Sc
    };
    let init = sc.build(mutant, mem).unwrap();
    explore_dfs(
        &init,
        &MachineReduction::new(&sc, true),
        Limits::default(),
        threads,
    )
}

#[test]
fn the_number_of_workers_changes_nothing_but_the_time() {
    // Verified: every count. (Symmetric scenarios included: the singleton chosen is a function
    // of the state's class, so the renaming a worker happens to reach first does not matter.)
    for (name, mm) in [
        ("flush_catchup", "tso"),
        ("pv_tlb_flush", "tso"),
        ("symmetric_flushers", "tso"),
        ("kvm_tdp_zap_roots", "sc"),
        ("madvise_nested", "sc"),
    ] {
        let one = dfs_run(name, None, mm, 1);
        assert_eq!(one.end, DfsEnd::Verified, "{name}");
        for threads in [2, 3] {
            let other = dfs_run(name, None, mm, threads);
            assert_eq!(
                (one.ex.states, one.ex.transitions, one.ex.reduced),
                (other.ex.states, other.ex.transitions, other.ex.reduced),
                "{name} {mm} on {threads} workers"
            );
        }
    }
    // Violations: the verdict and invariant (which counterexample is found first may differ).
    for (name, mutant, mm) in [
        ("flush_catchup", "partial_flush_when_full_owed", "sc"),
        ("switch_mm_flush", "switch_mm_no_barrier", "tso"),
        ("symmetric_flushers", "inc_tlb_gen_after_ipis", "sc"),
    ] {
        for threads in [1, 2, 3] {
            let r = dfs_run(name, Some(mutant), mm, threads);
            let DfsEnd::Violation(v, path, _) = &r.end else {
                panic!("{name} {mutant} on {threads}: {:?}", r.end)
            };
            assert_eq!(r.ex.path, *path);
            assert!(!path.is_empty(), "{name} {mutant}: {}", v.invariant);
        }
    }
}

#[test]
fn the_state_bound_stops_every_worker() {
    for strategy in ["dfs", "auto"] {
        let r = check(
            &scenario("flush_catchup"),
            None,
            "tso",
            Some(1000),
            None,
            0,
            strategy,
            true,
            &[],
        )
        .unwrap();
        assert_eq!(
            (r.verdict.as_str(), r.states),
            ("bound-reached", 1000),
            "{strategy}"
        );
        assert!(r.notes.iter().any(|n| n.contains("nothing is proved")));
    }
}

#[test]
fn the_default_strategy_verifies_depth_first_and_prints_a_shortest_counterexample() {
    let v = check(
        &scenario("flush_catchup"),
        None,
        "tso",
        Some(5_000_000),
        None,
        0,
        "auto",
        true,
        &[],
    )
    .unwrap();
    let d = dfs("flush_catchup", None, "tso");
    assert_eq!(
        (v.verdict.as_str(), v.strategy.as_str()),
        ("verified", "dfs")
    );
    assert_eq!((v.states, v.transitions), (d.states, d.transitions));
    for (name, mutant, mm) in [
        ("flush_catchup", "partial_flush_when_full_owed", "sc"),
        ("symmetric_flushers", "inc_tlb_gen_after_ipis", "sc"),
    ] {
        let a = check(
            &scenario(name),
            Some(mutant),
            mm,
            Some(5_000_000),
            None,
            0,
            "auto",
            true,
            &[],
        )
        .unwrap();
        let b = check(
            &scenario(name),
            Some(mutant),
            mm,
            Some(5_000_000),
            None,
            0,
            "parallel",
            true,
            &[],
        )
        .unwrap();
        assert_eq!(a.strategy, "parallel");
        assert_eq!(
            (&a.verdict, &a.invariant, a.counterexample.len(), a.states),
            (&b.verdict, &b.invariant, b.counterexample.len(), b.states),
            "{name} {mutant}"
        );
        assert!(a
            .notes
            .iter()
            .any(|n| n.contains("depth-first search found a violation")));
    }
}

/// An agent that counts round 0 → 1 → 2 → 0 and one that raises a flag, which is a
/// violation: the count is *local*, but its steps form a cycle.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Round {
    count: u8,
    flag: bool,
}

impl Model for Round {
    type Action = usize;
    fn agents(&self) -> usize {
        2
    }
    fn enabled(&self, out: &mut Vec<usize>) {
        out.push(0);
        if !self.flag {
            out.push(1);
        }
    }
    fn timed_action(&self, a: usize, _: Time) -> usize {
        a
    }
    fn agent_of(&self, a: usize) -> usize {
        a
    }
    fn apply<E: Env>(&mut self, a: usize, _: &mut E) -> Outcome {
        match a {
            0 => self.count = (self.count + 1) % 3,
            _ => self.flag = true,
        }
        Outcome::run()
    }
    fn describe(&self, a: usize) -> String {
        format!("agent {a}")
    }
    fn agent_name(&self, a: usize) -> String {
        format!("t{a}")
    }
    fn finished(&self) -> bool {
        false
    }
    fn check_state(&self) -> Option<Violation> {
        self.flag.then(|| Violation {
            invariant: "FLAG",
            detail: "the flag is up".into(),
        })
    }
}

/// Claims the counting agent's step is a persistent singleton in every state (it is: it
/// commutes with the flag), which only a proviso keeps from ignoring the flag forever.
struct CountIsLocal;
impl Reduction<Round> for CountIsLocal {
    fn persistent_singleton(&self, _: &Round, _: &[usize]) -> Option<usize> {
        Some(0)
    }
}

#[test]
fn a_cycle_of_singleton_steps_is_found_not_ignored() {
    let init = Round {
        count: 0,
        flag: false,
    };
    for threads in [1, 2] {
        let r = explore_dfs(&init, &CountIsLocal, Limits::default(), threads);
        assert!(matches!(r.end, DfsEnd::LocalCycle(_)), "{:?}", r.end);
        assert_eq!(
            r.ex.verdict,
            Verdict::BoundReached,
            "a cycle proves nothing"
        );
    }
    // Breadth-first search's proviso expands the state whose singleton closes the cycle.
    let b = explore(&init, &CountIsLocal, Limits::default());
    assert_eq!(b.violation.map(|v| v.invariant), Some("FLAG"));
}

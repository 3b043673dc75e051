//! The level-synchronous parallel search finds what the sequential breadth-first search finds
//! (the same verdict, invariant and counterexample length), and what it finds, down to the
//! number of states and the counterexample itself, does not depend on the number of threads.
mod common;
use common::*;
use shootdown_checker::explore::{Exploration, Limits};
use shootdown_checker::parallel::explore_parallel;
use shootdown_checker::reduce::MachineReduction;
use shootdown_checker::{check_scenario, CheckOptions, Scenario};
use shootdown_linux::{Action, MemoryModel};

fn mem(mm: &str) -> MemoryModel {
    if mm == "tso" {
        MemoryModel::Tso
    } else {
        MemoryModel::Sc
    }
}

fn run(name: &str, mutant: Option<&str>, mm: &str, threads: usize) -> Exploration<Action> {
    let sc = Scenario::load(&scenario(name)).unwrap();
    let init = sc.build(mutant, mem(mm)).unwrap();
    let red = MachineReduction::new(&sc, true);
    explore_parallel(&init, &red, Limits::default(), threads)
}

const CASES: &[(&str, Option<&str>, &str)] = &[
    ("flush_catchup", None, "tso"),
    ("madvise_nested", None, "sc"),
    ("pv_tlb_flush", None, "tso"),
    ("symmetric_flushers", None, "tso"),
    ("kvm_tdp_zap_roots", None, "sc"),
    ("flush_catchup", Some("partial_flush_when_full_owed"), "sc"),
    ("switch_mm_flush", Some("switch_mm_no_barrier"), "tso"),
    (
        "madvise_nested",
        Some("tlb_finish_mmu_ignores_nested"),
        "sc",
    ),
    ("symmetric_flushers", Some("inc_tlb_gen_after_ipis"), "sc"),
    (
        "kvm_noncoherent_fault",
        Some("zap_gfn_range_no_invalidate"),
        "sc",
    ),
];

#[test]
fn the_thread_count_changes_nothing_but_the_time() {
    for &(name, mutant, mm) in CASES {
        let one = run(name, mutant, mm, 1);
        let two = run(name, mutant, mm, 2);
        let three = run(name, mutant, mm, 3);
        for other in [&two, &three] {
            assert_eq!(
                (
                    one.verdict,
                    one.states,
                    one.transitions,
                    one.reduced,
                    &one.path
                ),
                (
                    other.verdict,
                    other.states,
                    other.transitions,
                    other.reduced,
                    &other.path
                ),
                "{name} {mutant:?} {mm}"
            );
        }
    }
}

#[test]
fn parallel_verdicts_equal_breadth_first_ones() {
    for &(name, mutant, mm) in CASES {
        let sc = Scenario::load(&scenario(name)).unwrap();
        let [bfs, par] = [None, Some(2)].map(|parallel| {
            check_scenario(
                &sc,
                mutant,
                mem(mm),
                CheckOptions {
                    parallel,
                    ..CheckOptions::default()
                },
            )
            .unwrap()
        });
        assert_eq!(par.strategy, "parallel");
        assert_eq!(
            (&bfs.verdict, &bfs.invariant, bfs.counterexample.len()),
            (&par.verdict, &par.invariant, par.counterexample.len()),
            "{name} {mutant:?} {mm}"
        );
    }
}

//! The coherence oracle lives in the model and is active under the explorer: these tests pin
//! each invariant it reports (INV-STALE and INV-PTFREE are also pinned through the mutants).
mod common;
use common::*;
use shootdown_checker::Scenario;
use shootdown_engine::Model;
use shootdown_hw::tlb::TlbEntry;
use shootdown_linux::describe::NullEnv;
use shootdown_linux::{Action, MemoryModel};

fn started() -> shootdown_linux::Machine {
    // cpu1's thread has touched page 0x10 and is about to touch it again.
    let sc = Scenario::load(&scenario("batch_unmap")).unwrap();
    sc.build(None, MemoryModel::Sc).unwrap()
}

#[test]
fn stale_use_after_flush_returned_is_inv_stale_but_not_before() {
    // The N8 mutant's counterexample: the stale entry is used only after the flush returned.
    let r = run("batch_unmap", Some("batch_flush_gen_zero"), "sc");
    let ret = r
        .counterexample
        .iter()
        .position(|s| s.text.contains("batched flush complete"))
        .expect("the flush returns");
    assert!(
        ret + 1 < r.counterexample.len(),
        "the violating use follows the return"
    );
    assert!(r.counterexample.last().unwrap().text.contains("INV-STALE"));
}

#[test]
fn entry_of_another_mm_under_the_same_pcid_is_inv_asid() {
    let mut m = started();
    let c = &m.cpus[1];
    let pcid = c.cr3_pcid;
    let other = 0; // init_mm: never the task's mm
    m.cpus[1].tlb.flush_all();
    m.cpus[1].tlb.insert(
        pcid,
        0x10,
        TlbEntry {
            pfn: 1,
            writable: true,
            global: false,
            mm: other,
            version: 0,
            ept: None,
            huge: false,
        },
        0,
    );
    let out = m.apply(Action::Step(1), &mut NullEnv);
    assert_eq!(out.violation.expect("violation").invariant, "INV-ASID");
}

#[test]
fn user_access_through_a_foreign_cr3_is_inv_ctx() {
    let mut m = started();
    m.cpus[1].cr3_mm = 0;
    let out = m.apply(Action::Step(1), &mut NullEnv);
    assert_eq!(out.violation.expect("violation").invariant, "INV-CTX");
}

#[test]
fn walk_through_a_freed_table_is_inv_ptfree() {
    let r = run("lazy_munmap", Some("lazy_ignores_freed_tables"), "sc");
    let last = r.counterexample.last().unwrap();
    assert_eq!(last.actor, "cpu1");
    assert!(last.text.contains("speculative fill"), "{last:?}");
    assert!(last.text.contains("INV-PTFREE"), "{last:?}");
}

#[test]
fn the_fixed_protocol_never_trips_the_oracle_in_any_interleaving() {
    // Same scenarios, every interleaving, oracle on: verified (see verify.rs for counts).
    for sc in ["batch_unmap", "lazy_munmap"] {
        assert_eq!(run(sc, None, "tso").verdict, "verified");
    }
}

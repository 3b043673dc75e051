//! Counterexample texts (`describe.rs`): a step's own summary and what the functions it runs
//! say are both printed, and mms appear by their names.
use shootdown_engine::Model;
use shootdown_hw::{CostProfile, Features, Topology};
use shootdown_linux::describe::NullEnv;
use shootdown_linux::*;
use std::sync::Arc;

#[test]
fn steps_say_what_they_do_with_mms_by_name() {
    let topo = Topology::new(1, 1, 1).unwrap();
    let prof = Arc::new(CostProfile::uniform("t", 10.0, Features::modern()));
    let mut m = Machine::new(topo, prof, Options::default(), MemoryModel::Sc);
    let mm = m.add_mm("webserver");
    m.add_task("t", mm, 0, vec![UserOp::Pause]);
    let mm2 = m.add_mm("db");
    m.add_task("u", mm2, 0, vec![UserOp::Compute { ns: 5 }, UserOp::Exit]);
    // Run cpu0 until its task is about to run its first user operation.
    for _ in 0..100 {
        if !m.is_idle_cpu(0) && m.top_frame_name(0).is_none() {
            break;
        }
        m.apply(Action::Step(0), &mut NullEnv);
    }
    // pause() says what it does; a user operation that says nothing has a summary.
    assert_eq!(m.describe(Action::Step(0)), "t (user): pause(): sleep");
    // Index-named mms in texts read as their names; other words are left alone.
    assert_eq!(
        m.name_mms("read mm1.tlb_gen; mm_cpumask(mm0); mmap_sem; mm12; xmm1"),
        "read webserver.tlb_gen; mm_cpumask(init_mm); mmap_sem; mm12; xmm1"
    );
    // After t sleeps, u runs: its compute step is described by its summary.
    for _ in 0..100 {
        m.apply(Action::Step(0), &mut NullEnv);
        if m.describe(Action::Step(0)).starts_with("u (user)") {
            break;
        }
    }
    assert_eq!(m.describe(Action::Step(0)), "u (user): compute 5 ns");
}

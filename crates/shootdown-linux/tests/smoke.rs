use shootdown_engine::timed::{Limits, TimedDriver};
use shootdown_engine::Time;
use shootdown_hw::{CostProfile, Features, Topology};
use shootdown_linux::*;
use std::sync::Arc;

#[test]
fn two_threads_madvise_run_to_completion() {
    let topo = Topology::new(1, 2, 1).unwrap();
    let prof = Arc::new(CostProfile::uniform("t", 10.0, Features::modern()));
    let mut m = Machine::new(topo, prof, Options::default(), MemoryModel::Sc);
    let mm = m.add_mm("mm1");
    let prog = vec![
        UserOp::Touch {
            vpn: 0x10,
            write: true,
        },
        UserOp::MadviseDontneed {
            start: 0x10,
            npages: 1,
        },
        UserOp::Event,
        UserOp::Loop {
            to: 0,
            times: Some(20),
        },
        UserOp::Exit,
    ];
    m.add_task("a", mm, 0, prog.clone());
    m.add_task("b", mm, 1, prog);
    let mut d = TimedDriver::new(2, 1, 0);
    let st = d.run(
        &mut m,
        Limits {
            max_time: Time::from_ms(100),
            max_steps: 1_000_000,
        },
    );
    assert_eq!(st.stop, shootdown_engine::timed::Stop::Finished, "{st:?}");
    let c = m.counters();
    assert_eq!(c.get(Counter::Events), 42);
    assert!(c.get(Counter::NrTlbRemoteFlush) > 0);
    eprintln!("{:?}", c.named());
}

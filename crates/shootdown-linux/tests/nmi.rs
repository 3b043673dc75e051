//! perf's NMIs in the timed driver (`nmi.rs`): sampled at `perf_sample_hz` per running CPU,
//! none while halted, each reading the interrupted task's user stack.

mod common;
use common::{machine_with, run_to_end};
use shootdown_engine::Time;
use shootdown_linux::options::{AtLeastOne, Count};
use shootdown_linux::*;

/// cpu0 runs two tasks of two mms, each touching its page and computing 20 µs, 50 times, with a
/// 100 µs time slice (so cpu0 switches mms often); cpu1 stays idle. The run's counters and end.
fn run(hz: u64) -> (Counters, Time) {
    let opts = Options {
        perf_sample_hz: Count(hz),
        sched_timeslice_us: AtLeastOne(100),
        ..Options::default()
    };
    let mut m = machine_with(2, opts);
    for name in ["a", "b"] {
        let mm = m.add_mm(&format!("mm_{name}"));
        m.map_pages(mm, 0x10, 1, true);
        let prog = vec![
            UserOp::Touch {
                vpn: 0x10,
                write: true,
            },
            UserOp::Compute { ns: 20_000 },
            UserOp::Loop {
                to: 0,
                times: Some(50),
            },
            UserOp::Exit,
        ];
        m.add_task(name, mm, 0, prog);
    }
    let end = run_to_end(&mut m, 100, 10_000_000);
    (m.counters().clone(), end)
}

#[test]
fn samples_arrive_at_the_rate_on_running_cpus_only() {
    let (c, end) = run(10_000);
    let nmis = c.get(Counter::Nmis);
    eprintln!(
        "{nmis} NMIs in {end:?}: {:?}",
        c.named()
            .iter()
            .filter(|(n, _)| n.starts_with("nmi"))
            .collect::<Vec<_>>()
    );
    // cpu0 runs for the whole run, cpu1 is halted throughout: one sample per 100 µs of cpu0.
    let expect = end.0 / Time::from_us(100).0;
    assert!(
        nmis + 2 >= expect && nmis <= expect + 2,
        "{nmis} NMIs in {end:?} (expected about {expect})"
    );
    assert_eq!(
        c.get(Counter::NmiUaccessReads) + c.get(Counter::NmiUaccessSkipped),
        nmis
    );
    assert!(c.get(Counter::NmiUaccessReads) > 0);
    assert!(c.get(Counter::ContextSwitches) > 10);
    // Without perf, no NMIs, and the same work.
    let (c0, _) = run(0);
    assert_eq!(c0.get(Counter::Nmis), 0);
    assert_eq!(c0.get(Counter::Events), c.get(Counter::Events));
}

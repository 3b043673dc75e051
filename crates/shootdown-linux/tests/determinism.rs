//! Property: a timed run is a pure function of (machine, seed) — the same inputs give
//! bit-identical counters, metrics and end times.

use proptest::prelude::*;
use shootdown_engine::timed::{Limits, TimedDriver};
use shootdown_engine::Time;
use shootdown_hw::{CostProfile, Features, Topology};
use shootdown_linux::*;
use std::sync::Arc;

fn run(seed: u64, threads: usize, concurrent: bool) -> (Vec<u64>, Time, u64) {
    let topo = Topology::new(1, 4, 1).unwrap();
    let opts = Options {
        smp_call: if concurrent {
            SmpCall::Concurrent
        } else {
            SmpCall::RemoteThenLocal
        },
        ..Options::default()
    };
    let mut m = Machine::new(
        topo,
        Arc::new(CostProfile::uniform("t", 13.0, Features::modern())),
        opts,
        MemoryModel::Sc,
    );
    let mm = m.add_mm("mm");
    m.map_pages(mm, 0, 64, true);
    for t in 0..threads {
        m.add_task(
            "w",
            mm,
            t % 4,
            vec![
                UserOp::TouchRandomBlock {
                    start: 0,
                    span: 64,
                    npages: 2,
                },
                UserOp::MadviseDontneed {
                    start: (t as u64 * 8) % 64,
                    npages: 3,
                },
                UserOp::Event,
                UserOp::Loop {
                    to: 0,
                    times: Some(30),
                },
                UserOp::Exit,
            ],
        );
    }
    let mut d = TimedDriver::new(4, seed, 0);
    let st = d.run(
        &mut m,
        Limits {
            max_time: Time::from_ms(50),
            max_steps: 2_000_000,
        },
    );
    (m.counters().0.clone(), st.end, st.steps)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]
    #[test]
    fn same_inputs_same_results(seed in any::<u64>(), threads in 1usize..6, concurrent in any::<bool>()) {
        let a = run(seed, threads, concurrent);
        let b = run(seed, threads, concurrent);
        prop_assert_eq!(a, b);
    }
}

//! What the timed-driver tests of single mechanisms share: a native machine of uniform costs
//! and a run that must finish (the oracle stops a run short of it at a violation).
#![allow(dead_code)]

use shootdown_engine::timed::{Limits, Stop, TimedDriver};
use shootdown_engine::{Model, Time};
use shootdown_hw::{CostProfile, Features, Topology};
use shootdown_linux::*;
use std::sync::Arc;

/// `cpus` CPUs on one socket, 10 ns for every cost, with options `opts`.
pub fn machine_with(cpus: usize, opts: Options) -> Machine {
    let topo = Topology::new(1, cpus, 1).unwrap();
    let prof = Arc::new(CostProfile::uniform("t", 10.0, Features::modern()));
    Machine::new(topo, prof, opts, MemoryModel::Sc)
}

/// [`machine_with`] the default (mainline) options.
pub fn machine(cpus: usize) -> Machine {
    machine_with(cpus, Options::default())
}

/// Run `m` to the end within `ms` of simulated time and `max_steps` steps; returns when it
/// ended.
pub fn run_to_end(m: &mut Machine, ms: u64, max_steps: u64) -> Time {
    let st = TimedDriver::new(m.agents(), 1, 0).run(
        m,
        Limits {
            max_time: Time::from_ms(ms),
            max_steps,
        },
    );
    assert_eq!(st.stop, Stop::Finished, "{st:?}");
    st.end
}

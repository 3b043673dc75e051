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

/// A zapper on CPU 0 and a reader on CPU 1, threads of `mm` (16 pages mapped from 0x10): 208
/// rounds of the zapper writing page 0x10 + i (mod 16), madvising it away and computing
/// `zap_ns`; the reader reads all 16 pages and computes `read_ns`, `read_loops` times. Every
/// madvise is a shootdown of the reader's CPU.
pub fn madvise_against_reader(
    m: &mut Machine,
    mm: MmId,
    zap_ns: u64,
    read_ns: u64,
    read_loops: u32,
) {
    m.map_pages(mm, 0x10, 16, true);
    m.add_task(
        "zapper",
        mm,
        0,
        vec![
            UserOp::Touch {
                vpn: 0x10,
                write: true,
            },
            UserOp::MadviseDontneed {
                start: 0x10,
                npages: 1,
            },
            UserOp::Compute { ns: zap_ns },
            UserOp::NextPage { to: 0, pages: 16 },
            UserOp::Loop {
                to: 0,
                times: Some(12),
            },
            UserOp::Exit,
        ],
    );
    m.add_task(
        "reader",
        mm,
        1,
        vec![
            UserOp::TouchRange {
                start: 0x10,
                npages: 16,
                write: false,
            },
            UserOp::Compute { ns: read_ns },
            UserOp::Loop {
                to: 0,
                times: Some(read_loops),
            },
            UserOp::Exit,
        ],
    );
}

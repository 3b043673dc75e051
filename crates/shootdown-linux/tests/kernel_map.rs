//! Global kernel mappings and `flush_tlb_kernel_range()` in the timed driver (`kernel_map.rs`).

use shootdown_engine::timed::{Limits, Stop, TimedDriver};
use shootdown_engine::{Model, Time};
use shootdown_hw::{CostProfile, Features, Topology};
use shootdown_linux::kernel_map::VMALLOC_START_VPN;
use shootdown_linux::*;
use std::sync::Arc;

#[test]
fn a_kernel_range_flush_reaches_every_cpu_idle_ones_included() {
    let topo = Topology::new(1, 4, 1).unwrap();
    let prof = Arc::new(CostProfile::uniform("t", 10.0, Features::modern()));
    let mut m = Machine::new(topo, prof, Options::default(), MemoryModel::Sc);
    let page = VMALLOC_START_VPN + 7;
    m.map_pages(INIT_MM, page, 1, true);
    let mm = m.add_mm("mm1");
    // cpu1 reads the kernel page 50 times; cpu0 unmaps it meanwhile; cpu2 and cpu3 idle.
    m.add_task(
        "reader",
        mm,
        1,
        vec![
            UserOp::KernelTouch { vpn: page },
            UserOp::Compute { ns: 1_000 },
            UserOp::Loop {
                to: 0,
                times: Some(50),
            },
            UserOp::Exit,
        ],
    );
    m.add_task(
        "driver",
        mm,
        0,
        vec![
            UserOp::Compute { ns: 20_000 },
            UserOp::VunmapRange {
                start: page,
                npages: 1,
            },
            UserOp::Exit,
        ],
    );
    let st = TimedDriver::new(m.agents(), 1, 0).run(
        &mut m,
        Limits {
            max_time: Time::from_ms(10),
            max_steps: 1_000_000,
        },
    );
    assert_eq!(st.stop, Stop::Finished, "{st:?}");
    let c = m.counters();
    // on_each_cpu: the three other CPUs take the IPI, halted or not.
    assert_eq!(c.get(Counter::TlbShootdowns), 3);
    assert!(!m.mms[INIT_MM as usize].space.leaf(page, false).present);
}

//! Global ASIDs and INVLPGB (v6.15+, `global_asid.rs`) in the timed driver: four threads of one
//! process zap and touch their own pages in a loop (will-it-scale `tlb_flush2`'s shape), on a
//! CPU with INVLPGB and without, for over 30 ms: `consider_global_asid` looks only when a
//! flushing task's pid and the jiffies agree in their low five bits (pids 4–7: jiffies 4–7,
//! 16–32 ms in).

use shootdown_engine::timed::{Limits, Stop, TimedDriver};
use shootdown_engine::{Model, Time};
use shootdown_hw::{CostProfile, Features, Topology};
use shootdown_linux::*;
use std::sync::Arc;

fn run(invlpgb: bool, broadcast_tlb_flush: bool) -> Counters {
    let features = Features {
        invlpgb,
        invlpgb_count_max: 8,
        ..Features::modern()
    };
    let opts = Options {
        broadcast_tlb_flush,
        ..Options::default()
    };
    let mut m = Machine::new(
        Topology::new(1, 4, 1).unwrap(),
        Arc::new(CostProfile::uniform("t", 50.0, features)),
        opts,
        MemoryModel::Sc,
    );
    let mm = m.add_mm("p");
    m.map_pages(mm, 0x100, 64, true);
    for cpu in 0..4 {
        let page = 0x100 + 16 * cpu as u64;
        m.add_task(
            &format!("t{cpu}"),
            mm,
            cpu,
            vec![
                UserOp::TouchRange {
                    start: page,
                    npages: 4,
                    write: true,
                },
                UserOp::MadviseDontneed {
                    start: page,
                    npages: 4,
                },
                UserOp::Compute { ns: 10_000 },
                UserOp::Loop {
                    to: 0,
                    times: Some(3_000),
                },
                UserOp::Exit,
            ],
        );
    }
    let st = TimedDriver::new(m.agents(), 1, 0).run(
        &mut m,
        Limits {
            max_time: Time::from_ms(1_000),
            max_steps: 20_000_000,
        },
    );
    assert_eq!(st.stop, Stop::Finished, "{st:?}");
    m.counters().clone()
}

#[test]
fn a_process_on_four_cpus_gets_a_global_asid_and_stops_sending_flush_ipis() {
    let ipis = run(false, true);
    assert_eq!(ipis.get(Counter::GlobalAsidsAssigned), 0);
    assert_eq!(ipis.get(Counter::Invlpgb), 0);
    let b = run(true, true);
    // One global ASID, given within the first flushes once consider_global_asid's rate limit
    // lets the flusher look; from then on the flushes are broadcast and waited for.
    assert_eq!(b.get(Counter::GlobalAsidsAssigned), 1);
    assert!(
        b.get(Counter::Invlpgb) > 1_000,
        "{}",
        b.get(Counter::Invlpgb)
    );
    assert!(b.get(Counter::Tlbsync) > 1_000);
    // The IPIs that remain are those of the flushes before the assignment (about 16 ms in) and
    // the transition's: a third of the IPI-only run's.
    assert!(
        b.get(Counter::TlbShootdowns) * 2 < ipis.get(Counter::TlbShootdowns),
        "{} vs {}",
        b.get(Counter::TlbShootdowns),
        ipis.get(Counter::TlbShootdowns)
    );
    // The kernel option off (a kernel before v6.15) on the same CPU: IPIs as before.
    let off = run(true, false);
    assert_eq!(off.get(Counter::Invlpgb), 0);
    assert_eq!(
        off.get(Counter::TlbShootdowns),
        ipis.get(Counter::TlbShootdowns)
    );
}

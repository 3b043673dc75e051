//! A kernel module's cross calls (`UserOp::CrossCall`, the `ipi_benchmark` module's cases):
//! which CPUs take an IPI and run the function, and that the handlers' shared lock is left free.

mod common;
use common::{machine, run_to_end};
use shootdown_linux::smp::{CallFunc, CrossCallTo};
use shootdown_linux::*;

const CALLS: u32 = 50;

/// `CALLS` calls from CPU 0 of a 4-CPU machine; returns the machine after the run.
fn run(to: CrossCallTo, lock: bool) -> Machine {
    let mut m = machine(4);
    let func = if lock {
        CallFunc::SpinLock {
            lock: m.add_kernel_lock(),
        }
    } else {
        CallFunc::Nop
    };
    let mm = m.add_mm("insmod");
    m.add_task(
        "insmod",
        mm,
        0,
        vec![
            UserOp::CrossCall { to, func },
            UserOp::Loop {
                to: 0,
                times: Some(CALLS - 1),
            },
            UserOp::Exit,
        ],
    );
    run_to_end(&mut m, 1_000, 10_000_000);
    m
}

#[test]
fn a_call_to_this_cpu_sends_no_ipi_and_another_cpu_takes_one_per_call() {
    let m = run(CrossCallTo::This, false);
    assert_eq!(m.perf.counters.get(Counter::CallFunctionIpis), 0);
    let m = run(CrossCallTo::AnyBut, false);
    assert_eq!(m.perf.counters.get(Counter::CallFunctionIpis), CALLS as u64);
    // Nothing in these calls is a TLB flush.
    assert_eq!(m.perf.counters.get(Counter::TlbShootdowns), 0);
    assert_eq!(m.perf.counters.get(Counter::NrTlbRemoteFlush), 0);
}

#[test]
fn a_broadcast_interrupts_every_other_cpu_and_its_lock_ends_free() {
    for lock in [false, true] {
        let m = run(CrossCallTo::AllOthers, lock);
        assert_eq!(
            m.perf.counters.get(Counter::CallFunctionIpis),
            3 * CALLS as u64,
            "lock {lock}"
        );
        assert_eq!(m.perf.counters.get(Counter::TlbShootdowns), 0);
        if lock {
            let l = &m.kernel_locks[0];
            assert_eq!((l.val, l.queue.len()), (0, 0));
        }
    }
}

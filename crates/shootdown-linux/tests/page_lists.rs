//! The per-CPU page lists and the kernel spinlocks behind them (`page_lists.rs`,
//! `spinlock.rs`), in the timed driver: how often `zone->lock` and `lru_lock` are taken, FIFO
//! order among queued waiters, and how each spinlock form waits on an overcommitted host.
use shootdown_engine::timed::{Limits, TimedDriver};
use shootdown_engine::Time;
use shootdown_hw::{CostProfile, Features, Topology};
use shootdown_linux::page_lists::{PCP_BATCH, PCP_HIGH};
use shootdown_linux::*;
use std::sync::Arc;

/// ebizzy's record, reduced to its page traffic: fault `pages` in, free them.
fn record(pages: u32) -> Vec<UserOp> {
    vec![
        UserOp::AnonFaults { npages: pages },
        UserOp::Compute { ns: 2_000 },
        UserOp::FreePages { npages: pages },
        UserOp::Event,
        UserOp::Mark,
        UserOp::Loop { to: 0, times: None },
    ]
}

fn opts(spinlock: SpinlockKind) -> Options {
    let mut o = Options::default();
    o.set("page_lists", &OptValue::Bool(true)).unwrap();
    o.spinlock = spinlock;
    o
}

fn native(cpus: usize, spinlock: SpinlockKind) -> Machine {
    let topo = Topology::new(1, cpus, 1).unwrap();
    let prof = Arc::new(CostProfile::uniform("t", 10.0, Features::modern()));
    let mut m = Machine::new(topo, prof, opts(spinlock), MemoryModel::Sc);
    let mm = m.add_mm("pages");
    for c in 0..cpus {
        m.add_task(&format!("t{c}"), mm, c, record(126));
    }
    m
}

fn overcommitted(spinlock: SpinlockKind) -> Machine {
    overcommitted_with(spinlock, |_| {})
}

fn overcommitted_with(spinlock: SpinlockKind, f: impl FnOnce(&mut HostConfig)) -> Machine {
    // Two VMs of 4 vCPUs on 4 pCPUs, 500 us slices: every vCPU is preempted half the time.
    let topo = Topology::new(1, 4, 1).unwrap();
    let prof = Arc::new(CostProfile::uniform("t", 10.0, Features::modern()));
    let mut cfg = HostConfig {
        vms: 2,
        vcpus_per_vm: 4,
        timeslice_us: 500,
        ..HostConfig::default()
    };
    f(&mut cfg);
    cfg.validate(4).unwrap();
    let mut m = Machine::with_host(topo, prof, opts(spinlock), MemoryModel::Sc, cfg);
    for vm in 0..2 {
        let mm = m.add_mm(&format!("vm{vm}"));
        for v in 0..4 {
            m.add_task(&format!("vm{vm}/{v}"), mm, vm * 4 + v, record(126));
        }
    }
    m
}

fn run(m: &mut Machine, ms: u64) {
    let mut d = TimedDriver::new(m.cpus.len(), 1, 0);
    d.run(
        m,
        Limits {
            max_time: Time::from_ms(ms),
            max_steps: 50_000_000,
        },
    );
}

#[test]
fn one_cpu_takes_zone_lock_only_to_fill_its_list_and_lru_lock_fourteen_times_a_record() {
    let mut m = native(1, SpinlockKind::Queued);
    run(&mut m, 5);
    let c = m.counters();
    let records = c.get(Counter::Events);
    assert!(records > 20, "{records}");
    // 126 pages = 5 refills of 31 once; then the list holds 155 - 126 = 29 to 155 pages and
    // never reaches `high`.
    assert_eq!(c.get(Counter::ZoneLock), 5);
    assert_eq!(PCP_BATCH * 5 - 126 + 126, 155);
    assert!(m.page_lists[0].pcp < PCP_HIGH);
    // Per record: 9 full pagevecs (126 / 14), then release_pages of the gather's 8-page bundle
    // and of its 118 other pages in sections of 32: 1 + 4.
    let lru = c.get(Counter::LruLock);
    assert!(
        (14 * records..14 * (records + 1)).contains(&lru),
        "{lru} for {records}"
    );
    assert_eq!(c.get(Counter::LruLockContended), 0);
}

#[test]
fn queued_waiters_take_the_lock_in_turn() {
    let mut m = native(4, SpinlockKind::Queued);
    run(&mut m, 5);
    let c = m.counters();
    assert!(c.get(Counter::LruLockContended) > 0);
    // FIFO: no CPU starves; each finished about as many records as the others.
    let done: Vec<usize> = m
        .perf
        .marks
        .iter()
        .map(Vec::len)
        .filter(|&n| n > 0)
        .collect();
    assert_eq!(done.len(), 4);
    let (lo, hi) = (*done.iter().min().unwrap(), *done.iter().max().unwrap());
    assert!(lo > 0 && hi - lo <= hi / 5 + 1, "{done:?}");
}

#[test]
fn pv_waiters_halt_are_kicked_and_outrun_queued_ones_under_overcommit() {
    let mut pv = overcommitted(SpinlockKind::Pv);
    let mut queued = overcommitted(SpinlockKind::Queued);
    let mut tas = overcommitted(SpinlockKind::Tas);
    for m in [&mut pv, &mut queued, &mut tas] {
        run(m, 20);
    }
    let c = pv.counters();
    let (waits, kicks) = (c.get(Counter::PvWait), c.get(Counter::PvKick));
    assert!(
        waits > 0 && kicks > 0 && kicks <= waits,
        "{waits} waits, {kicks} kicks"
    );
    assert!(c.get(Counter::PvLockStealing) > 0);
    for m in [&queued, &tas] {
        assert_eq!(m.counters().get(Counter::PvWait), 0);
    }
    // A native queued lock in an overcommitted guest waits for preempted waiters in turn
    // (lock-waiter preemption); the PV lock lets a running newcomer steal it instead, and its
    // waiters halt rather than spin.
    let ev = |m: &Machine| m.counters().get(Counter::Events);
    assert!(
        ev(&queued) < ev(&pv),
        "queued {} vs pv {}",
        ev(&queued),
        ev(&pv)
    );
    // With PLE, a queued waiter's spin exits after its base window (reset at every sched-in),
    // and its directed yield hands its pCPU to the other VM's thread and preempts the target's:
    // nearly two host preemptions per yield, against only the 500 us slices' without PLE.
    let mut no_ple = overcommitted_with(SpinlockKind::Queued, |c| c.ple_gap = 0);
    run(&mut no_ple, 20);
    let (q, n) = (queued.counters(), no_ple.counters());
    assert_eq!(n.get(Counter::PleExits), 0);
    assert_eq!(n.get(Counter::HostPreemptions), 20 * 4 * 2);
    let yields = q.get(Counter::DirectedYields);
    assert!(yields > 1000, "{:?}", q.named());
    assert!(
        q.get(Counter::HostPreemptions) > yields * 3 / 2,
        "{:?}",
        q.named()
    );
    assert!(ev(&tas) > 0);
}

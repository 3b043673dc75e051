//! The host under the guests in the timed driver (host/, kvm/): the host scheduler shares
//! pCPUs between vCPU threads, housekeeping preempts, a halted vCPU blocks and is kicked awake,
//! and the PV TLB flush skips preempted vCPUs — with every translation use checked.
use shootdown_engine::timed::{Limits, Stop, TimedDriver};
use shootdown_engine::Time;
use shootdown_hw::{CostProfile, Features, Topology};
use shootdown_linux::*;
use std::sync::Arc;

fn host(vms: usize, vcpus: usize, pcpus: usize, f: impl FnOnce(&mut HostConfig)) -> Machine {
    let topo = Topology::new(1, pcpus, 1).unwrap();
    let prof = Arc::new(CostProfile::uniform("t", 10.0, Features::modern()));
    let mut cfg = HostConfig {
        vms,
        vcpus_per_vm: vcpus,
        timeslice_us: 1000,
        ..HostConfig::default()
    };
    f(&mut cfg);
    cfg.validate(pcpus).unwrap();
    Machine::with_host(topo, prof, Options::default(), MemoryModel::Sc, cfg)
}

fn compute_loop(m: &mut Machine, cpu: usize, mm: MmId) {
    let prog = vec![
        UserOp::Compute { ns: 1000 },
        UserOp::Event,
        UserOp::Loop { to: 0, times: None },
    ];
    m.add_task(&format!("loop{cpu}"), mm, cpu, prog);
}

fn run(m: &mut Machine, ms: u64) -> Stop {
    let n = m.cpus.len();
    let mut d = TimedDriver::new(n, 1, 0);
    d.run(
        m,
        Limits {
            max_time: Time::from_ms(ms),
            max_steps: 50_000_000,
        },
    )
    .stop
}

#[test]
fn two_vms_share_a_pcpu_round_robin() {
    // vCPU 0 (VM 0) and vCPU 1 (VM 1) both on the only pCPU, 1 ms slices.
    let mut m = host(2, 1, 1, |_| {});
    for vm in 0..2 {
        let mm = m.add_mm(&format!("vm{vm}"));
        compute_loop(&mut m, vm, mm);
    }
    assert_eq!(run(&mut m, 20), Stop::TimeLimit);
    let c = m.counters();
    // ~20 slices of 1 ms: each VM ran about half of the time.
    let pre = c.get(Counter::HostPreemptions);
    assert!((17..=22).contains(&pre), "{pre}");
    // Each event costs 1 us of compute + 3 steps at 10 ns: ~ 20 ms / 1.03 us in total, less
    // the 10 us context switches.
    let ev = c.get(Counter::Events);
    assert!(ev > 17_000 && ev < 20_000, "{ev}");
}

#[test]
fn housekeeping_takes_its_share_of_a_dedicated_pcpu() {
    let mut with = host(1, 1, 1, |c| {
        c.housekeeping_interval_us = 1000;
        c.housekeeping_run_us = 100;
    });
    let mut without = host(1, 1, 1, |_| {});
    for m in [&mut with, &mut without] {
        let mm = m.add_mm("vm0");
        compute_loop(m, 0, mm);
        run(m, 50);
    }
    let (a, b) = (
        with.counters().get(Counter::Events) as f64,
        without.counters().get(Counter::Events) as f64,
    );
    // 100 us of every ~1000 us (+ two context switches) goes to housekeeping.
    let loss = 1.0 - a / b;
    assert!(loss > 0.07 && loss < 0.14, "loss {loss}");
    assert!(with.counters().get(Counter::HostHousekeeping) >= 40);
}

/// Every thread of a VM's process zaps and flushes its own page in a loop: an ebizzy in small.
fn flushers(m: &mut Machine, vm: usize, vcpus: usize) {
    let mm = m.add_mm(&format!("vm{vm}"));
    for i in 0..vcpus {
        let vpn = 0x1000 + 0x200 * i as u64;
        let prog = vec![
            UserOp::Touch { vpn, write: true },
            UserOp::Compute { ns: 5_000 },
            UserOp::Compute { ns: 5_000 },
            UserOp::MadviseDontneed {
                start: vpn,
                npages: 1,
            },
            UserOp::Event,
            UserOp::Loop { to: 0, times: None },
        ];
        m.add_task(&format!("t{vm}.{i}"), mm, vm * vcpus + i, prog);
    }
}

fn overcommitted(pv: bool) -> Machine {
    overcommitted_with(pv, |_| {})
}

fn overcommitted_with(pv: bool, f: impl FnOnce(&mut HostConfig)) -> Machine {
    overcommitted_opts(pv, false, f)
}

fn overcommitted_opts(pv: bool, sched_yield: bool, f: impl FnOnce(&mut HostConfig)) -> Machine {
    let opts = Options {
        pv_tlb_flush: pv,
        pv_sched_yield: sched_yield,
        ..Options::default()
    };
    overcommitted_options(opts, f)
}

/// Two VMs of 4 vCPUs on 4 pCPUs, every vCPU a flusher, with the guest and host options
/// `opts`.
fn overcommitted_options(opts: Options, f: impl FnOnce(&mut HostConfig)) -> Machine {
    let topo = Topology::new(1, 4, 1).unwrap();
    let prof = Arc::new(CostProfile::uniform("t", 100.0, Features::modern()));
    let mut cfg = HostConfig {
        vms: 2,
        vcpus_per_vm: 4,
        timeslice_us: 500,
        ..HostConfig::default()
    };
    f(&mut cfg);
    // Seed 001's kernel (v4.16): a nested mmu_gather force-flushes only its range (mainline's
    // full flush with freed_tables would also IPI the lazy vCPUs).
    let opts = Options {
        mmu_gather: shootdown_linux::options::MmuGather::V4_13,
        ..opts
    };
    let mut m = Machine::with_host(topo, prof, opts, MemoryModel::Sc, cfg);
    for vm in 0..2 {
        flushers(&mut m, vm, 4);
    }
    m
}

#[test]
fn pv_tlb_flush_skips_preempted_vcpus_and_the_host_flushes_them() {
    let mut vanilla = overcommitted(false);
    let mut pv = overcommitted(true);
    // Every translation use is checked by the oracle: a run that ends at the time limit had no
    // violation.
    assert_eq!(run(&mut vanilla, 30), Stop::TimeLimit);
    assert_eq!(run(&mut pv, 30), Stop::TimeLimit);
    let (v, p) = (vanilla.counters(), pv.counters());
    assert_eq!(v.get(Counter::PvTlbFlushSkipped), 0);
    assert!(p.get(Counter::PvTlbFlushSkipped) > 100, "{:?}", p.named());
    // Skipped vCPUs are flushed by the host at entry, at most once per entry.
    let flushes = p.get(Counter::KvmTlbFlush);
    assert!(
        flushes > 10 && flushes <= p.get(Counter::HostPreemptions),
        "{flushes}"
    );
    assert!(pv.perf.uses_checked > 1000);
    // Initiators no longer wait for preempted vCPUs: more records. (+27 % while IPIs landed
    // at the start of their sending step; +20 % since they land after the send completes.)
    let (ev, ep) = (v.get(Counter::Events), p.get(Counter::Events));
    assert!(10 * ep > 11 * ev, "vanilla {ev}, pv {ep}");
}

/// Shoot4U (`shoot4u.rs`): each guest flush's remote part is one hypercall, and the host
/// flushes every target vCPU's VPID through a host IPI to its pCPU, running or preempted; no
/// guest IPI is sent and the oracle finds nothing.
#[test]
fn shoot4u_flushes_every_target_through_the_host() {
    let opts = Options {
        shoot4u: true,
        ..Options::default()
    };
    let mut m = overcommitted_options(opts, |_| {});
    assert_eq!(run(&mut m, 30), Stop::TimeLimit);
    let c = m.counters();
    let calls = c.get(Counter::Shoot4uHypercalls);
    assert!(calls > 100, "{:?}", c.named());
    assert_eq!(c.get(Counter::CallFunctionIpis), 0);
    // Each hypercall IPIs, one after the other, the pCPUs of the VM's other vCPUs in
    // `mm_cpumask` (at most 3), and each IPI flushes its vCPU's VPID.
    let (ipis, flushes) = (c.get(Counter::KvmKickIpis), c.get(Counter::KvmTlbFlush));
    assert!(ipis <= 3 * calls && ipis > 2 * calls, "{ipis} {calls}");
    assert!(flushes <= ipis && flushes + 8 >= ipis, "{flushes} {ipis}");
    assert!(m.perf.uses_checked > 1000);
}

/// The Hyper-V enlightened flush (`hyperv.rs`, `kvm/hyperv.rs`): every remote flush is one
/// hypercall; KVM sets a flush request on each target vCPU and kicks those in the guest, which
/// flush before they enter it again. v6.3+ puts the pages in each target's FIFO.
#[test]
fn hyperv_flushes_are_hypercalls_whose_targets_flush_before_entry() {
    for form in [HvTlbFlush::V4_18, HvTlbFlush::V5_10, HvTlbFlush::Mainline] {
        let opts = Options {
            hv_tlb_flush: form,
            ..Options::default()
        };
        let mut m = overcommitted_options(opts, |_| {});
        assert_eq!(run(&mut m, 30), Stop::TimeLimit, "{form:?}");
        let c = m.counters();
        let calls = c.get(Counter::HvFlushHypercalls);
        assert!(calls > 100, "{form:?}: {:?}", c.named());
        assert_eq!(c.get(Counter::CallFunctionIpis), 0, "{form:?}");
        // A kick only for a target in the guest (at most 3 per call), and every target
        // flushes, kicked or not, before it runs guest code again.
        let (kicks, flushes) = (c.get(Counter::KvmKickIpis), c.get(Counter::KvmTlbFlush));
        assert!(kicks <= 3 * calls && kicks > 0, "{form:?}: {kicks} {calls}");
        assert!(flushes > kicks / 2, "{form:?}: {flushes} {kicks}");
        assert!(m.perf.uses_checked > 1000);
    }
}

/// Pause-loop exiting (host/ple.rs): an initiator spinning in `csd_lock_wait` for a preempted
/// target exits after its window, `kvm_vcpu_on_spin` boosts a preempted vCPU of its VM and the
/// spinner gives its pCPU to the other VM's vCPU. Without PLE nothing exits and the spinners
/// burn their slices; `yield_to_kernel_mode` changes which vCPUs are boosted.
#[test]
fn pause_loop_exits_yield_the_pcpu_of_a_spinning_initiator() {
    let mut off = overcommitted_with(false, |c| c.ple_gap = 0);
    let mut on = overcommitted_with(false, |_| {});
    let mut any = overcommitted_with(false, |c| c.yield_to_kernel_mode = false);
    for m in [&mut off, &mut on, &mut any] {
        assert_eq!(run(m, 30), Stop::TimeLimit);
    }
    let (o, n, a) = (off.counters(), on.counters(), any.counters());
    assert_eq!(o.get(Counter::PleExits), 0);
    assert_eq!(o.get(Counter::DirectedYields), 0);
    let exits = n.get(Counter::PleExits);
    assert!(exits > 100, "{:?}", n.named());
    // Every exit either boosted a vCPU or found none.
    assert_eq!(
        exits,
        n.get(Counter::DirectedYields) + n.get(Counter::PleNoCandidate)
    );
    assert!(n.get(Counter::DirectedYields) > 0);
    // A yield is a preemption of the spinner (its pCPU has another thread).
    assert!(n.get(Counter::HostPreemptions) > o.get(Counter::HostPreemptions));
    // Which preempted vCPUs are candidates changes what the yields do.
    assert!(a.get(Counter::DirectedYields) > 0);
    assert_ne!(
        (a.get(Counter::DirectedYields), a.get(Counter::Events)),
        (n.get(Counter::DirectedYields), n.get(Counter::Events))
    );
    // The spinners' slices go to useful work: more records.
    let (eo, en) = (o.get(Counter::Events), n.get(Counter::Events));
    assert!(en > eo, "without PLE {eo}, with {en}");
}

/// PV sched yield (v5.3): a sender whose call-function IPI went to a preempted vCPU yields
/// its pCPU to it (`KVM_HC_SCHED_YIELD` → `kvm_vcpu_yield_to`), instead of spinning until the
/// target's turn comes. (In this small all-flushing pair of VMs it does not pay: 3,457 records
/// against 3,582 without; the yielder waits out the slice of the thread it yielded to.)
#[test]
fn pv_sched_yield_hands_the_pcpu_to_the_preempted_target() {
    let mut off = overcommitted_opts(false, false, |_| {});
    let mut on = overcommitted_opts(false, true, |_| {});
    for m in [&mut off, &mut on] {
        assert_eq!(run(m, 30), Stop::TimeLimit);
    }
    let (o, n) = (off.counters(), on.counters());
    assert_eq!(o.get(Counter::PvSchedYield), 0);
    let (calls, yields) = (n.get(Counter::PvSchedYield), n.get(Counter::PvSchedYieldTo));
    assert!(
        calls > 100 && yields > 0 && yields <= calls,
        "{calls} {yields}"
    );
    assert!(n.get(Counter::HostPreemptions) > o.get(Counter::HostPreemptions));
    assert_ne!(o.get(Counter::Events), n.get(Counter::Events));
}

#[test]
fn halted_vcpu_blocks_and_an_ipi_kicks_it_awake() {
    // The reader faults on its page every round (it zaps it) and so takes mmap_sem for read;
    // the writer keeps taking it for write (mmap). When the reader has to sleep, its vCPU has
    // nothing else to run: the guest halts, the host blocks the vCPU thread, and the writer's
    // unlock (try_to_wake_up + reschedule IPI) kicks it awake.
    let mut m = mmap_sem_pair(0, 1);
    assert_eq!(run(&mut m, 100), Stop::Finished);
    let c = m.counters();
    assert!(c.get(Counter::MmapSemContended) > 0, "{:?}", c.named());
    assert!(c.get(Counter::KvmHaltExits) > 1, "{:?}", c.named());
    // Every block but the last (after the tasks exit) ended with a kick.
    assert!(c.get(Counter::VcpuWakeups) + 2 >= c.get(Counter::KvmHaltExits));
    assert!(c.get(Counter::VcpuWakeups) > 0);
}

/// A writer (mmap, so `mmap_sem` for write) and a reader (a fault and a zap, `mmap_sem` for
/// read) in each of `vms` VMs of 2 vCPUs on 2 pCPUs, with `halt_poll_ns = max` (0 = none).
fn mmap_sem_pair(max: u64, vms: usize) -> Machine {
    let mut m = host(vms, 2, 2, |c| c.halt_poll_ns = max);
    for vm in 0..vms {
        let mm = m.add_mm(&format!("vm{vm}"));
        let writer = vec![
            UserOp::Mmap {
                start: 0x10,
                npages: 1,
            },
            UserOp::Event,
            UserOp::Loop {
                to: 0,
                times: Some(200),
            },
            UserOp::Exit,
        ];
        let reader = vec![
            UserOp::Touch {
                vpn: 0x10,
                write: true,
            },
            UserOp::MadviseDontneed {
                start: 0x10,
                npages: 1,
            },
            UserOp::Loop {
                to: 0,
                times: Some(300),
            },
            UserOp::Exit,
        ];
        m.add_task("writer", mm, 2 * vm, writer);
        m.add_task("reader", mm, 2 * vm + 1, reader);
    }
    m
}

#[test]
fn halt_polling_catches_a_kick_without_a_wakeup_only_on_a_pcpu_of_its_own() {
    let mut none = mmap_sem_pair(0, 1);
    let mut polls = mmap_sem_pair(200_000, 1);
    for m in [&mut none, &mut polls] {
        assert_eq!(run(m, 100), Stop::Finished);
    }
    let (a, b) = (none.counters(), polls.counters());
    assert_eq!(a.get(Counter::HaltAttemptedPoll), 0);
    // The first halt grows the poll time from 0 to 10 us; after that each halt polls, and the
    // writer's reschedule IPI ends most polls.
    let (tried, caught) = (
        b.get(Counter::HaltAttemptedPoll),
        b.get(Counter::HaltSuccessfulPoll),
    );
    assert!(
        tried > 0 && caught > 0 && caught <= tried,
        "{tried} {caught}"
    );
    assert!(b.get(Counter::KvmHaltExits) > tried);
    // A caught kick needs no wake-up of a sleeping thread.
    assert!(b.get(Counter::VcpuWakeups) < a.get(Counter::VcpuWakeups));
    // Two VMs on the same two pCPUs: a halting vCPU polls only when the other VM's thread on
    // its pCPU is blocked too (`single_task_running()`); a kick that wakes that one ends the
    // poll. Far fewer polls catch their kick.
    let mut shared = mmap_sem_pair(200_000, 2);
    run(&mut shared, 100);
    let c = shared.counters();
    let (halts, tried2, caught2) = (
        c.get(Counter::KvmHaltExits),
        c.get(Counter::HaltAttemptedPoll),
        c.get(Counter::HaltSuccessfulPoll),
    );
    assert!(tried2 < halts, "{tried2} of {halts}");
    assert!(caught2 * 4 < caught, "{caught2} vs {caught} alone");
}

#[test]
fn idle_poll_vcpus_never_halt_and_ipis_wait_for_preempted_ones() {
    // pthread_mmap in small (seed 002): two threads on two vCPUs map, touch and unmap their
    // own range, contending on mmap_sem. With idle=poll the guest never executes HLT: a vCPU
    // whose thread sleeps on mmap_sem keeps polling in guest mode (lazy, still in mm_cpumask
    // before the tlb_gen rework) until housekeeping preempts it, and a flush IPI to it then
    // waits for the host to run it again.
    let build = |idle: Idle| {
        let topo = Topology::new(1, 2, 1).unwrap();
        let prof = Arc::new(CostProfile::uniform("t", 100.0, Features::modern()));
        let cfg = HostConfig {
            vms: 1,
            vcpus_per_vm: 2,
            housekeeping_interval_us: 500,
            housekeeping_run_us: 200,
            ..HostConfig::default()
        };
        let opts = Options {
            idle,
            lazy_tlb: LazyTlb::Legacy,
            pcid: false,
            ..Options::default()
        };
        let mut m = Machine::with_host(topo, prof, opts, MemoryModel::Sc, cfg);
        let mm = m.add_mm("vm0");
        for i in 0..2u64 {
            let start = 0x40_0000 + i * 0x400;
            let prog = vec![
                UserOp::Mmap { start, npages: 8 },
                UserOp::TouchRange {
                    start,
                    npages: 8,
                    write: true,
                },
                UserOp::Munmap { start, npages: 8 },
                UserOp::Loop {
                    to: 0,
                    times: Some(300),
                },
                UserOp::Exit,
            ];
            m.add_task(&format!("t{i}"), mm, i as usize, prog);
        }
        m
    };
    let mut poll = build(Idle::Poll);
    assert_eq!(run(&mut poll, 1000), Stop::Finished);
    let c = poll.counters();
    assert_eq!(c.get(Counter::KvmHaltExits), 0, "{:?}", c.named());
    assert!(c.get(Counter::MmapSemContended) > 0, "{:?}", c.named());
    assert!(c.get(Counter::HostPreemptions) > 10, "{:?}", c.named());
    assert!(c.get(Counter::IpisToPreemptedVcpus) > 0, "{:?}", c.named());
    assert!(c.get(Counter::PreemptedIpiWaitUs) > 0, "{:?}", c.named());
    // The same guest with idle=halt blocks its vCPU threads instead.
    let mut halt = build(Idle::Halt);
    assert_eq!(run(&mut halt, 1000), Stop::Finished);
    assert!(halt.counters().get(Counter::KvmHaltExits) > 0);
}

/// Interruptible work (here 3 ms of user computation) only advances while the host runs the
/// vCPU: sharing one pCPU round robin with another VM in 1 ms slices, it ends after about 5 ms,
/// not 3.
#[test]
fn guest_work_stops_while_its_vcpu_is_descheduled() {
    let mut m = host(2, 1, 1, |_| {});
    let mm0 = m.add_mm("vm0");
    let t = m.add_task(
        "long",
        mm0,
        0,
        vec![
            UserOp::Compute { ns: 3_000_000 },
            UserOp::Mark,
            UserOp::Exit,
        ],
    );
    let mm1 = m.add_mm("vm1");
    compute_loop(&mut m, 1, mm1);
    assert_eq!(run(&mut m, 20), Stop::TimeLimit);
    let done = m.perf.marks[t as usize][0];
    assert!(
        done >= Time::from_us(5_000) && done <= Time::from_us(7_000),
        "{done:?}"
    );
}

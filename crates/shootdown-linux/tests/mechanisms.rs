//! Unit tests of single mechanisms against the spec (kernel-model.md §1.5–§1.9).

use shootdown_engine::timed::{Limits, Stop, TimedDriver};
use shootdown_engine::{Model, Time};
use shootdown_hw::{CostProfile, Features, Topology};
use shootdown_linux::describe::NullEnv;
use shootdown_linux::frame::FlushFunc;
use shootdown_linux::state::{FlushTlbInfo, TlbContext};
use shootdown_linux::*;
use std::sync::Arc;

fn machine(opts: Options, cpus: usize) -> Machine {
    let topo = Topology::new(1, cpus, 1).unwrap();
    Machine::new(
        topo,
        Arc::new(CostProfile::uniform("t", 10.0, Features::modern())),
        opts,
        MemoryModel::Sc,
    )
}

/// cpu1 has `mm` loaded in ASID 0 at generation `local`; `mm` is at `mm_gen`; run one remote
/// `flush_tlb_func` for page 0x10 carrying `new_gen` to completion.
fn run_flush_func(local: u64, mm_gen: u64, new_gen: u64) -> Machine {
    let mut m = machine(Options::default(), 2);
    let mm = m.add_mm("mm1");
    m.mms[mm as usize].tlb_gen = mm_gen;
    let ctx_id = m.mms[mm as usize].ctx_id;
    let c = &mut m.cpus[1];
    c.tlbstate.loaded_mm = mm as u64;
    c.tlbstate.loaded_mm_asid = 0;
    c.tlbstate.ctxs[0] = TlbContext {
        ctx_id,
        tlb_gen: local,
    };
    c.cr3_mm = mm;
    let info = FlushTlbInfo {
        mm: Some(mm),
        start: 0x10,
        end: 0x11,
        new_tlb_gen: new_gen,
        freed_tables: false,
        trim_cpumask: false,
        initiator: 0,
    };
    c.irq_stack.push(FlushFunc::call(info, false));
    for _ in 0..10 {
        if m.cpus[1].irq_stack.is_empty() {
            break;
        }
        m.apply(Action::Step(1), &mut NullEnv);
    }
    assert!(
        m.cpus[1].irq_stack.is_empty(),
        "flush_tlb_func did not return"
    );
    m
}

#[test]
fn partial_flush_when_exactly_one_generation_behind() {
    let m = run_flush_func(2, 3, 3);
    assert_eq!(m.counters().get(Counter::NrTlbLocalFlushOne), 1);
    assert_eq!(m.counters().get(Counter::NrTlbLocalFlushAll), 0);
    assert_eq!(m.cpus[1].tlbstate.ctxs[0].tlb_gen, 3);
}

#[test]
fn partial_flush_upgraded_to_full_when_more_than_one_generation_behind() {
    let m = run_flush_func(1, 3, 3);
    assert_eq!(m.counters().get(Counter::NrTlbLocalFlushOne), 0);
    assert_eq!(m.counters().get(Counter::NrTlbLocalFlushAll), 1);
    assert_eq!(
        m.cpus[1].tlbstate.ctxs[0].tlb_gen, 3,
        "jumps to mm's newest generation"
    );
}

#[test]
fn full_flush_when_newer_requests_are_outstanding() {
    // new_gen = local+1 but mm already at local+2: one full flush to mm_gen.
    let m = run_flush_func(2, 4, 3);
    assert_eq!(m.counters().get(Counter::NrTlbLocalFlushAll), 1);
    assert_eq!(m.cpus[1].tlbstate.ctxs[0].tlb_gen, 4);
}

#[test]
fn flush_skipped_when_up_to_date() {
    let m = run_flush_func(3, 3, 3);
    assert_eq!(m.counters().get(Counter::FlushSkippedUpToDate), 1);
    assert_eq!(
        m.counters().get(Counter::NrTlbLocalFlushOne)
            + m.counters().get(Counter::NrTlbLocalFlushAll),
        0
    );
}

#[test]
fn batched_flush_with_generation_zero_is_not_skipped() {
    // arch_tlbbatch_flush sends new_tlb_gen = 0 (TLB_GENERATION_INVALID); mainline must still flush.
    let mut m = run_flush_func(3, 4, 0);
    assert_eq!(m.counters().get(Counter::NrTlbLocalFlushAll), 1);
    // With the N8 mutant the shortcut swallows it.
    let _ = &mut m;
    let mut opts = Options::default();
    opts.mutants.batch_flush_gen_zero = true;
    let mut m = machine(opts, 2);
    let mm = m.add_mm("mm1");
    m.mms[mm as usize].tlb_gen = 4;
    let ctx_id = m.mms[mm as usize].ctx_id;
    let c = &mut m.cpus[1];
    c.tlbstate.loaded_mm = mm as u64;
    c.tlbstate.ctxs[0] = TlbContext { ctx_id, tlb_gen: 3 };
    let info = FlushTlbInfo {
        mm: None,
        start: 0,
        end: u64::MAX,
        new_tlb_gen: 0,
        freed_tables: false,
        trim_cpumask: false,
        initiator: 0,
    };
    c.irq_stack.push(FlushFunc::call(info, false));
    m.apply(Action::Step(1), &mut NullEnv);
    assert_eq!(
        m.counters().get(Counter::FlushSkippedUpToDate),
        1,
        "N8: skipped"
    );
}

/// cpu1 runs a thread of the mm, then exits (goes idle: lazy); cpu0's thread then madvises (no
/// tables freed) and munmaps a whole page-table page (tables freed). Returns the counters.
fn lazy_scenario(lazy_tlb: LazyTlb) -> Counters {
    let mut opts = Options::default();
    opts.lazy_tlb = lazy_tlb;
    opts.pcid = lazy_tlb != LazyTlb::Legacy;
    let mut m = machine(opts, 2);
    let mm = m.add_mm("mm1");
    m.map_pages(mm, 0, 1024, true);
    m.add_task(
        "idler",
        mm,
        1,
        vec![
            UserOp::Touch {
                vpn: 5,
                write: true,
            },
            UserOp::Exit,
        ],
    );
    m.add_task(
        "unmapper",
        mm,
        0,
        vec![
            UserOp::Compute { ns: 200_000 },
            UserOp::MadviseDontneed {
                start: 5,
                npages: 1,
            },
            UserOp::Munmap {
                start: 512,
                npages: 512,
            },
            UserOp::Exit,
        ],
    );
    let mut d = TimedDriver::new(2, 7, 0);
    let st = d.run(
        &mut m,
        Limits {
            max_time: Time::from_ms(10),
            max_steps: 100_000,
        },
    );
    assert_eq!(st.stop, Stop::Finished, "{st:?}");
    m.counters().clone()
}

#[test]
fn lazy_cpu_not_ipid_unless_page_tables_freed() {
    for lazy in [LazyTlb::IsLazy, LazyTlb::Mainline] {
        let c = lazy_scenario(lazy);
        // The munmap (freed tables) is the only flush that reaches the lazy CPU, which then
        // switches to init_mm.
        assert_eq!(c.get(Counter::TlbShootdowns), 1, "{lazy:?}");
        assert_eq!(c.get(Counter::LeaveMm), 1, "{lazy:?}");
    }
}

#[test]
fn andys_rework_never_ipis_lazy_cpus() {
    // V1: the lazy CPU left mm_cpumask, so not even the page-table free reaches it (bug N3).
    let c = lazy_scenario(LazyTlb::TlbGen);
    assert_eq!(c.get(Counter::TlbShootdowns), 0);
}

#[test]
fn v412_lazy_cpu_is_ipid_once_then_leaves() {
    // V0: lazy CPUs stay in mm_cpumask; the first flush IPIs it and it leave_mm()s, so the second
    // flush finds it gone.
    let c = lazy_scenario(LazyTlb::Legacy);
    assert_eq!(c.get(Counter::TlbShootdowns), 1);
    assert_eq!(c.get(Counter::LeaveMm), 1);
}

#[test]
fn oracle_checks_uses_in_the_timed_driver() {
    let c = lazy_scenario(LazyTlb::Mainline);
    let _ = c;
    let mut m = machine(Options::default(), 2);
    let mm = m.add_mm("mm1");
    m.map_pages(mm, 0, 4, true);
    m.add_task(
        "t",
        mm,
        0,
        vec![
            UserOp::TouchRange {
                start: 0,
                npages: 4,
                write: true,
            },
            UserOp::Exit,
        ],
    );
    let mut d = TimedDriver::new(2, 1, 0);
    d.run(&mut m, Limits::default());
    assert_eq!(m.perf.uses_checked, 4);
}

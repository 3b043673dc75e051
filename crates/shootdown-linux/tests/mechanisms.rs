//! Unit tests of single mechanisms against the spec (docs/design/kernel-model.md §1.4–§1.10, §2).

use shootdown_engine::timed::{Limits, Stop, TimedDriver};
use shootdown_engine::{Model, Time};
use shootdown_hw::{CostProfile, Features, Topology};
use shootdown_linux::describe::NullEnv;
use shootdown_linux::state::{FlushTlbInfo, TlbContext};
use shootdown_linux::tlb::FlushFunc;
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

/// Run `m` with RNG `seed` until its tasks finish, within `max_ms` of simulated time and
/// `max_steps` steps.
fn run_to_completion(m: &mut Machine, seed: u64, max_ms: u64, max_steps: u64) {
    let st = TimedDriver::new(m.agents(), seed, 0).run(
        m,
        Limits {
            max_time: Time::from_ms(max_ms),
            max_steps,
        },
    );
    assert_eq!(st.stop, Stop::Finished, "{st:?}");
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
        stride_shift: 0,
        freed_tables: false,
        trim_cpumask: false,
        initiator: 0,
        kernel: false,
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
        stride_shift: 0,
        freed_tables: false,
        trim_cpumask: false,
        initiator: 0,
        kernel: false,
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
    let opts = Options {
        lazy_tlb,
        pcid: lazy_tlb != LazyTlb::Legacy,
        ..Options::default()
    };
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
    run_to_completion(&mut m, 7, 10, 100_000);
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

/// Two DAX files in one mm: a write fault dirties only its own file, and `fdatasync` of a file
/// write-protects and flushes only that file's dirty entries (one `flush_tlb_mm_range` each).
#[test]
fn fdatasync_writes_back_only_its_own_file() {
    let mut m = machine(Options::default(), 2);
    let mm = m.add_mm("db");
    m.map_pages(mm, 0, 8, false);
    m.map_pages(mm, 512, 8, false);
    let a = m.add_dax_file(mm, 0, 8);
    let b = m.add_dax_file(mm, 512, 8);
    let touch = |vpn| UserOp::Touch { vpn, write: true };
    m.add_task(
        "writer",
        mm,
        0,
        vec![
            touch(1),
            touch(2),
            touch(513),
            UserOp::Fdatasync { file: a },
            UserOp::Exit,
        ],
    );
    run_to_completion(&mut m, 1, 10, 100_000);
    assert_eq!(m.counters().get(Counter::PageFaults), 3);
    // File a's two entries were written back (one flush each), file b's entry is still dirty.
    assert_eq!(m.counters().get(Counter::NrTlbLocalFlushOne), 2);
    assert!(m.dax_files[a as usize].dirty.is_empty());
    assert_eq!(
        m.dax_files[b as usize]
            .dirty
            .iter()
            .copied()
            .collect::<Vec<_>>(),
        vec![513]
    );
}

/// sysbench's request generator: process-wide, after every `fsync_freq` writes the next
/// requests fsync each file in turn, whichever thread asks.
#[test]
fn fileio_generator_fsyncs_every_file_after_fsync_freq_writes() {
    let mut m = machine(Options::default(), 2);
    let mm = m.add_mm("sysbench");
    let mut files = Vec::new();
    for i in 0..3 {
        m.map_pages(mm, i * 512, 4, false);
        files.push(m.add_dax_file(mm, i * 512, 4));
    }
    m.fileio = Some(FileioGen {
        files,
        units_per_file: 4,
        units_per_block: 1,
        fsync_freq: 5,
        req_performed: 0,
        is_dirty: false,
        fsynced_file: 0,
    });
    let prog = vec![
        UserOp::FileioNext,
        UserOp::FileioExec {
            npages: 1,
            copy_pages: 0,
        },
        UserOp::Event,
        UserOp::Loop {
            to: 0,
            times: Some(15),
        },
        UserOp::Exit,
    ];
    m.add_task("t0", mm, 0, prog.clone());
    m.add_task("t1", mm, 1, prog);
    run_to_completion(&mut m, 3, 100, 1_000_000);
    let g = m.fileio.as_ref().unwrap();
    // 32 requests = cycles of 5 writes + 3 fsyncs: 4 cycles, all files synced each time.
    assert_eq!(m.counters().get(Counter::Events), 32);
    assert_eq!(g.req_performed, 20);
    assert!(!g.is_dirty);
    assert_eq!(g.fsynced_file, 0);
    // Every dirty entry was written back by some fsync: nothing is left dirty.
    assert!(m.dax_files.iter().all(|f| f.dirty.is_empty()));
}

/// In mmap mode sysbench fsyncs with `msync(MS_SYNC)`, which read-locks `mmap_sem` around
/// `find_vma()`: with a writer inside (another thread's munmap) it waits. A plain `fdatasync()`
/// never touches `mmap_sem` and completes.
#[test]
fn sysbench_fsync_is_msync_and_waits_for_mmap_sem() {
    for msync in [true, false] {
        let mut m = machine(Options::default(), 2);
        let mm = m.add_mm("sysbench");
        m.map_pages(mm, 0, 4, false);
        let f = m.add_dax_file(mm, 0, 4);
        // The next request is an fsync: 5 writes done, fsync_freq 5, files dirty.
        m.fileio = Some(FileioGen {
            files: vec![f],
            units_per_file: 4,
            units_per_block: 1,
            fsync_freq: 5,
            req_performed: 5,
            is_dirty: true,
            fsynced_file: 0,
        });
        let request = if msync {
            vec![
                UserOp::FileioNext,
                UserOp::FileioExec {
                    npages: 1,
                    copy_pages: 0,
                },
            ]
        } else {
            vec![UserOp::Fdatasync { file: f }]
        };
        let prog = [request, vec![UserOp::Event, UserOp::Exit]].concat();
        m.add_task("t0", mm, 0, prog);
        m.mms[mm as usize].mmap_sem.writer = true;
        let st = TimedDriver::new(2, 1, 0).run(
            &mut m,
            Limits {
                max_time: Time::from_ms(10),
                max_steps: 100_000,
            },
        );
        let contended = m.counters().get(Counter::MmapSemContended);
        let events = m.counters().get(Counter::Events);
        if msync {
            assert_eq!((contended, events), (1, 0), "{st:?}");
        } else {
            assert_eq!((contended, events), (0, 1), "{st:?}");
        }
    }
}

/// An aged machine hands a process the ASID slot each CPU's rotor points at (so different
/// slots on different CPUs), the same ones for the same seed; a fresh machine gives ASID 1.
#[test]
fn aged_asid_rotors_decide_the_slot_a_process_gets() {
    let slots = |age: Option<u64>| {
        let mut m = machine(Options::default(), 16);
        if let Some(seed) = age {
            m.age_asid_rotors(seed);
        }
        let rotors: Vec<u16> = m.cpus.iter().map(|c| c.tlbstate.next_asid).collect();
        let mm = m.add_mm("p");
        let got: Vec<u16> = (0..16).map(|cpu| m.choose_new_asid(cpu, mm, 1).0).collect();
        (rotors, got)
    };
    let (_, fresh) = slots(None);
    assert!(fresh.iter().all(|&a| a == 1), "{fresh:?}");
    let (rotors, aged) = slots(Some(7));
    assert_eq!(aged, rotors, "the slot is where the rotor stood");
    assert!(aged.iter().all(|&a| (a as usize) < state::TLB_NR_DYN_ASIDS));
    assert!(aged.iter().any(|&a| a != aged[0]), "{aged:?}");
    assert_eq!(slots(Some(7)).1, aged, "deterministic in the seed");
    assert_ne!(slots(Some(8)).1, aged);
}

/// `map_pages` over a fresh range and over one that overlaps existing entries: every page ends
/// present with the new protection, and an existing entry keeps its version history.
#[test]
fn map_pages_fresh_and_overlapping_ranges() {
    let mut m = machine(Options::default(), 2);
    let mm = m.add_mm("p");
    m.map_pages(mm, 1000, 8, false);
    m.map_pages(mm, 0, 4, false); // fresh, below the existing entries
    let mut old = m.mms[mm as usize].space.pte(1004);
    old.version = 3;
    m.mms[mm as usize].space.ptes.insert(1004, old);
    m.map_pages(mm, 1004, 8, true); // overlaps 1004..1008
    let space = &m.mms[mm as usize].space;
    assert_eq!(space.ptes.len(), 16);
    for v in (0..4).chain(1000..1004) {
        assert!(space.pte(v).present && !space.pte(v).writable, "{v}");
    }
    for v in 1004..1012 {
        assert!(space.pte(v).present && space.pte(v).writable, "{v}");
    }
    assert_eq!(space.pte(1004).version, 3);
    // Page-table pages: one per 512-page group touched (0..4 is group 0, 1000..1012 group 1).
    assert_eq!(space.pmd.len(), 2);
}

/// An IPI that arrives while its target runs interruptible work (here user code) is taken at its
/// arrival: cpu1's `madvise` flush completes long before cpu0's 200 µs of computation ends,
/// instead of waiting for it as it would if the computation were one indivisible step.
#[test]
fn an_ipi_interrupts_long_user_work() {
    let mut m = machine(Options::default(), 2);
    let mm = m.add_mm("p");
    m.map_pages(mm, 0, 2, false);
    let a = m.add_task(
        "computes",
        mm,
        0,
        vec![
            UserOp::Touch {
                vpn: 0,
                write: false,
            },
            UserOp::Compute { ns: 200_000 },
            UserOp::Mark,
            UserOp::Exit,
        ],
    );
    let b = m.add_task(
        "flushes",
        mm,
        1,
        vec![
            UserOp::Touch {
                vpn: 1,
                write: false,
            },
            UserOp::Compute { ns: 1_000 },
            UserOp::MadviseDontneed {
                start: 1,
                npages: 1,
            },
            UserOp::Mark,
            UserOp::Exit,
        ],
    );
    run_to_completion(&mut m, 1, 10, 100_000);
    assert!(m.counters().get(Counter::CallFunctionIpis) >= 1);
    let (computed, flushed) = (m.perf.marks[a as usize][0], m.perf.marks[b as usize][0]);
    assert!(computed >= Time::from_ns(200_000), "{computed:?}");
    assert!(
        flushed < Time::from_ns(20_000),
        "the flush waited for the computation: {flushed:?}"
    );
}

/// `flush_tlb_mm_range()` (docs/design/kernel-model.md §1.7): a range of at most
/// `tlb_single_page_flush_ceiling` pages is flushed page by page (INVLPG each), a longer one
/// with one full flush.
#[test]
fn single_page_flush_ceiling_splits_partial_and_full_flushes() {
    for ceiling in [33, 10] {
        let mut m = machine(
            Options {
                tlb_single_page_flush_ceiling: shootdown_linux::options::AtLeastOne(ceiling),
                ..Options::default()
            },
            1,
        );
        let mm = m.add_mm("p");
        m.map_pages(mm, 0, 200, true);
        m.add_task(
            "t",
            mm,
            0,
            vec![
                UserOp::TouchRange {
                    start: 0,
                    npages: 200,
                    write: true,
                },
                UserOp::MadviseDontneed {
                    start: 0,
                    npages: 33,
                },
                UserOp::MadviseDontneed {
                    start: 100,
                    npages: 34,
                },
                UserOp::Exit,
            ],
        );
        run_to_completion(&mut m, 1, 10, 1_000_000);
        let c = m.counters();
        let (one, all) = if ceiling == 33 { (33, 1) } else { (0, 2) };
        assert_eq!(c.get(Counter::NrTlbLocalFlushOne), one, "ceiling {ceiling}");
        assert_eq!(c.get(Counter::NrTlbLocalFlushAll), all, "ceiling {ceiling}");
        assert_eq!(c.get(Counter::InvlpgCount), one, "ceiling {ceiling}");
    }
}

/// cpu0 madvises one page while cpu1 runs a thread of the same mm; returns when cpu0's madvise
/// returned, and the counters.
fn one_shootdown(smp_call: SmpCall) -> (Time, Counters) {
    let mut m = machine(
        Options {
            smp_call,
            ..Options::default()
        },
        2,
    );
    let mm = m.add_mm("p");
    m.map_pages(mm, 0, 2, true);
    let a = m.add_task(
        "flusher",
        mm,
        0,
        vec![
            UserOp::Touch {
                vpn: 0,
                write: true,
            },
            UserOp::Compute { ns: 1_000 },
            UserOp::MadviseDontneed {
                start: 0,
                npages: 1,
            },
            UserOp::Mark,
            UserOp::Exit,
        ],
    );
    m.add_task(
        "busy",
        mm,
        1,
        vec![
            UserOp::Touch {
                vpn: 1,
                write: true,
            },
            UserOp::Compute { ns: 50_000 },
            UserOp::Exit,
        ],
    );
    run_to_completion(&mut m, 1, 10, 1_000_000);
    (m.perf.marks[a as usize][0], m.counters().clone())
}

/// Seed 000's concurrent flush (docs/design/kernel-model.md §2.3, `SCF_RUN_LOCAL`): the
/// initiator runs its local flush while the remote CPU handles the IPI, instead of flushing
/// locally first and only then sending the IPI and waiting. Same work, less initiator time.
#[test]
fn concurrent_flush_overlaps_the_local_flush_with_the_remote_one() {
    let (before, cb) = one_shootdown(SmpCall::RemoteThenLocal);
    let (after, ca) = one_shootdown(SmpCall::Concurrent);
    for c in [&cb, &ca] {
        assert_eq!(c.get(Counter::FlushLocalMmShootdown), 1);
        assert_eq!(c.get(Counter::FlushRemoteShootdown), 1);
        assert_eq!(c.get(Counter::CallFunctionIpis), 1);
    }
    assert!(
        after < before,
        "concurrent {after:?} is not faster than local-then-remote {before:?}"
    );
}

/// PTI without INVPCID (docs/design/kernel-model.md §1.4): a flush of a user page INVLPGs the kernel PCID
/// and only marks the user PCID in `user_pcid_flush_mask`; the stale user-PCID entry survives
/// until the return to user (`SWITCH_TO_USER_CR3`) flushes that PCID. With INVPCID the user
/// entry goes at once and nothing is deferred.
#[test]
fn pti_defers_the_user_pcid_flush_to_the_return_to_user() {
    for invpcid in [false, true] {
        let features = Features {
            pti: true,
            invpcid,
            ..Features::modern()
        };
        let mut m = Machine::new(
            Topology::new(1, 1, 1).unwrap(),
            Arc::new(CostProfile::uniform("t", 10.0, features)),
            Options::default(),
            MemoryModel::Sc,
        );
        let mm = m.add_mm("p");
        m.map_pages(mm, 0, 4, true);
        m.add_task(
            "t",
            mm,
            0,
            vec![
                UserOp::Touch {
                    vpn: 3,
                    write: true,
                },
                UserOp::MadviseDontneed {
                    start: 3,
                    npages: 1,
                },
                UserOp::Touch {
                    vpn: 3,
                    write: true,
                },
                UserOp::Exit,
            ],
        );
        let mut deferred_with_stale_entry = false;
        for _ in 0..10_000 {
            if m.finished() {
                break;
            }
            let out = m.apply(Action::Step(0), &mut NullEnv);
            assert!(out.violation.is_none(), "{:?}", out.violation);
            let ts = &m.cpus[0].tlbstate;
            let up = m.user_pcid(ts.loaded_mm_asid);
            if ts.user_pcid_flush_mask != 0 {
                deferred_with_stale_entry |= m.cpus[0].tlb.lookup(up, 3).is_some();
            }
        }
        assert!(m.finished());
        assert_eq!(m.cpus[0].tlbstate.user_pcid_flush_mask, 0);
        assert_eq!(deferred_with_stale_entry, !invpcid, "invpcid {invpcid}");
        // The second touch found the page gone and faulted it back in.
        assert_eq!(
            m.counters().get(Counter::PageFaults),
            1,
            "invpcid {invpcid}"
        );
    }
}

/// Two CPUs and two mms of 4 mapped pages each, with the lazy-TLB form `lazy_tlb`.
fn two_mms(lazy_tlb: LazyTlb) -> (Machine, MmId, MmId) {
    let mut m = machine(
        Options {
            lazy_tlb,
            ..Options::default()
        },
        2,
    );
    let mm1 = m.add_mm("mm1");
    let mm2 = m.add_mm("mm2");
    m.map_pages(mm1, 0, 4, true);
    m.map_pages(mm2, 0, 4, true);
    (m, mm1, mm2)
}

/// cpu1 runs a thread of mm1, which exits, then a thread of mm2; cpu0's thread of mm1 then
/// flushes twice (two one-page madvises). Returns the counters and whether cpu1 is still in
/// mm1's `mm_cpumask` at the end.
fn flushes_after_switching_away(lazy_tlb: LazyTlb) -> (Counters, bool) {
    let (mut m, mm1, mm2) = two_mms(lazy_tlb);
    let touch = |vpn| UserOp::Touch { vpn, write: true };
    m.add_task("mm1-a", mm1, 1, vec![touch(3), UserOp::Exit]);
    m.add_task(
        "mm2",
        mm2,
        1,
        vec![touch(0), UserOp::Compute { ns: 100_000 }, UserOp::Exit],
    );
    let madvise = |start| UserOp::MadviseDontneed { start, npages: 1 };
    m.add_task(
        "mm1-b",
        mm1,
        0,
        vec![
            touch(0),
            UserOp::Compute { ns: 20_000 },
            madvise(0),
            madvise(1),
            UserOp::Exit,
        ],
    );
    run_to_completion(&mut m, 1, 10, 1_000_000);
    let in_mask = m.mms[mm1 as usize].cpumask_test(1);
    (m.counters().clone(), in_mask)
}

/// A CPU that switched away from mm1 (docs/design/kernel-model.md §1.8): v6.13 leaves it in
/// mm1's `mm_cpumask`, and the first flush IPIs it there (`tlb_is_not_lazy`): its
/// `flush_tlb_func`, finding another mm loaded, clears the stale bit, and the second flush
/// skips it. v6.17 and mainline leave the bit too but `should_flush_tlb` skips a CPU running
/// another mm unless the flush trims, which `should_trim_cpumask` allows only a second after the
/// mm's creation and then once a second: within this run the bit stays and no IPI is sent.
/// v5.x (`is_lazy`) clears the bit at the switch, so no flush ever reaches it.
#[test]
fn a_stale_cpumask_bit_is_trimmed_by_v6_13s_first_flush_and_skipped_since_v6_14() {
    let (c, in_mask) = flushes_after_switching_away(LazyTlb::V6_13);
    assert_eq!(c.get(Counter::NrTlbRemoteFlush), 1);
    assert_eq!(c.get(Counter::CallFunctionIpis), 1);
    assert_eq!(c.get(Counter::CpumaskTrimmed), 1);
    assert!(!in_mask);

    for lazy_tlb in [LazyTlb::V6_17, LazyTlb::Mainline] {
        let (c, in_mask) = flushes_after_switching_away(lazy_tlb);
        assert_eq!(c.get(Counter::CallFunctionIpis), 0, "{lazy_tlb:?}");
        assert_eq!(c.get(Counter::CpumaskTrimmed), 0, "{lazy_tlb:?}");
        assert!(in_mask, "{lazy_tlb:?}");
    }

    let (c, in_mask) = flushes_after_switching_away(LazyTlb::IsLazy);
    assert_eq!(c.get(Counter::NrTlbRemoteFlush), 0);
    assert_eq!(c.get(Counter::CallFunctionIpis), 0);
    assert_eq!(c.get(Counter::CpumaskTrimmed), 0);
    assert!(!in_mask);
}

/// SMT: a CPU's core-bound work stretches by the profile's `smt_slowdown` while its sibling
/// executes too, not while the sibling idles, and not because another core is busy.
#[test]
fn a_busy_smt_sibling_stretches_core_bound_work() {
    // One socket, two cores, two threads each: CPUs 0 and 2 share core 0, 1 and 3 core 1.
    let finish = |slowdown_permille: u32, other: Option<(usize, u64)>| {
        let mut features = Features::modern();
        features.smt_slowdown_permille = slowdown_permille;
        let mut m = Machine::new(
            Topology::new(1, 2, 2).unwrap(),
            Arc::new(CostProfile::uniform("t", 10.0, features)),
            Options::default(),
            MemoryModel::Sc,
        );
        let mm = m.add_mm("p");
        let work = |ns| vec![UserOp::Compute { ns }, UserOp::Mark, UserOp::Exit];
        let a = m.add_task("a", mm, 0, work(100_000));
        if let Some((cpu, ns)) = other {
            m.add_task("b", mm, cpu, work(ns));
        }
        run_to_completion(&mut m, 1, 10, 100_000);
        m.perf.marks[a as usize][0].as_us_f64()
    };
    let alone = finish(1500, None);
    assert!((100.0..101.0).contains(&alone), "{alone}");
    // The sibling computes the whole time: 1.5 x.
    let shared = finish(1500, Some((2, 100_000)));
    assert!((150.0..151.5).contains(&shared), "{shared}");
    // The sibling's 50 us of work take 75 us, in which cpu0 does 50 of its 100; the other
    // 50 run alone once the sibling has exited: 125 us.
    let half = finish(1500, Some((2, 50_000)));
    assert!((125.0..126.5).contains(&half), "{half}");
    // The other core's CPU does not share this core's execution units.
    assert_eq!(finish(1500, Some((1, 100_000))), alone);
    // A profile without the slowdown: siblings do not interfere.
    assert_eq!(finish(1000, Some((2, 100_000))), alone);
}

/// `INV-FREEPAGE` in the timed driver (`page_alloc.rs`): cpu0 writes and `madvise`s four pages
/// in a loop while cpu1 keeps writing them. Every free comes after its flush, and the fault path
/// takes the freed frames back (no fresh frame after the first round); with the mutant that
/// frees at the zap, the run stops at the first free while cpu1 still maps the page.
#[test]
fn freed_frames_are_reused_and_freed_only_after_the_flush() {
    for mutant in [false, true] {
        let mut opts = Options::default();
        if mutant {
            opts.mutants.enable("free_pages_before_flush").unwrap();
        }
        let mut m = machine(opts, 2);
        let mm = m.add_mm("mm1");
        m.map_pages(mm, 0x10, 4, true);
        let w = |vpn| UserOp::Touch { vpn, write: true };
        let zapper = vec![
            w(0x10),
            w(0x11),
            w(0x12),
            w(0x13),
            UserOp::MadviseDontneed {
                start: 0x10,
                npages: 4,
            },
            UserOp::Loop {
                to: 0,
                times: Some(200),
            },
            UserOp::Exit,
        ];
        let user = vec![
            w(0x10),
            w(0x12),
            UserOp::Loop {
                to: 0,
                times: Some(2000),
            },
            UserOp::Exit,
        ];
        m.add_task("zapper", mm, 0, zapper);
        m.add_task("user", mm, 1, user);
        let fresh = m.next_pfn;
        let st = TimedDriver::new(m.agents(), 1, 0).run(
            &mut m,
            Limits {
                max_time: Time::from_ms(100),
                max_steps: 10_000_000,
            },
        );
        if mutant {
            match st.stop {
                Stop::Violation(v) => assert_eq!(v.invariant, "INV-FREEPAGE", "{v:?}"),
                s => panic!("the mutant ran to {s:?}"),
            }
        } else {
            assert_eq!(st.stop, Stop::Finished, "{st:?}");
            // Four pages refaulted 200 times take at most the four pages' worth of frames
            // that a fault may need before the previous round's free.
            assert!(
                m.next_pfn - fresh <= 8,
                "{} fresh frames",
                m.next_pfn - fresh
            );
            assert!(m.free_frames.len() <= 8);
        }
    }
}

/// cpu1 alternates between short threads of mm1 and of mm2 while cpu0's thread of mm1 flushes
/// in a loop. Returns the counters.
fn flushes_while_switching_back_and_forth(lazy_tlb: LazyTlb) -> Counters {
    let (mut m, mm1, mm2) = two_mms(lazy_tlb);
    let touch = |vpn| UserOp::Touch { vpn, write: true };
    for i in 0..4 {
        for (mm, name) in [(mm1, "mm1"), (mm2, "mm2")] {
            m.add_task(
                &format!("{name}-{i}"),
                mm,
                1,
                vec![touch(3), UserOp::Compute { ns: 20_000 }, UserOp::Exit],
            );
        }
    }
    m.add_task(
        "flusher",
        mm1,
        0,
        vec![
            touch(0),
            UserOp::MadviseDontneed {
                start: 0,
                npages: 1,
            },
            UserOp::Compute { ns: 4_000 },
            UserOp::Loop {
                to: 0,
                times: Some(40),
            },
            UserOp::Exit,
        ],
    );
    run_to_completion(&mut m, 1, 10, 1_000_000);
    m.counters().clone()
}

/// The `mm_cpumask` forms since v6.12 (#43): v6.12 (`is_lazy`'s rule) clears the bit when cpu1
/// switches to mm2, so no flush of mm1 reaches it there; v6.13 keeps the bit and IPIs cpu1
/// (which trims it) after each of its switches to mm2, the regression 6db2526c1d69 answered;
/// v6.17 and mainline skip a CPU running another mm (no trim in the run's first second).
#[test]
fn v6_13_ipis_a_cpu_running_another_mm_after_every_switch() {
    let is_lazy = flushes_while_switching_back_and_forth(LazyTlb::IsLazy);
    let v6_13 = flushes_while_switching_back_and_forth(LazyTlb::V6_13);
    let v6_17 = flushes_while_switching_back_and_forth(LazyTlb::V6_17);
    let mainline = flushes_while_switching_back_and_forth(LazyTlb::Mainline);
    assert_eq!(is_lazy.get(Counter::CpumaskTrimmed), 0);
    assert_eq!(v6_13.get(Counter::CpumaskTrimmed), 4);
    assert_eq!(v6_17.get(Counter::CpumaskTrimmed), 0);
    assert_eq!(mainline.get(Counter::CpumaskTrimmed), 0);
    let ipis = |c: &Counters| c.get(Counter::CallFunctionIpis);
    assert!(
        ipis(&v6_13) > ipis(&v6_17),
        "{} vs {}",
        ipis(&v6_13),
        ipis(&v6_17)
    );
    assert!(
        ipis(&v6_13) > ipis(&is_lazy),
        "{} vs {}",
        ipis(&v6_13),
        ipis(&is_lazy)
    );
}

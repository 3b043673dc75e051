//! Transparent huge pages and khugepaged (mm/huge_memory.c, mm/khugepaged.c): PMD leaves in
//! the page tables and TLBs, the flush stride, splits and collapses.

use shootdown_engine::Model;
use shootdown_hw::pagetable::pt_index;
use shootdown_hw::{CostProfile, Features, Topology};
use shootdown_linux::counters::Counter;
use shootdown_linux::describe::NullEnv;
use shootdown_linux::options::{FlushStride, Thp};
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

fn thp(stride: FlushStride) -> Options {
    Options {
        transparent_hugepage: Thp::Always,
        flush_stride: stride,
        ..Options::default()
    }
}

/// Step `cpu` until its tasks are done, asserting that the oracle saw nothing wrong.
fn run_cpu(m: &mut Machine, cpu: u32) {
    for _ in 0..100_000 {
        let mut en = Vec::new();
        m.enabled(&mut en);
        let Some(&a) = en
            .iter()
            .find(|a| matches!(a, Action::Step(c) | Action::Interrupt(c) if *c == cpu))
        else {
            return;
        };
        let out = m.apply(a, &mut NullEnv);
        assert!(out.violation.is_none(), "{:?}", out.violation);
        if m.finished() {
            return;
        }
    }
    panic!("cpu{cpu} did not finish");
}

/// 4 MiB touched with THP: one fault per 2 MiB; the munmap clears two PMD leaves and nothing
/// else, so (v4.20+) it flushes one INVLPG per 2 MiB; before v4.20 the ceiling counted 1024
/// pages and the flush was a full one.
#[test]
fn thp_faults_map_pmd_leaves_and_the_unmap_flushes_in_2mib_strides() {
    for (stride, one, all) in [(FlushStride::Mainline, 2, 0), (FlushStride::V4_19, 0, 1)] {
        let mut m = machine(thp(stride), 1);
        let mm = m.add_mm("mm1");
        m.add_task(
            "t",
            mm,
            0,
            vec![
                UserOp::Mmap {
                    start: 0x400,
                    npages: 1024,
                },
                UserOp::TouchRange {
                    start: 0x400,
                    npages: 1024,
                    write: true,
                },
                UserOp::Munmap {
                    start: 0x400,
                    npages: 1024,
                },
                UserOp::Exit,
            ],
        );
        run_cpu(&mut m, 0);
        let c = m.counters();
        assert_eq!(c.get(Counter::ThpFaultAlloc), 2, "{stride:?}");
        assert_eq!(c.get(Counter::PageFaults), 2, "{stride:?}");
        assert_eq!(c.get(Counter::NrTlbLocalFlushOne), one, "{stride:?}");
        assert_eq!(c.get(Counter::NrTlbLocalFlushAll), all, "{stride:?}");
        let space = &m.mms[mm as usize].space;
        assert!(space.pmd.is_empty(), "no page table was ever needed");
        assert!(!space.is_huge(2) && !space.is_huge(3));
    }
}

/// MADV_DONTNEED of one page of a 2 MiB page splits its leaf (pmdp_invalidate + a flush of the
/// group, then 512 PTEs to the same frames) and zaps the page; its neighbours keep their frames.
#[test]
fn a_partial_zap_splits_the_leaf_first() {
    let mut m = machine(thp(FlushStride::Mainline), 1);
    let mm = m.add_mm("mm1");
    m.add_task(
        "t",
        mm,
        0,
        vec![
            UserOp::Touch {
                vpn: 0x400,
                write: true,
            },
            UserOp::MadviseDontneed {
                start: 0x410,
                npages: 1,
            },
            UserOp::Touch {
                vpn: 0x411,
                write: false,
            },
            UserOp::Touch {
                vpn: 0x410,
                write: true,
            },
            UserOp::Exit,
        ],
    );
    run_cpu(&mut m, 0);
    let c = m.counters();
    assert_eq!(c.get(Counter::ThpFaultAlloc), 1);
    assert_eq!(c.get(Counter::ThpSplitPmd), 1);
    let space = &m.mms[mm as usize].space;
    assert!(!space.is_huge(pt_index(0x400)) && space.pmd.contains_key(&pt_index(0x400)));
    let leaf = space.huge_pmd(pt_index(0x400));
    assert_eq!(
        space.pte(0x411).pfn,
        leaf.pfn + 0x11,
        "same frame after the split"
    );
    assert!(space.pte(0x411).present && space.pte(0x410).present);
    // The zapped page was faulted anew (the THP fault, then this one), into the frame the
    // zap's tlb_finish_mmu had freed (page_alloc.rs: a freed frame before a fresh one).
    assert_eq!(c.get(Counter::PageFaults), 2);
    assert_eq!(
        space.pte(0x410).pfn,
        leaf.pfn + 0x10,
        "the freed frame, reused"
    );
    assert!(m.free_frames.is_empty());
}

/// khugepaged, a kernel thread on cpu0, collapses the page table cpu1's thread used: the PMD
/// becomes a leaf, the table is freed, cpu1 (lazy, mm still loaded) was IPI'd because mainline's
/// flush_tlb_range passes freed_tables.
#[test]
fn khugepaged_collapses_a_page_table_into_a_pmd_leaf() {
    let mut m = machine(Options::default(), 2);
    let mm = m.add_mm("mm1");
    m.add_task(
        "toucher",
        mm,
        1,
        vec![
            UserOp::TouchRange {
                start: 0x400,
                npages: 16,
                write: true,
            },
            UserOp::Exit,
        ],
    );
    run_cpu(&mut m, 1);
    let table = m.mms[mm as usize].space.pmd[&pt_index(0x400)];
    m.add_kthread(
        "khugepaged",
        0,
        vec![UserOp::Collapse { mm, start: 0x400 }, UserOp::Exit],
    );
    for _ in 0..1000 {
        let mut en = Vec::new();
        m.enabled(&mut en);
        let Some(&a) = en.iter().find(|a| !matches!(a, Action::Fill(..))) else {
            break;
        };
        let out = m.apply(a, &mut NullEnv);
        assert!(out.violation.is_none(), "{:?}", out.violation);
        if m.finished() {
            break;
        }
    }
    let space = &m.mms[mm as usize].space;
    assert_eq!(m.counters().get(Counter::ThpCollapseAlloc), 1);
    assert!(space.is_huge(pt_index(0x400)) && !space.pmd.contains_key(&pt_index(0x400)));
    assert!(!m.pt_pages.is_alive(table), "the page table was freed");
    assert_eq!(m.counters().get(Counter::LeaveMm), 1, "lazy cpu1 left mm1");
}

//! VMAs and the calls that move or revoke mappings, in the timed driver: `mremap`
//! (`mremap.rs`), `ftruncate` and a driver's revoke (`truncate.rs`), `migrate_vma`
//! (`migrate_device.rs`), and munmap of a file VMA (`vma.rs`). The oracle watches every run: a
//! violation would stop it short of `Finished`.

mod common;
use common::{machine, run_to_end};
use shootdown_linux::*;

/// A thread of `mm` on `cpu` that computes for `us` microseconds in 1 µs slices.
fn busy(m: &mut Machine, mm: MmId, cpu: usize, us: u32) {
    m.add_task(
        "busy",
        mm,
        cpu,
        vec![
            UserOp::Compute { ns: 1_000 },
            UserOp::Loop {
                to: 0,
                times: Some(us),
            },
            UserOp::Exit,
        ],
    );
}

#[test]
fn mremap_moves_a_file_mapping_and_flushes_the_other_thread() {
    let mut m = machine(2);
    let f = m.add_file("data", 4, false);
    let mm = m.add_mm("mm1");
    m.map_file(mm, 0x10, 4, f, 0, true);
    let frames: Vec<u32> = m.files[f as usize].pages.values().copied().collect();
    m.add_task(
        "mover",
        mm,
        0,
        vec![
            UserOp::Mremap {
                start: 0x10,
                npages: 4,
                new_start: 0x30,
            },
            UserOp::Mremap {
                start: 0x30,
                npages: 4,
                new_start: 0x10,
            },
            UserOp::Loop {
                to: 0,
                times: Some(10),
            },
            UserOp::Exit,
        ],
    );
    busy(&mut m, mm, 1, 200);
    run_to_end(&mut m, 50, 5_000_000);
    let c = m.counters();
    assert_eq!(c.get(Counter::Mremaps), 22);
    assert_eq!(c.get(Counter::MremapPtesMoved), 88);
    // Every move flushes the old range on the other thread's CPU.
    assert!(
        c.get(Counter::TlbShootdowns) >= 22,
        "{}",
        c.get(Counter::TlbShootdowns)
    );
    // The pages stayed in the page cache and the VMA is back where it began, alone in i_mmap.
    assert_eq!(
        m.files[f as usize]
            .pages
            .values()
            .copied()
            .collect::<Vec<_>>(),
        frames
    );
    assert_eq!(m.files[f as usize].i_mmap, vec![(mm, 0x10)]);
    assert!(m.mms[mm as usize].space.pte(0x13).present);
    assert!(!m.mms[mm as usize].space.pte(0x33).present);
}

#[test]
fn truncate_unmaps_frees_the_tail_and_later_reads_get_sigbus() {
    let mut m = machine(2);
    let f = m.add_file("data", 4, false);
    let mm = m.add_mm("mm1");
    m.map_file(mm, 0x10, 4, f, 0, true);
    m.add_task(
        "reader",
        mm,
        1,
        vec![
            UserOp::TouchRange {
                start: 0x10,
                npages: 4,
                write: false,
            },
            UserOp::Compute { ns: 1_000 },
            UserOp::Loop {
                to: 0,
                times: Some(40),
            },
            UserOp::Exit,
        ],
    );
    m.add_task(
        "truncater",
        mm,
        0,
        vec![
            UserOp::Compute { ns: 20_000 },
            UserOp::Truncate { file: f, npages: 2 },
            UserOp::Exit,
        ],
    );
    let free_before = m.free_frames.len();
    run_to_end(&mut m, 50, 5_000_000);
    let c = m.counters();
    assert_eq!(c.get(Counter::UnmapMappingRange), 1);
    assert_eq!(c.get(Counter::TruncatedPages), 2);
    assert_eq!(m.free_frames.len(), free_before + 2);
    assert!(c.get(Counter::Sigbus) > 0);
    assert_eq!(m.files[f as usize].pages.len(), 2);
    assert!(!m.mms[mm as usize].space.pte(0x12).present);
    assert!(m.mms[mm as usize].space.pte(0x11).present);
}

#[test]
fn migrate_vma_moves_pages_to_new_frames_under_a_writer() {
    let mut m = machine(2);
    let mm = m.add_mm("mm1");
    m.map_pages(mm, 0x10, 4, true);
    let old: Vec<u32> = (0x10..0x14)
        .map(|v| m.mms[mm as usize].space.pte(v).pfn)
        .collect();
    m.add_task(
        "writer",
        mm,
        1,
        vec![
            UserOp::TouchRange {
                start: 0x10,
                npages: 4,
                write: true,
            },
            UserOp::Compute { ns: 500 },
            UserOp::Loop {
                to: 0,
                times: Some(100),
            },
            UserOp::Exit,
        ],
    );
    m.add_task(
        "driver",
        mm,
        0,
        vec![
            UserOp::MigrateVma {
                start: 0x10,
                npages: 4,
            },
            UserOp::Compute { ns: 5_000 },
            UserOp::Loop {
                to: 0,
                times: Some(4),
            },
            UserOp::Exit,
        ],
    );
    run_to_end(&mut m, 50, 5_000_000);
    let c = m.counters();
    assert_eq!(c.get(Counter::MigratedPages), 20);
    // Each migration frees its four sources, which the next one allocates again: four frames
    // are free at the end, and after an odd number of migrations the pages are in the others.
    assert_eq!(m.free_frames.len(), 4);
    let new: Vec<u32> = (0x10..0x14)
        .map(|v| m.mms[mm as usize].space.pte(v).pfn)
        .collect();
    assert_ne!(new, old);
    assert!(m.mms[mm as usize].swap_ptes.is_empty());
}

#[test]
fn a_driver_revokes_a_pfnmap_mapping_and_munmap_keeps_device_frames() {
    let mut m = machine(2);
    let bar = m.add_file("bar", 2, true);
    let data = m.add_file("data", 2, false);
    let mm = m.add_mm("mm1");
    m.map_file(mm, 0x10, 2, bar, 0, true);
    m.map_file(mm, 0x20, 2, data, 0, true);
    m.add_task(
        "user",
        mm,
        1,
        vec![
            UserOp::TouchRange {
                start: 0x10,
                npages: 2,
                write: true,
            },
            UserOp::Compute { ns: 1_000 },
            UserOp::Loop {
                to: 0,
                times: Some(30),
            },
            UserOp::Munmap {
                start: 0x20,
                npages: 2,
            },
            UserOp::Exit,
        ],
    );
    m.add_task(
        "driver",
        mm,
        0,
        vec![
            UserOp::Compute { ns: 10_000 },
            UserOp::RevokeMapping { file: bar },
            UserOp::Exit,
        ],
    );
    let free_before = m.free_frames.len();
    run_to_end(&mut m, 50, 5_000_000);
    let c = m.counters();
    assert_eq!(c.get(Counter::UnmapMappingRange), 1);
    assert!(c.get(Counter::Sigbus) > 0);
    assert!(!m.mms[mm as usize].space.pte(0x10).present);
    // munmap of the file VMA: unlinked, its page-cache pages kept (not freed).
    assert!(m.files[data as usize].i_mmap.is_empty());
    assert_eq!(m.files[data as usize].pages.len(), 2);
    assert_eq!(m.free_frames.len(), free_before);
}

/// will-it-scale's `tlb_flush1` loop on one page of a MAP_PRIVATE file, `rounds` times, with
/// another thread of the mm busy on CPU 1; returns the machine.
fn private_file_loop(rounds: u32) -> (Machine, shootdown_linux::vma::FileId, MmId) {
    let mut m = machine(2);
    let f = m.add_file("private", 8, false);
    let mm = m.add_mm("mm1");
    m.add_task(
        "wis",
        mm,
        0,
        vec![
            UserOp::MmapFile {
                start: 0x100,
                npages: 8,
                file: f,
                private: true,
            },
            UserOp::Touch {
                vpn: 0x100,
                write: true,
            },
            UserOp::MadviseDontneed {
                start: 0x100,
                npages: 1,
            },
            UserOp::Touch {
                vpn: 0x100,
                write: false,
            },
            UserOp::NextPage { to: 1, pages: 8 },
            UserOp::Munmap {
                start: 0x100,
                npages: 8,
            },
            UserOp::Loop {
                to: 0,
                times: Some(rounds - 1),
            },
            UserOp::Exit,
        ],
    );
    busy(&mut m, mm, 1, 300);
    run_to_end(&mut m, 50, 5_000_000);
    (m, f, mm)
}

#[test]
fn a_private_file_write_copies_the_page_and_the_read_maps_the_page_cache() {
    let (m, f, mm) = private_file_loop(3);
    let c = m.counters();
    // Each of 3 passes over 8 pages: a write fault (a copy), DONTNEED, a read fault.
    assert_eq!(c.get(Counter::PageFaults), 48);
    // Each DONTNEED flushes the busy thread's CPU; each munmap too.
    assert!(
        c.get(Counter::TlbShootdowns) >= 24,
        "{}",
        c.get(Counter::TlbShootdowns)
    );
    // The page cache kept its 8 pages (the read faults mapped them, munmap dropped only the
    // mapping); the copies went back to the allocator; the VMA is gone.
    let file = &m.files[f as usize];
    assert_eq!(file.pages.len(), 8);
    assert_eq!(file.page_frames.len(), 8);
    assert!(file.i_mmap.is_empty());
    assert!(m.mms[mm as usize].vmas.is_empty());
    assert!(!m.free_frames.is_empty());
}

#[test]
fn an_anonymous_read_maps_the_zero_page_and_a_write_copies_it_with_a_flush() {
    let mut m = machine(2);
    let mm = m.add_mm("mm1");
    m.add_task(
        "reader",
        mm,
        0,
        vec![
            UserOp::Touch {
                vpn: 0x20,
                write: false,
            },
            UserOp::Touch {
                vpn: 0x21,
                write: false,
            },
            UserOp::Touch {
                vpn: 0x20,
                write: true,
            },
            UserOp::Exit,
        ],
    );
    busy(&mut m, mm, 1, 100);
    run_to_end(&mut m, 50, 5_000_000);
    let space = &m.mms[mm as usize].space;
    let zero = shootdown_linux::page_alloc::ZERO_PFN;
    // Two reads: both pages map the one zero page, read-only.
    let p21 = space.pte(0x21);
    assert!(p21.present && !p21.writable && p21.pfn == zero);
    // The write copied page 0x20 (wp_page_copy): a page of its own, writable, and the zero
    // page's translation flushed on the other thread's CPU first.
    let p20 = space.pte(0x20);
    assert!(p20.present && p20.writable && p20.pfn != zero);
    assert_eq!(m.counters().get(Counter::PageFaults), 3);
    assert!(m.counters().get(Counter::TlbShootdowns) >= 1);
}

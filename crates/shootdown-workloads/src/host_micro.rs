//! The microbenchmarks `shootdown validate` runs on the real machine (crate
//! `shootdown-hostbench`), mirrored step for step as a task program, so that the model's number
//! and the machine's are the same experiment.
//!
//! Thread 0 runs on CPU 0 and loops one operation on an anonymous mapping; `siblings` threads of
//! the same process run on CPUs 1..=siblings, each on a page of its own (never one the operation
//! touches, so a sibling never faults):
//! * `sibling_mode = "busy"`: the sibling reads its page in a loop. Its CPU keeps the mm loaded
//!   and not lazy, so it is in `mm_cpumask` and every flush of thread 0 interrupts it;
//! * `sibling_mode = "sleeping"`: the sibling reads its page once, then sleeps in `pause()`
//!   ([`UserOp::Pause`]). Its CPU runs the idle task with the mm still loaded (lazy TLB): whether
//!   a flush interrupts it is the lazy-TLB policy under test (mainline's `should_flush_tlb`
//!   skips it unless page tables were freed).
//!
//! The operations (one iteration each, one [`UserOp::Event`] per iteration; the metric is µs per
//! iteration):
//! * `madvise`: `madvise(MADV_DONTNEED)` of `pages` pages, then write one byte to each
//!   (`zap_page_range_single` → `tlb_finish_mmu` → `flush_tlb_mm_range`, and a fault per page);
//! * `mprotect`: `mprotect(PROT_READ)` then `mprotect(PROT_READ|PROT_WRITE)` of `pages` pages,
//!   then write one byte to each (`change_protection` → a flush for each: x86 flushes a
//!   `_PAGE_RW` change either way);
//! * `munmap`: `mmap` a 2 MiB-aligned region of its own, write its first page (a page-table
//!   page is allocated), `munmap` it (`unmap_region` → `free_pgtables`: the flush carries
//!   `freed_tables`, which lazy CPUs must take too);
//! * `fault` (the calibration's per-page primitive, no siblings): the same region with its
//!   first `pages` pages written before the `munmap` (that many anonymous faults, pages zapped
//!   and freed, one flush). The metric stays µs per iteration; per page is 1/`pages`.
//!
//! Simplifications: the real benchmark's loop, timing and the real `mmap`'s VMA work beyond
//! `mmap_syscall` are not modelled; nor is the page cache or THP (the real cases run with THP
//! off, and the model's default is `transparent_hugepage = never`).

use crate::{params::limits, Built, Measure, ParamError, Params};
use shootdown_engine::Time;
use shootdown_linux::{Machine, UserOp};

/// Where thread 0's operated pages start (page numbers), and where sibling `i`'s own page is:
/// in other page-table pages than the operated range, so `munmap`'s `free_pgtables` never
/// touches a sibling's table.
const OP_BASE: u64 = 0x10_0000;
const SIBLING_BASE: u64 = 0x20_0000;
/// The `munmap` case's region: 2 MiB = one page-table page's 512 entries, aligned.
const REGION_PAGES: u64 = 512;

pub fn build(p: &Params, mut m: Machine) -> Result<Built, ParamError> {
    let op = p.string("op", "madvise", &["madvise", "mprotect", "munmap", "fault"])?;
    let default_pages = match op.as_str() {
        "mprotect" => 8,
        "fault" => 512,
        _ => 1,
    };
    let pages = p.int("pages", default_pages, 1..=REGION_PAGES as i64)? as u64;
    let siblings = p.int("siblings", 0, 0..=limits::THREADS)? as usize;
    let mode = p.string("sibling_mode", "busy", &["busy", "sleeping"])?;
    let iterations = p.int("iterations", 2000, 2..=limits::COUNT)? as u32;
    let warmup = p.int("warmup_iterations", 50, 0..=limits::COUNT)? as u32;
    if siblings + 1 > m.cpus.len() {
        return Err((
            "siblings".into(),
            format!(
                "{siblings} siblings need {} CPUs; the machine has {}",
                siblings + 1,
                m.cpus.len()
            ),
        ));
    }
    let mm = m.add_mm("micro");
    let iteration: Vec<UserOp> = match op.as_str() {
        "madvise" => {
            m.map_pages(mm, OP_BASE, pages, true);
            vec![
                UserOp::MadviseDontneed {
                    start: OP_BASE,
                    npages: pages,
                },
                UserOp::TouchRange {
                    start: OP_BASE,
                    npages: pages,
                    write: true,
                },
            ]
        }
        "mprotect" => {
            m.map_pages(mm, OP_BASE, pages, true);
            vec![
                UserOp::Mprotect {
                    start: OP_BASE,
                    npages: pages,
                    writable: false,
                },
                UserOp::Mprotect {
                    start: OP_BASE,
                    npages: pages,
                    writable: true,
                },
                UserOp::TouchRange {
                    start: OP_BASE,
                    npages: pages,
                    write: true,
                },
            ]
        }
        // munmap, fault: map the region, write its first page or all of them, unmap it.
        _ => vec![
            UserOp::Mmap {
                start: OP_BASE,
                npages: REGION_PAGES,
            },
            UserOp::TouchRange {
                start: OP_BASE,
                npages: if op == "fault" { pages } else { 1 },
                write: true,
            },
            UserOp::Munmap {
                start: OP_BASE,
                npages: REGION_PAGES,
            },
        ],
    };
    let prog = crate::timed_loop(&iteration, warmup, iterations);
    m.add_task("thread0", mm, 0, prog);
    for i in 0..siblings {
        let page = SIBLING_BASE + i as u64 * REGION_PAGES;
        m.map_pages(mm, page, 1, true);
        let read = UserOp::Touch {
            vpn: page,
            write: false,
        };
        let program = if mode == "busy" {
            vec![read, UserOp::Loop { to: 0, times: None }]
        } else {
            vec![read, UserOp::Pause]
        };
        m.add_background_task(&format!("sibling{}", i + 1), mm, i + 1, program);
    }
    Ok(Built {
        machine: m,
        measure: Measure::MicrosPerEvent,
        max_time: Time::from_ms(60_000),
    })
}

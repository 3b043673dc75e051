//! will-it-scale's TLB-flush testcases (Anton Blanchard's `will-it-scale`, `tests/tlb_flush*.c`),
//! in thread mode (one process, `tasks` threads: every `madvise` flushes the CPUs of the whole
//! mm) or process mode (`tasks` processes: each flushes only its own CPU). Every task loops:
//!
//! ```text
//! addr = mmap(NULL, SIZE, PROT_READ|PROT_WRITE, <mapping>, ...);
//! for (i = 0; i < SIZE; i += pgsize) {
//!     addr[i] = 1;                             // write fault
//!     madvise(addr + i, pgsize, MADV_DONTNEED); // zap one page, flush it
//!     assert(addr[i] == <expected>);           // read fault
//!     (*iteration)++;
//! }
//! munmap(addr, SIZE);
//! ```
//!
//! | testcase | mapping | SIZE | the read after `MADV_DONTNEED` maps |
//! |---|---|---|---|
//! | `tlb_flush1` | MAP_PRIVATE of the task's own 128 MiB file | 32768 pages | the page-cache page, read-only (the write had copied it: `do_cow_fault`) |
//! | `tlb_flush2` | MAP_PRIVATE \| MAP_ANONYMOUS | 256 pages | the shared zero page, read-only |
//! | `tlb_flush3` | MAP_SHARED of the task's own 128 MiB file | 32768 pages | the same page-cache page again |
//!
//! With a `[host]` (one VM) the tasks run on the VM's vCPUs.
//!
//! The metric is will-it-scale's: iterations per second, summed over the tasks, between
//! `warmup_ms` and `warmup_ms + measure_ms`.
//!
//! Assumptions (say so where they matter):
//! * the files are on tmpfs (`/tmp`; the testcases `mkstemp` there): a page-cache page is
//!   allocated and zeroed on first use, and `MADV_DONTNEED` of a shared mapping only unmaps it;
//! * task `i` runs on CPU `i` and stays there (will-it-scale binds each task to one CPU with
//!   hwloc; Linux numbers one thread of every core first);
//! * each task's region sits next to the others' (mmap's top-down placement), two 1 MiB regions
//!   to a page-table page for `tlb_flush2`;
//! * no fault-around: a read fault maps one page (in the first pass over a file, the only one a
//!   short window reaches, the pages ahead are not in the page cache, so fault-around would map
//!   nothing more).

use crate::{params::limits, rate_window, Built, ParamError, Params};
use shootdown_linux::{Machine, UserOp};

/// The testcases this workload runs.
pub const TESTCASES: &[&str] = &["tlb_flush1", "tlb_flush2", "tlb_flush3"];

pub fn build(p: &Params, mut m: Machine) -> Result<Built, ParamError> {
    let testcase = p.string("testcase", "tlb_flush2", TESTCASES)?;
    let threads = p.string("mode", "threads", &["threads", "processes"])? == "threads";
    if m.host.as_ref().is_some_and(|h| h.cfg.vms != 1) {
        return Err((
            "host.vms".into(),
            "will_it_scale runs in one VM (its tasks are placed on the VM's vCPUs)".into(),
        ));
    }
    // With a [host], the VM's vCPUs.
    let cpus = m.cpus.len();
    let tasks = p.int("tasks", cpus as i64, 1..=limits::THREADS)? as usize;
    if tasks > cpus {
        return Err((
            "tasks".into(),
            format!("{tasks} tasks but the machine has only {cpus} CPUs (one task per CPU)"),
        ));
    }
    let (default_pages, file, private) = match testcase.as_str() {
        "tlb_flush1" => (32768, true, true),
        "tlb_flush2" => (256, false, true),
        _ => (32768, true, false),
    };
    let pages = p.int("pages", default_pages, 1..=limits::MEMORY_MB * 256)? as u64;
    let warmup_ms = p.num("warmup_ms", 2.0, limits::MS)?;
    let measure_ms = p.num("measure_ms", 10.0, limits::MS)?;
    let shared_mm = threads.then(|| m.add_mm("will-it-scale"));
    for i in 0..tasks {
        let mm = match shared_mm {
            Some(mm) => mm,
            None => m.add_mm(&format!("will-it-scale/{i}")),
        };
        // Regions next to each other, in one mm or in each process's own.
        let start = 0x10_0000 + if threads { i as u64 * pages } else { 0 };
        let map = if file {
            let f = m.add_file(&format!("willitscale.{i}"), pages, false);
            UserOp::MmapFile {
                start,
                npages: pages,
                file: f,
                private,
            }
        } else {
            UserOp::Mmap {
                start,
                npages: pages,
            }
        };
        let prog = vec![
            map,
            UserOp::Touch {
                vpn: start,
                write: true,
            },
            UserOp::MadviseDontneed { start, npages: 1 },
            UserOp::Touch {
                vpn: start,
                write: false,
            },
            UserOp::Event,
            UserOp::NextPage { to: 1, pages },
            UserOp::Munmap {
                start,
                npages: pages,
            },
            UserOp::Loop { to: 0, times: None },
        ];
        m.add_task(&format!("{testcase}/{i}"), mm, i, prog);
    }
    Ok(rate_window(m, warmup_ms, measure_ms, 1.0))
}

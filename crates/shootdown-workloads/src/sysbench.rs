//! Seed 000's benchmark: `sysbench fileio --file-test-mode=rndwr --file-io-mode=mmap
//! --file-fsync-mode=fdatasync` on an ext4-DAX file on emulated pmem.
//!
//! Each thread loops: write one block (`block_size` bytes) at a random block-aligned offset of
//! the mmap'd file — a write-protect fault when the mapping entry is clean — and count one event;
//! every `fsync_freq` events, `fdatasync()`, which on DAX write-protects each dirty mapping entry
//! (`dax_writeback_one` → `pfn_mkclean`/`dax_entry_mkclean`) and flushes it from every CPU
//! running the mm with a one-entry `flush_tlb_mm_range` (kernel-model.md §8.3(a)). All threads
//! share the process's mm. The file starts mapped and clean (the steady state).
//!
//! `dax_pmd = true` (the default) maps the file with 2 MiB PMD entries, as ext4-DAX does when the
//! pmem namespace and file extents are 2 MiB-aligned: one fault and one flush per dirty 2 MiB
//! entry instead of per 4 KiB page. This is an assumption (the seed does not say); with
//! `dax_pmd = false` every 4 KiB page is its own entry.
//!
//! `main_thread = true` (the default) adds sysbench's main thread: it starts the workers and
//! sleeps in `pthread_join`, so its CPU (the first of the placement order the workers leave
//! free) idles lazily with the mm loaded and stays in `mm_cpumask` — every flush then has a
//! remote candidate to filter, even with one worker.
//!
//! Metric: steady-state events per run — all threads' events per second between the moment the
//! last thread finished `warmup_cycles` write+fsync cycles and the moment the last thread
//! finished `warmup_cycles + cycles`, times `run_seconds` (sysbench's default `--time=10`).

use crate::{place_threads, Built, Measure, ParamError, Params};
use shootdown_engine::Time;
use shootdown_linux::{Machine, UserOp};

pub fn build(p: &Params, mut m: Machine) -> Result<Built, ParamError> {
    let threads = p.int("threads", 1, 1)? as usize;
    let file_mb = p.int("file_total_size_mb", 3072, 1)? as u64;
    let block = p.int("block_size", 16384, 4096)? as u64;
    let fsync_freq = p.int("fsync_freq", 100, 1)? as u32;
    let user_ns = p.int("user_ns_per_request", 0, 0)? as u64;
    let dax_pmd = p.boolean("dax_pmd", true)?;
    let main_thread = p.boolean("main_thread", true)?;
    let warmup_cycles = p.int("warmup_cycles", 1, 0)? as usize;
    let cycles = p.int("cycles", 4, 1)? as usize;
    let run_seconds = p.num("run_seconds", 10.0)?;
    if block % 4096 != 0 {
        return Err((
            "block_size".into(),
            format!("must be a multiple of 4096 (got {block})"),
        ));
    }
    let cpus = place_threads(&m.topo, threads)?;
    let mm = m.add_mm("sysbench");
    // One mapping entry per `unit` 4 KiB pages.
    let unit = if dax_pmd { 512 } else { 1 };
    if dax_pmd && block > 512 * 4096 {
        return Err((
            "block_size".into(),
            "blocks larger than 2 MiB need dax_pmd = false".into(),
        ));
    }
    let entries = (file_mb * 256).div_ceil(unit);
    let start = 0x10_0000; // 4 GiB
    m.map_pages(mm, start, entries, false);
    m.set_dax_file(mm, start, entries);
    let pages_per_block = block / 4096;
    let mut prog = if dax_pmd {
        // One translation per block (a random 2 MiB entry), the rest of the copy needs none.
        vec![
            UserOp::TouchRandomBlock {
                start,
                span: entries,
                npages: 1,
            },
            UserOp::CopyPages {
                pages: pages_per_block - 1,
            },
        ]
    } else {
        vec![UserOp::TouchRandomBlock {
            start,
            span: entries,
            npages: pages_per_block,
        }]
    };
    if user_ns > 0 {
        prog.push(UserOp::Compute { ns: user_ns });
    }
    prog.push(UserOp::Event);
    if fsync_freq > 1 {
        prog.push(UserOp::Loop {
            to: 0,
            times: Some(fsync_freq - 1),
        });
    }
    prog.extend([
        UserOp::Fdatasync,
        UserOp::Mark,
        UserOp::Loop { to: 0, times: None },
    ]);
    for (i, &cpu) in cpus.iter().enumerate() {
        m.add_task(&format!("sysbench/{i}"), mm, cpu, prog.clone());
    }
    if main_thread {
        let order = place_threads(&m.topo, m.topo.nr_cpus()).unwrap_or_default();
        let mut free = order.into_iter().filter(|c| !cpus.contains(c));
        // With ≤ one socket of workers, numactl keeps the main thread on that socket too.
        let per_socket = m.topo.cores_per_socket * m.topo.threads_per_core;
        let first_free = if threads < per_socket {
            m.topo
                .cpus_of_socket(0)
                .into_iter()
                .find(|c| !cpus.contains(c))
        } else {
            free.next()
        };
        if let Some(cpu) = first_free {
            let stack = 0x1000;
            m.map_pages(mm, stack, 1, true);
            m.add_task(
                "sysbench/main",
                mm,
                cpu,
                vec![
                    UserOp::Touch {
                        vpn: stack,
                        write: true,
                    },
                    UserOp::Exit,
                ],
            );
        }
    }
    // Marks: one at each cycle end; the rate is taken over cycles after the warm-up.
    m.perf.stop_after_marks = Some(warmup_cycles + 1 + cycles);
    m.perf.log_events = true;
    Ok(Built {
        machine: m,
        measure: Measure::CycleRate {
            warm: warmup_cycles,
            events_per_cycle: fsync_freq as f64,
            run_seconds,
        },
        max_time: Time::from_ms(10_000),
    })
}

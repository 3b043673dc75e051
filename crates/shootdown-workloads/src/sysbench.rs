//! Seed 000's benchmark: `sysbench fileio --file-test-mode=rndwr --file-io-mode=mmap
//! --file-fsync-mode=fdatasync` on ext4-DAX files on emulated pmem.
//!
//! sysbench 1.0 (`src/tests/fileio/sb_fileio.c`) with its defaults: `--file-num=128` files of
//! `file_total_size / 128` each, every one mmap'd; `--file-block-size=16384`;
//! `--file-fsync-freq=100`. Each request of each thread comes from `file_get_rnd_request()`,
//! whose state is process-wide: after every 100 writes (counted over all threads) the next 128
//! requests are fsyncs of file 0, 1, … 127, whoever asks; otherwise the request writes one
//! block at a uniformly random offset of the total size (a write-protect fault when the entry is
//! clean: `ext4_dax_huge_fault` under a jbd2 handle and the file's `xa_lock`). Every request,
//! write or fsync, is one sysbench event. In mmap mode a 64-bit sysbench fsyncs with
//! `msync(MS_SYNC | MS_INVALIDATE)` of the file's whole mapping (`file_do_fsync()`;
//! `--file-fsync-mode` only matters in sync/async mode): `find_vma` under `mmap_sem` held for read,
//! then `vfs_fsync_range(datasync=1)`, the same `ext4_sync_file()` as `fdatasync()`. On DAX that
//! write-protects each dirty entry of that file (`dax_writeback_one` → `pfn_mkclean`/`dax_entry_mkclean`) and flushes it from every
//! CPU running the mm with a one-entry `flush_tlb_mm_range` (docs/design/kernel-model.md §8.3(a)). All
//! threads share the process's mm. The files start mapped and clean (the steady state).
//!
//! `dax_pmd = false` (the default) maps the files with 4 KiB PTEs, one `dax_writeback_one` and one
//! one-page flush per dirty 4 KiB page (a 16 KiB block dirties four). This is an assumption (the
//! seed does not say): ext4-DAX maps a 2 MiB PMD only where the file's extent is 2 MiB-aligned on
//! the pmem device, which sysbench's `prepare` (16 KiB `write()`s on a filesystem made without
//! stripe hints) does not arrange. With it the modelled single-thread rate (no contention, just
//! the per-event path) is within ~15 % of the published one; with PMDs it is twice as high.
//! `dax_pmd = true` maps 2 MiB PMD entries instead: one fault and one flush per dirty 2 MiB entry.
//!
//! `main_thread = true` (the default) adds sysbench's main thread: it starts the workers and
//! sleeps in `pthread_join`, so its CPU (the first of the placement order the workers leave
//! free) idles lazily with the mm loaded and stays in `mm_cpumask` — every flush then has a
//! remote candidate to filter, even with one worker.
//!
//! Metric: events (writes and fsyncs) per second between `warmup_ms` and `warmup_ms +
//! measure_ms` of simulated time, times `run_seconds` (sysbench's default `--time=10`).

use crate::{params::limits, place_threads, Built, Measure, ParamError, Params};
use shootdown_engine::Time;
use shootdown_linux::{FileioGen, Machine, UserOp};

pub fn build(p: &Params, mut m: Machine) -> Result<Built, ParamError> {
    let threads = p.int("threads", 1, 1..=limits::THREADS)? as usize;
    let file_mb = p.int("file_total_size_mb", 3072, 1..=limits::MEMORY_MB)? as u64;
    let num_files = p.int("file_num", 128, 1..=limits::COUNT)? as u64;
    let block = p.int("block_size", 16384, 4096..=limits::OBJECT_KB * 1024)? as u64;
    let fsync_freq = p.int("fsync_freq", 100, 0..=limits::COUNT)? as u64;
    let user_ns = p.int("user_ns_per_request", 0, 0..=limits::NS)? as u64;
    let dax_pmd = p.boolean("dax_pmd", false)?;
    let main_thread = p.boolean("main_thread", true)?;
    let warmup_ms = p.num("warmup_ms", 2.0, limits::MS)?;
    let measure_ms = p.num("measure_ms", 10.0, limits::MS)?;
    let run_seconds = p.num("run_seconds", 10.0, limits::MS / 1000.0)?;
    if block % 4096 != 0 {
        return Err((
            "block_size".into(),
            format!("must be a multiple of 4096 (got {block})"),
        ));
    }
    if measure_ms <= 0.0 {
        return Err(("measure_ms".into(), "must be positive".into()));
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
    let file_pages = file_mb * 256 / num_files;
    if file_pages < block / 4096 || (dax_pmd && file_pages < 512) {
        return Err((
            "file_num".into(),
            format!(
                "{num_files} files of {file_mb} MiB in total are smaller than one block{}",
                if dax_pmd { " or one 2 MiB entry" } else { "" }
            ),
        ));
    }
    let units_per_file = file_pages / unit;
    let pages_per_block = block / 4096;
    // 2 MiB-aligned, disjoint mappings, one per file (sysbench mmaps each file separately).
    let base = 0x10_0000; // 4 GiB
    let stride = units_per_file.div_ceil(512) * 512;
    if stride == units_per_file {
        // Back to back: one mapping call for all of them (set-up cost at 4 KiB entries).
        m.map_pages(mm, base, units_per_file * num_files, false);
    }
    let mut files = Vec::new();
    for i in 0..num_files {
        let start = base + i * stride;
        if stride != units_per_file {
            m.map_pages(mm, start, units_per_file, false);
        }
        files.push(m.add_dax_file(mm, start, units_per_file));
    }
    m.fileio = Some(FileioGen {
        files,
        units_per_file,
        // With PMD entries a block is inside one entry: one translation.
        units_per_block: if dax_pmd { 1 } else { pages_per_block },
        fsync_freq,
        req_performed: 0,
        is_dirty: false,
        fsynced_file: 0,
    });
    let (npages, copy_pages) = if dax_pmd {
        (1, pages_per_block - 1)
    } else {
        (pages_per_block, 0)
    };
    let mut prog = vec![
        UserOp::FileioNext,
        UserOp::FileioExec { npages, copy_pages },
    ];
    if user_ns > 0 {
        prog.push(UserOp::Compute { ns: user_ns });
    }
    prog.extend([UserOp::Event, UserOp::Loop { to: 0, times: None }]);
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
    let from = Time::from_ns_f64(warmup_ms * 1e6);
    m.perf.measure_from = from;
    Ok(Built {
        machine: m,
        measure: Measure::EventsPerRun { from, run_seconds },
        max_time: Time::from_ns_f64((warmup_ms + measure_ms) * 1e6),
    })
}

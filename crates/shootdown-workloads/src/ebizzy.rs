//! ebizzy (seed 001: `ebizzy -M` in each of 1/2/3 VMs of 64 vCPUs on a 64-pCPU host). Every
//! thread loops over "records": allocate a chunk with `malloc` (`-M`: never `mmap`), copy a
//! random source chunk into it, binary-search it for a random key, `free` it. With a chunk
//! larger than the trim threshold, glibc returns the freed top of the thread's heap to the
//! kernel with `madvise(MADV_DONTNEED)` (`heap_trim` → `shrink_heap`), so every record ends with
//! a range zap and a TLB flush of the whole process on every vCPU that runs one of its threads,
//! and the next record faults the chunk in again. Metric: records per second (per VM: each VM
//! runs its own ebizzy, as in the seed).
//!
//! Model of one record (assumptions, the benchmark source was not at hand: default chunk
//! 512 KiB; glibc of the time trimming on every free of a chunk above the threshold):
//! * `tracked_pages` pages of the chunk are really touched (page fault, TLB fill, each use
//!   checked by the coherence oracle);
//! * the rest of the chunk is charged in bulk: its page faults (`UserOp::AnonFaults`: entry/exit,
//!   allocation, zeroing, PTE, in kernel mode; with the `page_lists` option through the per-CPU
//!   page list and the LRU pagevec, under `zone->lock` and `lru_lock` when they fill or empty,
//!   `page_lists.rs`), the copy of the whole chunk and the search (`search_ns`) as user
//!   computation, the zap of its PTEs, and after the flush its frees (`UserOp::FreePages`:
//!   `release_pages` under `lru_lock`, the per-CPU list);
//! * `madvise(MADV_DONTNEED)` over the whole chunk: more pages than the flush ceiling, so a full
//!   flush of the mm, IPIs to every other vCPU running it (or, with PV TLB flush, the
//!   `KVM_VCPU_FLUSH_TLB` flag for preempted ones);
//! * one event.
//!
//! The coarse work is cut into steps of `compute_slice_ns` so that interrupts are not held
//! back for the whole of it (a step is atomic for the timed driver).
//! Threads are spread round-robin over the VM's vCPUs and stay there; each has its own heap
//! (glibc arenas), so they share only the mm and its `mmap_sem`.
//!
//! `free_with = "munmap"` models chunks served by `mmap` instead (above glibc's mmap threshold,
//! or ebizzy's `-m`): every record maps the chunk (`mmap_sem` for write) and unmaps it
//! (`mmap_sem` for write, held across the flush), so threads also queue on `mmap_sem` and their
//! vCPUs halt while they wait.
//!
//! Without a `[host]` the same program runs natively on every CPU of the topology.

use crate::{params::limits, Built, ParamError, Params};
use shootdown_linux::{Machine, UserOp};

pub fn build(p: &Params, mut m: Machine) -> Result<Built, ParamError> {
    let (vms, vcpus) = match &m.host {
        Some(h) => (h.cfg.vms, h.cfg.vcpus_per_vm),
        None => (1, m.cpus.len()),
    };
    let threads = p.int("threads", vcpus as i64, 1..=limits::THREADS)? as usize;
    let chunk_kb = p.int("chunk_size_kb", 512, 4..=limits::OBJECT_KB)? as u64;
    let tracked = p.int("tracked_pages", 2, 1..=limits::OBJECT_KB / 4)? as u64;
    let search_ns = p.int("search_ns", 1000, 0..=limits::NS)? as u64;
    let slice_ns = p.int("compute_slice_ns", 5000, 100..=limits::NS)? as u64;
    let munmap = p.string("free_with", "madvise", &["madvise", "munmap"])? == "munmap";
    let warmup_ms = p.num("warmup_ms", 20.0, limits::MS)?;
    let measure_ms = p.num("measure_ms", 100.0, limits::MS)?;
    if chunk_kb % 4 != 0 {
        return Err((
            "chunk_size_kb".into(),
            format!("must be a multiple of 4 (got {chunk_kb})"),
        ));
    }
    let chunk_pages = chunk_kb / 4;
    if chunk_pages > 512 * 1024 {
        return Err(("chunk_size_kb".into(), "at most 2 GiB".into()));
    }
    if tracked > chunk_pages {
        return Err((
            "tracked_pages".into(),
            format!("more than the {chunk_pages} pages of a chunk"),
        ));
    }
    if threads > 8 * vcpus {
        return Err((
            "threads".into(),
            format!("{threads} threads on {vcpus} CPUs: at most 8 per CPU"),
        ));
    }
    if measure_ms <= 0.0 {
        return Err(("measure_ms".into(), "must be positive".into()));
    }
    let c = m.perf.profile.costs.clone();
    let rest = chunk_pages - tracked;
    // The copy, the search, and the PTE clears of the untracked pages (their faults and their
    // frees are the program's AnonFaults and FreePages).
    let coarse_ps = chunk_pages * c.user_touch_page.0 + rest * c.pte_update.0 + search_ns * 1000;
    let fault_ps = c.page_fault_entry_exit.0 + c.page_alloc.0 + c.page_zero.0 + c.pte_update.0;
    // Each thread's heap: 2 MiB-aligned, disjoint.
    let stride = chunk_pages.div_ceil(512) * 512 + 512;
    for vm in 0..vms {
        let mm = m.add_mm(&format!("ebizzy/vm{vm}"));
        for i in 0..threads {
            let cpu = vm * vcpus + i % vcpus;
            let start = 0x10_0000 + i as u64 * stride;
            // Threads start out of step (thread creation, first allocations): a deterministic
            // stagger over one record's work, so they do not all flush in lock-step.
            let golden = ((i as u64 * 0x9e37_79b9) % 1_000_003) as f64 / 1_000_003.0;
            let record_ps = coarse_ps + rest * (fault_ps + c.page_free.0);
            let mut prog = vec![UserOp::Compute {
                ns: (golden * record_ps as f64 / 1000.0) as u64,
            }];
            if munmap {
                prog.push(UserOp::Mmap {
                    start,
                    npages: chunk_pages,
                });
            }
            prog.push(UserOp::TouchRange {
                start,
                npages: tracked,
                write: true,
            });
            prog.push(UserOp::AnonFaults {
                npages: rest as u32,
            });
            prog.extend(compute_slices(coarse_ps / 1000, slice_ns));
            prog.push(if munmap {
                UserOp::Munmap {
                    start,
                    npages: chunk_pages,
                }
            } else {
                UserOp::MadviseDontneed {
                    start,
                    npages: chunk_pages,
                }
            });
            prog.extend([
                UserOp::FreePages {
                    npages: rest as u32,
                },
                UserOp::Event,
                UserOp::Loop { to: 1, times: None },
            ]);
            m.add_task(&format!("ebizzy/vm{vm}/{i}"), mm, cpu, prog);
        }
    }
    Ok(crate::rate_window(m, warmup_ms, measure_ms, vms as f64))
}

/// `ns` of coarse work as steps of at most `slice` ns each: a step is atomic for the timed
/// driver, so an interrupt (a flush IPI) waits for the end of the step it arrives in; real code
/// takes it at the next instruction. Slicing bounds that artificial delay.
fn compute_slices(ns: u64, slice: u64) -> Vec<UserOp> {
    let n = ns.div_ceil(slice).max(1);
    (0..n)
        .map(|k| UserOp::Compute {
            ns: ns / n + u64::from(k < ns % n),
        })
        .collect()
}

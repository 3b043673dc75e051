//! Vitaly Kuznetsov's `pthread_mmap` microbenchmark (seed 002): `threads` threads, each round
//! mapping its share of `data_mb`, writing every page, and unmapping it. Faults take `mmap_sem`
//! for read, mmap/munmap for write, so threads block and their CPUs go idle (lazy); munmap
//! frees page tables. Metric: seconds until all threads finish `nrounds`.
//!
//! Assumption (the benchmark source was not available): `data_mb` is split evenly between the
//! threads; threads are placed round-robin on `cpus` CPUs and not migrated.
//!
//! With a `[host]` the CPUs are the vCPUs of one VM (seed 002 ran in a KVM guest): a vCPU whose
//! thread the host has descheduled takes a flush IPI only when the host runs it again.

use crate::{params::limits, Built, Measure, ParamError, Params};
use shootdown_engine::Time;
use shootdown_hw::MAX_CPUS;
use shootdown_linux::{Machine, UserOp};

pub fn build(p: &Params, mut m: Machine) -> Result<Built, ParamError> {
    let threads = p.int("threads", 8, 1..=limits::THREADS)? as u64;
    let cpus = p.int("cpus", 4, 1..=MAX_CPUS as i64)? as usize;
    let nrounds = p.int("nrounds", 100, 1..=limits::COUNT)? as u32;
    let data_mb = p.int("data_mb", 256, 1..=limits::MEMORY_MB)? as u64;
    // On a host the CPUs are the VM's vCPUs, not the topology's pCPUs.
    if cpus > m.cpus.len() {
        return Err((
            "cpus".into(),
            format!("{cpus} CPUs but the machine has only {}", m.cpus.len()),
        ));
    }
    let pages = data_mb * 256 / threads;
    if pages == 0 {
        return Err(("data_mb".into(), "less than one page per thread".into()));
    }
    let mm = m.add_mm("pthread_mmap");
    for i in 0..threads {
        // 2 MiB-aligned, disjoint regions so each munmap frees whole page-table pages.
        let start = 0x40_0000 + i * pages.div_ceil(512) * 512 + i * 512;
        let prog = vec![
            UserOp::Mmap {
                start,
                npages: pages,
            },
            UserOp::TouchRange {
                start,
                npages: pages,
                write: true,
            },
            UserOp::Munmap {
                start,
                npages: pages,
            },
            UserOp::Event,
            UserOp::Loop {
                to: 0,
                times: Some(nrounds - 1),
            },
            UserOp::Exit,
        ];
        let cpu = (i as usize) % cpus;
        m.add_task(&format!("pthread_mmap/{i}"), mm, cpu, prog);
    }
    Ok(Built {
        machine: m,
        measure: Measure::CompletionSeconds,
        max_time: Time::from_ms(600_000),
    })
}

//! Seed 002's "nearly worst-case" microbenchmark: one thread loops `madvise(MADV_DONTNEED)` on a
//! page, touches it, and `sched_setaffinity`s itself to the other CPU. The CPU it left runs
//! idle with the mm still loaded (lazy): before Andy's rework it stays in `mm_cpumask`, so the
//! next DONTNEED IPIs it; after, it does not. Metric: µs per iteration.

use crate::{params::limits, Built, Measure, ParamError, Params};
use shootdown_engine::Time;
use shootdown_hw::MAX_CPUS;
use shootdown_linux::{Machine, UserOp};

pub fn build(p: &Params, mut m: Machine) -> Result<Built, ParamError> {
    let iterations = p.int("iterations", 2000, 1..=limits::COUNT)? as u32;
    let warmup = p.int("warmup_iterations", 50, 0..=limits::COUNT)? as u32;
    let cpu_a = p.int("cpu_a", 0, 0..=MAX_CPUS as i64)? as usize;
    let cpu_b = p.int("cpu_b", 1, 0..=MAX_CPUS as i64)? as usize;
    for (k, c) in [("cpu_a", cpu_a), ("cpu_b", cpu_b)] {
        // On a host the CPUs are the VM's vCPUs, not the topology's pCPUs.
        if c >= m.cpus.len() {
            return Err((
                k.into(),
                format!("CPU {c} does not exist (the machine has {})", m.cpus.len()),
            ));
        }
    }
    if cpu_a == cpu_b {
        return Err(("cpu_b".into(), "must differ from cpu_a".into()));
    }
    let mm = m.add_mm("madv");
    let page = 0x1000;
    m.map_pages(mm, page, 1, true);
    // One iteration: DONTNEED the page, touch it again, move to the other CPU.
    let iteration = [
        UserOp::MadviseDontneed {
            start: page,
            npages: 1,
        },
        UserOp::Touch {
            vpn: page,
            write: true,
        },
        UserOp::SetAffinityNext,
    ];
    let prog = crate::timed_loop(&iteration, warmup, iterations);
    let t = m.add_task("madv", mm, cpu_a, prog);
    m.tasks[t as usize].cpus = vec![cpu_a, cpu_b];
    Ok(Built {
        machine: m,
        measure: Measure::MicrosPerEvent,
        max_time: Time::from_ms(60_000),
    })
}

//! # shootdown-workloads
//!
//! The seeds' benchmarks (and generic ones) as task programs for the Linux model. A workload
//! reads its parameters from an experiment's `[workload]` table ([`params::Params`] rejects
//! unknown keys), builds a [`Machine`] (mms, tasks, placement, pre-mapped memory), and turns the
//! finished run into its metric.
//!
//! | kind | seed | what | metric |
//! |---|---|---|---|
//! | `sysbench_fileio` | 000 | random 16 KiB writes to 128 mmap'd DAX files, each fdatasync'd after every 100 writes | events per run (10 s) |
//! | `madv_dontneed_pingpong` | 002 | MADV_DONTNEED + touch + sched_setaffinity to the other CPU | µs per iteration |
//! | `pthread_mmap` | 002 | threads mmap / touch / munmap in rounds, contending on mmap_sem | seconds |
//! | `ebizzy` | 001 | threads allocate, copy, search, free chunks (madvise flush per record), in VMs | records/s per VM |
//! | `vmexit_cpuid` | 000 (2nd letter) | CPUID loop in every vCPU | VM exits/s per vCPU |
//! | `mmtest_rom` | 003 | threads re-access 2000 MB each while QEMU creates and deletes a ROM memslot | ms per pass |
//! | `host_micro` | — | `shootdown validate`'s cases: madvise / mprotect / munmap + touch on CPU 0 with busy or sleeping siblings | µs per iteration |
//! | `guest_boot` | 004 | every vCPU runs its firmware's and kernel's MTRR / CR0.CD script (data) while KVM zaps | zap M cycles |
//! | `hackbench` | — | groups of senders write messages through pipes to receivers, which sleep and wake (mm switches) | seconds |
//! | `ipi_benchmark` | — | the `ipi_benchmark` module's cases: cross calls to this CPU, another, or all | µs per call |
//! | `will_it_scale` | — | will-it-scale's `tlb_flush1/2/3`: write a page, `madvise(MADV_DONTNEED)` it, read it, next page | iterations/s |
//!
//! A workload table may carry a `host` sub-table (the experiment's `[host]`, see
//! `shootdown_linux::host`): the machine is then the vCPUs of `vms` VMs on the topology's
//! pCPUs. Only the workloads in [`HOST_KINDS`] accept it (`ebizzy`, `vmexit_cpuid`, and seed
//! 002's two, which place their threads on CPU numbers and so run unchanged on one VM's vCPUs).

pub mod ebizzy;
pub mod guest_boot;
pub mod hackbench;
pub mod host_micro;
pub mod ipi_benchmark;
pub mod madv_pingpong;
pub mod mmtest_rom;
pub mod params;
pub mod pthread_mmap;
pub mod sysbench;
pub mod vmexit;
pub mod will_it_scale;

use shootdown_engine::timed::RunStats;
use shootdown_engine::Time;
use shootdown_hw::{CostProfile, Topology};
use shootdown_linux::{HostConfig, Machine, MemoryModel, OptValue, Options};
use std::sync::Arc;

pub use params::{ParamError, Params};

/// How a finished run becomes the metric.
#[derive(Clone, Debug)]
pub enum Measure {
    /// Events counted after `from`, as a rate over the simulated window, scaled to a run of
    /// `run_seconds` (sysbench reports totals for a fixed-length run).
    EventsPerRun { from: Time, run_seconds: f64 },
    /// Time between consecutive measured events, in microseconds.
    MicrosPerEvent,
    /// Time until every task finished, in seconds.
    CompletionSeconds,
    /// Events per second after `from` (to the end of the run), divided by `per` (per VM, per
    /// vCPU…).
    RatePer { from: Time, per: f64 },
    /// The mean over tasks of the time between a task's first and last [`UserOp::Mark`], in
    /// milliseconds (a pass each thread times itself).
    ///
    /// [`UserOp::Mark`]: shootdown_linux::UserOp::Mark
    MeanMarkedMillis,
    /// A counter of the run times `scale` (seed 004: nanoseconds in zap requests → M cycles).
    CounterScaled {
        counter: shootdown_linux::Counter,
        scale: f64,
    },
}

/// A machine ready to run, with how long to run it and how to measure it.
pub struct Built {
    pub machine: Machine,
    pub measure: Measure,
    /// Simulated-time limit of the run.
    pub max_time: Time,
}

/// A microbenchmark's program: `warmup` uncounted runs of `iteration`, then `iterations` runs
/// each followed by a [`UserOp::Event`] (the metric's µs per iteration), then exit.
///
/// [`UserOp::Event`]: shootdown_linux::UserOp::Event
pub(crate) fn timed_loop(
    iteration: &[shootdown_linux::UserOp],
    warmup: u32,
    iterations: u32,
) -> Vec<shootdown_linux::UserOp> {
    use shootdown_linux::UserOp;
    let mut prog = Vec::new();
    if warmup > 0 {
        prog.extend_from_slice(iteration);
        prog.push(UserOp::Loop {
            to: 0,
            times: Some(warmup - 1),
        });
    }
    let top = prog.len() as u16;
    prog.extend_from_slice(iteration);
    prog.extend([
        UserOp::Event,
        UserOp::Loop {
            to: top,
            times: Some(iterations - 1),
        },
        UserOp::Exit,
    ]);
    prog
}

/// A run measured as events per second (divided by `per`) between `warmup_ms` and
/// `warmup_ms + measure_ms` of simulated time.
pub(crate) fn rate_window(mut m: Machine, warmup_ms: f64, measure_ms: f64, per: f64) -> Built {
    let from = Time::from_ns_f64(warmup_ms * 1e6);
    m.perf.measure_from = from;
    Built {
        machine: m,
        measure: Measure::RatePer { from, per },
        max_time: Time::from_ns_f64((warmup_ms + measure_ms) * 1e6),
    }
}

/// The workload kinds this crate knows.
pub const KINDS: &[&str] = &[
    "sysbench_fileio",
    "madv_dontneed_pingpong",
    "pthread_mmap",
    "ebizzy",
    "vmexit_cpuid",
    "mmtest_rom",
    "guest_boot",
    "host_micro",
    "will_it_scale",
    "hackbench",
    "ipi_benchmark",
];

/// The workload kinds that accept a `[host]` (run in a VM on the topology's pCPUs).
pub const HOST_KINDS: &[&str] = &[
    "madv_dontneed_pingpong",
    "pthread_mmap",
    "ebizzy",
    "vmexit_cpuid",
    "mmtest_rom",
    "guest_boot",
    "host_micro",
    "will_it_scale",
    "hackbench",
    "ipi_benchmark",
];

/// Read a `[host]` table into a validated [`HostConfig`] for a host with `pcpus` pCPUs. Errors
/// are `(key within the table, reason)`.
pub fn host_config(t: &toml::Table, pcpus: usize) -> Result<HostConfig, ParamError> {
    let mut cfg = HostConfig::default();
    for (k, v) in t {
        let ov = match v {
            toml::Value::Integer(i) => OptValue::Int(*i),
            toml::Value::Boolean(b) => OptValue::Bool(*b),
            toml::Value::String(s) => OptValue::Str(s.clone()),
            other => {
                return Err((
                    k.clone(),
                    format!("expected an integer or a boolean, got {}", other.type_str()),
                ))
            }
        };
        cfg.set(k, &ov).map_err(|r| (k.clone(), r))?;
    }
    cfg.validate(pcpus)?;
    Ok(cfg)
}

/// Build the machine for a workload table. Errors are `(key, reason)` within `[workload]`.
pub fn build(
    table: &toml::Table,
    topo: &Topology,
    profile: Arc<CostProfile>,
    opts: Options,
) -> Result<Built, ParamError> {
    let p = Params::new(table);
    let kind = match table.get("kind") {
        Some(toml::Value::String(k)) => k.clone(),
        Some(_) => return Err(("kind".into(), "expected a string".into())),
        None => {
            return Err((
                "kind".into(),
                format!("missing (one of: {})", KINDS.join(", ")),
            ))
        }
    };
    p.mark_used("host");
    let host = match table.get("host") {
        None => None,
        Some(toml::Value::Table(h)) => {
            Some(host_config(h, topo.nr_cpus()).map_err(|(k, r)| (format!("host.{k}"), r))?)
        }
        Some(_) => return Err(("host".into(), "expected a table".into())),
    };
    let machine = match host {
        None => Machine::new(topo.clone(), profile, opts, MemoryModel::Sc),
        Some(cfg) => {
            if !HOST_KINDS.contains(&kind.as_str()) {
                return Err((
                    "kind".into(),
                    format!(
                        "workload '{kind}' runs natively: [host] is for {}",
                        HOST_KINDS.join(", ")
                    ),
                ));
            }
            Machine::with_host(topo.clone(), profile, opts, MemoryModel::Sc, cfg)
        }
    };
    let built = match kind.as_str() {
        "sysbench_fileio" => sysbench::build(&p, machine)?,
        "madv_dontneed_pingpong" => madv_pingpong::build(&p, machine)?,
        "pthread_mmap" => pthread_mmap::build(&p, machine)?,
        "ebizzy" => ebizzy::build(&p, machine)?,
        "vmexit_cpuid" => vmexit::build(&p, machine)?,
        "mmtest_rom" => mmtest_rom::build(&p, machine)?,
        "guest_boot" => guest_boot::build(&p, machine)?,
        "host_micro" => host_micro::build(&p, machine)?,
        "will_it_scale" => will_it_scale::build(&p, machine)?,
        "hackbench" => hackbench::build(&p, machine)?,
        "ipi_benchmark" => ipi_benchmark::build(&p, machine)?,
        other => {
            return Err((
                "kind".into(),
                format!("unknown workload '{other}' (one of: {})", KINDS.join(", ")),
            ))
        }
    };
    p.finish()?;
    Ok(built)
}

/// The metric of a finished run.
pub fn metric(m: &Machine, measure: &Measure, stats: &RunStats) -> f64 {
    let perf = &m.perf;
    match measure {
        Measure::EventsPerRun { from, run_seconds } => {
            let window = stats.end.saturating_sub(*from).as_secs_f64();
            if window <= 0.0 {
                0.0
            } else {
                perf.events_measured as f64 / window * run_seconds
            }
        }
        Measure::MicrosPerEvent => match perf.first_event_at {
            Some(first) if perf.events_measured > 1 => {
                perf.last_event_at.saturating_sub(first).as_us_f64()
                    / (perf.events_measured - 1) as f64
            }
            _ => f64::NAN,
        },
        Measure::CompletionSeconds => stats.end.as_secs_f64(),
        Measure::RatePer { from, per } => {
            let window = stats.end.saturating_sub(*from).as_secs_f64();
            if window <= 0.0 || *per <= 0.0 {
                0.0
            } else {
                perf.events_measured as f64 / window / per
            }
        }
        Measure::CounterScaled { counter, scale } => m.counters().get(*counter) as f64 * scale,
        Measure::MeanMarkedMillis => {
            let spans: Vec<f64> = perf
                .marks
                .iter()
                .filter(|m| m.len() >= 2)
                .map(|m| m[m.len() - 1].saturating_sub(m[0]).as_secs_f64() * 1e3)
                .collect();
            if spans.is_empty() {
                f64::NAN
            } else {
                spans.iter().sum::<f64>() / spans.len() as f64
            }
        }
    }
}

/// Place `n` threads: up to one socket's worth on socket 0 (cores first, then SMT siblings —
/// `numactl` binding), beyond that spread over every core first, then siblings.
pub fn place_threads(topo: &Topology, n: usize) -> Result<Vec<usize>, ParamError> {
    if n > topo.nr_cpus() {
        return Err((
            "threads".into(),
            format!(
                "{n} threads but the topology has only {} CPUs",
                topo.nr_cpus()
            ),
        ));
    }
    let per_socket = topo.cores_per_socket * topo.threads_per_core;
    if n <= per_socket {
        return Ok(topo.cpus_of_socket(0)[..n].to_vec());
    }
    Ok((0..n).collect())
}

//! [`run_case`]: validate a spec against the host, build its workload on a pinned measuring
//! thread, calibrate the op count, warm up, time the repetitions, count IPIs.

mod mm;
mod primitives;

use crate::interrupts::Counts;
use crate::siblings::Siblings;
use crate::{pin, stats, CaseResult, CaseSpec, HostError, Op};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Something timed: `run(n)` performs `n` iterations of the case, each worth
/// [`Workload::ops_per_iter`] ops of the result.
pub(crate) trait Workload {
    /// Ops of the result per iteration (2 for `ctx_switch`, where an iteration is a round trip
    /// of two switches; 1 otherwise).
    fn ops_per_iter(&self) -> u64 {
        1
    }
    fn run(&mut self, iters: u64) -> Result<(), HostError>;
    /// The sibling threads, for the shootdown cases.
    fn siblings(&self) -> Option<&Siblings> {
        None
    }
}

/// The most iterations one repetition may have, whatever the calibration says.
const MAX_ITERS: u64 = 1 << 36;

pub(crate) fn run_case(spec: &CaseSpec, cancel: &AtomicBool) -> Result<CaseResult, HostError> {
    check(cancel)?;
    spec.validate()?;
    let online = pin::online_cpus()?;
    let cpus = cpus_for(spec, &online)?;
    // Fail early, with its own message, if the counters can't be read at all.
    Counts::read()?;

    let measured = std::thread::scope(|scope| {
        let handle = std::thread::Builder::new()
            .name("hostbench-0".into())
            .spawn_scoped(scope, || measure_on(spec, &cpus, cancel))
            .map_err(|e| {
                HostError::Thread(format!(
                    "cannot start the measuring thread: {e} (raise the thread limit)"
                ))
            })?;
        handle
            .join()
            .map_err(|_| HostError::Thread("the measuring thread panicked".into()))?
    })?;

    let (median_us, min_us, max_us) = stats::summary(&measured.us_per_op);
    let [tlb, cal, res] = measured.before.per_op(&measured.after, measured.total_ops);
    Ok(CaseResult {
        spec: spec.clone(),
        unit: spec.op.unit().to_string(),
        cpus,
        ops_per_rep: measured.ops_per_rep,
        us_per_op: measured.us_per_op,
        median_us,
        min_us,
        max_us,
        tlb_ipis_per_op: tlb,
        cal_ipis_per_op: cal,
        res_ipis_per_op: res,
        sibling_cpu_share: measured.sibling_cpu_share,
    })
}

fn check(cancel: &AtomicBool) -> Result<(), HostError> {
    if cancel.load(Ordering::Relaxed) {
        Err(HostError::Cancelled)
    } else {
        Ok(())
    }
}

/// The CPUs the case uses: thread 0's first, then siblings' or the partner's.
fn cpus_for(spec: &CaseSpec, online: &[usize]) -> Result<Vec<usize>, HostError> {
    let (need, what) = match spec.op {
        Op::Madvise | Op::Mprotect | Op::Munmap => (
            spec.siblings + 1,
            format!(
                "{} with {} sibling{}",
                spec.op.name(),
                spec.siblings,
                crate::plural(&spec.siblings)
            ),
        ),
        Op::NullSyscall | Op::CtxSwitch | Op::Fault => (1, spec.op.name().to_string()),
        Op::WakeIpi => (2, "wake_ipi (a thread on each of 2 CPUs)".to_string()),
        Op::Migrate => (2, "migrate (a thread hopping between 2 CPUs)".to_string()),
    };
    if online.len() < need {
        return Err(HostError::TooFewCpus {
            have: online.len(),
            need,
            what,
        });
    }
    let extra = match spec.op {
        Op::Madvise | Op::Mprotect | Op::Munmap => spec.siblings,
        Op::WakeIpi | Op::Migrate => 1,
        Op::NullSyscall | Op::CtxSwitch | Op::Fault => 0,
    };
    Ok(online[..=extra].to_vec())
}

struct Measured {
    ops_per_rep: u64,
    us_per_op: Vec<f64>,
    total_ops: u64,
    before: Counts,
    after: Counts,
    sibling_cpu_share: Option<f64>,
}

/// On the measuring thread: pin, build the workload, time it. The workload (threads,
/// mappings) is dropped before returning, on every path.
fn measure_on(spec: &CaseSpec, cpus: &[usize], cancel: &AtomicBool) -> Result<Measured, HostError> {
    pin::pin_and_check(cpus[0])?;
    check(cancel)?;
    let mut workload: Box<dyn Workload> = match spec.op {
        Op::Madvise => Box::new(mm::Madvise::new(spec, &cpus[1..])?),
        Op::Mprotect => Box::new(mm::Mprotect::new(spec, &cpus[1..])?),
        Op::Munmap => Box::new(mm::Munmap::new(spec, &cpus[1..])?),
        Op::NullSyscall => Box::new(primitives::NullSyscall),
        Op::Fault => Box::new(mm::Munmap::fault(spec)?),
        Op::CtxSwitch => Box::new(primitives::PingPong::new(cpus[0], 2)?),
        Op::WakeIpi => Box::new(primitives::PingPong::new(cpus[1], 1)?),
        Op::Migrate => Box::new(primitives::Migrate::new(cpus[0], cpus[1])),
    };
    measure(workload.as_mut(), spec, cancel)
}

/// Calibrate, warm up, time `spec.reps` repetitions.
fn measure(
    w: &mut dyn Workload,
    spec: &CaseSpec,
    cancel: &AtomicBool,
) -> Result<Measured, HostError> {
    let budget = Duration::from_secs_f64(spec.target_ms / 1e3);
    let iters = calibrate(w, budget, cancel)?;
    let ops_per_rep = iters.saturating_mul(w.ops_per_iter());

    check(cancel)?;
    w.run(iters)?; // warm-up, untimed

    let sibling_cpu =
        |w: &dyn Workload| w.siblings().and_then(|s| Some((s.len(), s.cpu_time_ns()?)));
    let cpu0 = sibling_cpu(w);
    let wall0 = Instant::now();
    let before = Counts::read()?;
    let mut us_per_op = Vec::with_capacity(spec.reps);
    for _ in 0..spec.reps {
        check(cancel)?;
        let t0 = Instant::now();
        w.run(iters)?;
        let dt = t0.elapsed();
        us_per_op.push(dt.as_secs_f64() * 1e6 / ops_per_rep as f64);
    }
    let after = Counts::read()?;
    let wall = wall0.elapsed().as_secs_f64() * 1e9;
    let sibling_cpu_share = match (cpu0, sibling_cpu(w)) {
        (Some((n, a)), Some((_, b))) if n > 0 && wall > 0.0 => {
            Some(b.saturating_sub(a) as f64 / (wall * n as f64))
        }
        _ => None,
    };
    Ok(Measured {
        ops_per_rep,
        us_per_op,
        total_ops: ops_per_rep.saturating_mul(spec.reps as u64),
        before,
        after,
        sibling_cpu_share,
    })
}

/// Iterations that fill `budget`: run 1, 2, 4, … iterations until one trial takes a tenth of
/// the budget (at least 200 µs, at most the budget), then scale.
fn calibrate(
    w: &mut dyn Workload,
    budget: Duration,
    cancel: &AtomicBool,
) -> Result<u64, HostError> {
    let goal = (budget / 10).clamp(Duration::from_micros(200).min(budget), budget);
    let mut n = 1u64;
    loop {
        check(cancel)?;
        let t0 = Instant::now();
        w.run(n)?;
        let dt = t0.elapsed();
        if dt >= goal || n >= MAX_ITERS {
            let per_iter = dt.as_secs_f64() / n as f64;
            let iters = if per_iter > 0.0 {
                (budget.as_secs_f64() / per_iter).round()
            } else {
                MAX_ITERS as f64
            };
            return Ok((iters as u64).clamp(1, MAX_ITERS));
        }
        n = n.saturating_mul(2);
    }
}

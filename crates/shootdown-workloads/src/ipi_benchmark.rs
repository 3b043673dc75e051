//! The `ipi_benchmark` kernel module (Yury Norov's "IPI performance benchmark", posted to
//! LKML in December 2017 and never merged; read from the copies of `kernel/ipi_benchmark.c` in
//! kernel forks, and used since to measure KVM's PV send-IPI). Its init function runs each
//! case `NTIMES` (100,000) times from one CPU, preemption off around each call, and prints the
//! total time of the loop:
//!
//! | case | call, each iteration | runs on the targets |
//! |---|---|---|
//! | `dry_run` | nothing (`get_cpu()` / `put_cpu()`) | — |
//! | `self_ipi` | `smp_call_function_single(this_cpu, handle_ipi, …, 1)`: no IPI, the function runs here | `handle_ipi` |
//! | `normal_ipi` | `smp_call_function_single(cpumask_any_but(online, this_cpu), …, 1)` | `handle_ipi` |
//! | `broadcast_ipi` | `smp_call_function_many(cpu_online_mask, handle_ipi, NULL, 1)`: every other CPU | `handle_ipi` |
//! | `broadcast_lock` | the same with `handle_ipi_spinlock` | `spin_lock` + `spin_unlock` of one lock |
//!
//! Metric: microseconds per call (the module's "total" column divided by `NTIMES`), from the
//! time between consecutive calls' ends.
//!
//! Simplified: `ntimes` calls (default 1,000, not 100,000: the mean settles long before, and a
//! broadcast at 256 CPUs costs 256 handler runs per call); the caller is CPU 0 (the module ran
//! on whichever CPU `insmod` did); the clock reads (`ktime_get()` before each call and in
//! `handle_ipi`, which the module's other column sums) cost nothing; the other CPUs are idle,
//! as on a quiet machine, so each IPI also wakes its target from the idle state the options
//! choose (`idle`); with a `[host]` the CPUs are one VM's vCPUs, and the sender's ICR writes or
//! PV send-IPI hypercall, and each target's injection, are the host's (`apic.rs`).

use crate::{params::limits, Built, Measure, ParamError, Params};
use shootdown_engine::Time;
use shootdown_linux::smp::{CallFunc, CrossCallTo};
use shootdown_linux::{Machine, UserOp};

/// The module's cases, as the workload's `case` names them.
pub const CASES: &[&str] = &[
    "dry_run",
    "self_ipi",
    "normal_ipi",
    "broadcast_ipi",
    "broadcast_lock",
];

pub fn build(p: &Params, mut m: Machine) -> Result<Built, ParamError> {
    let case = p.string("case", "normal_ipi", CASES)?;
    let ntimes = p.int("ntimes", 1000, 2..=limits::COUNT)? as u32;
    if m.cpus.len() < 2 && case != "dry_run" && case != "self_ipi" {
        return Err((
            "case".into(),
            format!("'{case}' needs another CPU, and the machine has one"),
        ));
    }
    let call = match case.as_str() {
        "dry_run" => None,
        "self_ipi" => Some((CrossCallTo::This, CallFunc::Nop)),
        "normal_ipi" => Some((CrossCallTo::AnyBut, CallFunc::Nop)),
        "broadcast_ipi" => Some((CrossCallTo::AllOthers, CallFunc::Nop)),
        "broadcast_lock" => {
            let lock = m.add_kernel_lock();
            Some((CrossCallTo::AllOthers, CallFunc::SpinLock { lock }))
        }
        _ => unreachable!("Params::string checked the case"),
    };
    let mut prog: Vec<UserOp> = call
        .map(|(to, func)| UserOp::CrossCall { to, func })
        .into_iter()
        .collect();
    prog.push(UserOp::Event);
    prog.push(UserOp::Loop {
        to: 0,
        times: Some(ntimes - 1),
    });
    prog.push(UserOp::Exit);
    let mm = m.add_mm("insmod");
    m.add_task("insmod ipi_benchmark", mm, 0, prog);
    Ok(Built {
        machine: m,
        measure: Measure::MicrosPerEvent,
        max_time: Time::from_ms(600_000),
    })
}

//! A VM-exit microbenchmark (seed 000's second cover letter, docs/design/kernel-model.md §6): every vCPU
//! runs a thread that executes CPUID in a loop — an exit KVM emulates — like kvm-unit-tests'
//! `vmexit cpuid`. Each exit pays the VM exit + entry, the error checks after the
//! `vmcs_accesses_per_exit` VMREAD/VMWRITEs of the exit path (option `vmx_insn_error_check`),
//! and the CPUID emulation. Metric: VM exits per second per vCPU.

use crate::{params::limits, Built, ParamError, Params};
use shootdown_linux::{Machine, UserOp};

pub fn build(p: &Params, mut m: Machine) -> Result<Built, ParamError> {
    if m.host.is_none() {
        return Err((
            "kind".into(),
            "vmexit_cpuid needs a [host] (vCPUs to exit from)".into(),
        ));
    }
    let warmup_ms = p.num("warmup_ms", 1.0, limits::MS)?;
    let measure_ms = p.num("measure_ms", 10.0, limits::MS)?;
    if measure_ms <= 0.0 {
        return Err(("measure_ms".into(), "must be positive".into()));
    }
    let n = m.cpus.len();
    let mm = m.add_mm("vmexit");
    for cpu in 0..n {
        let prog = vec![
            UserOp::Cpuid,
            UserOp::Event,
            UserOp::Loop { to: 0, times: None },
        ];
        m.add_task(&format!("vmexit/{cpu}"), mm, cpu, prog);
    }
    Ok(crate::rate_window(m, warmup_ms, measure_ms, n as f64))
}

//! virt/kvm/kvm_main.c: the preempt notifiers of a vCPU thread. When the host scheduler takes
//! the pCPU away from a vCPU, `kvm_sched_out` → `kvm_arch_vcpu_put` runs (and marks the vCPU
//! preempted in its steal-time area); when it gets the pCPU back, `kvm_sched_in` →
//! `vcpu_load`, then `vcpu_run` continues ([`crate::kvm::x86`]).

use crate::counters::Counter;
use crate::kvm::{ThreadState, VcpuRun};
use crate::machine::Machine;
use shootdown_engine::{Env, Park};
use shootdown_hw::CpuId;

impl Machine {
    /// Host action `VcpuPut(v)` enabled in the explorer?
    pub(crate) fn host_may_preempt(&self, v: CpuId) -> bool {
        let h = self.host_ref();
        h.vcpus[v].in_guest()
            && h.cfg.preemptible.contains(&v)
            && (h.cfg.max_preemptions == 0
                || (h.vcpus[v].preemptions as u32) < h.cfg.max_preemptions)
    }

    /// Host action `VcpuPut(v)` (H1+H2): a host interrupt exits vCPU `v`, the host scheduler
    /// preempts its thread (`kvm_sched_out` → `kvm_arch_vcpu_put`) and marks it preempted; the
    /// thread will come back through `vcpu_run`. The timed driver then runs the host scheduler
    /// on that pCPU.
    pub(crate) fn vcpu_put_step<E: Env>(&mut self, v: CpuId, env: &mut E) -> Park {
        // The exit orders the guest's stores before anything the host does.
        self.fence(v);
        self.suspend_busy(v, env.now());
        self.vm_exit(env);
        self.perf.counters.inc(Counter::HostPreemptions);
        self.say(|| format!("preempt vcpu{v}: VM exit, kvm_sched_out, vcpu_put"));
        self.kvm_steal_time_set_preempted(v, env);
        let bounded = self.host_ref().cfg.max_preemptions > 0;
        let h = self.host_mut();
        h.vcpus[v].thread = ThreadState::Runnable;
        h.vcpus[v].stack.push(VcpuRun::call());
        if bounded {
            h.vcpus[v].preemptions = h.vcpus[v].preemptions.saturating_add(1);
        }
        if env.timed() {
            let p = h.vcpus[v].pcpu as usize;
            h.pcpus[p].rq.push_back(v as u32);
            h.pcpus[p].curr = None;
            self.perf.host.resched_at[p] = None;
            let t = env.now() + self.vm_exit_cost();
            self.host_switch(p, t, env);
        }
        Park::Halt
    }

    /// Explorer action `VcpuIoctl(v)`: a preempted vCPU is loaded and put again without entering
    /// the guest (a userspace ioctl on it, or a second preemption between `vcpu_load` and
    /// `record_steal_time`): `kvm_arch_vcpu_put` runs `set_preempted` once more.
    pub(crate) fn vcpu_ioctl_step<E: Env>(&mut self, v: CpuId, env: &mut E) -> Park {
        self.say(|| format!("vcpu_load + vcpu_put of vcpu{v} without entering the guest (ioctl)"));
        self.kvm_steal_time_set_preempted(v, env);
        Park::Halt
    }
}

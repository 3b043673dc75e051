//! What the host does to a vCPU agent, for each driver: the actions a vCPU thread offers the
//! explorer (host code of `vcpu_run`, preemption, ioctl puts) and the one the timed driver runs
//! when its clock comes up.

use crate::kvm::ThreadState;
use crate::machine::{Action, Machine};
use shootdown_engine::Time;
use shootdown_hw::CpuId;

impl Machine {
    /// The host's actions of vCPU `cpu` (explorer); false if the vCPU runs no guest code now, so
    /// no guest action of it is enabled either.
    pub(crate) fn vcpu_enabled(&self, cpu: CpuId, out: &mut Vec<Action>) -> bool {
        let h = self.host_ref();
        let v = &h.vcpus[cpu];
        let c = cpu as u32;
        if !v.stack.is_empty() {
            // The vCPU thread runs host code (`vcpu_run`), unless it is blocked.
            if v.thread != ThreadState::Blocked {
                out.push(Action::Step(c));
            }
            if v.thread == ThreadState::Runnable
                && h.cfg.ioctl_puts
                && self.vcpu_ioctl_would_change(cpu)
            {
                out.push(Action::VcpuIoctl(c));
            }
            return false;
        }
        if v.thread != ThreadState::Running {
            return false;
        }
        if self.host_may_preempt(cpu) {
            out.push(Action::VcpuPut(c));
        }
        true
    }

    /// The host's action for vCPU agent `agent` at `now` (timed driver), if the host acts
    /// rather than the guest: host code of `vcpu_run` (a no-op that parks the agent while its
    /// thread is not current on its pCPU), a blocked vCPU (parks too), or a preemption that is
    /// due.
    pub(crate) fn vcpu_timed_action(&self, agent: CpuId, now: Time) -> Option<Action> {
        let v = &self.host_ref().vcpus[agent];
        if !v.stack.is_empty() || v.thread != ThreadState::Running {
            return Some(Action::Step(agent as u32));
        }
        if self.host_preempt_due(agent, now) {
            return Some(Action::VcpuPut(agent as u32));
        }
        None
    }
}

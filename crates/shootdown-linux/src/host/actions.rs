//! What the host does to a vCPU agent, for each driver: the actions a vCPU thread offers the
//! explorer (host code of `vcpu_run`, preemption, ioctl puts, PLE exits) and the one the timed
//! driver runs when its clock comes up.

use crate::kvm::{Exit, ThreadState};
use crate::machine::{Action, Machine};
use shootdown_engine::{Env, Park, Time};
use shootdown_hw::CpuId;

impl Machine {
    /// The host's actions of vCPU `cpu` (explorer); false if the vCPU runs no guest code now, so
    /// no guest action of it is enabled either.
    pub(crate) fn vcpu_enabled(&self, cpu: CpuId, out: &mut Vec<Action>) -> bool {
        let h = self.host_ref();
        let v = &h.vcpus[cpu];
        let c = cpu as u32;
        if self.kick_deliverable(cpu) {
            out.push(Action::HostIrq(c));
        }
        if !v.stack.is_empty() {
            // The vCPU thread runs host code (`vcpu_run`), unless it waits; a blocked one (HLT)
            // is woken when an interrupt for its guest is pending: an IPI, or the reschedule
            // IPI of a wake-up that queued a task on its idle guest CPU (`kick_cpu` sends
            // none in the explorer).
            let runs = match v.thread {
                ThreadState::Blocked => {
                    self.cpus[cpu].ipi_pending || !self.cpus[cpu].runqueue.is_empty()
                }
                _ => !self.host_stack_blocked(cpu),
            };
            if runs {
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
        if self.ple_may_exit(cpu) {
            out.push(Action::PleExit(c));
        }
        true
    }

    /// The host's action for vCPU agent `agent` at `now` (timed driver), if the host acts
    /// rather than the guest: host code of `vcpu_run` (a no-op that parks the agent while its
    /// thread is not current on its pCPU), a blocked vCPU (parks too), or a preemption that is
    /// due.
    pub(crate) fn vcpu_timed_action(&self, agent: CpuId, now: Time) -> Option<Action> {
        let v = &self.host_ref().vcpus[agent];
        if self.kick_deliverable(agent) && now >= self.perf.cpu[agent].kick_arrival {
            return Some(Action::HostIrq(agent as u32));
        }
        if !v.stack.is_empty() || v.thread != ThreadState::Running {
            return Some(Action::Step(agent as u32));
        }
        if self.host_preempt_due(agent, now) {
            return Some(Action::VcpuPut(agent as u32));
        }
        if self.ple_exit_due(agent, now) {
            return Some(Action::PleExit(agent as u32));
        }
        None
    }

    /// The actions of host threads (explorer).
    pub(crate) fn host_threads_enabled(&self, out: &mut Vec<Action>) {
        let Some(h) = &self.host else { return };
        let n = self.cpus.len();
        for (t, th) in h.threads.iter().enumerate() {
            let a = n + t;
            if !self.host_thread_blocked(a) {
                out.push(Action::Step(a as u32));
            }
            if !th.sb.is_empty() {
                out.push(Action::Drain(a as u32));
            }
        }
    }

    /// Can a pending kick IPI to vCPU `v`'s pCPU be taken now: the vCPU runs guest code (the
    /// IPI exits it), or host code with interrupts enabled, or its thread is not running (the
    /// pCPU, idle or running another thread, takes it)?
    pub(crate) fn kick_deliverable(&self, v: CpuId) -> bool {
        let vc = &self.host_ref().vcpus[v];
        !vc.kicks.is_empty()
            && (vc.thread != ThreadState::Running || vc.stack.is_empty() || !vc.irqs_off)
    }

    /// Timed driver: vCPU agent `v`, which parks (spins, halts, or waits for its pCPU), is
    /// woken when a deliverable kick IPI on its way arrives. The wake its sender asked for may
    /// have been merged into an earlier one of this agent, which found the kick not yet
    /// arrived and stepped on (in host code: queued on `mmu_lock`, whose holder waits for this
    /// very kick in `kvm_make_all_cpus_request`).
    pub(crate) fn wake_for_kick<E: Env>(&self, v: CpuId, env: &mut E) {
        if env.timed() && v < self.cpus.len() && self.host.is_some() && self.kick_deliverable(v) {
            env.wake(v, self.perf.cpu[v].kick_arrival);
        }
    }

    /// Action `HostIrq(v)`: the kick IPI exits a vCPU in the guest (acknowledged once
    /// `vcpu_run` enables interrupts); on a vCPU thread in host code, or a pCPU the thread is
    /// not running on, `ack_flush` runs at once.
    pub(crate) fn host_irq<E: Env>(&mut self, v: CpuId, env: &mut E) -> Park {
        if self.vcpu_in_guest(v) {
            self.say(|| "kick IPI".into());
            self.vm_exit_to_kvm(v, Exit::Kick, env);
        } else {
            self.ack_kicks(v, env);
        }
        Park::Run
    }
}

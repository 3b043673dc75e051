//! Interrupt delivery (arch/x86/kernel/apic, kernel/smp.c's IPI side): sending the
//! CALL_FUNCTION IPI through the ICR, taking it (entering `call_function_interrupt`), and
//! kicking an idle CPU for a reschedule. In a guest, the ICR write and the injection exit to KVM
//! unless PV send-IPI / posted interrupts are on.

use crate::counters::Counter;
use crate::frame::Frame;
use crate::machine::Machine;
use crate::options::Idle;
use shootdown_engine::trace::TraceEvent;
use shootdown_engine::{Env, Park, Time};
use shootdown_hw::CpuId;

impl Machine {
    /// Take the pending CALL_FUNCTION IPI: enter `call_function_interrupt`
    /// (`smp_call_function_interrupt`: `ipi_entering_ack_irq()` then the queue). Only the entry
    /// (`irq_entry`, and `irq_user_entry` from user mode) is charged here; the exit comes after
    /// the handler has unlocked the csds, so a waiting initiator does not wait for it.
    pub(crate) fn take_interrupt<E: Env>(&mut self, cpu: CpuId, env: &mut E) -> Park {
        let from_user = env.timed() && !self.in_kernel_mode(cpu);
        let c = &mut self.cpus[cpu];
        c.ipi_pending = false;
        let was_halted = std::mem::replace(&mut c.halted, false);
        // The slice opens before the entry cost so that a profile counts it in the handler.
        if env.tracing() {
            for id in std::mem::take(&mut self.perf.ipi_flows[cpu]) {
                env.trace(TraceEvent::FlowIn {
                    agent: cpu,
                    id,
                    name: "CALL_FUNCTION IPI",
                });
            }
            env.trace(TraceEvent::Begin {
                agent: cpu,
                name: "call_function_interrupt",
                detail: None,
            });
        }
        if env.timed() {
            let t = self.irq_entry_time(from_user, was_halted);
            env.charge(t);
        }
        self.cpus[cpu]
            .irq_stack
            .push(Frame::CallFunctionIrq(crate::smp::CallFunctionIrq::new(
                from_user,
            )));
        Park::Run
    }

    /// Timed driver: the cost of taking an interrupt (entry up to the handler), from user mode
    /// or not, on a CPU that was halted or not; in a guest without APICv, with the exits that
    /// inject and acknowledge it.
    pub(crate) fn irq_entry_time(&mut self, from_user: bool, was_halted: bool) -> Time {
        let costs = &self.perf.profile.costs;
        let mut t = self.core_time(if from_user {
            costs.irq_entry + costs.irq_user_entry
        } else {
            costs.irq_entry
        });
        if was_halted && self.opts.idle == Idle::Halt {
            t += costs.idle_wakeup;
        }
        if self.host.is_some() && !self.opts.posted_interrupts {
            // Without APICv: the kick exit that injects the interrupt, and the EOI exit.
            t += Time(self.vm_exit_cost().0 * 2);
            self.perf
                .counters
                .add(crate::counters::Counter::KvmExits, 2);
        }
        t
    }

    /// Timed driver: the cost of returning from an interrupt handler (to user mode or not).
    pub(crate) fn irq_exit_time(&self, to_user: bool) -> Time {
        let c = &self.perf.profile.costs;
        self.core_time(if to_user {
            c.irq_exit + c.irq_user_exit
        } else {
            c.irq_exit
        })
    }

    /// An IPI's delivery latency from `src` to `dst` (by their pCPUs' distance): what
    /// CALL_FUNCTION IPIs, reschedule kicks and the host's IPIs all take to arrive.
    pub(crate) fn ipi_latency(&self, src: CpuId, dst: CpuId) -> Time {
        let c = &self.perf.profile.costs;
        match self.topo.distance(self.phys_cpu(src), self.phys_cpu(dst)) {
            shootdown_hw::Distance::CrossSocket => c.ipi_latency_cross_socket,
            _ => c.ipi_latency_same_socket,
        }
    }

    /// Send the CALL_FUNCTION IPI to `targets` (one ICR write, x2APIC cluster-style: the first
    /// target costs `ipi_send`, each further one `ipi_send_per_target`).
    pub(crate) fn send_call_function_ipi<E: Env>(
        &mut self,
        src: CpuId,
        targets: &[CpuId],
        env: &mut E,
    ) {
        if targets.is_empty() {
            return;
        }
        if env.timed() {
            let c = self.perf.profile.clone();
            let c = &c.costs;
            let k = targets.len() as u64;
            let send = if self.host.is_none() {
                c.ipi_send + Time(c.ipi_send_per_target.0 * (k - 1))
            } else if self.opts.pv_send_ipi {
                // One KVM_HC_SEND_IPI hypercall for the whole set.
                self.perf.counters.inc(crate::counters::Counter::KvmExits);
                self.vm_exit_cost() + c.ipi_send + Time(c.ipi_send_per_target.0 * (k - 1))
            } else {
                // x2APIC cluster mode in a guest without PV IPIs: one ICR write per cluster of
                // 16 logical CPUs among the targets, and every ICR write exits to KVM, which
                // then delivers to each destination.
                let mut clusters: Vec<usize> = targets.iter().map(|&t| t / 16).collect();
                clusters.dedup();
                let n = clusters.len() as u64;
                self.perf
                    .counters
                    .add(crate::counters::Counter::KvmExits, n);
                Time((self.vm_exit_cost().0 + c.ipi_send.0) * n + c.ipi_send_per_target.0 * (k - n))
            };
            env.charge(send);
        }
        // The ICR write completes at the end of the send cost charged above (and of whatever the
        // step charged before it): delivery latency is measured from there, never from the
        // start of the sending step.
        let sent = env.now() + env.elapsed();
        for &t in targets {
            self.perf.counters.inc(Counter::CallFunctionIpis);
            let already = std::mem::replace(&mut self.cpus[t].ipi_pending, true);
            if env.timed() {
                let lat = self.ipi_latency(src, t);
                // An IPI already pending (not yet taken) coalesces with this one: the
                // interrupt is taken at the earlier arrival.
                let mut arrival = sent + lat;
                if already {
                    arrival = arrival.min(self.perf.cpu[t].ipi_arrival);
                }
                self.perf.cpu[t].ipi_arrival = arrival;
                env.wake(t, arrival);
            }
            if env.tracing() {
                let id = self.perf.next_flow_id;
                self.perf.next_flow_id += 1;
                self.perf.ipi_flows[t].push(id);
                env.trace(TraceEvent::FlowOut {
                    agent: src,
                    id,
                    name: "CALL_FUNCTION IPI",
                });
            }
        }
        if self.opts.pv_sched_yield && self.host.is_some() {
            self.pv_sched_yield(src, targets, env);
        }
    }

    /// Wake a sleeping/halted CPU because work was queued for it (`resched_curr` /
    /// `wake_up_idle_cpu`).
    pub(crate) fn kick_cpu<E: Env>(&mut self, from: CpuId, cpu: CpuId, env: &mut E) {
        self.cpus[cpu].need_resched = true;
        if !env.timed() || cpu == from {
            return;
        }
        let c = &self.perf.profile.costs;
        // As for CALL_FUNCTION IPIs, the target notices from the end of what this step charged
        // (the store to `need_resched`, or the ICR write), not from the step's start.
        let at = if self.opts.idle == Idle::Poll {
            env.now() + env.elapsed() + c.poll_idle_notice
        } else {
            let lat = self.ipi_latency(from, cpu);
            env.charge(c.ipi_send);
            env.now() + env.elapsed() + lat + c.idle_wakeup + c.irq_entry + c.irq_exit
        };
        env.wake(cpu, at);
    }
}

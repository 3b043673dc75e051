//! The host's scheduling policy for vCPU threads (timed driver only, like the guest scheduler's
//! time slices; the explorer chooses preemptions freely).
//!
//! vCPU `i` of every VM is pinned to pCPU `i % pcpus`; each pCPU round-robins its runnable vCPU
//! threads with a time slice (`timeslice_us`), a woken (kicked) vCPU goes to the head of the
//! queue and preempts the running one if its vruntime is more than `wakeup_granularity_us`
//! behind (`wakeup_preemption`; CFS's vruntime is in [`crate::host::fair`]),
//! and an optional housekeeping task preempts whatever runs: sporadic host work arriving at
//! random (Poisson, mean interval `housekeeping_interval_us`) and running for an exponentially
//! distributed time (mean `housekeeping_run_us`, capped at ten times that). A vCPU agent runs
//! only while its thread is current on its pCPU; while descheduled it is parked and its clock
//! jumps to the moment it is picked again. A guest that halts (HLT exit) blocks its thread
//! (`kvm_vcpu_block`); an IPI to it kicks it awake. A guest booted with `idle=poll` never halts:
//! its idle vCPU keeps running (polling) in guest mode until the host preempts it, like a
//! busy-waiting one.

use crate::counters::Counter;
use crate::host::env::HostEnv;
use crate::kvm::ThreadState;
use crate::machine::{Action, Machine};
use crate::options::Idle;
use shootdown_engine::{Env, Model, Outcome, Park, Time};
use shootdown_hw::CpuId;

/// An exponentially distributed number with mean 1, from the run's random numbers.
fn exponential<E: Env>(env: &mut E) -> f64 {
    let u = (env.random(1 << 30) as f64 + 0.5) / (1u64 << 30) as f64;
    -u.ln()
}

impl Machine {
    /// The timed driver on a host: run the step with wake-ups collected, then let the host act
    /// on them ([`HostEnv`]), block a vCPU whose guest halted, and make sure a busy-waiting vCPU
    /// is preempted when its pCPU is wanted.
    pub(crate) fn apply_on_host<E: Env>(&mut self, a: Action, env: &mut E) -> Outcome {
        let v = self.agent_of(a);
        let now = env.now();
        // A guest step (not the host code of `vcpu_run`), and whether the vCPU was in the host.
        let guest = match a {
            Action::Step(_) => self.vcpu_in_guest(v),
            Action::Interrupt(_) | Action::Tick(_) => true,
            _ => false,
        };
        let entering = matches!(a, Action::Step(_)) && self.in_host_code(v);
        if self.shadow_step_waits(a) {
            // Shadow paging: the vCPU spins until `mmu_lock` is released (as the explorer's
            // `Machine::enabled` leaves the step out).
            self.perf.counters.inc(crate::Counter::KvmShadowLockWaits);
            let lock = crate::mem::Loc::MmuLock(self.vm_of(v) as u32);
            return Outcome {
                park: Park::SpinOn(crate::mem::spin_key(lock)),
                kind: shootdown_engine::StepKind::Shared,
                violation: None,
            };
        }
        let (out, charged, wakes) = {
            let mut henv = HostEnv {
                inner: &mut *env,
                charged: Time::ZERO,
                wakes: Vec::new(),
            };
            let out = self.apply_step(a, &mut henv);
            (out, henv.charged, henv.wakes)
        };
        let idle_poll = self.opts.idle == Idle::Poll;
        if guest && out.park == Park::Halt && self.perf.cpu[v].pv_waiting {
            // pv_wait: `kvm_wait`'s HLT (interrupts off): the thread blocks until a kick.
            self.host_block(v, now + charged, env);
        } else if guest
            && out.park == Park::Halt
            && self.vcpu_in_guest(v)
            && !(self.cpus[v].ipi_pending && self.irqs_enabled(v))
        {
            // Parked for interruptible work, the vCPU is running guest code, not halted.
            if idle_poll || self.is_busy(v) {
                // idle=poll: the guest's idle loop spins in guest mode and never executes HLT,
                // so the vCPU thread stays runnable and keeps its pCPU until the host wants it.
                if let Some(t) = self.host_next_preempt(v) {
                    env.wake_by(v, t);
                }
            } else {
                self.host_block(v, now + charged, env);
            }
        }
        if entering {
            // An IPI that waited for this vCPU's thread: how long, from its arrival to entry.
            if self.vcpu_in_guest(v) && self.cpus[v].ipi_pending {
                let waited = (now + charged).saturating_sub(self.perf.cpu[v].ipi_arrival);
                self.perf.counters.add(
                    Counter::PreemptedIpiWaitUs,
                    waited.as_us_f64().round() as u64,
                );
            }
        }
        for (w, at) in wakes {
            if w >= self.cpus.len() {
                env.wake(w, at);
                continue;
            }
            match self.host_ref().vcpus[w].thread {
                ThreadState::Running => env.wake(w, at),
                ThreadState::Runnable => {
                    if self.cpus[w].ipi_pending {
                        self.perf.counters.inc(Counter::IpisToPreemptedVcpus);
                    }
                }
                ThreadState::Blocked => self.host_kick(w, at, env),
            }
        }
        for (w, at) in std::mem::take(&mut self.perf.host.switched_in) {
            env.wake(w, at);
        }
        let spinning = |m: &Machine, out: &Outcome| {
            matches!(out.park, Park::Spin | Park::SpinOn(_)) && m.vcpu_in_guest(v)
        };
        if self.ple_enabled() && guest {
            if spinning(self, &out) {
                self.ple_on_spin(v, now + charged, env);
            } else {
                self.ple_loop_ended(v);
            }
        }
        if spinning(self, &out) {
            if let Some(t) = self.host_next_preempt(v) {
                env.wake_by(v, t);
            }
        }
        out
    }

    /// When pCPU `p`'s running thread has had its turn: after `timeslice_us`, or at CFS's tick
    /// (`tick_us` > 0).
    fn slice_due(&self, p: usize) -> Time {
        if self.host_ref().cfg.tick_us == 0 {
            self.perf.host.slice_end[p]
        } else {
            self.fair_tick_preempt_at(p)
        }
    }

    /// Should the host take the pCPU away from running vCPU `v` now?
    pub(crate) fn host_preempt_due(&self, v: CpuId, now: Time) -> bool {
        let h = self.host_ref();
        let p = h.vcpus[v].pcpu as usize;
        let hp = &self.perf.host;
        (now >= self.slice_due(p) && !h.pcpus[p].rq.is_empty())
            || now >= hp.next_hk[p]
            || hp.resched_at[p].is_some_and(|t| now >= t)
    }

    /// When the host will next want the pCPU of `v` (slice end with others waiting,
    /// housekeeping, pending wake-up preemption).
    pub(crate) fn host_next_preempt(&self, v: CpuId) -> Option<Time> {
        let h = self.host_ref();
        let p = h.vcpus[v].pcpu as usize;
        let hp = &self.perf.host;
        let mut t = hp.next_hk[p];
        if !h.pcpus[p].rq.is_empty() {
            t = t.min(self.slice_due(p));
        }
        if let Some(r) = hp.resched_at[p] {
            t = t.min(r);
        }
        (t != Time::MAX).then_some(t)
    }

    /// Queued vCPU thread `w` of pCPU `p` is the next to run there.
    pub(crate) fn host_queue_first(&mut self, p: usize, w: CpuId) {
        let rq = &mut self.host_mut().pcpus[p].rq;
        if let Some(i) = rq.iter().position(|&x| x as usize == w) {
            rq.remove(i);
            rq.push_front(w as u32);
        }
    }

    /// The host scheduler on pCPU `p` at time `t` (its current vCPU thread is gone): run the
    /// housekeeping task if it is due, then switch to the next runnable vCPU thread.
    pub(crate) fn host_switch<E: Env>(&mut self, p: usize, mut t: Time, env: &mut E) {
        let cfg_hk = self.host_ref().cfg.housekeeping_interval_us;
        if cfg_hk > 0 && t >= self.perf.host.next_hk[p] {
            // Sporadic host work: Poisson arrivals, exponentially distributed run times
            // (capped at ten times the mean).
            self.perf.counters.inc(Counter::HostHousekeeping);
            let run = self.host_ref().cfg.housekeeping_run_us as f64;
            t += Time::from_ns_f64(1000.0 * run * exponential(env).min(10.0));
            let gap = cfg_hk as f64 * exponential(env);
            self.perf.host.next_hk[p] = t + Time::from_ns_f64(1000.0 * gap);
        }
        t += self.perf.profile.costs.vcpu_context_switch;
        let slice = Time::from_us(self.host_ref().cfg.timeslice_us);
        let h = self.host_mut();
        match h.pcpus[p].rq.pop_front() {
            Some(w) => {
                // `w` stays Runnable until its thread really runs (at `t`): a kick before
                // that must not bring it in early.
                h.pcpus[p].curr = Some(w);
                self.ple_sched_in(w as usize);
                self.fair_sched_in(w as usize, t);
                let hp = &mut self.perf.host;
                hp.slice_start[p] = t;
                hp.slice_end[p] = t + slice;
                hp.resched_at[p] = None;
                hp.switched_in.push((w as usize, t));
            }
            None => h.pcpus[p].curr = None,
        }
    }

    /// The guest on `v` halted with nothing pending (HLT exit): its thread blocks in
    /// `kvm_vcpu_block` (marked preempted with `set_preempted = every_put`, as v4.16's
    /// `kvm_arch_vcpu_put` did) and the pCPU runs another vCPU thread.
    pub(crate) fn host_block<E: Env>(&mut self, v: CpuId, end: Time, env: &mut E) {
        let t = end + self.vm_exit_cost();
        let p = self.host_ref().vcpus[v].pcpu as usize;
        let polls = self.halt_poll_start(v, p, t, env);
        self.kvm_vcpu_block_put(v, !polls, env);
        if polls {
            // The thread polls on its pCPU (`halt_poll.rs`).
            return;
        }
        self.fair_sched_out(v, t);
        let h = self.host_mut();
        h.pcpus[p].curr = None;
        self.perf.host.resched_at[p] = None;
        self.host_switch(p, t, env);
    }

    /// `kvm_vcpu_kick` of a blocked vCPU (an IPI or a reschedule for its guest): wake its thread.
    /// On an idle pCPU it runs at once; otherwise it is placed (`place_entity`) and queued first
    /// in line and, with wake-up preemption, takes the pCPU at once if CFS's
    /// `check_preempt_wakeup` says so ([`Machine::fair_wakeup_preempts`]), else when the
    /// running thread's slice ends.
    pub(crate) fn host_kick<E: Env>(&mut self, w: CpuId, at: Time, env: &mut E) {
        if self.halt_polling(w) {
            self.halt_poll_success(w, at, env);
            return;
        }
        self.halt_poll_woken(w, at);
        self.fair_place(w, at);
        self.perf.counters.inc(Counter::VcpuWakeups);
        let wake_cost = self.perf.profile.costs.vcpu_wakeup;
        let slice = Time::from_us(self.host_ref().cfg.timeslice_us);
        let preempt = self.host_ref().cfg.wakeup_preemption;
        let p = self.host_ref().vcpus[w].pcpu as usize;
        let h = self.host_mut();
        match h.pcpus[p].curr {
            None => {
                h.pcpus[p].curr = Some(w as u32);
                h.vcpus[w].thread = ThreadState::Runnable;
                let t = at + wake_cost;
                let hp = &mut self.perf.host;
                hp.slice_start[p] = t;
                hp.slice_end[p] = t + slice;
                hp.switched_in.push((w, t));
                self.ple_sched_in(w);
                self.fair_sched_in(w, t);
            }
            Some(u) => {
                h.vcpus[w].thread = ThreadState::Runnable;
                h.pcpus[p].rq.push_front(w as u32);
                if self.halt_polling(u as usize) {
                    // `single_task_running()` fails: the polling thread sleeps, this one runs.
                    self.halt_poll_give_up(u as usize, p, at, env);
                } else if preempt && self.fair_wakeup_preempts(u as usize, w, at) {
                    self.host_resched_curr(p, at, env);
                }
            }
        }
    }

    /// `resched_curr()` of pCPU `p` taking effect at `when`: its running thread is preempted
    /// for the one first in its queue (a polling one stops polling).
    pub(crate) fn host_resched_curr<E: Env>(&mut self, p: usize, when: Time, env: &mut E) {
        let h = self.host_ref();
        let Some(u) = h.pcpus[p].curr else { return };
        if self.halt_polling(u as usize) {
            // A thread waits: `single_task_running()` ends the poll.
            self.halt_poll_give_up(u as usize, p, when, env);
            return;
        }
        let running = h.vcpus[u as usize].in_guest();
        let hp = &mut self.perf.host;
        let r = hp.resched_at[p].map_or(when, |r| r.min(when));
        hp.resched_at[p] = Some(r);
        // A vCPU still switching in sees the request at its first guest step.
        if running {
            env.wake(u as usize, r);
        }
    }
}

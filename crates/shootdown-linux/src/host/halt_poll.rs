//! Halt-polling (`kvm_vcpu_block`, virt/kvm/kvm_main.c, v4.15; docs/design/overcommit.md §5),
//! timed driver only like the rest of the host's scheduling policy.
//!
//! A vCPU that halts (a HLT exit: an idle guest, or a PV spinlock waiter in `pv_wait`) does not
//! give its pCPU away at once when its own poll time `vcpu->halt_poll_ns` is non-zero: its
//! thread polls for a wake-up for up to that long, *while it is the only runnable thread on its
//! pCPU* (`single_task_running()`). A kick meanwhile (an interrupt for the guest, a PV unhalt)
//! ends the poll: the vCPU enters the guest again with no wake-up and no context switch
//! (`halt_successful_poll`). A poll that runs out, or that another thread interrupts, blocks
//! the thread as before. After each halt the poll time adapts to how long the halt lasted
//! (`block_ns`): kept if the halt fit in it; shrunk (`halt_poll_ns_shrink`, v4.15's 0 = reset)
//! after a halt longer than `halt_poll_ns`; grown (10 us, then × `halt_poll_ns_grow`, at most
//! `halt_poll_ns`) after a halt shorter than `halt_poll_ns` that the poll did not cover.
//!
//! Simplified: the polling loop's own cost is the thread keeping its pCPU (nothing else is
//! charged); a housekeeping run does not cut a poll short; the guest-side `cpuidle-haltpoll`
//! (v5.4) and `KVM_FEATURE_POLL_CONTROL` are not modelled.

use crate::counters::Counter;
use crate::machine::Machine;
use shootdown_engine::trace::TraceEvent;
use shootdown_engine::{Env, Time};
use shootdown_hw::CpuId;

impl Machine {
    /// `kvm_vcpu_block` of vCPU `v`, halted at `t` (its exit done): poll on its pCPU `p`, or
    /// not. True if its thread polls (it keeps the pCPU until a kick or `poll_until`).
    pub(crate) fn halt_poll_start<E: Env>(
        &mut self,
        v: CpuId,
        p: usize,
        t: Time,
        env: &mut E,
    ) -> bool {
        self.perf.host.halt_start[v] = t;
        let poll = self.perf.host.halt_poll[v];
        if poll == 0 || !self.host_ref().pcpus[p].rq.is_empty() {
            return false;
        }
        self.perf.counters.inc(Counter::HaltAttemptedPoll);
        let until = t + Time::from_ns(poll);
        self.perf.host.poll_until[v] = until;
        // Its agent runs at the deadline to end the poll (wake_by: a stale deadline never
        // holds back a spinner).
        env.wake_by(v, until);
        true
    }

    /// Is vCPU `v`'s thread polling in `kvm_vcpu_block`?
    pub(crate) fn halt_polling(&self, v: CpuId) -> bool {
        self.perf
            .host
            .poll_until
            .get(v)
            .is_some_and(|&u| u != Time::MAX)
    }

    /// A polling vCPU `v` is kicked at `at`: the poll succeeds; it runs on from there.
    pub(crate) fn halt_poll_success<E: Env>(&mut self, v: CpuId, at: Time, env: &mut E) {
        self.perf.counters.inc(Counter::HaltSuccessfulPoll);
        self.perf.host.poll_until[v] = Time::MAX;
        let resume = at.max(self.perf.host.halt_start[v]);
        self.halt_poll_woken(v, resume);
        self.host_mut().vcpus[v].thread = crate::kvm::ThreadState::Runnable;
        self.perf.host.switched_in.push((v, resume));
        if env.tracing() {
            env.trace(TraceEvent::Instant {
                agent: v,
                name: "halt_poll",
                detail: Some("successful poll".into()),
            });
        }
    }

    /// The poll of vCPU `v` on pCPU `p` ends at `t` without a kick (ran out, or another thread
    /// wants the pCPU): the thread sleeps and the pCPU runs whoever waits.
    pub(crate) fn halt_poll_give_up<E: Env>(&mut self, v: CpuId, p: usize, t: Time, env: &mut E) {
        self.perf.host.poll_until[v] = Time::MAX;
        // schedule() switches the thread out: `kvm_arch_vcpu_put` now.
        if self.opts.set_preempted == crate::options::SetPreempted::EveryPut {
            self.kvm_steal_time_set_preempted(v, env);
        }
        self.fair_sched_out(v, t);
        self.host_mut().pcpus[p].curr = None;
        self.perf.host.resched_at[p] = None;
        self.host_switch(p, t, env);
    }

    /// A blocked (not polling) vCPU `v` is woken at `at`: adapt its poll time to the halt.
    pub(crate) fn halt_poll_woken(&mut self, v: CpuId, at: Time) {
        let start = self.perf.host.halt_start[v];
        self.halt_poll_adapt(v, at.saturating_sub(start));
    }

    /// The poll-time update at the end of `kvm_vcpu_block`, from the halt's length.
    fn halt_poll_adapt(&mut self, v: CpuId, block: Time) {
        let cfg = &self.host_ref().cfg;
        let (max, grow, shrink) = (
            cfg.halt_poll_ns,
            cfg.halt_poll_ns_grow,
            cfg.halt_poll_ns_shrink,
        );
        let val = self.perf.host.halt_poll[v];
        let block = block.as_ns_f64() as u64;
        self.perf.host.halt_poll[v] = if max == 0 {
            0
        } else if block <= val {
            val
        } else if val > 0 && block > max {
            // shrink_halt_poll_ns: a divisor of 0 resets it.
            val.checked_div(shrink).unwrap_or(0)
        } else if val < max && block < max {
            // grow_halt_poll_ns: the first step is 10 us.
            if val == 0 && grow > 0 {
                10_000
            } else {
                val * grow
            }
            .min(max)
        } else {
            val
        };
    }
}

//! Pause-loop exiting and directed yield on the host. The exit is one action, `PleExit`, in
//! both drivers ([`Machine::ple_exit_step`]); the windows, the scan's memory and the run queues
//! are the timed driver's policy (the explorer takes an exit whenever a spinning vCPU has a
//! preempted candidate, and preempts vCPUs freely, which covers every yield's outcome).
//!
//! Models VMX's PAUSE-loop exit and what KVM does with it at v4.15 (docs/design/overcommit.md
//! §2–§3):
//!
//! * **The exit** (`handle_pause`, arch/x86/kvm/vmx.c): a vCPU that busy-waits in guest kernel
//!   code (the model's spinning steps: `csd_lock_wait`, a spinlock, the PV flush wait) for
//!   longer than its window exits. `grow_ple_window` then multiplies the window by
//!   `ple_window_grow` (or adds it, if it is not below `ple_window`) up to `ple_window_max`;
//!   `shrink_ple_window` at the next sched-in resets it (`ple_window_shrink = 0`) or divides it.
//! * **The yield** (`kvm_vcpu_on_spin`, virt/kvm/kvm_main.c): the VM's other vCPUs are scanned
//!   from the one after `last_boosted_vcpu`, wrapping around once; the first whose thread was
//!   preempted (runnable, not halted) — and, with `yield_to_kernel_mode`, preempted in guest
//!   kernel mode — is boosted with `yield_to`. The scan does not know whom the spinner waits
//!   for.
//! * **`yield_to`** (kernel/sched/core.c, CFS's `yield_to_task_fair`): the target becomes its
//!   run queue's next buddy and that pCPU is rescheduled (an IPI); the yielder becomes the skip
//!   buddy of its own run queue and calls `schedule()`. `pick_next_entity` honours either
//!   buddy only within `wakeup_gran` of the leftmost thread's vruntime ([`crate::host::fair`]):
//!   the target runs when the reschedule IPI lands (one `ipi_latency_same_socket`) if it is
//!   not too far ahead, and the yielder gives up its pCPU to a waiting thread not too far
//!   ahead of it, and keeps spinning otherwise.
//!
//! Simplified: `kvm_vcpu_eligible_for_directed_yield`'s alternation for vCPUs that were
//! themselves spinning is left out (every candidate is eligible); the `-ESRCH` budget never
//! matters, since a preempted candidate always shares its pCPU with a running thread. The exit
//! is priced as one `vm_exit_entry`, the scan and the yield as a `vcpu_context_switch` when the
//! yielder gives up its pCPU (which `host_switch` charges).
//!
//! Whether the CPU recognises the guest's loop at all depends on how far apart its PAUSEs are
//! against `ple_gap` (Skylake-SP's PAUSE takes about 140 cycles, against the default gap of
//! 128 ticks; nothing read says how the CPU counts it): assumed recognised when `ple_gap > 0`.

use crate::counters::Counter;
use crate::frame::Frame;
use crate::kvm::{Exit, ThreadState, VcpuRun};
use crate::machine::Machine;
use shootdown_engine::trace::TraceEvent;
use shootdown_engine::{Env, Park, Time};
use shootdown_hw::CpuId;

impl Machine {
    /// Pause-loop exiting is on for this host.
    pub(crate) fn ple_enabled(&self) -> bool {
        self.host.as_deref().is_some_and(|h| h.cfg.ple_gap > 0)
    }

    /// The vCPU's window as a time, from its TSC ticks.
    fn ple_window_time(&self, v: CpuId) -> Time {
        let mhz = self.host_ref().cfg.tsc_mhz as f64;
        Time::from_ns_f64(self.perf.host.ple_window[v] as f64 * 1000.0 / mhz)
    }

    /// A vCPU thread was scheduled in (`kvm_sched_in` → `vmx_sched_in` → `shrink_ple_window`).
    pub(crate) fn ple_sched_in(&mut self, v: CpuId) {
        if !self.ple_enabled() {
            return;
        }
        let cfg = &self.host_ref().cfg;
        let (base, shrink) = (cfg.ple_window, cfg.ple_window_shrink);
        let w = &mut self.perf.host.ple_window[v];
        *w = if shrink == 0 {
            base
        } else if shrink < base {
            (*w / shrink).max(base)
        } else {
            w.saturating_sub(shrink).max(base)
        };
        self.perf.host.ple_due[v] = Time::MAX;
    }

    /// `grow_ple_window` on a PLE exit.
    fn ple_grow(&mut self, v: CpuId) {
        let cfg = &self.host_ref().cfg;
        let (base, grow, max) = (cfg.ple_window, cfg.ple_window_grow, cfg.ple_window_max);
        let w = &mut self.perf.host.ple_window[v];
        *w = if grow == 0 {
            base
        } else if grow < base {
            w.saturating_mul(grow)
        } else {
            w.saturating_add(grow)
        }
        .min(max);
    }

    /// After a guest step of vCPU `v` that ended spinning in guest mode at `end`: start its
    /// PAUSE loop's window if it just began. The agent is woken when the window runs out, and
    /// then takes the exit ([`Machine::ple_exit_due`]).
    pub(crate) fn ple_on_spin<E: Env>(&mut self, v: CpuId, end: Time, env: &mut E) {
        if !self.in_kernel_mode(v) {
            // User-mode spins never exit: VMX ignores PAUSE loops at CPL > 0.
            return;
        }
        let due = self.perf.host.ple_due[v];
        let due = if due == Time::MAX {
            let at = end + self.ple_window_time(v);
            self.perf.host.ple_due[v] = at;
            at
        } else {
            due
        };
        env.wake_by(v, due);
    }

    /// The guest on `v` stopped spinning: its next PAUSE loop starts a new window.
    #[inline]
    pub(crate) fn ple_loop_ended(&mut self, v: CpuId) {
        if let Some(d) = self.perf.host.ple_due.get_mut(v) {
            *d = Time::MAX;
        }
    }

    /// Timed driver: has running vCPU `v`'s PAUSE loop outlasted its window by `now`, with the
    /// guest still only spinning? Then it takes `PleExit(v)`.
    pub(crate) fn ple_exit_due(&self, v: CpuId, now: Time) -> bool {
        self.perf.host.ple_due.get(v).is_some_and(|&d| now >= d) && self.spins_in_guest(v)
    }

    /// The vCPU's guest spins (a PAUSE loop): its next step only waits, and not inside a
    /// hypercall (Shoot4U's waits run in the host).
    fn spins_in_guest(&self, v: CpuId) -> bool {
        self.step_blocked(v)
            && !matches!(
                self.top_frame(v),
                Some(Frame::Shoot4u(_) | Frame::MakeAllCpusRequest(_))
            )
    }

    /// Explorer: may running vCPU `v` take a PLE exit now? Its guest only spins, in kernel
    /// mode, and `kvm_vcpu_on_spin` has a candidate. (The explorer has no windows: any spin may
    /// outlast its window; and every preempted vCPU counts as a candidate, since whether it
    /// was preempted in kernel mode is timed-driver state.)
    pub(crate) fn ple_may_exit(&self, v: CpuId) -> bool {
        self.ple_enabled()
            && self.in_kernel_mode(v)
            && self.spins_in_guest(v)
            && self.ple_candidate(v, false).is_some()
    }

    /// Action `PleExit(v)`, both drivers: the PAUSE loop of vCPU `v` ran out its window.
    /// `handle_pause` grows the window and calls `kvm_vcpu_on_spin`, whose `yield_to` boosts
    /// the candidate; the yielder's `schedule()` then switches to another thread waiting for
    /// its pCPU (the timed driver's run queue says whether there is one; in the explorer that
    /// outcome is `VcpuPut`, and this action is the other), or returns and the vCPU goes back
    /// into the guest (with a KVM MMU, through the rest of `vcpu_run`: the requests and the
    /// entry handshake).
    ///
    /// Simplified: the scan and the yield run in the exit's step, before `vcpu_run` stores
    /// `OUTSIDE_GUEST_MODE`; they touch nothing the guest or the other vCPUs read. With the
    /// `ple_yield_marks_preempted` mutant, the yielder is marked preempted in its steal-time
    /// area before it yields, whether or not it then gives up its pCPU.
    pub(crate) fn ple_exit_step<E: Env>(&mut self, v: CpuId, env: &mut E) -> Park {
        self.fence(v);
        self.suspend_busy(v, env.now());
        self.vm_exit(env);
        self.perf.counters.inc(Counter::PleExits);
        self.perf.host.ple_due[v] = Time::MAX;
        if env.timed() {
            self.ple_grow(v);
        }
        self.say(|| format!("PLE exit (vcpu{v}): handle_pause"));
        if self.opts.mutants.ple_yield_marks_preempted() {
            self.kvm_steal_time_set_preempted(v, env);
        }
        let target = self.ple_candidate(v, env.timed());
        if env.tracing() {
            env.trace(TraceEvent::Instant {
                agent: v,
                name: "pause_loop_exit",
                detail: Some(match target {
                    Some(w) => format!("directed yield to vcpu{w}"),
                    None => "no candidate".into(),
                }),
            });
        }
        let gives_up = match target {
            None => {
                self.perf.counters.inc(Counter::PleNoCandidate);
                self.say(|| "kvm_vcpu_on_spin finds no candidate".into());
                false
            }
            Some(w) => {
                self.perf.counters.inc(Counter::DirectedYields);
                if env.timed() {
                    let vm = self.host_ref().vcpus[v].vm as usize;
                    let first = self.host_ref().vm_cpus(vm).start;
                    self.perf.host.last_boosted[vm] = w - first;
                }
                // yield_task_fair + schedule(): the yielder runs on if it is alone on its pCPU,
                // or if CFS finds the others too far ahead of it.
                let gives_up = env.timed() && {
                    let at = env.now() + env.elapsed();
                    self.yield_to_boost(w, at, env);
                    self.fair_yield_switch(v, at).is_some()
                };
                self.say(|| {
                    format!(
                        "kvm_vcpu_on_spin yields to vcpu{w}; schedule() {}",
                        if gives_up { "switches away" } else { "returns" }
                    )
                });
                gives_up
            }
        };
        if gives_up {
            return self.kvm_sched_out(v, env);
        }
        if self.has_kvm_mmu(v) {
            self.push_host_frame(v, VcpuRun::exited(Exit::Pause), env);
        }
        Park::Run
    }

    /// `kvm_vcpu_on_spin`'s scan: the first eligible preempted vCPU of `v`'s VM after the last
    /// one boosted (wrapping around once). `in_kernel`: apply `yield_to_kernel_mode` (the
    /// timed driver knows where each vCPU was preempted).
    fn ple_candidate(&self, v: CpuId, in_kernel: bool) -> Option<CpuId> {
        let h = self.host_ref();
        let vm = h.vcpus[v].vm as usize;
        let cpus = h.vm_cpus(vm);
        let kernel_only = in_kernel && h.cfg.yield_to_kernel_mode;
        let n = cpus.len();
        let last = self.perf.host.last_boosted.get(vm).copied().unwrap_or(0);
        (1..=n).map(|k| cpus.start + (last + k) % n).find(|&w| {
            w != v
                && h.vcpus[w].thread == ThreadState::Runnable
                && (!kernel_only || self.perf.host.preempted_in_kernel[w])
        })
    }

    /// `yield_to(target)` on the target's side: it becomes the next buddy of its pCPU's run
    /// queue, and that pCPU is rescheduled at once (`resched_curr(p_rq)`, an IPI away when it
    /// is another pCPU); "pick_next_entity takes care of fairness": the target runs only if
    /// its vruntime is not too far past the leftmost's, which runs otherwise
    /// ([`Machine::fair_pick_with_next_buddy`]).
    fn yield_to_boost<E: Env>(&mut self, w: CpuId, at: Time, env: &mut E) {
        let pick = self.fair_pick_with_next_buddy(w, at);
        if pick != w {
            self.perf.counters.inc(Counter::YieldBuddyUnfair);
        }
        let h = self.host_mut();
        let q = h.vcpus[w].pcpu as usize;
        if h.pcpus[q].curr == Some(pick as u32) {
            // The pick holds the pCPU already (the leftmost runs on, or the target is being
            // switched in): nothing to reschedule.
            return;
        }
        self.host_queue_first(q, pick);
        let lat = self.perf.profile.costs.ipi_latency_same_socket;
        self.host_resched_curr(q, at + lat, env);
    }

    /// `kvm_sched_yield` (arch/x86/kvm/x86.c, v5.3): the hypercall of vCPU `v` naming vCPU `t`.
    /// If `t`'s thread is ready (preempted: runnable, not blocked), `kvm_vcpu_yield_to` boosts it
    /// as a directed yield does, and `v` gives up its pCPU at once if another thread waits
    /// there; otherwise nothing happens.
    pub(crate) fn kvm_sched_yield<E: Env>(&mut self, v: CpuId, t: CpuId, env: &mut E) {
        if self.host_ref().vcpus[t].thread != ThreadState::Runnable {
            return;
        }
        self.perf.counters.inc(Counter::PvSchedYieldTo);
        let at = env.now() + env.elapsed();
        self.yield_to_boost(t, at, env);
        let p = self.host_ref().vcpus[v].pcpu as usize;
        if self.fair_yield_switch(v, at).is_some() {
            // yield_task_fair + schedule(): preempted at the end of this step.
            let r = &mut self.perf.host.resched_at[p];
            *r = Some(r.map_or(at, |r| r.min(at)));
        }
    }
}

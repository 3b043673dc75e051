//! Interruptible work: user code, exception and syscall entry, a writeback's cache flushes —
//! work a CPU does with interrupts enabled and that publishes nothing when it ends. The timed
//! driver parks the CPU for it instead of folding it into one step, so an IPI arriving meanwhile
//! is taken at its arrival and the rest of the work resumes after the handler (see
//! [`crate::perf::Busy`]). Explorer runs never charge it.

use crate::machine::{Action, Machine};
use shootdown_engine::{Env, Park, Time};
use shootdown_hw::CpuId;

impl Machine {
    /// Like [`Machine::charge`], for interruptible work of `cpu`'s running step (see [`Busy`]).
    pub(crate) fn charge_interruptible<E: Env>(
        &mut self,
        env: &mut E,
        cpu: CpuId,
        t: impl Fn(&shootdown_hw::profile::Costs) -> Time,
    ) {
        if env.timed() {
            let cost = self.core_time(t(&self.perf.profile.costs));
            self.perf.cpu[cpu].busy.pending += cost;
        }
    }

    /// The CPU (a vCPU the host deschedules) stops its interruptible work now; the rest is
    /// resumed when it next runs with an empty interrupt stack.
    pub(crate) fn suspend_busy(&mut self, cpu: CpuId, now: Time) {
        let b = &mut self.perf.cpu[cpu].busy;
        if b.until > now {
            b.left += b.until - now;
        }
        b.until = Time::ZERO;
    }

    /// Parked for interruptible work (not halted, not spinning).
    pub(crate) fn is_busy(&self, cpu: CpuId) -> bool {
        self.perf.cpu[cpu].busy.until > Time::ZERO
    }

    /// Timed driver: before `a` runs, account for interruptible work in progress. An interrupt
    /// cuts the work off (the rest is resumed after the handler); a step woken before the work
    /// ends, or the first step after a handler, parks for what is left (`Some` = a no-op step).
    /// That work was priced when charged: the step keeps its SMT stretch.
    pub(crate) fn busy_before<E: Env>(&mut self, a: Action, env: &mut E) -> Option<()> {
        let now = env.now();
        match a {
            Action::Interrupt(c) | Action::Nmi(c) | Action::Tick(c) => {
                self.suspend_busy(c as usize, now);
                None
            }
            Action::Step(c) => {
                let c = c as usize;
                let irq_idle = self.cpus[c].irq_stack.is_empty();
                let b = &mut self.perf.cpu[c].busy;
                let resumed = if b.until > now {
                    b.pending = b.until - now;
                    true
                } else if irq_idle && b.left > Time::ZERO {
                    b.pending = std::mem::take(&mut b.left);
                    true
                } else {
                    false
                };
                b.until = Time::ZERO;
                if resumed {
                    self.perf.core_scale_permille = b.scale.max(1000);
                    return Some(());
                }
                None
            }
            _ => None,
        }
    }

    /// Timed driver: after a step, turn the interruptible work it charged into a park until the
    /// work ends (only if the CPU goes on running with interrupts enabled; else it is charged).
    pub(crate) fn busy_after<E: Env>(&mut self, a: Action, park: Park, env: &mut E) -> Park {
        let (Action::Step(c) | Action::Interrupt(c)) = a else {
            return park;
        };
        let c = c as usize;
        let pending = std::mem::take(&mut self.perf.cpu[c].busy.pending);
        if pending == Time::ZERO {
            return park;
        }
        if park == Park::Run && self.irqs_enabled(c) {
            let until = env.now() + env.elapsed() + pending;
            self.perf.cpu[c].busy.until = until;
            self.perf.cpu[c].busy.scale = self.perf.core_scale_permille;
            env.wake(c, until);
            self.wake_for_nmi(c, env);
            self.wake_for_tick(c, env);
            Park::Halt
        } else {
            env.charge(pending);
            park
        }
    }
}

//! Hyper-threads sharing a core: core-bound work runs slower while the SMT sibling executes.
//!
//! Two logical CPUs of one core share its execution units, so each runs core-bound work slower
//! than it would alone; together they still do more than one thread (Intel's Hyper-Threading
//! brief: "up to 30 %"). The profile's `features.smt_slowdown` is how much longer a CPU's
//! core-bound work takes while a sibling executes. Which costs are core-bound: the profile's
//! fixed costs charged with [`Machine::charge`] and [`Machine::charge_interruptible`] (kernel
//! paths, user work, INVLPG, atomics). Not stretched: cache-line transfers
//! ([`Machine::touch_line`]), IPI latency, C-state exits, VM exits.
//!
//! A sibling *executes* after a step that leaves it running a task or a handler, or parked for
//! interruptible work; an idle CPU (HLT, or the `idle=poll` loop) and a busy-waiting one (a
//! `cpu_relax()` loop issues few instructions) do not slow its sibling. The sibling's state
//! when a step starts prices that step's own costs; a CPU parked for long interruptible work
//! has the rest of it repriced whenever a sibling starts or stops executing.
//!
//! Not modelled in guests (a machine with a host): a vCPU's sibling is another pCPU's thread,
//! whose activity is the host's. Not modelled either: how the core's share is split (both
//! siblings slow down alike), and memory bandwidth, which `smt_slowdown` lumps in.

use crate::machine::Machine;
use shootdown_engine::{Env, Park, Time};
use shootdown_hw::{CpuId, Topology};

impl Machine {
    /// Core-bound work of the running step: `t` stretched while an SMT sibling executes.
    pub(crate) fn core_time(&self, t: Time) -> Time {
        stretch(t, self.perf.core_scale_permille)
    }

    /// How much `cpu`'s core-bound work stretches now, in thousandths: the profile's
    /// `smt_slowdown` if an SMT sibling of `cpu` executes, else 1000.
    pub(crate) fn smt_core_scale(&self, cpu: CpuId) -> u32 {
        let (core, thread) = (self.topo.core_of(cpu), self.topo.thread_of(cpu));
        if self.smt_priced() && self.perf.core_executing[core] & !(1 << thread) != 0 {
            self.perf.profile.features.smt_slowdown_permille
        } else {
            1000
        }
    }

    /// Whether this machine prices SMT sharing at all: a slowdown in the profile, CPUs with
    /// siblings, and no host (see the module documentation).
    fn smt_priced(&self) -> bool {
        self.perf.profile.features.smt_slowdown_permille != 1000
            && self.host.is_none()
            && self.topo.threads_per_core > 1
    }

    /// After a timed step of `cpu` that parked it with `park`: record whether it now executes;
    /// if that changed, reprice what is left of its siblings' parked interruptible work.
    /// (Inlined into every timed step: usually nothing changed.)
    #[inline(always)]
    pub(crate) fn smt_after_step<E: Env>(&mut self, cpu: CpuId, park: Park, env: &mut E) {
        if !self.smt_priced() {
            return;
        }
        let executing = match park {
            Park::Run => true,
            Park::Halt => self.is_busy(cpu),
            Park::Spin | Park::SpinOn(_) | Park::Done => false,
        };
        let (core, bit) = (self.topo.core_of(cpu), 1 << self.topo.thread_of(cpu));
        if executing == (self.perf.core_executing[core] & bit != 0) {
            return;
        }
        self.perf.core_executing[core] ^= bit;
        self.smt_reprice_siblings(cpu, env);
    }

    /// `cpu` started or stopped executing: its siblings' parked work stretches anew.
    #[inline(never)]
    fn smt_reprice_siblings<E: Env>(&mut self, cpu: CpuId, env: &mut E) {
        let now = env.now() + env.elapsed();
        for s in siblings(&self.topo, cpu) {
            let b = self.perf.cpu[s].busy;
            if b.until <= now {
                continue;
            }
            let (old, new) = (b.scale.max(1000), self.smt_core_scale(s));
            if old == new {
                continue;
            }
            // The work left, in unstretched time, at the new stretch.
            let left = Time((b.until - now).0 * 1000 / old as u64);
            let until = now + stretch(left, new);
            let b = &mut self.perf.cpu[s].busy;
            b.until = until;
            b.scale = new;
            // Earlier: wake it then. Later: it wakes at the old time and parks for the rest.
            env.wake(s, until);
        }
    }
}

/// The other logical CPUs of `cpu`'s core (Linux numbering: all cores' first threads, then the
/// second threads, so a sibling is `core + t * nr_cores`).
fn siblings(topo: &Topology, cpu: CpuId) -> impl Iterator<Item = CpuId> {
    let (cores, core) = (topo.nr_cores(), topo.core_of(cpu));
    (0..topo.threads_per_core)
        .map(move |t| core + t * cores)
        .filter(move |&s| s != cpu)
}

fn stretch(t: Time, permille: u32) -> Time {
    match permille {
        1000 => t,
        k => Time(t.0 * k as u64 / 1000),
    }
}

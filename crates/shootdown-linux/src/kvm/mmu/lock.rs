//! `kvm->mmu_lock` (a spinlock in v5.x: a queued spinlock, modelled as the FIFO ticket lock it
//! behaves like) and the oracle's rule for releasing it (kernel-model.md §4.7 K1): a flush owed
//! for SPTEs zapped under the lock is done before the lock is dropped, by `spin_unlock` or by a
//! lock break (`cond_resched_lock`). Otherwise another thread may find the SPTE already gone,
//! conclude no flush is needed, and let the host free the page while a vCPU still caches it.

use crate::frame::Flow;
use crate::machine::Machine;
use crate::mem::{spin_key, Loc};
use shootdown_engine::Env;

impl Machine {
    /// `spin_lock(&kvm->mmu_lock)` by agent `me`: take a ticket the first time (a locked
    /// `fetch_add`), then wait until it is served. `Some(spin)` while waiting; `ticket` keeps the
    /// ticket in the caller's frame.
    pub(crate) fn mmu_lock_acquire<E: Env>(
        &mut self,
        me: usize,
        ticket: &mut Option<u64>,
        env: &mut E,
    ) -> Option<Flow> {
        let vm = self.vm_of(me) as u32;
        let (t, first) = match *ticket {
            Some(t) => (t, false),
            None => {
                let t = self.rmw(env, me, Loc::MmuLockNext(vm), |n| n + 1);
                *ticket = Some(t);
                (t, true)
            }
        };
        if self.load(env, me, Loc::MmuLockOwner(vm)) != t {
            if first {
                self.perf
                    .counters
                    .inc(crate::counters::Counter::KvmMmuLockContended);
            }
            self.say(|| "spin_lock(&kvm->mmu_lock): held, wait".into());
            return Some(Flow::Spin(spin_key(Loc::MmuLockOwner(vm))));
        }
        self.say(|| "spin_lock(&kvm->mmu_lock)".into());
        None
    }

    /// Would `me`, holding `ticket`, only wait for `mmu_lock`?
    pub(crate) fn mmu_lock_waits(&self, me: usize, ticket: Option<u64>) -> bool {
        let Some(t) = ticket else { return false };
        let loc = Loc::MmuLockOwner(self.vm_of(me) as u32);
        self.sb(me)
            .forward(loc)
            .unwrap_or_else(|| self.raw_read(loc))
            != t
    }

    /// `spin_unlock(&kvm->mmu_lock)` (a release store serving the next ticket), after the
    /// oracle's check that no flush is owed.
    pub(crate) fn mmu_lock_release<E: Env>(&mut self, me: usize, env: &mut E) {
        let vm = self.vm_of(me);
        self.check_flush_owed(vm);
        let owner = self.load(env, me, Loc::MmuLockOwner(vm as u32));
        self.store(env, me, Loc::MmuLockOwner(vm as u32), owner + 1);
    }

    /// `spin_needbreak(&kvm->mmu_lock)`: another agent holds a ticket.
    pub(crate) fn mmu_lock_contended<E: Env>(&mut self, me: usize, env: &mut E) -> bool {
        let vm = self.vm_of(me) as u32;
        let next = self.load(env, me, Loc::MmuLockNext(vm));
        let owner = self.load(env, me, Loc::MmuLockOwner(vm));
        next > owner + 1
    }
}

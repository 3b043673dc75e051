//! `kvm->mmu_lock` (a spinlock in v5.x) and the oracle's rule for releasing it
//! (docs/design/kernel-model.md §4.7 K1): a flush owed for SPTEs zapped under the lock is done before the
//! lock is dropped, by `spin_unlock` or by a lock break (`cond_resched_lock`). Otherwise another
//! thread may find the SPTE already gone, conclude no flush is needed, and let the host free the
//! page while a vCPU still caches it.
//!
//! The lock is x86's queued spinlock (`kernel/locking/qspinlock.c`), reduced to what orders its
//! waiters: the lock word (`Loc::MmuLock`: the holder + 1, or 0) and the MCS queue of waiters
//! (`QueuedSpinlock::queue`). `queued_spin_lock` takes a free lock with one `cmpxchg` only when
//! nobody queues; otherwise the caller joins the tail (a locked `xchg`), waits to become the
//! head, then waits for the lock word to clear and takes it. So the lock is FIFO among waiters
//! and a newcomer cannot overtake the queue, as in the kernel. Simplified: the pending bit (the
//! first waiter spinning without a queue node) is folded into the queue; it changes who spins
//! on which cache line, not the order. Unlike a ticket model, the state is bounded (a holder and
//! a queue of at most every agent), so retry loops under the explorer have a finite state space.

use crate::frame::Flow;
use crate::machine::Machine;
use crate::mem::{spin_key, Loc};
use shootdown_engine::Env;

/// `arch_spinlock_t` as a queued spinlock: the lock word and the MCS queue (head first).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct QueuedSpinlock {
    /// The lock word's locked byte: the holder agent + 1, or 0.
    pub val: u64,
    /// Agents queued for the lock (`mcs_spinlock` nodes), the head first.
    pub queue: Vec<u32>,
}

impl Machine {
    /// `spin_lock(&kvm->mmu_lock)` by agent `me`; `Some(spin)` while it waits. Call again after
    /// each wake-up: the first call takes a free lock or joins the queue, later ones take the
    /// lock once `me` heads the queue and the holder released it.
    pub(crate) fn mmu_lock_acquire<E: Env>(&mut self, me: usize, env: &mut E) -> Option<Flow> {
        let vm = self.vm_of(me);
        let loc = Loc::MmuLock(vm as u32);
        let owner = me as u64 + 1;
        let queue = &self.kvm(vm).mmu_lock.queue;
        if !queue.contains(&(me as u32)) {
            // Fast path `cmpxchg(lock, 0, LOCKED)`, which fails when the tail is set as well;
            // on failure the slow path's `xchg_tail` (both locked operations, one step here).
            let empty = queue.is_empty();
            let old = self.rmw(env, me, loc, |v| if v == 0 && empty { owner } else { v });
            if old == 0 && empty {
                self.say(|| "spin_lock(&kvm->mmu_lock)".into());
                return None;
            }
            self.kvm_mut(vm).mmu_lock.queue.push(me as u32);
            self.perf
                .counters
                .inc(crate::counters::Counter::KvmMmuLockContended);
            self.say(|| "spin_lock(&kvm->mmu_lock): held, queue and wait".into());
            return Some(Flow::Spin(spin_key(loc)));
        }
        if queue[0] != me as u32 || self.load(env, me, loc) != 0 {
            return Some(Flow::Spin(spin_key(loc)));
        }
        // The queue head: the lock word cleared, take it (`atomic_try_cmpxchg_relaxed`).
        let old = self.rmw(env, me, loc, |v| if v == 0 { owner } else { v });
        if old != 0 {
            return Some(Flow::Spin(spin_key(loc)));
        }
        self.kvm_mut(vm).mmu_lock.queue.remove(0);
        self.say(|| "spin_lock(&kvm->mmu_lock): queue head, lock taken".into());
        None
    }

    /// Would `me`'s next `mmu_lock_acquire` only wait? (Queued, and not the head of the queue
    /// or the lock word still set as `me` sees it.)
    pub(crate) fn mmu_lock_waits(&self, me: usize) -> bool {
        let vm = self.vm_of(me);
        let queue = &self.kvm(vm).mmu_lock.queue;
        let Some(pos) = queue.iter().position(|&a| a == me as u32) else {
            return false;
        };
        let loc = Loc::MmuLock(vm as u32);
        pos != 0 || self.value_seen_by(me, loc) != 0
    }

    /// Is `me` queued for `mmu_lock` (it called `mmu_lock_acquire` and waits)?
    pub(crate) fn mmu_lock_queued(&self, me: usize) -> bool {
        self.kvm(self.vm_of(me))
            .mmu_lock
            .queue
            .contains(&(me as u32))
    }

    /// `spin_unlock(&kvm->mmu_lock)` (a release store clearing the locked byte), after the
    /// oracle's check that no flush is owed.
    pub(crate) fn mmu_lock_release<E: Env>(&mut self, me: usize, env: &mut E) {
        let vm = self.vm_of(me);
        self.check_flush_owed(vm);
        self.store(env, me, Loc::MmuLock(vm as u32), 0);
    }

    /// `spin_needbreak(&kvm->mmu_lock)` (`spin_is_contended`): a waiter is queued.
    pub(crate) fn mmu_lock_contended<E: Env>(&mut self, me: usize, env: &mut E) -> bool {
        let vm = self.vm_of(me);
        self.load(env, me, Loc::MmuLock(vm as u32));
        !self.kvm(vm).mmu_lock.queue.is_empty()
    }
}

//! `kvm->mmu_lock` (a spinlock in v5.x) and the oracle's rule for releasing it
//! (docs/design/kernel-model.md §4.7 K1): a flush owed for SPTEs zapped under the lock is done before the
//! lock is dropped, by `spin_unlock` or by a lock break (`cond_resched_lock`). Otherwise another
//! thread may find the SPTE already gone, conclude no flush is needed, and let the host free the
//! page while a vCPU still caches it.
//!
//! The lock is x86's queued spinlock (`crate::spinlock`: FIFO among waiters, bounded state).

use crate::frame::Flow;
use crate::machine::Machine;
use crate::mem::{spin_key, Loc};
use crate::spinlock::{LockRef, Queued};
use shootdown_engine::Env;

pub use crate::spinlock::QueuedSpinlock;

impl Machine {
    /// `spin_lock(&kvm->mmu_lock)` by agent `me`; `Some(spin)` while it waits. Call again after
    /// each wake-up: the first call takes a free lock or joins the queue, later ones take the
    /// lock once `me` heads the queue and the holder released it.
    pub(crate) fn mmu_lock_acquire<E: Env>(&mut self, me: usize, env: &mut E) -> Option<Flow> {
        let vm = self.vm_of(me) as u32;
        let spin = Flow::Spin(spin_key(Loc::MmuLock(vm)));
        match self.queued_spin_lock(me, LockRef::MmuLock(vm), env) {
            Queued::Fast => {
                self.say(|| "spin_lock(&kvm->mmu_lock)".into());
                None
            }
            Queued::Joined => {
                self.perf
                    .counters
                    .inc(crate::counters::Counter::KvmMmuLockContended);
                self.say(|| "spin_lock(&kvm->mmu_lock): held, queue and wait".into());
                Some(spin)
            }
            Queued::Wait => Some(spin),
            Queued::Head => {
                self.say(|| "spin_lock(&kvm->mmu_lock): queue head, lock taken".into());
                None
            }
        }
    }

    /// Would `me`'s next `mmu_lock_acquire` only wait? (Queued, and not the head of the queue
    /// or the lock word still set as `me` sees it.)
    pub(crate) fn mmu_lock_waits(&self, me: usize) -> bool {
        self.queued_spin_lock_waits(me, LockRef::MmuLock(self.vm_of(me) as u32))
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

impl Machine {
    /// `KVM_MMU_LOCK(kvm)`: the legacy MMU's spinlock, or the TDP MMU's rwlock for write
    /// (`shared`: for read, `read_lock(&kvm->mmu_lock)`). `Some(spin)` while it waits; call
    /// again after each wake-up with the same `lock` (the rwlock's wait state).
    pub(crate) fn kvm_mmu_lock<E: Env>(
        &mut self,
        me: usize,
        lock: &mut crate::kvm::mmu::rwlock::RwlockWait,
        shared: bool,
        env: &mut E,
    ) -> Option<Flow> {
        match (self.opts.tdp_mmu, shared) {
            (false, _) => self.mmu_lock_acquire(me, env),
            (true, false) => self.mmu_write_lock(me, lock, env),
            (true, true) => self.mmu_read_lock(me, lock, env),
        }
    }

    /// `KVM_MMU_UNLOCK(kvm)` (`shared`: `read_unlock`), the release of [`Machine::kvm_mmu_lock`].
    pub(crate) fn kvm_mmu_unlock<E: Env>(&mut self, me: usize, shared: bool, env: &mut E) {
        match (self.opts.tdp_mmu, shared) {
            (false, _) => self.mmu_lock_release(me, env),
            (true, false) => self.mmu_write_unlock(me, env),
            (true, true) => self.mmu_read_unlock(me, env),
        }
    }

    /// Would `me`'s next [`Machine::kvm_mmu_lock`] only wait?
    pub(crate) fn kvm_mmu_lock_waits(
        &self,
        me: usize,
        lock: crate::kvm::mmu::rwlock::RwlockWait,
        shared: bool,
    ) -> bool {
        if self.opts.tdp_mmu {
            self.mmu_rwlock_waits(me, lock, !shared)
        } else {
            self.mmu_lock_waits(me)
        }
    }
}

//! RCU protection of TDP MMU page-table memory (v5.12+, 7cca2d0b7e7d): a table the TDP MMU
//! unlinks is handed to `call_rcu()` (`tdp_mmu_free_sp_rcu_callback`) and freed only after a
//! grace period, so that a walker inside `rcu_read_lock()` (the zap's walk, a fault, a
//! lockless walk) never reads freed memory.
//!
//! What RCU does *not* protect is the hardware: a vCPU in guest mode is in an extended
//! quiescent state, so its paging-structure cache can still point into a table whose grace
//! period has ended. A walk that removes tables must therefore flush before the grace period
//! can end: before v5.18, `handle_removed_tdp_mmu_page()` flushed the table's range before its
//! `call_rcu`; from v5.18 (bb95dfb9e2df) the caller does, before its own `rcu_read_unlock()`
//! (which is why bd29677952fa moved the yield's flush ahead of it).
//!
//! Simplifications: one RCU domain per VM for the MMU's walks; a grace period ends the moment
//! the last reader it waits for leaves (the earliest a real one can, so every use-after-free
//! the code allows is reachable; in the kernel the callback runs later still, from softirq);
//! the model's TDP faults are single atomic steps, so their read sections never span a step
//! and are not recorded; a callback frees the removed table with its whole subtree (in the
//! kernel each child table has a callback of its own, queued in the same walk).

use crate::machine::Machine;
use shootdown_engine::Env;
use shootdown_hw::ept::SpId;

/// The RCU state of one VM's TDP MMU walks.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct TdpMmuRcu {
    /// Agents inside `rcu_read_lock()` on an MMU walk, in ascending order (a set: the state
    /// does not depend on who entered first).
    pub readers: Vec<u32>,
    /// Queued `call_rcu(&sp->rcu_head, tdp_mmu_free_sp_rcu_callback)`s: the removed table and
    /// the readers its grace period still waits for.
    pub callbacks: Vec<(SpId, Vec<u32>)>,
}

impl Machine {
    /// `rcu_read_lock()` by agent `me` around a TDP MMU walk.
    pub(crate) fn tdp_rcu_read_lock(&mut self, me: usize) {
        let vm = self.vm_of(me);
        let r = &mut self.kvm_mut(vm).mmu.rcu;
        if let Err(at) = r.readers.binary_search(&(me as u32)) {
            r.readers.insert(at, me as u32);
        }
    }

    /// `rcu_read_unlock()` by agent `me`: every grace period that waited only for it ends,
    /// and their callbacks free the tables. Returns how many tables were freed.
    pub(crate) fn tdp_rcu_read_unlock<E: Env>(&mut self, me: usize, env: &mut E) -> usize {
        let vm = self.vm_of(me);
        let me = me as u32;
        let r = &mut self.kvm_mut(vm).mmu.rcu;
        r.readers.retain(|&a| a != me);
        for (_, waits) in r.callbacks.iter_mut() {
            waits.retain(|&a| a != me);
        }
        let (done, left): (Vec<_>, Vec<_>) = std::mem::take(&mut r.callbacks)
            .into_iter()
            .partition(|(_, waits)| waits.is_empty());
        r.callbacks = left;
        for &(sp, _) in &done {
            self.tdp_mmu_free_subtree(vm, sp, env);
        }
        done.len()
    }

    /// `call_rcu(&sp->rcu_head, tdp_mmu_free_sp_rcu_callback)` for table `sp` of VM `vm`,
    /// already unlinked: freed once every reader now inside a read section has left (at once
    /// if there is none).
    pub(crate) fn tdp_call_rcu<E: Env>(&mut self, vm: usize, sp: SpId, env: &mut E) {
        let r = &mut self.kvm_mut(vm).mmu.rcu;
        if r.readers.is_empty() {
            self.tdp_mmu_free_subtree(vm, sp, env);
            return;
        }
        let waits = r.readers.clone();
        r.callbacks.push((sp, waits));
    }
}

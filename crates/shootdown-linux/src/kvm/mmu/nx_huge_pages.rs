//! The iTLB multihit mitigation (`kvm.nx_huge_pages`, v5.4+; arch/x86/kvm/mmu/mmu.c as of
//! v6.6): KVM never lets the guest execute from a huge SPTE. Huge leaves are made without the
//! X bit (`make_spte`); an instruction fetch from a huge-backed frame maps it with 4 KiB
//! SPTEs (`kvm_mmu_hugepage_adjust` sets `huge_page_disallowed`), and the page table it links
//! where the huge leaf would be is marked `nx_huge_page_disallowed` and, if a huge page was
//! possible there, tracked on `possible_nx_huge_pages` (`account_nx_huge_page`); a later data
//! fault there keeps to 4 KiB rather than replace that table (`disallowed_hugepage_adjust`).
//! A huge leaf already in the way of a fetch is zapped, with its flush, before the table is
//! linked (`drop_large_spte` in the shadow MMU; `tdp_mmu_zap_spte_atomic` in the TDP MMU
//! before the in-place split of later kernels, which replaces the leaf with an equivalent
//! table and does not flush — not modelled: the oracle's per-SPTE versions would call the
//! old entry stale).
//!
//! The recovery worker (`kvm_nx_huge_page_recovery_worker` → `kvm_recover_nx_huge_pages`)
//! zaps `ceil(splits / nx_huge_pages_recovery_ratio)` of the tracked tables, oldest first,
//! under `mmu_lock` held for write, so that data faults can map huge pages again: a TDP MMU
//! table by zapping the SPTE that links it (`kvm_tdp_mmu_zap_sp`, whose "flush needed" the
//! caller owes), a shadow page by `kvm_mmu_prepare_zap_page`; then
//! `kvm_mmu_remote_flush_or_zap` and the unlock. v5.10–v5.11 (`nx_recovery_flush = "v5_10"`)
//! ignored the TDP zap's result and only committed the shadow pages' invalid list, so a TDP
//! table was unlinked and freed with no flush (fixed by 048f49809c52).
//!
//! Simplifications: the worker runs when its host thread's program says (no period, no
//! `need_resched` lock break); the TDP recovery clears only the SPTE that links the table
//! (`handle_removed_pt` also marks each child SPTE removed), so a walk through a cached pointer
//! to the table still finds its leaves until the flush, which comes before the free; no
//! dirty-logging check (`kvm_slot_dirty_track_enabled`); the `nx_huge_pages` parameter is
//! fixed for the run (no toggling, which zaps everything); the guest's own page tables allow
//! execution everywhere.

use crate::counters::Counter;
use crate::frame::{Flow, Frame};
use crate::kvm::kvm_main::FlushRemoteTlbs;
use crate::kvm::mmu::page::CommitZap;
use crate::kvm::mmu::rwlock::RwlockWait;
use crate::machine::Machine;
use crate::options::NxRecoveryFlush;
use shootdown_engine::Env;
use shootdown_hw::ept::{ept_index, Gfn, SpId, SpteKind};

/// What `kvm_mmu_hugepage_adjust` decided for one fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct NxFault {
    /// `fault->huge_page_disallowed`: an instruction fetch with the mitigation on.
    pub disallowed: bool,
    /// `fault->req_level`: the level the memslot and host mapping allow.
    pub req_level: u8,
}

impl Machine {
    /// `make_spte`'s X bit: a leaf above 4 KiB is not executable under the mitigation.
    pub(crate) fn spte_exec(&self, level: u8) -> bool {
        !(self.opts.nx_huge_pages && level > 1)
    }

    /// `kvm_mmu_hugepage_adjust()` and `disallowed_hugepage_adjust()` for a fault of `gfn`
    /// under `root` that the memslot allows at `req_level`: the goal level, and the fault's
    /// NX state. A fetch goes to 4 KiB; any fault whose 2 MiB goal meets a table linked by a
    /// disallowed fault goes down to 4 KiB too, rather than replace that table.
    pub(crate) fn nx_hugepage_adjust(
        &self,
        vm: usize,
        root: SpId,
        gfn: Gfn,
        req_level: u8,
        exec: bool,
    ) -> (u8, NxFault) {
        let nx = NxFault {
            disallowed: exec && self.opts.nx_huge_pages,
            req_level,
        };
        if nx.disallowed {
            return (1, nx);
        }
        if self.opts.nx_huge_pages && req_level == 2 {
            if let Some(child) = self.table_at_level2(root, gfn) {
                let mmu = &self.kvm(vm).mmu;
                if mmu
                    .pages
                    .get(&child)
                    .is_some_and(|p| p.nx_huge_page_disallowed)
                {
                    return (1, nx);
                }
            }
        }
        (req_level, nx)
    }

    /// The page table a level-2 SPTE of `gfn` under `root` links, if it links one.
    pub(crate) fn table_at_level2(&self, root: SpId, gfn: Gfn) -> Option<SpId> {
        let mut sp = root;
        loop {
            let p = self.ept.page(sp);
            if !p.alive {
                return None;
            }
            let kind = self.ept.spte(sp, ept_index(p.level, gfn)).kind;
            match kind {
                SpteKind::Table(child) if p.level == 2 => return Some(child),
                SpteKind::Table(child) if p.level > 2 => sp = child,
                _ => return None,
            }
        }
    }

    /// `account_nx_huge_page(kvm, sp, nx_huge_page_possible)`: a table a disallowed fault
    /// linked, linked at `linked_level`; tracked for recovery if a huge page was possible
    /// there (`req_level >= linked_level`).
    pub(crate) fn account_nx_huge_page(
        &mut self,
        vm: usize,
        sp: SpId,
        nx: NxFault,
        linked_level: u8,
    ) {
        if !nx.disallowed {
            return;
        }
        let mmu = &mut self.kvm_mut(vm).mmu;
        if let Some(p) = mmu.pages.get_mut(&sp) {
            p.nx_huge_page_disallowed = true;
        }
        // track_possible_nx_huge_page(): once, at the list's tail.
        if nx.req_level >= linked_level && !mmu.possible_nx_huge_pages.contains(&sp) {
            mmu.possible_nx_huge_pages.push(sp);
            self.perf.counters.inc(Counter::KvmNxLpageSplits);
        }
    }

    /// `unaccount_nx_huge_page()`: a zapped table is neither disallowed nor tracked any more.
    pub(crate) fn unaccount_nx_huge_page(&mut self, vm: usize, sp: SpId) {
        let mmu = &mut self.kvm_mut(vm).mmu;
        if let Some(p) = mmu.pages.get_mut(&sp) {
            p.nx_huge_page_disallowed = false;
        }
        mmu.possible_nx_huge_pages.retain(|&x| x != sp);
    }
}

/// `kvm_recover_nx_huge_pages(kvm)` run by agent (a host thread) of the VM.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct NxRecover {
    pub pc: NxRecoverPc,
    /// Tables still to zap in this run.
    pub to_zap: u64,
    /// `flush`: a TDP MMU zap owes a remote flush.
    pub flush: bool,
    /// `invalid_list`: shadow pages prepared for freeing.
    pub invalid_list: Vec<SpId>,
    /// TDP MMU tables unlinked, freed after the flush (their RCU callback).
    pub rcu_free: Vec<SpId>,
    pub lock: RwlockWait,
}

/// The steps of the recovery.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NxRecoverPc {
    /// `write_lock(&kvm->mmu_lock)` (the shadow MMU's spinlock in its v5.x form); `to_zap`.
    Lock,
    /// Zap the oldest tracked table.
    Zap,
    /// `kvm_mmu_remote_flush_or_zap(kvm, &invalid_list, flush)`.
    Flush,
    /// The TDP tables' RCU callbacks; `write_unlock`.
    Unlock,
}

impl NxRecover {
    pub fn call() -> Frame {
        Frame::NxRecover(Box::new(NxRecover {
            pc: NxRecoverPc::Lock,
            to_zap: 0,
            flush: false,
            invalid_list: Vec::new(),
            rcu_free: Vec::new(),
            lock: RwlockWait::Fast,
        }))
    }
}

impl Machine {
    /// One step of `kvm_recover_nx_huge_pages()` by agent `me`.
    pub(crate) fn nx_recover_step<E: Env>(
        &mut self,
        me: usize,
        s: &mut NxRecover,
        env: &mut E,
    ) -> Flow {
        use NxRecoverPc::*;
        let vm = self.vm_of(me);
        let tdp = self.opts.tdp_mmu;
        match s.pc {
            Lock => {
                let spin = if tdp {
                    self.mmu_write_lock(me, &mut s.lock, env)
                } else {
                    self.mmu_lock_acquire(me, env)
                };
                if let Some(spin) = spin {
                    return spin;
                }
                let ratio = self.opts.nx_huge_pages_recovery_ratio.0;
                let splits = self.kvm(vm).mmu.possible_nx_huge_pages.len() as u64;
                s.to_zap = if ratio == 0 {
                    0
                } else {
                    splits.div_ceil(ratio)
                };
                let n = s.to_zap;
                self.say(|| format!("{splits} split page(s) tracked, zap {n}"));
                s.pc = Zap;
                Flow::Next
            }
            Zap => {
                let next = self.kvm(vm).mmu.possible_nx_huge_pages.first().copied();
                let Some(sp) = next.filter(|_| s.to_zap > 0) else {
                    s.pc = Flush;
                    return Flow::Next;
                };
                s.to_zap -= 1;
                self.perf.counters.inc(Counter::KvmNxRecovered);
                if tdp {
                    // kvm_tdp_mmu_zap_sp(): clear the SPTE that links the table, under the
                    // write lock (handle_removed_pt: the table goes to an RCU callback).
                    self.unaccount_nx_huge_page(vm, sp);
                    if let Some((parent, idx)) = self.ept.page(sp).parent {
                        self.set_spte(vm, parent, idx, SpteKind::None);
                    }
                    self.charge(env, |c| c.spte_zap);
                    match self.opts.nx_recovery_flush {
                        NxRecoveryFlush::Mainline => {
                            s.flush = true;
                            s.rcu_free.push(sp);
                        }
                        // v5.10: the zap's "flush needed" is dropped, and the table is freed
                        // at once.
                        NxRecoveryFlush::V5_10 => self.tdp_mmu_free_subtree(vm, sp, env),
                    }
                    self.say(|| format!("kvm_tdp_mmu_zap_sp: unlink split EPT page #{sp}"));
                } else {
                    let mut list = std::mem::take(&mut s.invalid_list);
                    self.prepare_zap_page(me, vm, sp, &mut list, env);
                    s.invalid_list = list;
                    self.say(|| format!("kvm_mmu_prepare_zap_page(split page #{sp})"));
                }
                Flow::Next
            }
            Flush => {
                s.pc = Unlock;
                if !s.invalid_list.is_empty() {
                    self.say(|| "kvm_mmu_commit_zap_page: flush, free".into());
                    return Flow::Call(CommitZap::call(std::mem::take(&mut s.invalid_list)));
                }
                if s.flush {
                    s.flush = false;
                    self.say(|| "kvm_mmu_remote_flush_or_zap: kvm_flush_remote_tlbs".into());
                    return Flow::Call(FlushRemoteTlbs::call());
                }
                self.say(|| "nothing to flush".into());
                Flow::Next
            }
            Unlock => {
                for sp in std::mem::take(&mut s.rcu_free) {
                    self.tdp_mmu_free_subtree(vm, sp, env);
                }
                if tdp {
                    self.mmu_write_unlock(me, env);
                } else {
                    self.mmu_lock_release(me, env);
                }
                self.say(|| "write_unlock(&kvm->mmu_lock)".into());
                Flow::Return
            }
        }
    }

    /// Would the recovery's next step only wait for `mmu_lock`?
    pub(crate) fn nx_recover_waits(&self, me: usize, s: &NxRecover) -> bool {
        s.pc == NxRecoverPc::Lock
            && if self.opts.tdp_mmu {
                self.mmu_rwlock_waits(me, s.lock, true)
            } else {
                self.mmu_lock_waits(me)
            }
    }
}

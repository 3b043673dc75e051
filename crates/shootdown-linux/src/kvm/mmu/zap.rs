//! What KVM zaps when a memslot goes away (`kvm_arch_flush_shadow_memslot`, docs/design/kernel-model.md
//! §4.5; docs/design/kvm-mmu-seeds.md §1.3) and when the MMIO generation wraps
//! (`kvm_mmu_invalidate_mmio_sptes`), each strategy in the form `kvm` selects:
//!
//! * `fast_invalidate` (`kvm_mmu_invalidate_zap_all_pages`, v5.0; `kvm_mmu_zap_all_fast`
//!   since v5.3): under `mmu_lock`, a new `mmu_valid_gen` makes every page obsolete and every
//!   vCPU is made to drop its root (`KVM_REQ_MMU_RELOAD`, waited for); the obsolete pages are
//!   then zapped oldest first, and every `BATCH_ZAP_PAGES` pages the lock may be dropped
//!   *without* a flush (no vCPU can use an obsolete root any more); the list is committed (one
//!   flush, then free) at the end.
//! * `slot_only` (v5.1, seed 003's patch): zap the slot's leaf SPTEs through its rmaps at every
//!   level (v5.1: lock breaks here do not flush, `lock_flush_tlb = false`; mainline's
//!   `kvm_mmu_zap_memslot` flushes before them), then for each gfn of the slot prepare-zap the
//!   valid pages whose `gfn` it is; before each lock break and at the end,
//!   `kvm_mmu_remote_flush_or_zap()`.
//! * `zap_all` (`kvm_mmu_zap_all`; what the v5.3-rc revert used for memslots): prepare-zap
//!   every page from the head of the list, then commit; from v5.1 with lock breaks that neither
//!   commit nor flush (safe for VM teardown, for which they were written — not for a memslot).
//!
//! Simplifications: `need_resched()` is false (the zapping thread has its pCPU to itself): a
//! lock break happens when another agent waits for `mmu_lock` (`spin_needbreak`); no 1 GiB
//! leaves.

use crate::counters::Counter;
use crate::frame::{Flow, Frame};
use crate::kvm::kvm_main::{FlushRemoteTlbs, MakeAllCpusRequest};
use crate::kvm::memslot::Memslot;
use crate::kvm::mmu::page::CommitZap;
use crate::kvm::mmu::spte::mmio_gen_wrapped;
use crate::kvm::Request;
use crate::machine::Machine;
use crate::options::{KvmVersion, MemslotZap};
use shootdown_engine::Env;
use shootdown_hw::ept::{gfns_per_entry, Gfn, SpId};

/// `BATCH_ZAP_PAGES`: pages the fast zap prepares between lock-break checks.
const BATCH_ZAP_PAGES: u32 = 10;

/// A zap of shadow pages under `mmu_lock`, in one of the strategies above.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct ZapMemslot {
    pub pc: ZapPc,
    pub strategy: MemslotZap,
    /// `zap_all` of MMIO-caching pages only (`__kvm_mmu_zap_all(kvm, mmio_only = true)`).
    pub mmio_only: bool,
    /// The memslot being removed (`slot_only`), and its address space (whose rmaps it has).
    pub slot: Memslot,
    pub as_id: u8,
    /// The local `invalid_list`.
    pub list: Vec<SpId>,
    /// A remote flush is owed for zapped SPTEs (`flush`).
    pub flush: bool,
    /// Pages prepared since the last lock-break check (`fast_invalidate`).
    pub batch: u32,
    /// Walk position: the rmap level and gfn (`slot_only`).
    pub level: u8,
    pub gfn: Gfn,
    /// Where the walk goes on after a lock break or a flush-or-zap.
    pub resume: ZapPc,
}

shootdown_engine::clone_by_fields!(ZapMemslot {
    pc,
    strategy,
    mmio_only,
    slot,
    as_id,
    list,
    flush,
    batch,
    level,
    gfn,
    resume,
});

/// The steps of the zaps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ZapPc {
    /// `spin_lock(&kvm->mmu_lock)`.
    Lock,
    /// `fast_invalidate`: `mmu_valid_gen++` and `KVM_REQ_MMU_RELOAD` to every vCPU.
    NewGeneration,
    /// `fast_invalidate`: `kvm_zap_obsolete_pages()`, one page a step.
    ZapObsolete,
    /// `slot_only`: `slot_handle_all_level(slot, kvm_zap_rmapp)`, one rmap head a step.
    ZapRmaps,
    /// `slot_only`: the valid pages of the next gfn (`for_each_valid_sp`).
    ZapGfnPages,
    /// `zap_all`: the next page of `active_mmu_pages`.
    ZapNext,
    /// `kvm_mmu_remote_flush_or_zap(kvm, invalid_list, flush)`.
    FlushOrZap,
    /// `cond_resched_lock(&kvm->mmu_lock)`: drop the lock.
    Yield,
    /// Take it again.
    Relock,
    /// `kvm_mmu_commit_zap_page()` of the list.
    Commit,
    /// `spin_unlock`; return.
    Unlock,
}

impl ZapMemslot {
    /// `kvm_arch_flush_shadow_memslot(kvm, slot)` with `strategy`, for `slot` of address space
    /// `as_id`.
    pub fn call(strategy: MemslotZap, as_id: u8, slot: Memslot) -> Frame {
        Frame::ZapMemslot(Box::new(ZapMemslot {
            pc: ZapPc::Lock,
            strategy,
            mmio_only: false,
            gfn: slot.base_gfn,
            slot,
            as_id,
            list: Vec::new(),
            flush: false,
            batch: 0,
            level: 1,
            resume: ZapPc::Unlock,
        }))
    }

    /// `__kvm_mmu_zap_all(kvm, mmio_only = true)` (v5.1's zap on an MMIO-generation wrap).
    pub fn mmio_sptes() -> Frame {
        let Frame::ZapMemslot(mut z) = ZapMemslot::call(MemslotZap::ZapAll, 0, Memslot::default())
        else {
            unreachable!()
        };
        z.mmio_only = true;
        Frame::ZapMemslot(z)
    }
}

impl Machine {
    /// `kvm_arch_memslots_updated(kvm, gen)` → `kvm_mmu_invalidate_mmio_sptes()`: when the MMIO
    /// generation `gen` is about to wrap, zap every MMIO SPTE (v5.1: the MMIO-caching pages;
    /// v5.0 and mainline: a fast invalidate of everything).
    pub(crate) fn kvm_arch_memslots_updated<E: Env>(
        &mut self,
        me: usize,
        gen: u64,
        _env: &mut E,
    ) -> Flow {
        let bits = self.opts.mmio_gen_bits.0;
        if !mmio_gen_wrapped(self.opts.kvm, gen, bits) {
            self.summary(|| format!("kvm_arch_memslots_updated({gen}): no MMIO-generation wrap"));
            return Flow::Next;
        }
        let _ = me;
        self.summary(|| {
            format!("kvm_arch_memslots_updated({gen}): the MMIO generation wraps: zap MMIO SPTEs")
        });
        Flow::Call(match self.opts.kvm {
            KvmVersion::V5_1 => ZapMemslot::mmio_sptes(),
            _ => ZapMemslot::call(MemslotZap::FastInvalidate, 0, Memslot::default()),
        })
    }

    /// Would the zap's next step only wait for `mmu_lock`?
    pub(crate) fn zap_waits(&self, me: usize, s: &ZapMemslot) -> bool {
        matches!(s.pc, ZapPc::Lock | ZapPc::Relock) && self.mmu_lock_waits(me)
    }

    /// One step of a zap (see the module documentation).
    pub(crate) fn zap_memslot_step<E: Env>(
        &mut self,
        me: usize,
        s: &mut ZapMemslot,
        env: &mut E,
    ) -> Flow {
        use ZapPc::*;
        let vm = self.vm_of(me);
        match s.pc {
            Lock | Relock => {
                if let Some(spin) = self.mmu_lock_acquire(me, env) {
                    return spin;
                }
                if s.pc == Relock {
                    s.pc = s.resume;
                    return Flow::Next;
                }
                s.pc = match s.strategy {
                    MemslotZap::FastInvalidate => NewGeneration,
                    MemslotZap::SlotOnly => ZapRmaps,
                    MemslotZap::ZapAll => ZapNext,
                };
                if s.strategy == MemslotZap::SlotOnly && self.kvm(vm).mmu.active.is_empty() {
                    self.summary(|| "no shadow page at all: nothing to zap".into());
                    s.pc = Unlock;
                }
                Flow::Next
            }
            NewGeneration => {
                let g = {
                    let mmu = &mut self.kvm_mut(vm).mmu;
                    mmu.mmu_valid_gen += 1;
                    mmu.mmu_valid_gen
                };
                self.say(|| {
                    format!("kvm_mmu_invalidate_zap_all_pages: mmu_valid_gen = {g}; KVM_REQ_MMU_RELOAD to every vCPU")
                });
                if env.tracing() {
                    env.trace(shootdown_engine::trace::TraceEvent::Instant {
                        agent: me,
                        name: "kvm_mmu_invalidate_zap_all_pages",
                        detail: None,
                    });
                }
                s.pc = ZapObsolete;
                Flow::Call(MakeAllCpusRequest::call(Request::MmuReload))
            }
            ZapObsolete => {
                let next = {
                    let mmu = &self.kvm(vm).mmu;
                    let mut next = None;
                    for &sp in mmu.active.iter().rev() {
                        if !mmu.is_obsolete(sp) {
                            break;
                        }
                        if !mmu.pages[&sp].invalid {
                            next = Some(sp);
                            break;
                        }
                    }
                    next
                };
                let Some(sp) = next else {
                    s.pc = Commit;
                    s.list = std::mem::take(&mut self.kvm_mut(vm).mmu.zapped_obsolete);
                    self.summary(|| "no obsolete page left".into());
                    return Flow::Next;
                };
                if s.batch >= BATCH_ZAP_PAGES && self.mmu_lock_contended(me, env) {
                    // No flush: every vCPU has been made to drop its (obsolete) root.
                    s.batch = 0;
                    s.resume = ZapObsolete;
                    s.pc = Yield;
                    self.summary(|| "batch done and mmu_lock contended: break the lock".into());
                    return Flow::Next;
                }
                let mut list = std::mem::take(&mut self.kvm_mut(vm).mmu.zapped_obsolete);
                self.prepare_zap_page(me, vm, sp, &mut list, env);
                self.kvm_mut(vm).mmu.zapped_obsolete = list;
                s.batch += 1;
                self.say(|| format!("kvm_mmu_prepare_zap_page(obsolete EPT page #{sp})"));
                Flow::Next
            }
            ZapRmaps => self.zap_slot_rmaps(me, s, env),
            ZapGfnPages => {
                let end = s.slot.end();
                if s.gfn >= end {
                    s.resume = Unlock;
                    s.pc = FlushOrZap;
                    self.summary(|| "every gfn of the slot done".into());
                    return Flow::Next;
                }
                let gfn = s.gfn;
                s.gfn += 1;
                self.charge(env, |c| c.rmap_walk_step);
                let pages: Vec<SpId> = {
                    let mmu = &self.kvm(vm).mmu;
                    mmu.hash
                        .iter()
                        .filter(|((g, _), _)| *g == gfn)
                        .flat_map(|(_, v)| v.iter().copied())
                        .filter(|sp| !mmu.pages[sp].invalid)
                        .collect()
                };
                let mut reload = false;
                for &sp in &pages {
                    reload |= self.prepare_zap_page(me, vm, sp, &mut s.list, env);
                }
                if !pages.is_empty() {
                    self.say(|| {
                        format!("gfn {gfn:#x}: kvm_mmu_prepare_zap_page(EPT pages {pages:?})")
                    });
                }
                if self.mmu_lock_contended(me, env) {
                    s.resume = Yield;
                    s.pc = FlushOrZap;
                    self.summary(|| format!("gfn {gfn:#x}: mmu_lock contended"));
                } else {
                    self.summary(|| format!("gfn {gfn:#x}: no valid page with this gfn"));
                }
                if reload {
                    return Flow::Call(MakeAllCpusRequest::call(Request::MmuReload));
                }
                Flow::Next
            }
            ZapNext => {
                let next = {
                    let mmu = &self.kvm(vm).mmu;
                    mmu.active.iter().copied().find(|sp| {
                        let p = &mmu.pages[sp];
                        !(p.invalid && p.root_count > 0) && (!s.mmio_only || p.mmio_cached)
                    })
                };
                let Some(sp) = next else {
                    s.pc = Commit;
                    self.summary(|| "every page prepared".into());
                    return Flow::Next;
                };
                let reload = self.prepare_zap_page(me, vm, sp, &mut s.list, env);
                self.say(|| format!("kvm_mmu_prepare_zap_page(EPT page #{sp})"));
                // v5.1+ ("Voluntarily reschedule as needed when zapping all sptes"):
                // cond_resched_lock(), which neither commits nor flushes; v5.0 never breaks.
                if self.opts.kvm != KvmVersion::V5_0 && self.mmu_lock_contended(me, env) {
                    s.resume = ZapNext;
                    s.pc = Yield;
                }
                if reload {
                    return Flow::Call(MakeAllCpusRequest::call(Request::MmuReload));
                }
                Flow::Next
            }
            FlushOrZap => {
                let flush = std::mem::take(&mut s.flush);
                let list = std::mem::take(&mut s.list);
                s.pc = s.resume;
                self.remote_flush_or_zap(list, flush)
            }
            Yield => {
                self.mmu_lock_release(me, env);
                self.perf.counters.inc(Counter::KvmMmuLockBreaks);
                self.say(|| "cond_resched_lock: spin_unlock(&kvm->mmu_lock), reschedule".into());
                if s.resume == Yield {
                    s.resume = ZapGfnPages;
                }
                s.pc = Relock;
                Flow::Next
            }
            Commit => {
                s.pc = Unlock;
                let n = s.list.len();
                self.summary(|| {
                    format!("kvm_mmu_commit_zap_page: {n} page(s) on the invalid list")
                });
                Flow::Call(CommitZap::call(std::mem::take(&mut s.list)))
            }
            Unlock => {
                self.mmu_lock_release(me, env);
                self.say(|| "spin_unlock(&kvm->mmu_lock)".into());
                Flow::Return
            }
        }
    }

    /// `slot_only`'s first pass, one rmap head per step: the leaf SPTEs mapping the next gfn of
    /// the slot at the current level (4 KiB, then the 2 MiB regions the slot overlaps).
    fn zap_slot_rmaps<E: Env>(&mut self, me: usize, s: &mut ZapMemslot, env: &mut E) -> Flow {
        let vm = self.vm_of(me);
        let span = gfns_per_entry(s.level);
        let end = s.slot.end();
        if s.gfn >= end {
            if s.level < 2 {
                s.level += 1;
                let span = gfns_per_entry(s.level);
                s.gfn = s.slot.base_gfn / span * span;
                let l = s.level;
                self.summary(|| format!("slot_handle_level: level {l}"));
            } else {
                s.pc = ZapPc::ZapGfnPages;
                s.gfn = s.slot.base_gfn;
                self.summary(|| "rmaps done: now the pages of each gfn".into());
            }
            return Flow::Next;
        }
        let gfn = s.gfn;
        s.gfn = gfn / span * span + span;
        self.charge(env, |c| c.rmap_walk_step);
        let n = self.zap_rmap(vm, (s.level, gfn), Some(s.as_id), env);
        s.flush |= n > 0;
        let lvl = s.level;
        if n > 0 {
            self.say(|| format!("kvm_zap_rmapp(level {lvl}, gfn {gfn:#x}): {n} SPTE(s) zapped"));
        } else {
            self.summary(|| format!("kvm_zap_rmapp(level {lvl}, gfn {gfn:#x}): empty"));
        }
        if self.mmu_lock_contended(me, env) {
            s.resume = ZapPc::ZapRmaps;
            let flush_on_yield = self.opts.kvm == KvmVersion::Mainline
                && !self.opts.mutants.slot_zap_rmap_break_without_flush();
            if flush_on_yield && s.flush {
                // __walk_slot_rmaps(flush_on_yield = true): flush, then yield.
                s.flush = false;
                s.pc = ZapPc::Yield;
                return Flow::Call(FlushRemoteTlbs::call());
            }
            // v5.x slot_handle_level_range(lock_flush_tlb = false): yield, flush or not.
            s.pc = ZapPc::Yield;
        }
        Flow::Next
    }

    /// `kvm_mmu_remote_flush_or_zap(kvm, invalid_list, remote_flush)`: commit a non-empty list
    /// (which flushes before freeing), else flush if one is owed — in the form of the fixed
    /// helper, of K10 (an inverted `list_empty()`), or of seed 003 v1 (the flush first).
    fn remote_flush_or_zap(&mut self, list: Vec<SpId>, flush: bool) -> Flow {
        let m = self.opts.mutants;
        let n = list.len();
        if m.remote_flush_or_zap_flush_first() {
            if flush {
                self.say(|| {
                    format!("kvm_mmu_remote_flush_or_zap(flush, {n} page(s)): flush first (v1), the list is dropped")
                });
                return Flow::Call(FlushRemoteTlbs::call());
            }
        } else if m.remote_flush_or_zap_inverted() {
            if !flush && !list.is_empty() {
                self.say(|| {
                    format!(
                        "kvm_mmu_remote_flush_or_zap(no flush, {n} page(s)): !list_empty: return"
                    )
                });
                return Flow::Next;
            }
        } else if !flush && list.is_empty() {
            self.summary(|| "kvm_mmu_remote_flush_or_zap: nothing to do".into());
            return Flow::Next;
        }
        if !list.is_empty() {
            self.say(|| format!("kvm_mmu_remote_flush_or_zap: commit {n} page(s)"));
            return Flow::Call(CommitZap::call(list));
        }
        if flush || m.remote_flush_or_zap_inverted() {
            self.say(|| "kvm_mmu_remote_flush_or_zap: flush".into());
            return Flow::Call(FlushRemoteTlbs::call());
        }
        Flow::Next
    }
}

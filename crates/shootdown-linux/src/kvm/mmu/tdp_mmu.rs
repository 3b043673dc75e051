//! arch/x86/kvm/mmu/tdp_mmu.c (and `kvm_zap_gfn_range` of mmu.c) as of v6.5, the base of seed
//! 004 (docs/design/kvm-mmu-seeds.md §2.2, §2.6, §2.7; docs/design/kernel-model.md §4.6):
//!
//! * roots: one per address space and role, shared by the vCPUs that use it
//!   (`kvm_tdp_mmu_get_vcpu_root_hpa`), with a reference count; this VM has one role, so one
//!   root per address space (two with SMM);
//! * [`ZapGfnRange`] — `kvm_zap_gfn_range()`: under the write lock,
//!   `kvm_mmu_invalidate_begin(0, ~0)` (faults retry until the end), then for each address
//!   space and root `tdp_mmu_zap_leafs()` — the walk of [`TdpIter`] from 4 KiB level up, zapping
//!   present leaves, and before every iteration `tdp_mmu_iter_cond_resched()`: if the walk made
//!   progress and `mmu_lock` is contended (`rwlock_needbreak`), do the pending remote flush,
//!   drop the lock (`cond_resched_rwlock_write`), take it again and restart the walk from the
//!   root; then one remote flush if anything was zapped, `kvm_mmu_invalidate_end()`, unlock.
//!   Before v5.18 (`tdp_zap`) the walk is `zap_gfn_range()`: it zaps whole tables that lie
//!   inside the range too, each flushed for by `handle_removed_tdp_mmu_page()` and then freed
//!   (v5.10) or `call_rcu`'d (v5.12+, `tdp_rcu.rs`: each root's walk is an RCU read section,
//!   and a yield drops RCU before its flush); v5.15–v5.17 walk only the root's own entries
//!   when zapping everything.
//!   With patch 12 (`zap_gfn_range_lock = "read"`) the walk runs under the read lock and zaps
//!   atomically: every present entry of at most 1 GiB inside the range (tables too) is frozen,
//!   flushed for (`kvm_flush_remote_tlbs_gfn`, a full flush on VMX) and cleared, and a zapped
//!   table's subtree is freed;
//! * [`TdpMmuPageFault`] — `kvm_tdp_page_fault()` → `kvm_tdp_mmu_map()`: the
//!   `mmu_invalidate_seq` snapshot, the memslot lookup, the read lock, `is_page_fault_stale()`,
//!   then the walk that links missing tables and installs the leaf with the memory type
//!   `vmx_get_mt_mask()` gives (and, when guest MTRRs are honoured, at most the level over
//!   which they give one type: `kvm_mtrr_check_gfn_range_consistency`).
//!
//! Simplifications: the fault's walk, its table links and the leaf install are one atomic step
//! under the read lock (in the kernel each is a `cmpxchg` that fails and retries the fault if an
//! atomic zap changed the entry meanwhile; the only concurrent writers under the read lock are
//! patch 12's zaps, whose freeze this step honours by retrying); under patch 12 (and in the
//! v5.10 form) a zapped table's subtree is freed right after its flush, in the v5.12–v5.17 forms
//! after an RCU grace period (`tdp_rcu.rs`); a removed table keeps its entries until it is
//! freed (the kernel clears them first, so the model allows more paging-structure-cache fills,
//! never fewer); the pre-v5.16 forms use the fixed iterator (`yielded`), which only matters to
//! a walk at the root level (K15); v5.10 checks for a yield before each entry, as later kernels
//! do; no shadow MMU beside the TDP MMU (the rmap part of
//! `kvm_zap_gfn_range` finds nothing); no dirty logging, no 1 GiB leaves. NX huge pages:
//! `nx_huge_pages.rs`; a huge SPTE in the way of a fault's table (a fetch under the
//! mitigation, or MTRRs that narrowed the level) is zapped with its flush first
//! (`tdp_mmu_zap_spte_atomic`), as before the in-place split of later kernels.

use crate::counters::Counter;
use crate::frame::{Flow, Frame};
use crate::kvm::kvm_main::FlushRemoteTlbs;
use crate::kvm::mmu::fault::{Emulation, FaultTarget};
use crate::kvm::mmu::nx_huge_pages::NxFault;
use crate::kvm::mmu::rwlock::RwlockWait;
use crate::kvm::mmu::tdp_iter::TdpIter;
use crate::machine::Machine;
use crate::mem::Loc;
use crate::options::{TdpZap, ZapLock};
use crate::state::Access;
use shootdown_engine::trace::TraceEvent;
use shootdown_engine::Env;
use shootdown_hw::ept::{ept_index, gfns_per_entry, Gfn, SpId, SpteKind, EPT_ROOT_LEVEL};
use shootdown_hw::CpuId;

/// `KVM_ADDRESS_SPACE_NUM` on x86: the walk of `kvm_zap_gfn_range` visits both.
pub const KVM_ADDRESS_SPACE_NUM: u8 = 2;
/// `tdp_mmu_max_gfn_exclusive()`: one past the largest gfn the host's physical-address width
/// (46 bits) allows; a zap of `[0, ~0)` walks up to here.
pub const TDP_MMU_MAX_GFN_EXCLUSIVE: Gfn = 1 << (46 - 12);
/// `KVM_MAX_HUGEPAGE_LEVEL`: patch 12 zaps entries of at most this level (1 GiB) whole.
const KVM_MAX_HUGEPAGE_LEVEL: u8 = 3;

/// A TDP MMU root (`struct kvm_mmu_page` with `role.level` = the root level, on
/// `kvm->arch.tdp_mmu_roots`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TdpRoot {
    pub sp: SpId,
    pub as_id: u8,
    /// `role.invalid`.
    pub invalid: bool,
    /// `tdp_mmu_root_count`: vCPUs using it.
    pub refcount: u32,
}

/// `kvm_zap_gfn_range(kvm, start, end)`; with `notifier`, the TDP MMU's part of an MMU
/// notifier's `invalidate_range_start` (`kvm_handle_hva_range` under the write lock:
/// `kvm_mmu_invalidate_begin` of the range, `kvm_tdp_mmu_unmap_gfn_range` over the roots of each
/// address space whose memslots map it, the flush; `invalidate_range_end` ends it later).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ZapGfnRange {
    pub pc: ZapGfnRangePc,
    pub start: Gfn,
    pub end: Gfn,
    /// `flush`: SPTEs were zapped and not yet flushed for.
    pub flush: bool,
    /// The address space and the position in the root list of the walk.
    pub as_id: u8,
    pub root: u8,
    pub iter: TdpIter,
    /// Where a lock acquisition is.
    pub lock: RwlockWait,
    /// K12 mutant: the flush owed for the roots walked before the current one, which the
    /// current root's yields do not see.
    pub prior_flush: bool,
    /// An MMU notifier's unmap, not `kvm_zap_gfn_range`.
    pub notifier: bool,
    /// Before v5.18: the table just removed, freed once its flush is done.
    pub removed: Option<SpId>,
    /// `iter->old_spte` as the iterator read it on reaching the entry. Kept only for the
    /// `tdp_mmu_write_spte_plain` mutant: the fixed write (`kvm_tdp_mmu_write_spte`, an `xchg`
    /// when the entry has volatile bits) returns the value in memory, which the model reads
    /// at the write.
    pub old_spte: Option<SpteKind>,
}

/// The steps of `kvm_zap_gfn_range()`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ZapGfnRangePc {
    /// `write_lock(&kvm->mmu_lock)`.
    Lock,
    /// `kvm_mmu_invalidate_begin(kvm, 0, -1ul)`; the rmap part (nothing without a shadow MMU).
    Begin,
    /// Patch 12: `write_unlock`.
    DowngradeLock,
    /// Patch 12: `read_lock`.
    ReadLock,
    /// The next root of the address space (`for_each_tdp_mmu_root_yield_safe`), or the next
    /// address space, or the end of the walk.
    NextRoot,
    /// One iteration of `tdp_mmu_zap_leafs()`: the yield check, then zap the entry if it is a
    /// present leaf (before v5.18, `zap_gfn_range()`: or a table wholly inside the range).
    Walk,
    /// `tdp_mmu_iter_cond_resched()`, flush done: drop the lock (v5.18+ drops RCU here, after
    /// the flush; v5.12–v5.17 dropped it before the flush).
    Yield,
    /// Take the lock again (`cond_resched_rwlock_*`), `rcu_read_lock`, restart the walk.
    Relock,
    /// Patch 12: the frozen entry was flushed for: clear it; a table's subtree is freed.
    ClearFrozen,
    /// Before v5.18: `handle_removed_tdp_mmu_page()` flushed the removed table's range: free
    /// it (v5.10) or `call_rcu` it (v5.12+).
    FreeRemoved,
    /// Patch 12: `read_unlock`.
    UpgradeLock,
    /// Patch 12: `write_lock` again for the end.
    WriteLockEnd,
    /// `if (flush) kvm_flush_remote_tlbs_range()`.
    Flush,
    /// `kvm_mmu_invalidate_end()`; `write_unlock`; return.
    End,
}

impl ZapGfnRange {
    pub fn call(start: Gfn, end: Gfn) -> Frame {
        Self::frame(start, end, false)
    }

    /// The TDP MMU's `invalidate_range_start` of gfns `[start, end)` (v5.13+: the notifier
    /// holds `mmu_lock` for write; `kvm_tdp_mmu_unmap_gfn_range` zaps with `may_block`).
    pub fn notifier(start: Gfn, end: Gfn) -> Frame {
        Self::frame(start, end, true)
    }

    fn frame(start: Gfn, end: Gfn, notifier: bool) -> Frame {
        Frame::ZapGfnRange(Box::new(ZapGfnRange {
            pc: ZapGfnRangePc::Lock,
            start,
            end,
            flush: false,
            as_id: 0,
            root: 0,
            iter: TdpIter::default(),
            lock: RwlockWait::Fast,
            prior_flush: false,
            notifier,
            removed: None,
            old_spte: None,
        }))
    }
}

/// `kvm_tdp_page_fault()` with the TDP MMU (`kvm_tdp_mmu_page_fault` in later kernels).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TdpMmuPageFault {
    pub pc: TdpMmuPageFaultPc,
    pub gfn: Gfn,
    pub write: bool,
    /// An instruction fetch (`fault->exec`).
    pub exec: bool,
    /// `fault->mmu_seq`.
    pub mmu_seq: u64,
    pub target: FaultTarget,
    pub lock: RwlockWait,
    /// `kvm_arch_has_noncoherent_dma()` as the fault read it before taking the lock (for its
    /// maximum level: `kvm_tdp_page_fault` lowers it only when guest MTRRs are honoured).
    pub honors: bool,
    /// A huge SPTE in the way of the fault's table, frozen while its flush runs.
    pub frozen: Option<(SpId, u16)>,
}

/// The steps of the TDP MMU fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TdpMmuPageFaultPc {
    /// `fault->mmu_seq = kvm->mmu_invalidate_seq`; `kvm_faultin_pfn()` (memslot lookup).
    Lookup,
    /// `read_lock(&kvm->mmu_lock)`.
    Lock,
    /// `is_page_fault_stale()`, `kvm_tdp_mmu_map()`, `read_unlock`.
    Map,
    /// After the flush for a huge SPTE in the way: clear it, then the walk goes on
    /// (`kvm_tdp_mmu_map()`), `read_unlock`.
    ClearHuge,
}

impl TdpMmuPageFault {
    pub fn call(gfn: Gfn, access: Access) -> Frame {
        Frame::TdpMmuPageFault(Box::new(TdpMmuPageFault {
            pc: TdpMmuPageFaultPc::Lookup,
            gfn,
            write: access.is_write(),
            exec: access.is_fetch(),
            mmu_seq: 0,
            target: FaultTarget::NoSlot,
            lock: RwlockWait::Fast,
            honors: false,
            frozen: None,
        }))
    }
}

/// What the walk sees in an entry, in words.
fn entry_text(k: SpteKind) -> &'static str {
    match k {
        SpteKind::None | SpteKind::Mmio { .. } => "not present",
        SpteKind::Frozen(_) => "frozen",
        SpteKind::Table(_) => "a table: step down",
        SpteKind::Leaf { .. } => "a leaf",
    }
}

impl Machine {
    /// `tdp_mmu_alloc_sp()` + `tdp_mmu_init_sp()`: a new page-table page of VM `vm` for
    /// address space `as_id` (never shared: a TDP MMU table belongs to one root's tree, and
    /// takes its role).
    fn tdp_mmu_alloc_sp<E: Env>(
        &mut self,
        vm: usize,
        gfn: Gfn,
        level: u8,
        as_id: u8,
        env: &mut E,
    ) -> SpId {
        let sp = self.ept.alloc(level, gfn);
        self.perf.counters.inc(Counter::KvmMmuCacheMiss);
        self.charge(env, |c| c.sp_alloc);
        let base = self.ept.page(sp).gfn;
        self.kvm_mut(vm).mmu.add_page(sp, base, level, as_id);
        sp
    }

    /// `kvm_tdp_mmu_get_vcpu_root_hpa()`: the valid root of address space `as_id`, made if
    /// there is none, with a reference taken (`mmu_lock` held for write).
    pub(crate) fn kvm_tdp_mmu_get_vcpu_root<E: Env>(
        &mut self,
        vm: usize,
        as_id: u8,
        env: &mut E,
    ) -> SpId {
        if let Some(r) = self
            .kvm_mut(vm)
            .tdp_roots
            .iter_mut()
            .find(|r| r.as_id == as_id && !r.invalid)
        {
            r.refcount += 1;
            return r.sp;
        }
        let sp = self.tdp_mmu_alloc_sp(vm, 0, EPT_ROOT_LEVEL, as_id, env);
        self.kvm_mut(vm).tdp_roots.push(TdpRoot {
            sp,
            as_id,
            invalid: false,
            refcount: 1,
        });
        sp
    }

    /// The roots `kvm_zap_gfn_range` walks in address space `as_id`, in list order.
    pub(crate) fn tdp_roots_of(&self, vm: usize, as_id: u8) -> impl Iterator<Item = SpId> + '_ {
        self.kvm(vm)
            .tdp_roots
            .iter()
            .filter(move |r| r.as_id == as_id)
            .map(|r| r.sp)
    }

    /// Free a table unlinked by an atomic zap and every table below it (`handle_removed_pt`,
    /// then `tdp_mmu_free_sp_rcu_callback`).
    pub(crate) fn tdp_mmu_free_subtree<E: Env>(&mut self, vm: usize, sp: SpId, env: &mut E) {
        let children: Vec<SpId> = self
            .ept
            .page(sp)
            .entries
            .values()
            .filter_map(|e| match e.kind {
                SpteKind::Table(c) => Some(c),
                _ => None,
            })
            .collect();
        for c in children {
            self.tdp_mmu_free_subtree(vm, c, env);
        }
        self.ept.free(sp);
        self.charge(env, |c| c.sp_free);
        self.perf.counters.inc(Counter::KvmTdpTablesFreed);
        // tdp_mmu_unlink_sp(): a split page is no longer tracked for NX recovery.
        self.unaccount_nx_huge_page(vm, sp);
        if let Some(p) = self.kvm_mut(vm).mmu.pages.get_mut(&sp) {
            p.freed = true;
            p.invalid = true;
            p.active = false;
        }
    }

    /// One step of `kvm_zap_gfn_range()` by agent `me`.
    pub(crate) fn zap_gfn_range_step<E: Env>(
        &mut self,
        me: usize,
        s: &mut ZapGfnRange,
        env: &mut E,
    ) -> Flow {
        use ZapGfnRangePc::*;
        let vm = self.vm_of(me);
        let shared = self.opts.zap_gfn_range_lock == ZapLock::Read;
        match s.pc {
            Lock => {
                if let Some(spin) = self.mmu_write_lock(me, &mut s.lock, env) {
                    return spin;
                }
                s.pc = Begin;
                Flow::Next
            }
            Begin => {
                if s.notifier {
                    // kvm_mmu_invalidate_begin(kvm, start, end): faults in the range retry.
                    self.rmw(env, me, Loc::MmuNotifierCount(vm as u32), |c| c + 1);
                    // The notifier's range is of host virtual addresses, which faults compare
                    // with their own `hva`.
                    let hvas = (
                        self.gfn_hva(vm, s.start),
                        self.gfn_hva(vm, s.end - 1) + 4096,
                    );
                    self.kvm_mut(vm).mmu_invalidate_range = hvas;
                    let (a, b) = (s.start, s.end);
                    self.say(|| {
                        format!("invalidate_range_start(gfns {a:#x}..{b:#x}): kvm_mmu_invalidate_begin; kvm_tdp_mmu_unmap_gfn_range")
                    });
                    s.pc = NextRoot;
                    return Flow::Next;
                }
                // kvm_mmu_invalidate_begin(kvm, 0, -1ul): every fault that raced retries. (K14:
                // no mark at all.)
                if !self.opts.mutants.zap_gfn_range_no_invalidate() {
                    self.rmw(env, me, Loc::MmuNotifierCount(vm as u32), |c| c + 1);
                    self.kvm_mut(vm).mmu_invalidate_range = (0, u64::MAX);
                }
                self.perf.counters.inc(Counter::KvmZapGfnRange);
                let (a, b) = (s.start, s.end);
                self.say(|| {
                    format!("kvm_zap_gfn_range([{a:#x}, {b:#x})): kvm_mmu_invalidate_begin(0, ~0)")
                });
                s.pc = if shared { DowngradeLock } else { NextRoot };
                Flow::Next
            }
            DowngradeLock => {
                self.mmu_write_unlock(me, env);
                self.say(|| "patch 12: write_unlock(&kvm->mmu_lock)".into());
                s.pc = ReadLock;
                Flow::Next
            }
            ReadLock => {
                if let Some(spin) = self.mmu_read_lock(me, &mut s.lock, env) {
                    return spin;
                }
                s.pc = NextRoot;
                Flow::Next
            }
            NextRoot => {
                let root = self.tdp_roots_of(vm, s.as_id).nth(s.root as usize);
                match root {
                    Some(sp) => {
                        // v5.15–v5.17 `zap_gfn_range()`: a zap of everything walks the root's
                        // own entries only.
                        let min_level = if self.tdp_zap_all(vm, s) {
                            EPT_ROOT_LEVEL
                        } else {
                            1
                        };
                        s.iter = TdpIter::start(sp, min_level, s.start);
                        if self.tdp_zap_rcu() {
                            self.tdp_rcu_read_lock(me);
                        }
                        s.pc = Walk;
                        let a = s.as_id;
                        self.say(|| format!("walk root EPT page #{sp} (address space {a})"));
                        // K12: each root's walk starts with a flush flag of its own.
                        if self.opts.mutants.tdp_zap_yield_drops_prior_flush() {
                            s.prior_flush |= s.flush;
                            s.flush = false;
                        }
                    }
                    None if s.as_id + 1 < KVM_ADDRESS_SPACE_NUM => {
                        s.as_id += 1;
                        s.root = 0;
                        let a = s.as_id;
                        self.say(|| format!("address space {a}"));
                    }
                    None => {
                        s.pc = if shared { UpgradeLock } else { Flush };
                        self.say(|| "every root walked".into());
                    }
                }
                Flow::Next
            }
            Walk => self.zap_walk_step(me, s, env),
            Yield => {
                if shared {
                    self.mmu_read_unlock(me, env);
                } else {
                    self.mmu_write_unlock(me, env);
                }
                self.perf.counters.inc(Counter::KvmTdpMmuYields);
                self.charge(env, |c| c.mmu_lock_yield);
                let g = s.iter.next_last_level_gfn;
                if env.tracing() {
                    // The convoy on the timeline: a mark per yield on each zapper's track.
                    env.trace(TraceEvent::Instant {
                        agent: me,
                        name: "mmu_lock yield",
                        detail: Some(format!("gfn {g:#x}")),
                    });
                }
                self.say(|| {
                    format!("tdp_mmu_iter_cond_resched: mmu_lock contended: yield at gfn {g:#x}")
                });
                s.pc = Relock;
                Flow::Next
            }
            Relock => {
                let spin = if shared {
                    self.mmu_read_lock(me, &mut s.lock, env)
                } else {
                    self.mmu_write_lock(me, &mut s.lock, env)
                };
                if let Some(spin) = spin {
                    return spin;
                }
                if self.tdp_zap_rcu() {
                    self.tdp_rcu_read_lock(me);
                }
                s.flush = false;
                self.tdp_iter_resume_after_yield(s);
                s.pc = Walk;
                Flow::Next
            }
            ClearFrozen => {
                let (sp, idx) = s.iter.sptep();
                let old = self.ept.spte(sp, idx).kind;
                let SpteKind::Frozen(was) = old else {
                    unreachable!("only this zap freezes the entry")
                };
                self.set_spte(vm, sp, idx, SpteKind::None);
                if let Some(child) = was {
                    self.tdp_mmu_free_subtree(vm, child, env);
                }
                self.say(|| format!("clear the frozen SPTE (EPT page #{sp} entry {idx})"));
                self.zap_iter_next(s);
                s.pc = Walk;
                Flow::Next
            }
            FreeRemoved => {
                let sp = s.removed.take().expect("a removed table");
                self.tdp_free_removed(vm, sp, env);
                self.zap_iter_next(s);
                s.pc = Walk;
                Flow::Next
            }
            UpgradeLock => {
                self.mmu_read_unlock(me, env);
                self.say(|| "patch 12: read_unlock(&kvm->mmu_lock)".into());
                s.pc = WriteLockEnd;
                Flow::Next
            }
            WriteLockEnd => {
                if let Some(spin) = self.mmu_write_lock(me, &mut s.lock, env) {
                    return spin;
                }
                s.pc = End;
                Flow::Next
            }
            Flush => {
                s.pc = End;
                if s.notifier && s.flush && self.opts.mutants.tdp_notifier_skips_flush() {
                    self.say(|| "zapped, but no flush before the pages go".into());
                    s.flush = false;
                }
                if s.flush || s.prior_flush {
                    self.say(|| "kvm_flush_remote_tlbs_range (a full flush on VMX)".into());
                    s.flush = false;
                    s.prior_flush = false;
                    return Flow::Call(FlushRemoteTlbs::call());
                }
                self.say(|| "nothing zapped: no flush".into());
                Flow::Next
            }
            End if s.notifier => {
                // invalidate_range_end ends the invalidation, under the lock again.
                self.mmu_write_unlock(me, env);
                self.say(|| "write_unlock(&kvm->mmu_lock)".into());
                Flow::Return
            }
            End => {
                let vm32 = vm as u32;
                self.rmw(env, me, Loc::MmuNotifierSeq(vm32), |c| c + 1);
                if !self.opts.mutants.zap_gfn_range_no_invalidate() {
                    self.rmw(env, me, Loc::MmuNotifierCount(vm32), |c| c - 1);
                }
                self.mmu_write_unlock(me, env);
                self.say(|| "kvm_mmu_invalidate_end; write_unlock(&kvm->mmu_lock)".into());
                Flow::Return
            }
        }
    }

    /// Would the zap's next step only wait for `mmu_lock`?
    pub(crate) fn zap_gfn_range_waits(&self, me: usize, s: &ZapGfnRange) -> bool {
        use ZapGfnRangePc::*;
        let shared = self.opts.zap_gfn_range_lock == ZapLock::Read;
        match s.pc {
            Lock | WriteLockEnd => self.mmu_rwlock_waits(me, s.lock, true),
            ReadLock => self.mmu_rwlock_waits(me, s.lock, false),
            Relock => self.mmu_rwlock_waits(me, s.lock, !shared),
            _ => false,
        }
    }

    /// One iteration of `tdp_mmu_zap_leafs()` (write lock) or of patch 12's
    /// `zap_gfn_range_atomic()` (read lock).
    fn zap_walk_step<E: Env>(&mut self, me: usize, s: &mut ZapGfnRange, env: &mut E) -> Flow {
        let vm = self.vm_of(me);
        let shared = self.opts.zap_gfn_range_lock == ZapLock::Read;
        let end = s.end.min(self.kvm(vm).max_gfn);
        if !s.iter.valid || s.iter.gfn >= end {
            s.root += 1;
            s.pc = ZapGfnRangePc::NextRoot;
            if self.tdp_zap_rcu() {
                self.zap_rcu_read_unlock(me, "end of this root's walk", env);
            } else {
                self.say(|| "end of this root's walk".into());
            }
            return Flow::Next;
        }
        self.perf.counters.inc(Counter::KvmTdpIterSteps);
        self.charge(env, |c| c.tdp_iter_step);
        // tdp_mmu_iter_cond_resched(kvm, &iter, flush, shared): yield only after progress,
        // when mmu_lock is contended or the host wants the pCPU (need_resched()).
        if s.iter.made_progress()
            && (self.mmu_rwlock_contended(me, env) || self.need_resched(me, env))
        {
            s.pc = ZapGfnRangePc::Yield;
            // v5.12–v5.17: rcu_read_unlock() before the flush (bd29677952fa, v5.18, moved it
            // after).
            if self.tdp_zap_rcu() {
                self.zap_rcu_read_unlock(me, "tdp_mmu_iter_cond_resched", env);
            }
            if s.flush {
                s.flush = false;
                self.say(|| "tdp_mmu_iter_cond_resched: flush before yielding".into());
                return Flow::Call(FlushRemoteTlbs::call());
            }
            self.say(|| {
                "tdp_mmu_iter_cond_resched: contended after progress: yield (no flush pending)"
                    .into()
            });
            return Flow::Next;
        }
        let (sp, idx) = s.iter.sptep();
        let spte = self.ept.spte(sp, idx);
        let level = s.iter.level;
        let gfn = s.iter.gfn;
        if shared {
            // Zap whole entries of at most 1 GiB that lie inside the range, tables included.
            let inside = gfn >= s.start && gfn + gfns_per_entry(level) <= s.end;
            if spte.is_present() && level <= KVM_MAX_HUGEPAGE_LEVEL && inside {
                let child = match spte.kind {
                    SpteKind::Table(c) => Some(c),
                    _ => None,
                };
                // tdp_mmu_zap_spte_atomic(): freeze, flush, clear.
                self.set_spte(vm, sp, idx, SpteKind::Frozen(child));
                self.perf.counters.inc(Counter::KvmTdpSptesZapped);
                self.charge(env, |c| c.spte_zap);
                self.say(|| {
                    format!("freeze the SPTE of gfn {gfn:#x} (level {level}); kvm_flush_remote_tlbs_gfn")
                });
                s.pc = ZapGfnRangePc::ClearFrozen;
                return Flow::Call(FlushRemoteTlbs::call());
            }
            self.say(|| {
                format!(
                    "tdp_iter: gfn {gfn:#x} level {level}: {}",
                    entry_text(spte.kind)
                )
            });
            self.zap_iter_next(s);
            return Flow::Next;
        }
        if self.opts.tdp_zap != TdpZap::Mainline {
            if let Some(flow) = self.zap_whole_table(me, s, env) {
                return flow;
            }
        }
        if matches!(spte.kind, SpteKind::Leaf { .. }) {
            // tdp_mmu_set_spte(kvm, &iter, 0): handle_changed_spte() is handed what the write
            // returns (the fix's xchg), or, A4, what the iterator read.
            let believed = s.old_spte.unwrap_or(spte.kind);
            self.set_spte_believing(vm, sp, idx, SpteKind::None, believed);
            self.perf.counters.inc(Counter::KvmTdpSptesZapped);
            self.charge(env, |c| c.spte_zap);
            s.flush = true;
            self.say(|| format!("zap the leaf SPTE of gfn {gfn:#x} (level {level})"));
        } else {
            self.say(|| {
                format!(
                    "tdp_iter: gfn {gfn:#x} level {level}: {}",
                    entry_text(spte.kind)
                )
            });
        }
        self.zap_iter_next(s);
        Flow::Next
    }

    /// Before v5.18, `zap_gfn_range()` zaps a non-leaf entry that lies wholly inside the range
    /// (one that sticks out is stepped into): `tdp_mmu_set_spte()` clears it and
    /// `handle_removed_tdp_mmu_page()` (v5.10: `handle_changed_spte`) flushes the table's range
    /// (a full flush on VMX) before the table goes. `None` if the entry is not such a table.
    fn zap_whole_table<E: Env>(
        &mut self,
        me: usize,
        s: &mut ZapGfnRange,
        env: &mut E,
    ) -> Option<Flow> {
        let vm = self.vm_of(me);
        let (sp, idx) = s.iter.sptep();
        let (level, gfn) = (s.iter.level, s.iter.gfn);
        let SpteKind::Table(child) = self.ept.spte(sp, idx).kind else {
            return None;
        };
        // v5.15 clamps the range to the host's gfns first, and a zap of everything skips the
        // test (its walk sees the root's entries only).
        let end = match self.opts.tdp_zap {
            TdpZap::V5_15 => s.end.min(self.kvm(vm).max_gfn),
            _ => s.end,
        };
        if !self.tdp_zap_all(vm, s) && (gfn < s.start || gfn + gfns_per_entry(level) > end) {
            return None;
        }
        self.set_spte(vm, sp, idx, SpteKind::None);
        self.perf.counters.inc(Counter::KvmTdpSptesZapped);
        self.charge(env, |c| c.spte_zap);
        s.flush = true;
        if self.opts.tdp_zap != TdpZap::V5_10 && self.opts.mutants.tdp_removed_pt_defers_flush() {
            // bb95dfb9e2df: the flush is the caller's.
            self.tdp_call_rcu(vm, child, env);
            self.say(|| {
                format!("zap the table SPTE of gfn {gfn:#x} (level {level}); handle_removed_tdp_mmu_page: call_rcu(EPT page #{child}), the flush left to the caller")
            });
            self.zap_iter_next(s);
            return Some(Flow::Next);
        }
        s.removed = Some(child);
        s.pc = ZapGfnRangePc::FreeRemoved;
        self.say(|| {
            format!("zap the table SPTE of gfn {gfn:#x} (level {level}); handle_removed_tdp_mmu_page: kvm_flush_remote_tlbs_with_address")
        });
        Some(Flow::Call(FlushRemoteTlbs::call()))
    }

    /// `tdp_iter_next()`, which reads the entry it reaches into `iter->old_spte` (kept only for
    /// the A4 mutant, see [`ZapGfnRange::old_spte`]).
    fn zap_iter_next(&self, s: &mut ZapGfnRange) {
        s.iter.next(&self.ept);
        s.old_spte = (s.iter.valid && self.opts.mutants.tdp_mmu_write_spte_plain())
            .then(|| s.iter.old_spte(&self.ept).kind);
    }

    /// After a yield, the walk goes on from where it stopped: `tdp_iter_next()` sees
    /// `iter->yielded` and restarts from the root at `next_last_level_gfn` without stepping.
    /// K15 (v5.15, before 3a0f64de479c): `tdp_iter_restart()`, then the loop's own
    /// `tdp_iter_next()`, which steps over the entry the walk restarted at.
    fn tdp_iter_resume_after_yield(&mut self, s: &mut ZapGfnRange) {
        if self.opts.tdp_zap == TdpZap::V5_15 && self.opts.mutants.tdp_iter_advances_after_restart()
        {
            s.iter.restart();
            self.zap_iter_next(s);
            let g = s.iter.gfn;
            self.say(|| {
                format!("tdp_iter_restart, then tdp_iter_next: the walk goes on at gfn {g:#x}")
            });
        } else {
            s.iter.yielded = true;
            self.zap_iter_next(s);
        }
    }

    /// A table removed by a pre-v5.18 zap, its range flushed: `free_page()` at once with its
    /// subtree (v5.10, `handle_changed_spte`), or `call_rcu()` (v5.12+, freed after the walk's
    /// and every fault's RCU read sections end).
    fn tdp_free_removed<E: Env>(&mut self, vm: usize, sp: SpId, env: &mut E) {
        if self.opts.tdp_zap == TdpZap::V5_10 {
            self.tdp_mmu_free_subtree(vm, sp, env);
            self.say(|| format!("free_page(EPT page #{sp}) and its subtree"));
        } else {
            self.tdp_call_rcu(vm, sp, env);
            self.say(|| format!("call_rcu(EPT page #{sp}): freed after a grace period"));
        }
    }

    /// `zap_gfn_range()`'s `zap_all` (v5.15–v5.17, from 524a1e4e381f): a zap from gfn 0 to at
    /// least the host's largest gfn walks each root's own entries only and zaps them whole.
    fn tdp_zap_all(&self, vm: usize, s: &ZapGfnRange) -> bool {
        self.opts.tdp_zap == TdpZap::V5_15 && s.start == 0 && s.end >= self.kvm(vm).max_gfn
    }

    /// Is the GFN-range zap's walk an RCU read section that matters: one whose tables go to
    /// `call_rcu` (v5.12–v5.17)? (From v5.12 every form walks inside `rcu_read_lock()`, but the
    /// leaf-only walk and patch 12's, which frees after its flush, free nothing through RCU,
    /// so their read sections are not recorded.)
    fn tdp_zap_rcu(&self) -> bool {
        matches!(self.opts.tdp_zap, TdpZap::V5_12 | TdpZap::V5_15)
    }

    /// The zap walk's `rcu_read_unlock()` (at `at`), saying which grace periods it ended.
    fn zap_rcu_read_unlock<E: Env>(&mut self, me: usize, at: &'static str, env: &mut E) {
        let freed = self.tdp_rcu_read_unlock(me, env);
        self.say(|| match freed {
            0 => format!("{at}: rcu_read_unlock"),
            n => {
                format!("{at}: rcu_read_unlock: the grace period ends, {n} removed table(s) freed")
            }
        });
    }

    /// The host virtual address behind guest frame `gfn` of VM `vm` (`__gfn_to_hva_memslot`
    /// of address space 0's slot; the model's host maps guest memory at hva = host frame <<
    /// 12), or the frame's own address where no slot covers it.
    fn gfn_hva(&self, vm: usize, gfn: Gfn) -> u64 {
        let slots = self.kvm(vm).address_spaces[0].active_set();
        slots.lookup(gfn).map_or(gfn, |sl| sl.pfn_of(gfn)) << 12
    }

    /// `need_resched()` on agent `me`'s host CPU: the host scheduler wants the pCPU of a vCPU
    /// thread (its time slice is over with another thread waiting, housekeeping is due, or a
    /// wake-up preempts it). Timed driver only (the explorer gives every vCPU its own pCPU);
    /// host threads other than vCPUs never see it. Simplified: the zap then yields `mmu_lock`
    /// as `cond_resched_rwlock_write()` does, but the thread is descheduled only at its next
    /// return to the guest (where the model's host preempts vCPU threads).
    fn need_resched<E: Env>(&self, me: usize, env: &E) -> bool {
        env.timed() && me < self.cpus.len() && self.host_preempt_due(me, env.now() + env.elapsed())
    }

    /// One step of the TDP MMU fault path on vCPU `v`.
    pub(crate) fn tdp_mmu_page_fault_step<E: Env>(
        &mut self,
        v: CpuId,
        s: &mut TdpMmuPageFault,
        env: &mut E,
    ) -> Flow {
        use TdpMmuPageFaultPc::*;
        let vm = self.vm_of(v);
        let gfn = s.gfn;
        match s.pc {
            Lookup => {
                self.perf.counters.inc(Counter::KvmEptViolations);
                self.charge(env, |c| c.ept_violation);
                // The topup; its seeded mutant tops up under the lock (`Map`), which alone asks
                // for it (so that only the mutated code marks it run).
                if !self.opts.mutants.topup_failure_skips_read_unlock
                    && self.mmu_topup_memory_caches_fails(v)
                {
                    return self.fault_returns_enomem(v, || {
                        format!(
                            "kvm_tdp_page_fault(gfn {gfn:#x}): mmu_topup_memory_caches: -ENOMEM"
                        )
                    });
                }
                s.mmu_seq = self.load(env, v, Loc::MmuNotifierSeq(vm as u32));
                let noncoherent = self.load(env, v, Loc::NoncoherentDma(vm as u32)) != 0;
                s.honors = self.honors_guest_mtrrs_with(noncoherent);
                let a = self.fault_as_id(v);
                s.target = self.fault_target(vm, a, gfn, s.write);
                let seq = s.mmu_seq;
                self.say(|| format!("kvm_tdp_page_fault(gfn {gfn:#x}): mmu_seq = {seq}"));
                match s.target {
                    FaultTarget::Ram { .. } => {}
                    // A write to a ROM slot: emulated, nothing mapped.
                    FaultTarget::RomWrite => {
                        self.host_mut().vcpus[v].emulate = Some(Emulation::RomWrite { gfn });
                        return Flow::Return;
                    }
                    // No slot: emulated as MMIO. (The TDP MMU's MMIO SPTEs are not modelled:
                    // every access to such a frame exits.)
                    FaultTarget::NoSlot => {
                        let derived = self.kvm(vm).address_spaces[a].active_set().version;
                        self.host_mut().vcpus[v].emulate = Some(Emulation::Mmio { gfn, derived });
                        return Flow::Return;
                    }
                }
                s.pc = Lock;
                Flow::Next
            }
            Lock => {
                if let Some(spin) = self.mmu_read_lock(v, &mut s.lock, env) {
                    return spin;
                }
                s.pc = Map;
                Flow::Next
            }
            Map => {
                if self.mmu_topup_failure_pending(v)
                    && self.opts.mutants.topup_failure_skips_read_unlock()
                    && self.mmu_topup_memory_caches_fails(v)
                {
                    return self.fault_returns_enomem(v, || {
                        format!("kvm_tdp_page_fault(gfn {gfn:#x}): mmu_topup_memory_caches under mmu_lock: -ENOMEM; return (still holding it for read)")
                    });
                }
                // is_page_fault_stale() → mmu_invalidate_retry_hva(kvm, mmu_seq, hva).
                let count = self.load(env, v, Loc::MmuNotifierCount(vm as u32));
                let seq = self.load(env, v, Loc::MmuNotifierSeq(vm as u32));
                let (rs, re) = self.kvm(vm).mmu_invalidate_range;
                let FaultTarget::Ram { pfn, .. } = s.target else {
                    unreachable!("Lookup returned for anything but RAM")
                };
                // The model's host maps guest memory at hva = its host frame << 12.
                let hva = pfn << 12;
                if (count != 0 && hva >= rs && hva < re) || seq != s.mmu_seq {
                    self.mmu_read_unlock(v, env);
                    self.perf.counters.inc(Counter::KvmFaultRetries);
                    self.say(|| {
                        format!(
                            "is_page_fault_stale (in progress {count}, seq {seq}): RET_PF_RETRY"
                        )
                    });
                    return Flow::Return;
                }
                let (goal, nx) = self.tdp_fault_goal(v, s);
                if let Some((sp, idx)) = self.tdp_huge_leaf_in_the_way(v, gfn, goal) {
                    // tdp_mmu_zap_spte_atomic(): freeze the huge SPTE, flush it from every
                    // vCPU, clear it; the walk then links a table there.
                    self.set_spte(vm, sp, idx, SpteKind::Frozen(None));
                    self.charge(env, |c| c.spte_zap);
                    s.frozen = Some((sp, idx));
                    s.pc = ClearHuge;
                    if self.opts.mutants.huge_spte_split_skips_flush() {
                        self.say(|| format!("kvm_tdp_mmu_map: a huge SPTE where a table goes (EPT page #{sp} entry {idx}): freeze it, no flush"));
                        return Flow::Next;
                    }
                    self.say(|| format!("kvm_tdp_mmu_map: a huge SPTE where a table goes (EPT page #{sp} entry {idx}): freeze it; kvm_flush_remote_tlbs_gfn"));
                    return Flow::Call(FlushRemoteTlbs::call());
                }
                self.tdp_mmu_map_and_unlock(v, s, goal, nx, env)
            }
            ClearHuge => {
                let (sp, idx) = s.frozen.take().expect("the frozen huge SPTE");
                self.set_spte(vm, sp, idx, SpteKind::None);
                self.say(|| format!("clear the frozen huge SPTE (EPT page #{sp} entry {idx})"));
                let (goal, nx) = self.tdp_fault_goal(v, s);
                self.tdp_mmu_map_and_unlock(v, s, goal, nx, env)
            }
        }
    }

    /// `kvm_tdp_mmu_map()` at the fault's goal level, then `read_unlock(&kvm->mmu_lock)`: the
    /// fault returns.
    fn tdp_mmu_map_and_unlock<E: Env>(
        &mut self,
        v: CpuId,
        s: &TdpMmuPageFault,
        goal: u8,
        nx: NxFault,
        env: &mut E,
    ) -> Flow {
        let what = self.kvm_tdp_mmu_map(v, s, goal, nx, env);
        self.charge(env, |c| c.spte_install);
        self.mmu_read_unlock(v, env);
        self.say(|| format!("kvm_tdp_mmu_map: {what}; read_unlock(&kvm->mmu_lock)"));
        Flow::Return
    }

    /// The fault's goal level and NX state: the memslot's level, lowered for guest MTRRs
    /// (`tdp_max_level`) and by `kvm_mmu_hugepage_adjust`/`disallowed_hugepage_adjust`.
    fn tdp_fault_goal(&self, v: CpuId, s: &TdpMmuPageFault) -> (u8, NxFault) {
        let FaultTarget::Ram { level, .. } = s.target else {
            unreachable!("only RAM is mapped")
        };
        let req = self.tdp_max_level(v, s.gfn, level, s.honors);
        match self.host_ref().vcpus[v].root {
            Some(root) => self.nx_hugepage_adjust(self.vm_of(v), root, s.gfn, req, s.exec),
            None => (
                req,
                NxFault {
                    disallowed: false,
                    req_level: req,
                },
            ),
        }
    }

    /// A huge leaf on the walk of `gfn` from the vCPU's root above level `goal`.
    fn tdp_huge_leaf_in_the_way(&self, v: CpuId, gfn: Gfn, goal: u8) -> Option<(SpId, u16)> {
        let mut sp = self.host_ref().vcpus[v].root?;
        for l in (goal + 1..=EPT_ROOT_LEVEL).rev() {
            let idx = ept_index(l, gfn);
            match self.ept.spte(sp, idx).kind {
                SpteKind::Table(child) => sp = child,
                SpteKind::Leaf { .. } => return Some((sp, idx)),
                _ => return None,
            }
        }
        None
    }

    /// `kvm_tdp_mmu_map()`: walk from the vCPU's root, link missing tables and install the leaf
    /// at the fault's level (see the module's simplifications). Returns what it did.
    fn kvm_tdp_mmu_map<E: Env>(
        &mut self,
        v: CpuId,
        s: &TdpMmuPageFault,
        goal: u8,
        nx: NxFault,
        env: &mut E,
    ) -> String {
        let vm = self.vm_of(v);
        let Some(mut sp) = self.host_ref().vcpus[v].root else {
            return "no root: RET_PF_RETRY".into();
        };
        let FaultTarget::Ram { pfn, writable, .. } = s.target else {
            unreachable!("Lookup returned for anything but RAM")
        };
        let gfn = s.gfn;
        let as_id = self.kvm(vm).mmu.sp_as_id(sp);
        for l in (goal + 1..=EPT_ROOT_LEVEL).rev() {
            let idx = ept_index(l, gfn);
            match self.ept.spte(sp, idx).kind {
                SpteKind::Table(child) => sp = child,
                SpteKind::Frozen(_) => return format!("gfn {gfn:#x}: a frozen SPTE: RET_PF_RETRY"),
                SpteKind::None | SpteKind::Mmio { .. } => {
                    let child = self.tdp_mmu_alloc_sp(vm, gfn, l - 1, as_id, env);
                    self.set_spte(vm, sp, idx, SpteKind::Table(child));
                    self.account_nx_huge_page(vm, child, nx, l);
                    sp = child;
                }
                // A huge leaf where a table is wanted: the fault's `Map` step has zapped any such
                // leaf with its flush before this walk (`tdp_huge_leaf_in_the_way`), so only a
                // change between the two would land here; the fault then retries.
                SpteKind::Leaf { .. } => {
                    return format!("gfn {gfn:#x}: a huge SPTE where a table goes: RET_PF_RETRY")
                }
            }
        }
        let idx = ept_index(goal, gfn);
        let span = gfns_per_entry(goal);
        let leaf_pfn = pfn - (gfn % span);
        let memtype = self.vmx_get_mt_mask(v, gfn);
        let kind = SpteKind::Leaf {
            pfn: leaf_pfn,
            writable,
            mmu_writable: writable,
            memtype,
            exec: self.spte_exec(goal),
            dirty: self.make_spte_dirty(writable),
            access_tracked: false,
        };
        // make_spte(): a writable SPTE of a slot that logs dirty pages marks its gfn.
        if writable && !self.make_spte_leaves_mark_to_pml() {
            self.mark_page_dirty_in_slot(v, as_id as usize, gfn, env);
        }
        let old = self.ept.spte(sp, idx).kind;
        if old == kind {
            return format!("gfn {gfn:#x} already mapped: RET_PF_SPURIOUS");
        }
        if matches!(
            old,
            SpteKind::Frozen(_) | SpteKind::Leaf { .. } | SpteKind::Table(_)
        ) {
            return format!("gfn {gfn:#x}: the SPTE changed under the walk: RET_PF_RETRY");
        }
        self.set_spte(vm, sp, idx, kind);
        self.kvm_mut(vm)
            .mmu
            .memtype_origin
            .insert((sp, idx), v as u32);
        self.perf.counters.inc(Counter::KvmMmuPfFixed);
        let size = if goal == 2 { "2 MiB" } else { "4 KiB" };
        format!(
            "map gfn {gfn:#x} -> pfn {leaf_pfn:#x} ({size}, memtype {}, EPT page #{sp} entry {idx})",
            crate::kvm::vmx::memtype_text(memtype)
        )
    }

    /// Populate every root of VM `vm` for gfns `[start, start + npages)` as vCPU 0's faults
    /// would have, each from its own address space's memslots (setup before a run: memory the
    /// guest touched before).
    pub(crate) fn tdp_prefault<E: Env>(&mut self, vm: usize, start: Gfn, npages: u64, env: &mut E) {
        let v0 = self.kvm(vm).vcpus.start;
        if !self.kvm(vm).tdp_roots.iter().any(|r| r.as_id == 0) {
            self.kvm_tdp_mmu_get_vcpu_root(vm, 0, env);
        }
        let roots: Vec<(SpId, u8)> = self
            .kvm(vm)
            .tdp_roots
            .iter()
            .map(|r| (r.sp, r.as_id))
            .collect();
        let honors = self.honors_guest_mtrrs(vm);
        let mut gfn = start;
        while gfn < start + npages {
            // On to the next region any root's leaf here ends (one gfn if none maps it).
            let mut next = gfn + 1;
            let mut first = true;
            for &(root, as_id) in &roots {
                let FaultTarget::Ram {
                    pfn,
                    writable,
                    level,
                } = self.fault_target(vm, as_id as usize, gfn, false)
                else {
                    continue;
                };
                let goal = self.tdp_max_level(v0, gfn, level, honors);
                let span = gfns_per_entry(goal);
                let end = gfn / span * span + span;
                next = if first { end } else { next.min(end) };
                first = false;
                let mut sp = root;
                for l in (goal + 1..=EPT_ROOT_LEVEL).rev() {
                    let idx = ept_index(l, gfn);
                    sp = match self.ept.spte(sp, idx).kind {
                        SpteKind::Table(child) => child,
                        _ => {
                            let child = self.tdp_mmu_alloc_sp(vm, gfn, l - 1, as_id, env);
                            self.set_spte(vm, sp, idx, SpteKind::Table(child));
                            child
                        }
                    };
                }
                let idx = ept_index(goal, gfn);
                let memtype = self.vmx_get_mt_mask(v0, gfn);
                let kind = SpteKind::Leaf {
                    pfn: pfn - (gfn % span),
                    writable,
                    mmu_writable: writable,
                    memtype,
                    exec: self.spte_exec(goal),
                    dirty: self.make_spte_dirty(writable),
                    access_tracked: false,
                };
                self.set_spte(vm, sp, idx, kind);
                self.kvm_mut(vm)
                    .mmu
                    .memtype_origin
                    .insert((sp, idx), v0 as u32);
            }
            gfn = next;
        }
    }

    /// The fault's goal level: the memslot's (`level`), lowered while guest MTRRs are honoured
    /// until the vCPU's MTRRs give the whole huge page one type
    /// (`kvm_mtrr_check_gfn_range_consistency`).
    fn tdp_max_level(&self, v: CpuId, gfn: Gfn, level: u8, honors: bool) -> u8 {
        if level < 2 || !honors {
            return level;
        }
        let n = gfns_per_entry(2);
        let base = gfn / n * n;
        if self.host_ref().vcpus[v].mtrr.uniform(base, n) {
            2
        } else {
            1
        }
    }
}

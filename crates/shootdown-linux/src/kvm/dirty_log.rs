//! Dirty logging (virt/kvm/kvm_main.c, arch/x86/kvm/x86.c and mmu/): a memslot made with
//! `KVM_MEM_LOG_DIRTY_PAGES` has a dirty bitmap; every writable SPTE made for it marks its gfn
//! (`make_spte` → `mark_page_dirty_in_slot`, or `fast_page_fault` after its `cmpxchg`), and the
//! VMM harvests the bitmap with `KVM_GET_DIRTY_LOG` (`kvm_get_dirty_log_protect`): under
//! `slots_lock` and `mmu_lock`, each non-zero word is taken with `xchg` and its gfns
//! write-protected (`kvm_arch_mmu_enable_log_dirty_pt_masked` →
//! `kvm_mmu_write_protect_pt_masked`: the rmaps' `__rmap_write_protect(.., pt_protect =
//! false)`, the TDP MMU's `kvm_tdp_mmu_clear_dirty_pt_masked(.., wrprot = true)`); then, after
//! `mmu_lock` is dropped, one remote flush (`kvm_arch_flush_remote_tlbs_memslot`) before the
//! bitmap is copied out. The next write to such a page faults — the fast path sets W again
//! and marks it (`fast_pf.rs`).
//!
//! Why the flush before the copy is enough: a vCPU may keep a writable TLB entry of a page
//! until the flush, writing it without marking it, but that page's bit was set when its SPTE
//! was made writable (or, for an SPTE writable before logging began, the VMM copies the page
//! once turning logging on has returned) and is in the bitmap being returned, and those
//! writes are done before the VMM reads the page (it copies only after the ioctl returns).
//!
//! The oracle (`INV-DIRTYLOG`): every guest write to a logged page is owed to the VMM until a
//! returned bitmap holds the page. When `KVM_GET_DIRTY_LOG` returns, each page owed must be
//! in the bitmap it returns, or set again in the live bitmap, or about to be set by a vCPU
//! that made its SPTE writable and has yet to mark it — otherwise the write is lost to the
//! VMM (a migration would send the old contents).
//!
//! With `manual_dirty_log_protect` (`KVM_CAP_MANUAL_DIRTY_LOG_PROTECT2`, which QEMU enables
//! when the kernel has it) `KVM_GET_DIRTY_LOG` only copies the live bitmap out (no lock, no
//! write-protect, no flush), and the VMM then clears the bits it got with
//! `KVM_CLEAR_DIRTY_LOG` (`kvm_clear_dirty_log_protect`): under `mmu_lock`,
//! `atomic_long_fetch_andnot` of its mask from each word, the bits that were still set
//! write-protected, one flush after the unlock; the VMM copies those pages once it returns,
//! so that is where `INV-DIRTYLOG` judges.
//!
//! With PML (`pml.rs`) a harvest clears D bits instead of W, and pages the CPU logged but KVM
//! has not drained yet count as reported later. A host thread may also turn logging on for a
//! live slot (`enable_dirty_log`: a FLAGS_ONLY memslot update, then
//! `kvm_mmu_slot_apply_flags` write-protects the slot and flushes — always, since
//! b64d740ea7dd), after which only later writes are owed; with `KVM_DIRTY_LOG_INITIALLY_SET`
//! the bitmap starts all set and nothing is write-protected until `KVM_CLEAR_DIRTY_LOG`.
//!
//! Simplified: no dirty ring; `KVM_CLEAR_DIRTY_LOG` clears the whole slot's range with the
//! mask of the VMM's last `KVM_GET_DIRTY_LOG` (QEMU clears the bits it fetched, in chunks);
//! logging is never turned off; a logged slot's new SPTEs are 4 KiB (as
//! `kvm_mmu_hugepage_adjust` makes them once logging is on).

use crate::counters::Counter;
use crate::frame::{Flow, Frame};
use crate::kvm::kvm_main::{FlushRemoteTlbs, SetMemoryRegion, SetMemoryRegionPc};
use crate::kvm::memslot::Memslot;
use crate::kvm::mmu::rwlock::RwlockWait;
use crate::kvm::mode;
use crate::machine::Machine;
use crate::mem::{spin_key, Loc};
use shootdown_engine::{Env, Violation};
use shootdown_hw::ept::{gfns_per_entry, EptWalk, Gfn, SpId, SpteKind};
use shootdown_hw::CpuId;
use std::collections::BTreeMap;

/// The ioctl's name, for the counterexample.
fn ioctl_name(clear: bool) -> &'static str {
    if clear {
        "KVM_CLEAR_DIRTY_LOG"
    } else {
        "KVM_GET_DIRTY_LOG"
    }
}

/// Bits per dirty-bitmap word (`BITS_PER_LONG`).
pub const BITS_PER_LONG: u64 = 64;

/// Where page `rel` of a slot is in its bitmap: the word and the bit (`set_bit_le`).
pub fn bit_of(rel: u64) -> (u32, u64) {
    ((rel / BITS_PER_LONG) as u32, 1 << (rel % BITS_PER_LONG))
}

/// A memslot's key in the dirty log: `(as_id << 16) | id`, as `KVM_GET_DIRTY_LOG`'s `slot`.
pub fn slot_key(as_id: u8, id: u16) -> u32 {
    (as_id as u32) << 16 | id as u32
}

/// The VM's dirty bitmaps and the oracle's record of writes not yet reported.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct DirtyLog {
    /// `memslot->dirty_bitmap` of each logged slot, by [`slot_key`] (`Loc::DirtyBitmap`).
    pub bitmaps: BTreeMap<u32, Vec<u64>>,
    /// The VMM's copy of each slot's bitmap from its last `KVM_GET_DIRTY_LOG` (manual
    /// protect: the mask its `KVM_CLEAR_DIRTY_LOG` passes).
    pub fetched: BTreeMap<u32, Vec<u64>>,
    /// Oracle: pages written since a returned bitmap last held them, with the vCPU that
    /// wrote last.
    pub owed: BTreeMap<Gfn, u32>,
}

impl DirtyLog {
    /// Give memslot `sl` of address space `as_id` a dirty bitmap (`kvm_alloc_dirty_bitmap`),
    /// with every page's bit set if `all_set` (`KVM_DIRTY_LOG_INITIALLY_SET`: `bitmap_set`).
    pub fn alloc(&mut self, as_id: u8, sl: &Memslot, all_set: bool) {
        let words = sl.npages.div_ceil(BITS_PER_LONG) as usize;
        let mut b = vec![0; words];
        if all_set {
            for (w, x) in b.iter_mut().enumerate() {
                let left = sl.npages - w as u64 * BITS_PER_LONG;
                *x = if left >= BITS_PER_LONG {
                    u64::MAX
                } else {
                    (1 << left) - 1
                };
            }
        }
        self.bitmaps.insert(slot_key(as_id, sl.id), b);
    }

    pub fn word(&self, key: u32, w: u32) -> u64 {
        self.bitmaps.get(&key).map_or(0, |b| b[w as usize])
    }

    pub fn set_word(&mut self, key: u32, w: u32, x: u64) {
        if let Some(b) = self.bitmaps.get_mut(&key) {
            b[w as usize] = x;
        }
    }
}

/// `kvm_vm_ioctl_get_dirty_log()` (x86.c) → `kvm_get_dirty_log_protect()`, or
/// `kvm_vm_ioctl_clear_dirty_log()` → `kvm_clear_dirty_log_protect()`, by a VMM thread.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct GetDirtyLog {
    pub pc: GetDirtyLogPc,
    pub as_id: u8,
    pub id: u16,
    /// `KVM_CLEAR_DIRTY_LOG` (of the whole slot, with the VMM's last fetched bitmap).
    pub clear: bool,
    /// The slot's first gfn, its size and its bitmap's length in words (read under
    /// `slots_lock`).
    pub base_gfn: Gfn,
    pub npages: u64,
    pub words: u32,
    /// The next word to harvest.
    pub word: u32,
    /// `dirty_bitmap_buffer`: what the ioctl will copy out.
    pub buffer: Vec<u64>,
    pub flush: bool,
    pub lock: RwlockWait,
    /// `kvm_arch_sync_dirty_log()`: the vCPUs kicked so far.
    pub kicked: u32,
}

/// The steps of `KVM_GET_DIRTY_LOG`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GetDirtyLogPc {
    /// `mutex_lock(&kvm->slots_lock)`; `id_to_memslot()` (-ENOENT without a dirty bitmap).
    SlotsLock,
    /// With PML: `kvm_arch_sync_dirty_log()`, `kvm_vcpu_kick()` of each vCPU in turn (no wait).
    SyncDirtyLog,
    /// `KVM_MMU_LOCK(kvm)` (the spinlock, or the TDP MMU's rwlock for write).
    MmuLock,
    /// One word: `if (!dirty_bitmap[i]) continue; flush = true; mask = xchg(&dirty_bitmap[i],
    /// 0)`; `kvm_arch_mmu_enable_log_dirty_pt_masked(kvm, memslot, offset, mask)`. (CLEAR:
    /// `if (!mask) continue; mask &= atomic_long_fetch_andnot(mask, &dirty_bitmap[i])`; if
    /// bits were set, `flush = true` and the same write-protect.)
    Harvest,
    /// `KVM_MMU_UNLOCK(kvm)`; `if (flush) kvm_arch_flush_remote_tlbs_memslot()`.
    Unlock,
    /// `copy_to_user(log->dirty_bitmap, dirty_bitmap_buffer, n)`; `mutex_unlock`; return.
    CopyToUser,
}

impl GetDirtyLog {
    pub fn call(as_id: u8, id: u16) -> Frame {
        Self::frame(as_id, id, false)
    }

    /// `KVM_CLEAR_DIRTY_LOG` of all of memslot `id` (manual protect).
    pub fn clear(as_id: u8, id: u16) -> Frame {
        Self::frame(as_id, id, true)
    }

    fn frame(as_id: u8, id: u16, clear: bool) -> Frame {
        Frame::GetDirtyLog(Box::new(GetDirtyLog {
            pc: GetDirtyLogPc::SlotsLock,
            as_id,
            id,
            clear,
            base_gfn: 0,
            npages: 0,
            words: 0,
            word: 0,
            buffer: Vec::new(),
            flush: false,
            lock: RwlockWait::Fast,
            kicked: 0,
        }))
    }
}

impl Machine {
    /// `kvm_vcpu_mark_page_dirty()` (`fast_page_fault`'s): look `gfn` up in the memslots of
    /// address space `as_id` (`kvm_vcpu_gfn_to_memslot`, a read of `kvm->memslots`), then
    /// `mark_page_dirty_in_slot()`. Whether it marked.
    pub(crate) fn kvm_vcpu_mark_page_dirty<E: Env>(
        &mut self,
        me: usize,
        as_id: usize,
        gfn: Gfn,
        env: &mut E,
    ) -> bool {
        self.mark_page_dirty(me, as_id, gfn, true, env)
    }

    /// `mark_page_dirty_in_slot()` from a fault's `make_spte()`, for the slot the fault
    /// looked up (the model takes the active set's: the lookup read it already). Whether it
    /// marked.
    pub(crate) fn mark_page_dirty_in_slot<E: Env>(
        &mut self,
        me: usize,
        as_id: usize,
        gfn: Gfn,
        env: &mut E,
    ) -> bool {
        self.mark_page_dirty(me, as_id, gfn, false, env)
    }

    /// Both marks: the slot of `gfn` in address space `as_id`'s memslots — read afresh from
    /// `kvm->memslots` (`lookup`) or the active set's — and its bit, if it logs.
    fn mark_page_dirty<E: Env>(
        &mut self,
        me: usize,
        as_id: usize,
        gfn: Gfn,
        lookup: bool,
        env: &mut E,
    ) -> bool {
        let vm = self.vm_of(me);
        if self.kvm(vm).dirty_log.bitmaps.is_empty() {
            return false;
        }
        let set = if lookup {
            self.load(env, me, Loc::Memslots(vm as u32, as_id as u32)) as usize
        } else {
            self.kvm(vm).address_spaces[as_id].active as usize
        };
        let slot = self.kvm(vm).address_spaces[as_id].sets[set]
            .lookup(gfn)
            .cloned();
        slot.is_some_and(|sl| self.set_dirty_bit(me, as_id, &sl, gfn, env))
    }

    /// `set_bit_le(rel_gfn, memslot->dirty_bitmap)`, if the slot logs.
    fn set_dirty_bit<E: Env>(
        &mut self,
        me: usize,
        as_id: usize,
        sl: &Memslot,
        gfn: Gfn,
        env: &mut E,
    ) -> bool {
        if !sl.dirty_log {
            return false;
        }
        let vm = self.vm_of(me);
        let key = slot_key(as_id as u8, sl.id);
        let rel = gfn - sl.base_gfn;
        let (w, bit) = bit_of(rel);
        self.rmw(env, me, Loc::DirtyBitmap(vm as u32, key, w), |x| x | bit);
        self.perf.counters.inc(Counter::KvmDirtyPagesMarked);
        true
    }

    /// Does a memslot of vCPU `v`'s address space log dirty pages at `gfn` (the oracle's
    /// view: the active set)?
    pub(crate) fn logs_dirty(&self, v: CpuId, gfn: Gfn) -> bool {
        let k = self.kvm(self.vm_of(v));
        !k.dirty_log.bitmaps.is_empty()
            && k.address_spaces[self.vcpu_as_id(v)]
                .active_set()
                .lookup(gfn)
                .is_some_and(|sl| sl.dirty_log)
    }

    /// Oracle: vCPU `v`'s guest wrote `gfn` (a write through a combined translation).
    pub(crate) fn note_guest_write(&mut self, v: CpuId, gfn: Gfn) {
        if self.logs_dirty(v, gfn) {
            let vm = self.vm_of(v);
            self.kvm_mut(vm).dirty_log.owed.insert(gfn, v as u32);
        }
    }

    /// `spte_write_protect(sptep, pt_protect = false)` on a leaf: clear W, keep the
    /// MMU-writable bits (so that `fast_page_fault` may set it again); with PML
    /// `spte_clear_dirty()` instead: clear D, keep W. Whether it changed.
    fn spte_write_protect(&mut self, sp: SpId, idx: u16) -> bool {
        let kind = self.ept.spte(sp, idx).kind;
        if self.opts.pml {
            // spte_clear_dirty() / clear_dirty_pt_masked(.., wrprot = false): clear D, keep W;
            // the next write sets D again and logs the page (pml.rs).
            if !matches!(kind, SpteKind::Leaf { dirty: true, .. }) {
                return false;
            }
            self.set_spte_attrs(sp, idx, kind.with_dirty(false));
            return true;
        }
        if !matches!(kind, SpteKind::Leaf { writable: true, .. }) {
            return false;
        }
        let new = kind.with_writable(false);
        self.set_spte_attrs(sp, idx, new);
        true
    }

    /// `kvm_mmu_slot_gfn_write_protect(.., PG_LEVEL_2M)` on a leaf: a huge one loses W and
    /// MMU-writable (`__rmap_write_protect(.., pt_protect = true)` / `write_protect_gfn`).
    fn huge_write_protect(&mut self, sp: SpId, idx: u16) -> bool {
        let kind = self.ept.spte(sp, idx).kind;
        if self.ept.page(sp).level < 2 {
            return false;
        }
        let SpteKind::Leaf {
            writable,
            mmu_writable,
            ..
        } = kind
        else {
            return false;
        };
        if !writable && !mmu_writable {
            return false;
        }
        let mut new = kind.with_writable(false);
        if let SpteKind::Leaf { mmu_writable, .. } = &mut new {
            *mmu_writable = false;
        }
        self.set_spte_attrs(sp, idx, new);
        true
    }

    /// `kvm_arch_mmu_enable_log_dirty_pt_masked()`'s callee and what it does, for the text.
    fn enable_log_dirty_text(&self) -> (&'static str, &'static str) {
        if self.opts.pml {
            ("kvm_mmu_clear_dirty_pt_masked", "cleaned (D cleared)")
        } else {
            ("kvm_mmu_write_protect_pt_masked", "write-protected")
        }
    }

    /// `kvm_mmu_write_protect_pt_masked()` (with PML, `kvm_mmu_clear_dirty_pt_masked()`):
    /// write-protect (clear D in) the 4 KiB SPTEs of the gfns of `mask` (bit i: `base + i`) in
    /// address space `as_id`: through the rmaps (legacy MMU), or each TDP root's leaf
    /// (`clear_dirty_pt_masked`, write lock held). How many changed.
    fn write_protect_pt_masked(&mut self, vm: usize, as_id: u8, base: Gfn, mask: u64) -> u32 {
        let mut n = 0;
        if self.opts.dirty_log_initially_set && mask != 0 {
            // kvm_arch_mmu_enable_log_dirty_pt_masked(): huge SPTEs were not write-protected
            // when logging started, so those over the mask's first and last gfn are, now
            // (kvm_mmu_slot_gfn_write_protect(.., PG_LEVEL_2M): W and MMU-writable cleared,
            // so that the next write faults and splits them).
            let first = base + mask.trailing_zeros() as u64;
            let last = base + 63 - mask.leading_zeros() as u64;
            for (sp, idx, level) in self.slot_leaves(vm, as_id, first, 1) {
                let _ = level;
                n += self.huge_write_protect(sp, idx) as u32;
            }
            // `ALIGN(start << PAGE_SHIFT, PMD_SIZE) != ALIGN(end << PAGE_SHIFT, PMD_SIZE)`: both
            // rounded *up* (an end on a 2 MiB boundary is not seen as crossing).
            let up = |g: Gfn| g.div_ceil(512) * 512;
            if up(first) != up(last) {
                for (sp, idx, _) in self.slot_leaves(vm, as_id, last, 1) {
                    n += self.huge_write_protect(sp, idx) as u32;
                }
            }
        }
        let gfns = (0..BITS_PER_LONG)
            .filter(|i| mask & (1 << i) != 0)
            .map(|i| base + i);
        if self.opts.tdp_mmu {
            let roots: Vec<SpId> = self.tdp_roots_of(vm, as_id).collect();
            for gfn in gfns {
                for &root in &roots {
                    if let EptWalk::Leaf {
                        sp, idx, level: 1, ..
                    } = self.ept.walk_from(root, gfn)
                    {
                        n += self.spte_write_protect(sp, idx) as u32;
                    }
                }
            }
        } else {
            for gfn in gfns {
                let heads = self
                    .kvm(vm)
                    .mmu
                    .rmap
                    .get(&(1, gfn))
                    .cloned()
                    .unwrap_or_default();
                for (sp, idx) in heads {
                    if self.kvm(vm).mmu.sp_as_id(sp) == as_id {
                        n += self.spte_write_protect(sp, idx) as u32;
                    }
                }
            }
        }
        n
    }

    /// One step of `KVM_GET_DIRTY_LOG` by agent `me`.
    pub(crate) fn get_dirty_log_step<E: Env>(
        &mut self,
        me: usize,
        s: &mut GetDirtyLog,
        env: &mut E,
    ) -> Flow {
        use GetDirtyLogPc::*;
        let vm = self.vm_of(me);
        let key = slot_key(s.as_id, s.id);
        match s.pc {
            SlotsLock => {
                if self.slots_lock_busy(me) {
                    return Flow::Spin(spin_key(Loc::SlotsLock(vm as u32)));
                }
                self.rmw(env, me, Loc::SlotsLock(vm as u32), |_| me as u64 + 1);
                let slot = self.kvm(vm).address_spaces[s.as_id as usize]
                    .active_set()
                    .slots
                    .iter()
                    .find(|sl| sl.id == s.id && sl.dirty_log)
                    .cloned();
                let Some(sl) = slot else {
                    self.store(env, me, Loc::SlotsLock(vm as u32), 0);
                    let id = s.id;
                    let what = ioctl_name(s.clear);
                    self.say(|| format!("{what}(slot {id}): no dirty bitmap: -ENOENT"));
                    return Flow::Return;
                };
                s.base_gfn = sl.base_gfn;
                s.npages = sl.npages;
                s.words = sl.npages.div_ceil(BITS_PER_LONG) as u32;
                s.buffer = vec![0; s.words as usize];
                s.pc = if self.opts.pml {
                    SyncDirtyLog
                } else {
                    self.after_sync_dirty_log(s)
                };
                let (id, what) = (s.id, ioctl_name(s.clear));
                self.say(|| format!("{what}(slot {id}): mutex_lock(&kvm->slots_lock)"));
                Flow::Next
            }
            SyncDirtyLog => {
                let Some(v) = self.kvm(vm).vcpus.clone().nth(s.kicked as usize) else {
                    s.pc = self.after_sync_dirty_log(s);
                    return self.get_dirty_log_step(me, s, env);
                };
                s.kicked += 1;
                // kvm_vcpu_kick(): an IPI only if the vCPU was in guest mode.
                let old = self.rmw(env, me, Loc::VcpuMode(v as u32), |m| {
                    if m == mode::IN_GUEST_MODE {
                        mode::EXITING_GUEST_MODE
                    } else {
                        m
                    }
                });
                let ipi = old == mode::IN_GUEST_MODE;
                if ipi {
                    self.send_kick(me, v, env);
                }
                self.say(|| {
                    format!(
                        "kvm_arch_sync_dirty_log: kvm_vcpu_kick(vcpu{v}){}",
                        if ipi {
                            ": in guest mode: IPI (no wait), its exit drains its PML log"
                        } else {
                            ": not in guest mode: no IPI"
                        }
                    )
                });
                Flow::Next
            }
            MmuLock => {
                let spin = self.kvm_mmu_lock(me, &mut s.lock, false, env);
                if let Some(spin) = spin {
                    return spin;
                }
                s.pc = Harvest;
                self.say(|| "KVM_MMU_LOCK(kvm)".into());
                Flow::Next
            }
            Harvest if s.clear => {
                let w = s.word;
                s.word += 1;
                if s.word >= s.words {
                    s.pc = Unlock;
                }
                let user = self
                    .kvm(vm)
                    .dirty_log
                    .fetched
                    .get(&key)
                    .map_or(0, |f| f[w as usize]);
                if user == 0 {
                    self.say(|| format!("mask[{w}] = 0"));
                    return Flow::Next;
                }
                let loc = Loc::DirtyBitmap(vm as u32, key, w);
                let mask = user & self.rmw(env, me, loc, |x| x & !user);
                s.buffer[w as usize] = mask;
                if mask == 0 {
                    self.say(|| {
                        format!("atomic_long_fetch_andnot(mask[{w}] = {user:#x}): nothing was set")
                    });
                    return Flow::Next;
                }
                s.flush = true;
                let base = s.base_gfn + w as u64 * BITS_PER_LONG;
                let n = self.write_protect_pt_masked(vm, s.as_id, base, mask);
                let pt_masked = self.enable_log_dirty_text();
                self.perf
                    .counters
                    .add(Counter::KvmDirtyPagesHarvested, mask.count_ones() as u64);
                self.say(|| {
                    format!("atomic_long_fetch_andnot(mask[{w}] = {user:#x}) cleared {mask:#x}; {}: {n} SPTE(s) {}", pt_masked.0, pt_masked.1)
                });
                Flow::Next
            }
            Harvest => {
                // The words read 0 are skipped in this step too (plain reads: a bit set after
                // its word was read stays for the next harvest).
                let first = s.word;
                let (mut w, mut loc) = (s.word, Loc::DirtyBitmap(vm as u32, key, s.word));
                while self.load(env, me, loc) == 0 && w + 1 < s.words {
                    w += 1;
                    loc = Loc::DirtyBitmap(vm as u32, key, w);
                }
                s.word = w + 1;
                if s.word >= s.words {
                    s.pc = Unlock;
                }
                let zeros = match (first, w) {
                    _ if w == first => String::new(),
                    (a, b) if b == a + 1 => format!("dirty_bitmap[{a}] = 0; "),
                    (a, b) => format!("dirty_bitmap[{a}..{}] = 0; ", b - 1),
                };
                if self.load(env, me, loc) == 0 {
                    self.say(|| format!("{zeros}dirty_bitmap[{w}] = 0"));
                    return Flow::Next;
                }
                s.flush = true;
                let mask = self.rmw(env, me, loc, |_| 0);
                s.buffer[w as usize] = mask;
                let base = s.base_gfn + w as u64 * BITS_PER_LONG;
                let n = self.write_protect_pt_masked(vm, s.as_id, base, mask);
                let pt_masked = self.enable_log_dirty_text();
                self.perf
                    .counters
                    .add(Counter::KvmDirtyPagesHarvested, mask.count_ones() as u64);
                self.charge(env, |c| shootdown_engine::Time(c.spte_zap.0 * n as u64));
                self.say(|| {
                    format!(
                        "{zeros}xchg(&dirty_bitmap[{w}], 0) = {mask:#x}; {}: {n} SPTE(s) {}",
                        pt_masked.0, pt_masked.1
                    )
                });
                Flow::Next
            }
            Unlock => {
                self.kvm_mmu_unlock(me, false, env);
                s.pc = CopyToUser;
                if s.flush && (s.clear || !self.opts.mutants.get_dirty_log_skips_flush()) {
                    self.say(|| "KVM_MMU_UNLOCK; kvm_arch_flush_remote_tlbs_memslot".into());
                    return Flow::Call(FlushRemoteTlbs::call());
                }
                self.say(|| {
                    if s.flush {
                        "KVM_MMU_UNLOCK; no flush".into()
                    } else {
                        "KVM_MMU_UNLOCK; nothing was dirty: no flush".into()
                    }
                });
                Flow::Next
            }
            CopyToUser if self.opts.manual_dirty_log_protect && !s.clear => {
                // copy_to_user() of the live bitmap: nothing is cleared, nothing reported yet.
                let copy: Vec<u64> = (0..s.words)
                    .map(|w| self.load(env, me, Loc::DirtyBitmap(vm as u32, key, w)))
                    .collect();
                let pages: u32 = copy.iter().map(|w| w.count_ones()).sum();
                self.kvm_mut(vm).dirty_log.fetched.insert(key, copy);
                self.store(env, me, Loc::SlotsLock(vm as u32), 0);
                self.say(|| {
                    format!("manual protect: copy_to_user of the live bitmap ({pages} page(s)); mutex_unlock(&kvm->slots_lock); return")
                });
                Flow::Return
            }
            CopyToUser => {
                self.check_dirty_log_returned(vm, s);
                self.perf.counters.inc(Counter::KvmDirtyLogHarvests);
                self.store(env, me, Loc::SlotsLock(vm as u32), 0);
                let pages: u32 = s.buffer.iter().map(|w| w.count_ones()).sum();
                self.say(|| {
                    if s.clear {
                        format!("{pages} page(s) cleared: the VMM may copy them; mutex_unlock(&kvm->slots_lock); return")
                    } else {
                        format!("copy_to_user: {pages} dirty page(s); mutex_unlock(&kvm->slots_lock); return")
                    }
                });
                Flow::Return
            }
        }
    }

    /// The leaf SPTEs of guest frames `[base, base + npages)` in address space `as_id`: each
    /// TDP root's (walked entry by entry), or the rmaps' (`slot_handle_level`).
    fn slot_leaves(&self, vm: usize, as_id: u8, base: Gfn, npages: u64) -> Vec<(SpId, u16, u8)> {
        let end = base + npages;
        let mut out = Vec::new();
        if self.opts.tdp_mmu {
            let mut todo: Vec<SpId> = self.tdp_roots_of(vm, as_id).collect();
            while let Some(sp) = todo.pop() {
                let page = self.ept.page(sp);
                let span = gfns_per_entry(page.level);
                for (&idx, e) in &page.entries {
                    let g = page.gfn + idx as u64 * span;
                    if g + span <= base || g >= end {
                        continue;
                    }
                    match e.kind {
                        SpteKind::Table(c) => todo.push(c),
                        SpteKind::Leaf { .. } => out.push((sp, idx, page.level)),
                        _ => {}
                    }
                }
            }
        } else {
            let mmu = &self.kvm(vm).mmu;
            for (&(level, _), heads) in mmu
                .rmap
                .iter()
                .filter(|(&(l, g), _)| g < end && g + gfns_per_entry(l) > base)
            {
                for &(sp, idx) in heads {
                    if mmu.sp_as_id(sp) == as_id {
                        out.push((sp, idx, level));
                    }
                }
            }
        }
        out.sort_unstable();
        out
    }

    /// `kvm_arch_commit_memory_region()` → `kvm_mmu_slot_apply_flags()` as a FLAGS_ONLY change
    /// turns dirty logging on (v5.15): `kvm_mmu_slot_remove_write_access(slot, PG_LEVEL_4K)`
    /// (the legacy MMU's rmaps under the spinlock, `__rmap_write_protect(.., pt_protect =
    /// false)`; the TDP MMU's `kvm_tdp_mmu_wrprot_slot` under the read lock, `cmpxchg`), or
    /// with PML `kvm_mmu_slot_leaf_clear_dirty` (4 KiB SPTEs: D cleared) and the huge SPTEs
    /// write-protected; then a flush — always, since b64d740ea7dd (v6.0): an access-tracked
    /// SPTE is already read-only, so "flush if an SPTE changed" (the A5 mutant, the code
    /// before) leaves a writable TLB entry that `clear_young` did not flush.
    pub(crate) fn kvm_mmu_slot_apply_flags_step<E: Env>(
        &mut self,
        me: usize,
        s: &mut SetMemoryRegion,
        env: &mut E,
    ) -> Flow {
        let vm = self.vm_of(me);
        match s.pc {
            SetMemoryRegionPc::ApplyFlagsLock => {
                let spin = self.kvm_mmu_lock(me, &mut s.lock, true, env);
                if let Some(spin) = spin {
                    return spin;
                }
                s.pc = SetMemoryRegionPc::ApplyFlags;
                self.say(|| {
                    "kvm_arch_commit_memory_region: kvm_mmu_slot_apply_flags (logging on): KVM_MMU_LOCK".into()
                });
                Flow::Next
            }
            _ => {
                let leaves = self.slot_leaves(vm, s.as_id, s.slot.base_gfn, s.slot.npages);
                let mut n = 0;
                for (sp, idx, level) in leaves {
                    let kind = self.ept.spte(sp, idx).kind;
                    let new = match kind {
                        SpteKind::Leaf { dirty: true, .. } if self.opts.pml && level == 1 => {
                            kind.with_dirty(false)
                        }
                        SpteKind::Leaf { writable: true, .. } if !self.opts.pml || level > 1 => {
                            kind.with_writable(false)
                        }
                        _ => continue,
                    };
                    self.set_spte_attrs(sp, idx, new);
                    n += 1;
                }
                s.wrprot = n;
                self.kvm_mmu_unlock(me, true, env);
                s.pc = SetMemoryRegionPc::Done;
                let what = if self.opts.pml {
                    "kvm_mmu_slot_leaf_clear_dirty"
                } else {
                    "kvm_mmu_slot_remove_write_access"
                };
                if n == 0 && self.opts.mutants.enable_dirty_log_flush_if_wrprot() {
                    self.say(|| format!("{what}: no SPTE changed; KVM_MMU_UNLOCK; no flush"));
                    return Flow::Next;
                }
                self.say(|| {
                    format!("{what}: {n} SPTE(s) changed; KVM_MMU_UNLOCK; kvm_arch_flush_remote_tlbs_memslot")
                });
                Flow::Call(FlushRemoteTlbs::call())
            }
        }
    }

    /// Oracle, as the ioctl that turned logging on for `slot` returns: the VMM now copies all
    /// of the slot's memory (migration's first pass), so only writes from here on are owed.
    pub(crate) fn enable_dirty_log_returned(&mut self, vm: usize, _as_id: u8, slot: &Memslot) {
        let range = slot.base_gfn..slot.base_gfn + slot.npages;
        self.kvm_mut(vm)
            .dirty_log
            .owed
            .retain(|g, _| !range.contains(g));
    }

    /// After `kvm_arch_sync_dirty_log()`: with manual protect, GET copies the live bitmap and
    /// CLEAR harvests; without, GET harvests.
    fn after_sync_dirty_log(&self, s: &GetDirtyLog) -> GetDirtyLogPc {
        if self.opts.manual_dirty_log_protect && !s.clear {
            GetDirtyLogPc::CopyToUser
        } else {
            GetDirtyLogPc::MmuLock
        }
    }

    /// Would `KVM_GET_DIRTY_LOG`'s next step only wait for a lock?
    pub(crate) fn get_dirty_log_waits(&self, me: usize, s: &GetDirtyLog) -> bool {
        match s.pc {
            GetDirtyLogPc::SlotsLock => self.slots_lock_busy(me),
            GetDirtyLogPc::MmuLock => self.kvm_mmu_lock_waits(me, s.lock, false),
            _ => false,
        }
    }

    /// Oracle, as `KVM_GET_DIRTY_LOG` returns bitmap `s.buffer` (manual protect:
    /// `KVM_CLEAR_DIRTY_LOG` returns having cleared it): `INV-DIRTYLOG` (module doc).
    fn check_dirty_log_returned(&mut self, vm: usize, s: &GetDirtyLog) {
        let key = slot_key(s.as_id, s.id);
        let end = s.base_gfn + s.npages;
        let bit = |words: &[u64], rel: u64| {
            let (w, b) = bit_of(rel);
            words.get(w as usize).is_some_and(|x| x & b != 0)
        };
        let owed: Vec<(Gfn, u32)> = self
            .kvm(vm)
            .dirty_log
            .owed
            .range(s.base_gfn..end)
            .map(|(&g, &v)| (g, v))
            .collect();
        let live = self
            .kvm(vm)
            .dirty_log
            .bitmaps
            .get(&key)
            .cloned()
            .unwrap_or_default();
        for (gfn, v) in owed {
            let rel = gfn - s.base_gfn;
            if bit(&s.buffer, rel) {
                self.kvm_mut(vm).dirty_log.owed.remove(&gfn);
                continue;
            }
            let pending = self
                .kvm(vm)
                .vcpus
                .clone()
                .any(|c| self.fast_pf_marks_pending(c, gfn));
            if bit(&live, rel) || pending || self.pml_pending(vm, gfn) {
                continue;
            }
            self.violate(Violation {
                invariant: "INV-DIRTYLOG",
                detail: format!(
                    "{} returned without gfn {gfn:#x}, which vcpu{v} wrote, and its dirty bit is not set again: the write is lost to the VMM",
                    ioctl_name(s.clear)
                ),
            });
            return;
        }
    }
}

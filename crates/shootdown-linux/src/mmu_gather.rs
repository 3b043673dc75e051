//! The mmu_gather around every call that clears or write-protects PTEs (mm/mmu_gather.c,
//! `flush_tlb_batched_pending()` of mm/rmap.c, `change_protection_range()` of mm/mprotect.c):
//! `madvise(MADV_DONTNEED)` (`zap_page_range`), `munmap` (`unmap_region`) and `mprotect`.
//!
//! The kernel flushes only what it gathered: a call that cleared no PTE (and freed no page
//! table) flushes nothing and returns at once. Two things keep that safe when another path has
//! cleared the PTEs and still owes their flush:
//!
//! * `mm->tlb_flush_pending` counts gathers in progress; `tlb_finish_mmu()` flushes anyway when
//!   it is above one (`mm_tlb_flush_nested()`, [`MmuGather`]): two `madvise`s of one range
//!   under `mmap_sem` read;
//! * `mm->tlb_flush_batched` says reclaim cleared PTEs of this mm with its flush deferred
//!   (`TTU_BATCH_FLUSH`); `flush_tlb_batched_pending()`, under the page-table lock, flushes
//!   the whole mm before changing PTEs ([`BatchedPending`]).
//!
//! Both were added after real stale-TLB bugs (the mutants `tlb_finish_mmu_ignores_nested` and
//! `no_flush_tlb_batched_pending` re-create them); the oracle's `INV-SYSRET` (the contract at
//! system-call return) is what catches them.
//!
//! Simplifications: a call's PTE changes happen in one step under the page-table lock of the
//! page-table page holding its first page (the kernel takes each page's lock in turn); page
//! faults do not take that lock (their PTE update is one atomic step).

use crate::frame::Flow;
use crate::huge_memory::PMD_STRIDE_SHIFT;
use crate::machine::Machine;
use crate::mem::{spin_key, Loc};
use crate::options::{BatchedPending, MmuGather};
use crate::state::{MmId, TLB_FLUSH_ALL};
use crate::syscalls::{Gather, ZapKind, ZapPc};
use crate::tlb::FlushMmRange;
use shootdown_engine::Env;
use shootdown_hw::pagetable::{Vpn, PTRS_PER_PT};
use shootdown_hw::CpuId;

/// The call a [`ZapPc`] sequence runs: which one, on which mm, over which pages.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ZapCall {
    pub mm: MmId,
    pub kind: ZapKind,
    pub start: Vpn,
    pub npages: u64,
}

impl ZapCall {
    /// The split page-table lock the call takes (that of the page-table page of its first page).
    fn ptl(&self) -> Loc {
        Loc::Ptl(self.mm, self.start / PTRS_PER_PT)
    }
}

/// Mainline `mm->tlb_flush_batched`: queued batches in the low half, flushed in the high half.
const BATCH_FLUSHED_SHIFT: u32 = 32;
const BATCH_PENDING_MASK: u64 = (1 << BATCH_FLUSHED_SHIFT) - 1;

impl Machine {
    /// One step of `madvise(MADV_DONTNEED)`, `munmap` or `mprotect` after `mmap_sem` is taken
    /// (`Start` is the caller's): see [`ZapPc`].
    pub(crate) fn zap_call_step<E: Env>(
        &mut self,
        cpu: CpuId,
        call: ZapCall,
        pc: &mut ZapPc,
        g: &mut Gather,
        env: &mut E,
    ) -> Flow {
        let ZapCall {
            mm,
            kind,
            start,
            npages,
        } = call;
        match *pc {
            ZapPc::Start => {
                self.charge(env, |c| c.syscall_entry_exit + c.unmap_base);
                self.summary(|| "take mmap_sem".into());
                *pc = ZapPc::Lock;
                let write = !matches!(kind, ZapKind::Madvise);
                Flow::Call(crate::sched::RwSemDown::call(mm, write))
            }
            ZapPc::Lock => {
                let ptl = call.ptl();
                if self.spin_trylock(env, cpu, ptl).is_none() {
                    return Flow::Spin(spin_key(ptl));
                }
                // tlb_gather_mmu()'s inc_tlb_flush_pending() comes before the PTL in the
                // kernel; nothing else this mm does depends on which of the two is first.
                self.rmw(env, cpu, Loc::TlbFlushPending(mm), |n| n + 1);
                if let Some(flush) = self.flush_tlb_batched_pending(cpu, mm, g, env) {
                    *pc = ZapPc::Batched;
                    return flush;
                }
                self.split_or_change_ptes(cpu, call, pc, g, env)
            }
            ZapPc::Split => {
                let pt = g.split.take().expect("a split in progress") as u64;
                self.split_huge_pmd_populate(mm, pt, env);
                self.say(|| {
                    format!(
                        "split: page table linked for mm{mm} pages {:#x}..",
                        pt * PTRS_PER_PT
                    )
                });
                self.split_or_change_ptes(cpu, call, pc, g, env)
            }
            ZapPc::Batched => {
                self.batched_pending_flushed(cpu, mm, g.batch, env);
                self.split_or_change_ptes(cpu, call, pc, g, env)
            }
            ZapPc::Finish => {
                // mprotect's change_protection_range() flushes its range if it changed a PTE;
                // madvise and munmap go through tlb_finish_mmu() and its nested check.
                let nested = !matches!(kind, ZapKind::Mprotect { .. })
                    && !self.opts.mutants.tlb_finish_mmu_ignores_nested()
                    && self.load(env, cpu, Loc::TlbFlushPending(mm)) > 1;
                *pc = ZapPc::Done;
                if nested && self.opts.mmu_gather == MmuGather::Mainline {
                    self.summary(|| {
                        "tlb_finish_mmu: mm_tlb_flush_nested: flush the whole mm (fullmm, freed_tables)".into()
                    });
                    return Flow::Call(FlushMmRange::in_munmap(FlushMmRange::call(
                        mm,
                        0,
                        TLB_FLUSH_ALL,
                        true,
                    )));
                }
                if let ZapKind::Mprotect { .. } = kind {
                    if g.changed > 0 {
                        self.summary(|| "change_protection_range: flush_tlb_range".into());
                        return Flow::Call(self.flush_tlb_range(mm, start, start + npages));
                    }
                } else if nested || g.changed > 0 || g.cleared_pmds > 0 || g.freed_tables {
                    let why = if nested {
                        "mm_tlb_flush_nested: force-flush the range"
                    } else {
                        "flush what was gathered"
                    };
                    // tlb_get_unmap_shift(): 2 MiB strides when only PMD leaves were cleared.
                    let stride = if g.changed == 0 && g.cleared_pmds > 0 {
                        PMD_STRIDE_SHIFT
                    } else {
                        0
                    };
                    self.summary(|| format!("tlb_finish_mmu: {why}"));
                    return Flow::Call(FlushMmRange::in_munmap(FlushMmRange::call_stride(
                        mm,
                        start,
                        start + npages,
                        stride,
                        g.freed_tables,
                    )));
                }
                let f = self.zap_call_return(cpu, call, env);
                self.summary(|| {
                    let lock = if kind == ZapKind::Madvise { "up_read" } else { "up_write" };
                    format!("tlb_finish_mmu: nothing gathered, no flush; dec_tlb_flush_pending; {lock}(mmap_sem); return")
                });
                f
            }
            ZapPc::Done => self.zap_call_return(cpu, call, env),
        }
    }

    /// The flush `flush_tlb_batched_pending()` called returned: mark the batch (as read, `seen`)
    /// done, unless (mainline) a new batch was queued meanwhile.
    pub(crate) fn batched_pending_flushed<E: Env>(
        &mut self,
        cpu: CpuId,
        mm: MmId,
        seen: u64,
        env: &mut E,
    ) {
        match self.opts.batched_pending {
            BatchedPending::V4_13 => self.store(env, cpu, Loc::TlbFlushBatched(mm), 0),
            BatchedPending::Mainline => {
                let pending = seen & BATCH_PENDING_MASK;
                self.rmw(env, cpu, Loc::TlbFlushBatched(mm), |b| {
                    if b == seen {
                        pending | pending << BATCH_FLUSHED_SHIFT
                    } else {
                        b
                    }
                });
            }
        }
    }

    /// `flush_tlb_batched_pending(mm)`, with the PTL held: `Some` is the call of the full flush
    /// (`flush_tlb_mm`) reclaim's pending batch needs; `g.batch` keeps what was read.
    pub(crate) fn flush_tlb_batched_pending<E: Env>(
        &mut self,
        cpu: CpuId,
        mm: MmId,
        g: &mut Gather,
        env: &mut E,
    ) -> Option<Flow> {
        if self.opts.mutants.no_flush_tlb_batched_pending() {
            return None;
        }
        let pending = match self.opts.batched_pending {
            BatchedPending::V4_13 => self.load(env, cpu, Loc::TlbFlushBatched(mm)) != 0,
            BatchedPending::Mainline => {
                let b = self.load(env, cpu, Loc::TlbFlushBatched(mm));
                g.batch = b;
                b & BATCH_PENDING_MASK != b >> BATCH_FLUSHED_SHIFT
            }
        };
        if !pending {
            return None;
        }
        self.summary(|| {
            format!("flush_tlb_batched_pending: reclaim left a batch: flush_tlb_mm(mm{mm})")
        });
        Some(Flow::Call(FlushMmRange::call(mm, 0, TLB_FLUSH_ALL, true)))
    }

    /// `set_tlb_ubc_flush_pending()`'s mark on the mm: reclaim queued a batch for it.
    pub(crate) fn mark_tlb_flush_batched<E: Env>(&mut self, cpu: CpuId, mm: MmId, env: &mut E) {
        match self.opts.batched_pending {
            BatchedPending::V4_13 => self.store(env, cpu, Loc::TlbFlushBatched(mm), 1),
            BatchedPending::Mainline => {
                self.rmw(env, cpu, Loc::TlbFlushBatched(mm), |b| {
                    (b & !BATCH_PENDING_MASK) | ((b + 1) & BATCH_PENDING_MASK)
                });
            }
        }
    }

    /// PTL held, batched flush done: split the next PMD leaf the call covers only in part
    /// (`ZapPc::Split` runs when its flush returns), else change the PTEs, unlock and go on to
    /// `ZapPc::Finish`.
    fn split_or_change_ptes<E: Env>(
        &mut self,
        cpu: CpuId,
        call: ZapCall,
        pc: &mut ZapPc,
        g: &mut Gather,
        env: &mut E,
    ) -> Flow {
        let writable_upgrade = call.kind == (ZapKind::Mprotect { writable: true });
        if !writable_upgrade {
            if let Some(pt) = self.huge_pmd_to_split(call.mm, call.start, call.npages) {
                let flush = self.split_huge_pmd_invalidate(call.mm, pt);
                self.kvm_shadow_pmd_written(call.mm, pt, env);
                g.split = Some(pt as u32);
                *pc = ZapPc::Split;
                let mm = call.mm;
                self.summary(|| {
                    format!(
                        "__split_huge_pmd: pmdp_invalidate mm{mm} pages {:#x}..: flush_tlb_range",
                        pt * PTRS_PER_PT
                    )
                });
                return Flow::Call(flush);
            }
        }
        self.change_ptes(cpu, call, g, env);
        *pc = ZapPc::Finish;
        Flow::Next
    }

    /// `unmap_page_range()`: clear the PMD leaves the call covers whole and the PTEs, and
    /// gather them.
    fn unmap_page_range<E: Env>(&mut self, cpu: CpuId, call: ZapCall, g: &mut Gather, env: &mut E) {
        let huge = self.huge_frames(call.mm, call.start, call.npages);
        self.zap_migration_entries(call.mm, call.start, call.npages);
        g.cleared_pmds = self.zap_huge_pmds(call.mm, call.start, call.npages, env) as u32;
        let mut frames = Vec::new();
        g.changed = self.zap_range(call.mm, call.start, call.npages, Some(&mut frames), env);
        for (pfn, n) in huge {
            crate::page_alloc::push_run(&mut frames, pfn, n);
        }
        let zapped = self.oracle.now();
        if self.opts.mutants.free_pages_before_flush() {
            // Each page freed as its PTE is cleared, before any flush.
            self.free_user_frames(call.mm, call.start, call.npages, zapped, frames);
        } else {
            let t = &mut self.tasks[self.cpus[cpu].curr as usize];
            t.gathered = frames;
            t.zapped_before = zapped;
        }
    }

    /// Change the call's PTEs (PTL held) and unlock the PTL: zap (madvise, munmap: also unlink
    /// the page-table pages the range covers entirely) or change the protection (mprotect).
    fn change_ptes<E: Env>(&mut self, cpu: CpuId, call: ZapCall, g: &mut Gather, env: &mut E) {
        let ZapCall {
            mm,
            kind,
            start,
            npages,
        } = call;
        match kind {
            ZapKind::Madvise => {
                self.unmap_page_range(cpu, call, g, env);
                let n = g.changed;
                self.say(|| format!("zap {n} PTEs of mm{mm} from {start:#x}"));
            }
            ZapKind::Munmap => {
                self.unmap_page_range(cpu, call, g, env);
                // The file VMAs go (the PTEs were zapped first: their pages' frames were
                // told apart from anonymous ones by the VMA).
                if !self.mms[mm as usize].vmas.is_empty() {
                    self.unmap_file_vmas(mm, start, npages);
                }
                // free_pgtables(): unlink page-table pages the range covers entirely.
                let first = start.div_ceil(PTRS_PER_PT);
                let last = (start + npages) / PTRS_PER_PT;
                let m = &mut self.mms[mm as usize];
                let mut unlinked = Vec::new();
                for idx in first..last {
                    if let Some(t) = m.space.pmd.remove(&idx) {
                        m.tables_to_free.push(t);
                        unlinked.push(idx);
                    }
                }
                for idx in unlinked {
                    self.kvm_shadow_pmd_written(mm, idx, env);
                }
                let m = &mut self.mms[mm as usize];
                let freed = !m.tables_to_free.is_empty();
                g.freed_tables = freed;
                if freed && self.opts.mutants.free_tables_before_flush() {
                    // N1: tlb_remove_table_one() after a failed batch allocation: a "sync"
                    // IPI that invalidates nothing, then the table is freed at once.
                    for t in std::mem::take(&mut self.mms[mm as usize].tables_to_free) {
                        self.pt_pages.free(t);
                    }
                }
                self.say(|| {
                    format!(
                        "zap mm{mm} pages {start:#x}..{:#x}; unlink page tables: {freed}",
                        start + npages
                    )
                });
            }
            ZapKind::Mprotect { writable } => {
                let m = &mut self.mms[mm as usize];
                let mut changed = 0u64;
                for (_, pte) in m.space.ptes.range_mut(start..start + npages) {
                    if !pte.present {
                        continue;
                    }
                    if writable {
                        // x86 flushes an upgrade too: `pte_needs_flush()` counts any change of
                        // _PAGE_RW (`flush_on_change`, v6.0+), and before v6.0
                        // `change_protection()` flushed whenever it changed a PTE. A stale
                        // read-only entry would only fault, so the oracle asks for nothing.
                        if !pte.writable {
                            pte.writable = true;
                            changed += 1;
                        }
                    } else if pte.writable {
                        pte.writable = false;
                        self.oracle.pte_changed(pte);
                        changed += 1;
                    }
                }
                self.charge(env, |c| shootdown_engine::Time(c.pte_update.0 * changed));
                if !writable {
                    changed += self.wrprotect_huge_pmds(mm, start, npages, env);
                }
                g.changed = changed;
                self.say(|| format!("change_protection: {changed} PTE(s) of mm{mm} changed"));
            }
        }
        self.spin_unlock(env, cpu, call.ptl());
    }

    /// The end of the call: munmap frees the unlinked page tables (after the flush);
    /// `dec_tlb_flush_pending()`; release `mmap_sem`; return to user space, where the oracle
    /// now holds the call to its contract (`INV-SYSRET`).
    fn zap_call_return<E: Env>(&mut self, cpu: CpuId, call: ZapCall, env: &mut E) -> Flow {
        let ZapCall {
            mm,
            kind,
            start,
            npages,
        } = call;
        // tlb_flush_mmu_free(): the gathered pages go back to the allocator, after the flush.
        let t = &mut self.tasks[self.cpus[cpu].curr as usize];
        let (frames, zapped) = (
            std::mem::take(&mut t.gathered),
            std::mem::take(&mut t.zapped_before),
        );
        self.free_user_frames(mm, start, npages, zapped, frames);
        if kind == ZapKind::Munmap {
            let tables = std::mem::take(&mut self.mms[mm as usize].tables_to_free);
            for t in &tables {
                self.pt_pages.free(*t);
                self.charge(env, |c| c.pgtable_free);
            }
            if !tables.is_empty() {
                self.say(|| format!("free {} page-table page(s) of mm{mm}", tables.len()));
            }
        }
        self.rmw(env, cpu, Loc::TlbFlushPending(mm), |n| n - 1);
        let write = !matches!(kind, ZapKind::Madvise);
        self.rwsem_up(cpu, mm, write, env);
        // LATR's contract: a saved flush lets the other CPUs use the range until their ticks.
        let latr = self.latr_take_saved(cpu);
        if kind != (ZapKind::Mprotect { writable: true }) && !latr {
            self.oracle.syscall_returned(mm, start, start + npages);
        }
        let lock = if write { "up_write" } else { "up_read" };
        self.summary(|| format!("dec_tlb_flush_pending; {lock}(mmap_sem); return"));
        Flow::Return
    }
}

//! `mremap(old, len, len, MREMAP_MAYMOVE | MREMAP_FIXED, new)` (mm/mremap.c): `move_vma()` —
//! `copy_vma()` links the new VMA, `move_page_tables()` moves the PTEs one page-table page at a
//! time (`move_ptes()`), then `do_munmap()` removes the old VMA.
//!
//! The page is not freed or re-gathered: it moves from one PTE to another, and what keeps it
//! alive while a CPU may still cache the *old* address is the page-table locks. So the flush of
//! the old range must be done before `move_ptes()` drops them. Until v4.18 it was not for clean
//! PTEs (`need_flush`, flushed once at the end of `move_page_tables()`), and a truncate could
//! zap the PTE at its new address, flush that address, and free the page while another CPU
//! still wrote it through the old one — CVE-2018-18281, fixed by eb66ae030829 (option
//! `mremap_tlb_flush`).
//!
//! `need_rmap_locks` is false: the new VMA goes after the old one in `i_mmap` (equal
//! `vm_pgoff`, `vma.rs`), so an rmap walker (truncate) meets the PTE at its old or its new
//! place. Simplified: the moved range lies in one page-table page at each end (`move_ptes()`
//! runs once); the old range's page-table pages are kept (`free_pgtables()` of the old VMA is
//! not modelled); a moved huge PMD (`move_huge_pmd`) is not modelled; the MMU-notifier calls
//! of `move_page_tables()` matter to no modelled secondary MMU here; the destination is empty (MREMAP_FIXED's unmap of
//! it is not modelled: the scenario parser refuses a destination that may be mapped). The
//! model's PTE dirty bit is set by write faults only (hardware A/D bits are not modelled, #41):
//! a page written only through the TLB counts as clean for v4.18's `force_flush`.

use crate::counters::Counter;
use crate::frame::Flow;
use crate::machine::Machine;
use crate::mem::{spin_key, Loc};
use crate::options::MremapTlbFlush;
use crate::sched::{RwSemDown, SemId};
use crate::state::MmId;
use crate::tlb::FlushMmRange;
use crate::vma::Vma;
use shootdown_engine::{Env, Time};
use shootdown_hw::pagetable::{Vpn, PTRS_PER_PT};
use shootdown_hw::CpuId;

/// The steps of `mremap()`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MremapPc {
    /// System-call entry; `mmap_write_lock()`.
    Start,
    /// `copy_vma()`: a file VMA is linked into `i_mmap` under `i_mmap_lock_write`.
    CopyVma,
    /// Holding `i_mmap_rwsem`: link the new VMA, unlock.
    Link,
    /// `move_ptes()`: allocate the new page table, take the old PTL.
    MovePtes,
    /// Take the new PTL (a different page-table page), holding the old one; then
    /// `flush_tlb_batched_pending()`.
    MoveNewPtl,
    /// The flush of reclaim's pending batch returned: mark it done, move the PTEs.
    Batched,
    /// The flush under the PTLs returned: drop them (the new one first).
    Unlock,
    /// v4.18: the dirty-PTE flush under the old PTL returned: drop it.
    UnlockOld,
    /// The end of `move_page_tables()`: v4.18's deferred flush of clean PTEs (`need_flush`).
    DeferredFlush,
    /// `do_munmap()` of the old range: a file VMA is unlinked under `i_mmap_lock_write`.
    Unmap,
    /// Holding `i_mmap_rwsem`: unlink the old VMA, unlock.
    Unlink,
    /// `mmap_write_unlock()`; return to user space.
    Done,
}

/// The state of one `mremap()` call.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Mremap {
    pub pc: MremapPc,
    pub start: Vpn,
    pub npages: u64,
    pub new_start: Vpn,
    /// The file VMA the old range is in, if any.
    pub vma: Option<Vma>,
    /// v4.18: clean present PTEs were moved and their flush is deferred.
    pub need_flush: bool,
    /// `mm->tlb_flush_batched` as `flush_tlb_batched_pending()` read it.
    pub gather: crate::syscalls::Gather,
}

impl Mremap {
    pub fn new(start: Vpn, npages: u64, new_start: Vpn) -> Self {
        Mremap {
            pc: MremapPc::Start,
            start,
            npages,
            new_start,
            vma: None,
            need_flush: false,
            gather: Default::default(),
        }
    }

    fn old_ptl(&self, mm: MmId) -> Loc {
        Loc::Ptl(mm, self.start / PTRS_PER_PT)
    }

    fn new_ptl(&self, mm: MmId) -> Option<Loc> {
        let (o, n) = (self.start / PTRS_PER_PT, self.new_start / PTRS_PER_PT);
        (o != n).then_some(Loc::Ptl(mm, n))
    }
}

impl Machine {
    /// One step of `mremap()` by the task on `cpu`, in its mm `mm`.
    pub(crate) fn mremap_step<E: Env>(
        &mut self,
        cpu: CpuId,
        mm: MmId,
        s: &mut Mremap,
        env: &mut E,
    ) -> Flow {
        match s.pc {
            MremapPc::Start => {
                self.charge_interruptible(env, cpu, |c| c.syscall_entry_exit + c.mmap_syscall);
                self.perf.counters.inc(Counter::Mremaps);
                self.summary(|| "mmap_write_lock".into());
                s.pc = MremapPc::CopyVma;
                Flow::Call(RwSemDown::call(mm, true))
            }
            MremapPc::CopyVma => {
                s.vma = self.vma_at(mm, s.start);
                match s.vma {
                    Some(v) => {
                        self.summary(|| "copy_vma: vma_link: i_mmap_lock_write".into());
                        s.pc = MremapPc::Link;
                        Flow::Call(RwSemDown::i_mmap(v.file, true))
                    }
                    None => {
                        self.summary(|| "copy_vma: an anonymous range (no file VMA)".into());
                        s.pc = MremapPc::MovePtes;
                        Flow::Next
                    }
                }
            }
            MremapPc::Link => {
                let v = s.vma.expect("a file VMA");
                let new = Vma {
                    start: s.new_start,
                    npages: s.npages,
                    pgoff: v.pgoff_of(s.start),
                    ..v
                };
                self.vma_link(mm, new);
                self.rwsem_up_sem(cpu, SemId::IMmap(v.file), true, env);
                let (ns, e) = (s.new_start, s.new_start + s.npages);
                self.say(|| {
                    format!("copy_vma: new VMA mm{mm} {ns:#x}..{e:#x} linked into i_mmap after the old one")
                });
                s.pc = MremapPc::MovePtes;
                Flow::Next
            }
            MremapPc::MovePtes => {
                // alloc_new_pmd() + pte_alloc() happen before the PTLs are taken.
                if self.ensure_table(mm, s.new_start) {
                    self.charge(env, |c| c.page_alloc + c.page_zero);
                }
                let ptl = s.old_ptl(mm);
                if self.spin_trylock(env, cpu, ptl).is_none() {
                    return Flow::Spin(spin_key(ptl));
                }
                if s.new_ptl(mm).is_some() {
                    self.summary(|| "move_ptes: take the old PTL".into());
                    s.pc = MremapPc::MoveNewPtl;
                    return Flow::Next;
                }
                self.batched_then_move(cpu, mm, s, env)
            }
            MremapPc::MoveNewPtl => {
                let ptl = s.new_ptl(mm).expect("a second page table");
                if self.spin_trylock(env, cpu, ptl).is_none() {
                    return Flow::Spin(spin_key(ptl));
                }
                self.batched_then_move(cpu, mm, s, env)
            }
            MremapPc::Batched => {
                self.batched_pending_flushed(cpu, mm, s.gather.batch, env);
                self.move_ptes(cpu, mm, s, env)
            }
            MremapPc::Unlock => {
                if let Some(ptl) = s.new_ptl(mm) {
                    self.spin_unlock(env, cpu, ptl);
                }
                self.spin_unlock(env, cpu, s.old_ptl(mm));
                self.summary(|| "move_ptes: drop the PTLs".into());
                s.pc = MremapPc::DeferredFlush;
                Flow::Next
            }
            MremapPc::UnlockOld => {
                self.spin_unlock(env, cpu, s.old_ptl(mm));
                self.summary(|| "move_ptes: drop the old PTL".into());
                s.pc = MremapPc::DeferredFlush;
                Flow::Next
            }
            MremapPc::DeferredFlush => {
                s.pc = MremapPc::Unmap;
                if std::mem::take(&mut s.need_flush) {
                    self.summary(|| {
                        "move_page_tables: need_flush: flush_tlb_range(old range), PTLs long dropped".into()
                    });
                    return Flow::Call(self.move_ptes_flush(mm, s));
                }
                self.summary(|| "move_page_tables: done, no deferred flush".into());
                Flow::Next
            }
            MremapPc::Unmap => match s.vma {
                Some(v) => {
                    self.summary(|| "do_munmap(old range): i_mmap_lock_write".into());
                    s.pc = MremapPc::Unlink;
                    Flow::Call(RwSemDown::i_mmap(v.file, true))
                }
                None => {
                    self.summary(|| "do_munmap(old range): no file VMA to unlink".into());
                    s.pc = MremapPc::Done;
                    Flow::Next
                }
            },
            MremapPc::Unlink => {
                let v = s.vma.expect("a file VMA");
                self.unmap_file_vmas(mm, s.start, s.npages);
                self.rwsem_up_sem(cpu, SemId::IMmap(v.file), true, env);
                self.summary(|| "do_munmap: the old VMA unlinked from i_mmap".into());
                s.pc = MremapPc::Done;
                Flow::Next
            }
            MremapPc::Done => {
                self.rwsem_up(cpu, mm, true, env);
                self.oracle
                    .syscall_returned(mm, s.start, s.start + s.npages);
                self.summary(|| "mmap_write_unlock; return".into());
                Flow::Return
            }
        }
    }

    /// `move_ptes()` with the PTLs held: `flush_tlb_batched_pending()` first (v4.12+: reclaim
    /// may have cleared PTEs of the mm and deferred their flush), then the move.
    fn batched_then_move<E: Env>(
        &mut self,
        cpu: CpuId,
        mm: MmId,
        s: &mut Mremap,
        env: &mut E,
    ) -> Flow {
        if let Some(flush) = self.flush_tlb_batched_pending(cpu, mm, &mut s.gather, env) {
            s.pc = MremapPc::Batched;
            return flush;
        }
        self.move_ptes(cpu, mm, s, env)
    }

    /// `move_ptes()` with the PTLs held: move each PTE (`ptep_get_and_clear` at the old
    /// address, `set_pte_at` at the new one), then flush as the version does.
    fn move_ptes<E: Env>(&mut self, cpu: CpuId, mm: MmId, s: &mut Mremap, env: &mut E) -> Flow {
        let (mut present, mut dirty, mut moved) = (false, false, 0u64);
        for i in 0..s.npages {
            let (old, new) = (s.start + i, s.new_start + i);
            let m = &mut self.mms[mm as usize];
            debug_assert!(!m.space.pte(new).present, "mremap onto a mapped page");
            let Some(pte) = m.space.ptes.get_mut(old).filter(|p| p.present) else {
                continue;
            };
            let (pfn, writable, d) = (pte.pfn, pte.writable, pte.dirty);
            pte.present = false;
            pte.writable = false;
            pte.dirty = false;
            self.oracle.pte_changed(pte);
            let mut np = m.space.pte(new);
            // Filling an empty PTE needs no flush: no version bump.
            np.present = true;
            np.pfn = pfn;
            np.writable = writable;
            np.dirty = d;
            m.space.ptes.insert(new, np);
            present = true;
            dirty |= d;
            moved += 1;
        }
        self.perf.counters.add(Counter::MremapPtesMoved, moved);
        self.charge(env, |c| Time(c.pte_update.0 * 2 * moved));
        let (st, ns) = (s.start, s.new_start);
        let what =
            move || format!("move_ptes: {moved} PTE(s) of mm{mm} moved from {st:#x} to {ns:#x}");
        match self.opts.mremap_tlb_flush {
            MremapTlbFlush::Mainline => {
                s.pc = MremapPc::Unlock;
                if !present {
                    self.summary(what);
                    return Flow::Next;
                }
                self.summary(|| {
                    format!("{}; flush_tlb_range(old range) with the PTLs held", what())
                });
                Flow::Call(self.move_ptes_flush(mm, s))
            }
            MremapTlbFlush::V4_18 if dirty => {
                if let Some(ptl) = s.new_ptl(mm) {
                    self.spin_unlock(env, cpu, ptl);
                }
                s.pc = MremapPc::UnlockOld;
                self.summary(|| {
                    format!(
                        "{}; dirty: flush_tlb_range(old range) under the old PTL",
                        what()
                    )
                });
                Flow::Call(self.move_ptes_flush(mm, s))
            }
            MremapTlbFlush::V4_18 => {
                // `else *need_flush = true`: whether or not a PTE was present.
                s.need_flush = true;
                if let Some(ptl) = s.new_ptl(mm) {
                    self.spin_unlock(env, cpu, ptl);
                }
                self.spin_unlock(env, cpu, s.old_ptl(mm));
                self.summary(|| {
                    format!(
                        "{}; clean: *need_flush = true; drop the PTLs unflushed",
                        what()
                    )
                });
                s.pc = MremapPc::DeferredFlush;
                Flow::Next
            }
        }
    }

    /// `flush_tlb_range(vma, old_end - len, old_end)`.
    fn move_ptes_flush(&self, mm: MmId, s: &Mremap) -> crate::frame::Frame {
        let start = if self.opts.mutants.move_ptes_flushes_new_range() {
            s.new_start
        } else {
            s.start
        };
        FlushMmRange::call(mm, start, start + s.npages, false)
    }
}

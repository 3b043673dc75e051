//! khugepaged (mm/khugepaged.c): a kernel thread that collapses a 512-page group of *another*
//! process's mm, mapped by a page-table page, into one PMD leaf.
//!
//! It runs with no mm of its own (lazy TLB on whatever was loaded), so its flush of the
//! target mm is a remote one. The steps, as `collapse_huge_page()` orders them:
//!
//! 1. `mmap_write_lock(mm)`;
//! 2. under the PMD lock, `pmdp_collapse_flush()`: clear the PMD that points to the page-table
//!    page and `flush_tlb_range()` the group (512 pages: above the ceiling, a full flush) —
//!    with `freed_tables` only from v6.15 (`flush_tlb_range` option; CVE-2025-22045): before
//!    that the flush skips lazy CPUs, whose paging-structure caches may still point to the
//!    table;
//! 3. copy the small pages into a 2 MiB page, install the PMD leaf (`set_pmd_at`), free the
//!    page-table page, `mmap_write_unlock`.
//!
//! Simplifications: the old PTEs are cleared with the PMD (the kernel clears them while
//! copying; either way nothing reaches them but a stale paging-structure-cache entry); the
//! page-table page is freed after the flush as `retract_page_tables()` does for file-backed
//! collapse (v6.1: under `mmap_write_trylock`, `pte_free`; v6.6: under the PMD and PTE locks
//! without `mmap_sem`, `pte_free_defer`, whose RCU grace period does not wait for lazy CPUs'
//! caches) — anonymous collapse deposits it for a later split instead; v6.1's
//! `tlb_remove_table_sync_one()` IPI (it serializes against GUP-fast and invalidates nothing)
//! and the MMU notifiers are left out; one lock stands for the PMD and PTE locks; no
//! `khugepaged_scan`: the op names the group.

use crate::counters::Counter;
use crate::frame::Flow;
use crate::machine::Machine;
use crate::mem::{spin_key, Loc};
use crate::sched::RwSemDown;
use crate::state::MmId;
use shootdown_engine::{Env, Time};
use shootdown_hw::pagetable::{Pte, PTRS_PER_PT};
use shootdown_hw::CpuId;

/// The steps of khugepaged's `collapse_huge_page()`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CollapsePc {
    /// `mmap_write_lock(mm)`.
    Start,
    /// Take the PMD lock; `pmdp_collapse_flush()`: clear the PMD, `flush_tlb_range()`.
    Lock,
    /// The flush returned: unlock, copy, install the PMD leaf, free the table, unlock
    /// `mmap_sem`, return.
    Install,
}

impl Machine {
    /// One step of khugepaged's collapse of group `pt` of `mm`, on `cpu`.
    pub(crate) fn collapse_step<E: Env>(
        &mut self,
        cpu: CpuId,
        mm: MmId,
        pt: u64,
        pc: &mut CollapsePc,
        env: &mut E,
    ) -> Flow {
        let ptl = Loc::Ptl(mm, pt);
        let (start, end) = (pt * PTRS_PER_PT, (pt + 1) * PTRS_PER_PT);
        match *pc {
            CollapsePc::Start => {
                self.summary(|| {
                    format!(
                        "khugepaged: collapse mm{mm} pages {start:#x}..{end:#x}: mmap_write_lock"
                    )
                });
                *pc = CollapsePc::Lock;
                Flow::Call(RwSemDown::call(mm, true))
            }
            CollapsePc::Lock => {
                if self.spin_trylock(env, cpu, ptl).is_none() {
                    return Flow::Spin(spin_key(ptl));
                }
                let m = &mut self.mms[mm as usize];
                if !m.space.pmd.contains_key(&pt) {
                    // Nothing to collapse (already a leaf, or unmapped).
                    self.spin_unlock(env, cpu, ptl);
                    self.rwsem_up(cpu, mm, true, env);
                    self.summary(|| "no page table here: mmap_write_unlock; return".into());
                    return Flow::Return;
                }
                let table = m.space.pmd.remove(&pt).expect("checked");
                m.tables_to_free.push(table);
                self.kvm_shadow_pmd_written(mm, pt, env);
                // The old small pages go (freed once copied).
                let n = self.zap_range(mm, start, PTRS_PER_PT, None, env);
                *pc = CollapsePc::Install;
                self.summary(|| {
                    format!("pmdp_collapse_flush: clear the PMD of mm{mm} (page table #{table}, {n} PTEs), flush_tlb_range")
                });
                Flow::Call(self.flush_tlb_range(mm, start, end))
            }
            CollapsePc::Install => {
                self.spin_unlock(env, cpu, ptl);
                // __collapse_huge_page_copy(): 512 pages copied (a copy reads and writes
                // what a zeroing writes).
                self.charge(env, |c| {
                    Time(c.page_alloc.0 + 2 * PTRS_PER_PT * c.page_zero.0)
                });
                let pfn = self.next_pfn + 1;
                self.next_pfn += PTRS_PER_PT as u32;
                let leaf = self.mms[mm as usize]
                    .space
                    .huge
                    .entry(pt)
                    .or_insert(Pte::NONE);
                leaf.pfn = pfn;
                leaf.present = true;
                leaf.writable = true;
                let tables = std::mem::take(&mut self.mms[mm as usize].tables_to_free);
                for t in &tables {
                    self.pt_pages.free(*t);
                    self.charge(env, |c| c.pgtable_free);
                }
                self.perf.counters.inc(Counter::ThpCollapseAlloc);
                self.rwsem_up(cpu, mm, true, env);
                self.summary(|| {
                    format!("set_pmd_at: 2 MiB leaf for mm{mm} pages {start:#x}..{end:#x}; free page table #{}; mmap_write_unlock; return", tables[0])
                });
                Flow::Return
            }
        }
    }
}

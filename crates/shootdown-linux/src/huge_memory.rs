//! Transparent huge pages (mm/huge_memory.c): a 512-page group mapped by one PMD leaf.
//!
//! * `do_huge_pmd_anonymous_page()`: with `transparent_hugepage = "always"`, an anonymous
//!   fault in a group that has neither a page-table page nor a PMD leaf maps the whole group;
//!   nothing was mapped before, so nothing is flushed.
//! * `zap_huge_pmd()`: an unmap or `MADV_DONTNEED` covering a whole group clears its PMD leaf
//!   and gathers a PMD (`tlb->cleared_pmds`): with nothing else gathered, the flush strides by
//!   2 MiB (`tlb_get_unmap_shift()`).
//! * `change_huge_pmd()`: `mprotect` of a whole group write-protects the leaf.
//! * `__split_huge_pmd()`: a call that covers part of a group splits it first, under the PMD
//!   lock: `pmdp_invalidate()` clears the leaf and flushes the group with `flush_tlb_range()`,
//!   then the deposited page-table page is filled with 512 PTEs to the same frames and linked.
//!
//! Simplifications: the model keeps no VMAs (a group is assumed to lie inside one); the PMD
//! lock is the group's page-table lock (`Loc::Ptl`); the page table deposited at a huge fault
//! is not modelled (a split allocates it; `zap_huge_pmd()` frees it directly with `pte_free()`,
//! never reachable by the hardware, so it needs no flush); a 2 MiB page is 512 consecutive
//! frames.

use crate::frame::Frame;
use crate::machine::Machine;
use crate::options::{FlushTlbRange, Thp};
use crate::state::MmId;
use crate::tlb::FlushMmRange;
use shootdown_engine::{Env, Time};
use shootdown_hw::pagetable::{pt_index, PtIndex, Pte, Vpn, PTRS_PER_PT};
use shootdown_hw::CpuId;

/// `stride_shift` (in pages) of a flush of 2 MiB leaves: `PMD_SHIFT - PAGE_SHIFT`.
pub(crate) const PMD_STRIDE_SHIFT: u8 = 9;

/// The pages of 512-page group `pt`.
fn group(pt: PtIndex) -> (Vpn, Vpn) {
    (pt * PTRS_PER_PT, (pt + 1) * PTRS_PER_PT)
}

impl Machine {
    /// The fault handler's PMD level (`__handle_mm_fault`): a write to a read-only PMD leaf
    /// makes it writable (`do_huge_pmd_wp_page`, an upgrade: no flush), an empty group gets a
    /// leaf ([`Machine::do_huge_pmd_anonymous_page`]). Returns whether the fault was resolved
    /// here; either way the faulting CPU's entry for the address is gone (the fault
    /// invalidated it).
    pub(crate) fn huge_pmd_fault<E: Env>(
        &mut self,
        cpu: CpuId,
        mm: MmId,
        vpn: Vpn,
        write: bool,
        env: &mut E,
    ) -> bool {
        let pt = pt_index(vpn);
        let done = if self.mms[mm as usize].space.is_huge(pt) {
            let leaf = self.mms[mm as usize]
                .space
                .huge
                .get_mut(&pt)
                .expect("present");
            if write && !leaf.writable {
                leaf.writable = true;
                self.charge(env, |c| c.pte_update);
                self.kvm_shadow_pmd_written(mm, pt, env);
            }
            true
        } else {
            self.do_huge_pmd_anonymous_page(mm, vpn, env)
        };
        if done {
            self.fault_dropped_entry(cpu, vpn);
        }
        done
    }

    /// `do_huge_pmd_anonymous_page()`: map `vpn`'s whole group with a PMD leaf if THP is on and
    /// the group has neither a page-table page nor a leaf. Returns whether it did.
    pub(crate) fn do_huge_pmd_anonymous_page<E: Env>(
        &mut self,
        mm: MmId,
        vpn: Vpn,
        env: &mut E,
    ) -> bool {
        let pt = pt_index(vpn);
        let space = &self.mms[mm as usize].space;
        if self.opts.transparent_hugepage != Thp::Always
            || space.pmd.contains_key(&pt)
            || space.is_huge(pt)
        {
            return false;
        }
        // clear_huge_page(): 512 pages zeroed.
        self.charge(env, |c| {
            Time(c.page_alloc.0 + PTRS_PER_PT * c.page_zero.0 + c.pte_update.0)
        });
        let pfn = self.next_pfn + 1;
        self.next_pfn += PTRS_PER_PT as u32;
        let m = &mut self.mms[mm as usize];
        let leaf = m.space.huge.entry(pt).or_insert(Pte::NONE);
        // A fill of an empty entry needs no flush: no version bump.
        leaf.pfn = pfn;
        leaf.present = true;
        leaf.writable = true;
        self.kvm_shadow_pmd_written(mm, pt, env);
        self.perf
            .counters
            .inc(crate::counters::Counter::ThpFaultAlloc);
        true
    }

    /// The first group that a call over `[start, start + npages)` covers only in part and that
    /// a present PMD leaf maps: it must be split before the call changes its PTEs.
    pub(crate) fn huge_pmd_to_split(&self, mm: MmId, start: Vpn, npages: u64) -> Option<PtIndex> {
        let end = start + npages;
        let space = &self.mms[mm as usize].space;
        [pt_index(start), pt_index(end.saturating_sub(1))]
            .into_iter()
            .find(|&pt| {
                let (s, e) = group(pt);
                space.is_huge(pt) && (start > s || end < e)
            })
    }

    /// `__split_huge_pmd()`'s first half: `pmdp_invalidate()` marks the leaf not present (its
    /// frame and permissions stay for the second half); returns its `flush_tlb_range()` of the
    /// group.
    pub(crate) fn split_huge_pmd_invalidate(&mut self, mm: MmId, pt: PtIndex) -> Frame {
        let leaf = self.mms[mm as usize]
            .space
            .huge
            .get_mut(&pt)
            .expect("a present leaf");
        leaf.present = false;
        self.oracle.pte_changed(leaf);
        self.perf
            .counters
            .inc(crate::counters::Counter::ThpSplitPmd);
        let (s, e) = group(pt);
        self.flush_tlb_range(mm, s, e)
    }

    /// `__split_huge_pmd()`'s second half, after the flush: 512 PTEs to the invalidated leaf's
    /// frames in a page-table page (the deposited one), linked into the PMD.
    pub(crate) fn split_huge_pmd_populate<E: Env>(&mut self, mm: MmId, pt: PtIndex, env: &mut E) {
        let leaf = self.mms[mm as usize].space.huge_pmd(pt);
        let t = self.pt_pages.alloc();
        let (s, e) = group(pt);
        let m = &mut self.mms[mm as usize];
        for (i, v) in (s..e).enumerate() {
            let pte = m.space.ptes.get_or_insert(v, Pte::NONE);
            pte.pfn = leaf.pfn + i as u32;
            pte.present = true;
            pte.writable = leaf.writable;
        }
        m.space.pmd.insert(pt, t);
        self.charge(env, |c| Time(PTRS_PER_PT * c.pte_update.0));
    }

    /// `zap_huge_pmd()` of every group `[start, start + npages)` covers whole: clear its PMD
    /// leaf. Returns how many were gathered (`tlb->cleared_pmds`; none under the mutant
    /// `zap_huge_pmd_not_gathered`, which clears them without `tlb_remove_pmd_tlb_entry()`).
    pub(crate) fn zap_huge_pmds<E: Env>(
        &mut self,
        mm: MmId,
        start: Vpn,
        npages: u64,
        env: &mut E,
    ) -> u64 {
        let cleared = self.change_huge_pmds(mm, start, npages, env, |leaf| {
            leaf.present = false;
            leaf.writable = false;
            true
        });
        if self.opts.mutants.zap_huge_pmd_not_gathered() {
            0
        } else {
            cleared
        }
    }

    /// `change_huge_pmd()` of every group the range covers whole: write-protect its leaf.
    /// Returns how many changed.
    pub(crate) fn wrprotect_huge_pmds<E: Env>(
        &mut self,
        mm: MmId,
        start: Vpn,
        npages: u64,
        env: &mut E,
    ) -> u64 {
        self.change_huge_pmds(mm, start, npages, env, |leaf| {
            std::mem::replace(&mut leaf.writable, false)
        })
    }

    /// Apply `change` (true: it changed the leaf) to the present leaf of every group the
    /// range covers whole; bump the versions of the changed ones.
    fn change_huge_pmds<E: Env>(
        &mut self,
        mm: MmId,
        start: Vpn,
        npages: u64,
        env: &mut E,
        change: impl Fn(&mut Pte) -> bool,
    ) -> u64 {
        let end = start + npages;
        let m = &mut self.mms[mm as usize];
        if m.space.huge.is_empty() {
            return 0;
        }
        let mut changed = Vec::new();
        for (&pt, leaf) in m.space.huge.range_mut(pt_index(start)..=pt_index(end - 1)) {
            let (s, e) = group(pt);
            if leaf.present && start <= s && e <= end && change(leaf) {
                self.oracle.pte_changed(leaf);
                changed.push(pt);
            }
        }
        let n = changed.len() as u64;
        for pt in changed {
            self.kvm_shadow_pmd_written(mm, pt, env);
        }
        self.charge(env, |c| Time(n * (c.pte_update.0 + c.page_free.0)));
        n
    }

    /// x86's `flush_tlb_range(vma, start, end)`: `flush_tlb_mm_range()` with the page size of a
    /// non-hugetlb VMA, and `freed_tables` as the kernel version passes it.
    pub(crate) fn flush_tlb_range(&self, mm: MmId, start: Vpn, end: Vpn) -> Frame {
        let freed = self.opts.flush_tlb_range == FlushTlbRange::Mainline
            && !self.opts.mutants.flush_tlb_range_without_freed_tables();
        FlushMmRange::call(mm, start, end, freed)
    }
}

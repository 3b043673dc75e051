//! The frames user pages live in (mm/page_alloc.c, as far as TLB coherence needs it): a free
//! list with reuse, and the `INV-FREEPAGE` check at every free (issue #42).
//!
//! * **Allocation**: the fault path takes a freed frame if there is one, else a fresh one;
//!   set-up gives every mm's pre-mapped pages frames of their own (a VM with a modelled KVM MMU keeps gfn = vpn: its memslots
//!   describe guest-physical memory by those numbers).
//! * **Free**: an unmap's mmu_gather collects the frames of the PTEs (and 2 MiB leaves) it
//!   clears (`__tlb_remove_page`), and `tlb_finish_mmu` frees them after its flush
//!   (`tlb_flush_mmu_tlbonly`, then `tlb_flush_mmu_free`). The `free_pages_before_flush`
//!   mutant frees each one as its PTE is cleared.
//! * **`INV-FREEPAGE`**: when a frame is freed, no TLB entry may still map it unless a flush
//!   covering that translation, begun after its PTE changed, has returned (the entry is then
//!   dead: any use of it is `INV-STALE`). Otherwise the frame may be handed to another user
//!   while a CPU can still write it through the old translation — a use-after-free that no
//!   later use of the old address reveals.
//!
//! Simplified: the free frames are a set (of runs) and a fault takes the lowest, not the per-CPU list's
//! most recently freed. Which free frame a page gets matters to no invariant (a TLB entry of
//! the frame's old page is checked when the frame is freed), and a set keeps states that differ
//! only in the order of frees equal. Frames freed by reclaim (`try_to_unmap` + `try_to_unmap_flush`) and by
//! khugepaged's collapse are not returned to the list; page-table pages have their own
//! invariant (`INV-PTFREE`); a paging-structure cache never maps a data frame.

use crate::machine::Machine;
use crate::state::MmId;
use shootdown_engine::Violation;
use shootdown_hw::pagetable::{pt_index, Pte, Vpn, PTRS_PER_PT};

/// A run of frames freed together: `(first pfn, count)` (a 4 KiB page is a run of 1, a 2 MiB
/// leaf a run of 512; consecutive frames of an unmap coalesce).
pub type FrameRun = (u32, u32);

/// The free frames, as sorted, disjoint runs `(first, end)` that do not touch (an unmap of
/// pre-mapped or sequentially faulted pages frees one run, not thousands of frames). A plain
/// vector: states are cloned and hashed by the million, and an empty or short one costs
/// nothing to either.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct FreeFrames(Vec<(u32, u32)>);

impl FreeFrames {
    /// Free `n` frames from `first` (none of them free already).
    pub fn insert(&mut self, first: u32, n: u32) {
        let end = first + n;
        // The first run that starts after `first`; the one before it may end at `first`.
        let i = self.0.partition_point(|&(s, _)| s < first);
        debug_assert!(
            i == 0 || self.0[i - 1].1 <= first,
            "frame {first:#x} freed twice"
        );
        let joins_prev = i > 0 && self.0[i - 1].1 == first;
        let joins_next = i < self.0.len() && self.0[i].0 == end;
        match (joins_prev, joins_next) {
            (true, true) => {
                self.0[i - 1].1 = self.0[i].1;
                self.0.remove(i);
            }
            (true, false) => self.0[i - 1].1 = end,
            (false, true) => self.0[i].0 = first,
            (false, false) => self.0.insert(i, (first, end)),
        }
    }

    /// Take the lowest free frame.
    pub fn pop_first(&mut self) -> Option<u32> {
        let (s, e) = *self.0.first()?;
        if s + 1 < e {
            self.0[0].0 = s + 1;
        } else {
            self.0.remove(0);
        }
        Some(s)
    }

    /// How many frames are free.
    pub fn len(&self) -> u64 {
        self.0.iter().map(|&(s, e)| (e - s) as u64).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Add `(pfn, n)` to `runs`, extending the last run if it ends at `pfn`.
pub(crate) fn push_run(runs: &mut Vec<FrameRun>, pfn: u32, n: u32) {
    match runs.last_mut() {
        Some(last) if last.0 + last.1 == pfn => last.1 += n,
        _ => runs.push((pfn, n)),
    }
}

/// The shared zero page (`ZERO_PAGE(0)`, `my_zero_pfn()`): an anonymous read fault maps it
/// read-only instead of allocating. It is never allocated or freed (`vm_normal_page()` is NULL
/// for it, so a zap neither gathers nor frees it): the frame below the first one the allocator
/// hands out.
pub const ZERO_PFN: u32 = FIRST_PFN;

/// The allocator hands out frames above this one (`Machine::next_pfn` starts here).
pub(crate) const FIRST_PFN: u32 = 1 << 24;

/// `frames` without the zero page.
pub(crate) fn without_zero_page(frames: Vec<FrameRun>) -> Vec<FrameRun> {
    if !frames
        .iter()
        .any(|&(p, n)| p <= ZERO_PFN && ZERO_PFN < p + n)
    {
        return frames;
    }
    let mut out = Vec::new();
    for (first, n) in frames {
        for pfn in (first..first + n).filter(|&p| p != ZERO_PFN) {
            push_run(&mut out, pfn, 1);
        }
    }
    out
}

impl Machine {
    /// A frame for a page the fault path maps: a freed one, else a fresh one.
    pub(crate) fn alloc_frame(&mut self) -> u32 {
        self.free_frames.pop_first().unwrap_or_else(|| {
            self.next_pfn += 1;
            self.next_pfn
        })
    }

    /// `npages` fresh, contiguous frames (set-up's pre-mapped pages); returns the first.
    pub(crate) fn alloc_frames(&mut self, npages: u64) -> u32 {
        let first = self.next_pfn + 1;
        self.next_pfn += npages as u32;
        first
    }

    /// The frames of the present 2 MiB leaves an unmap of `[start, start + npages)` of `mm`
    /// covers whole (read before `zap_huge_pmds` clears them; `zap_range` gathers the PTEs').
    pub(crate) fn huge_frames(&self, mm: MmId, start: Vpn, npages: u64) -> Vec<FrameRun> {
        let space = &self.mms[mm as usize].space;
        let (first, last) = (start.div_ceil(PTRS_PER_PT), (start + npages) / PTRS_PER_PT);
        let mut runs: Vec<FrameRun> = Vec::new();
        if first < last {
            for (_, leaf) in space.huge.range(first..last) {
                if leaf.present {
                    push_run(&mut runs, leaf.pfn, PTRS_PER_PT as u32);
                }
            }
        }
        runs
    }

    /// `tlb_flush_mmu_free` (or the mutant's early free): return `frames`, unmapped from
    /// `[start, start + npages)` of `mm` by changes made before oracle epoch `zapped_before`,
    /// to the allocator, checking `INV-FREEPAGE`.
    pub(crate) fn free_user_frames(
        &mut self,
        mm: MmId,
        start: Vpn,
        npages: u64,
        zapped_before: u64,
        frames: Vec<FrameRun>,
    ) {
        // The zero page is not a normal page (`vm_normal_page()`): never freed.
        let frames = without_zero_page(frames);
        if frames.is_empty() {
            return;
        }
        self.say(|| {
            let n: u32 = frames.iter().map(|f| f.1).sum();
            format!(
                "free {n} page(s) to the allocator (frame {:#x}…)",
                frames[0].0
            )
        });
        // A file's page (in the page cache, device memory, or still mapped elsewhere) loses
        // only this mapping's reference (`vma.rs`).
        let frames = self.drop_file_refs(frames);
        // A returned flush of the whole range, begun after the zap, covers every entry.
        if self
            .oracle
            .flushed_since(mm, start, start + npages, zapped_before)
        {
            for (pfn, n) in frames {
                self.free_frames.insert(pfn, n);
            }
        } else {
            self.free_frames_checked(frames);
        }
    }

    /// Free `frames` no covering flush is known for (a page leaving the page cache, an unmap's
    /// pages without one): `INV-FREEPAGE` if any TLB entry still maps one of them unflushed.
    pub(crate) fn free_frames_checked(&mut self, frames: Vec<FrameRun>) {
        if let Some(v) = self.entry_mapping_freed(&frames) {
            self.violate(v);
        }
        for (pfn, n) in frames {
            self.free_frames.insert(pfn, n);
        }
    }

    /// A TLB entry, on any CPU, that maps one of `frames` and is not covered by a returned
    /// flush begun after its PTE changed: the `INV-FREEPAGE` violation it makes.
    fn entry_mapping_freed(&self, frames: &[FrameRun]) -> Option<Violation> {
        for (c, cpu) in self.cpus.iter().enumerate() {
            for (_, pcid, vpn, e) in cpu.tlb.entries() {
                // A 2 MiB entry maps the 512 frames from its leaf's first.
                let span = if e.huge { PTRS_PER_PT as u32 } else { 1 };
                let hit = frames
                    .iter()
                    .any(|&(f, n)| f < e.pfn + span && e.pfn < f + n);
                if !hit {
                    continue;
                }
                let space = &self.mms[e.mm as usize].space;
                let pte = if e.huge {
                    space.huge.get(&pt_index(vpn)).copied().unwrap_or(Pte::NONE)
                } else {
                    space.pte(vpn)
                };
                if !self.oracle.entry_flushed(e.mm, vpn, e.version, &pte) {
                    return Some(Violation {
                        invariant: "INV-FREEPAGE",
                        detail: format!(
                            "frame {:#x} freed while cpu{c}'s TLB maps it (mm{} page {vpn:#x}, PCID {pcid}) and no flush covering that translation has returned",
                            e.pfn, e.mm
                        ),
                    });
                }
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_runs_merge_and_hand_out_the_lowest_frame() {
        let mut f = FreeFrames::default();
        f.insert(10, 2);
        f.insert(14, 1);
        f.insert(12, 2); // joins both neighbours
        assert_eq!(f.0.len(), 1);
        assert_eq!(f.len(), 5);
        assert_eq!(f.pop_first(), Some(10));
        assert_eq!(f.pop_first(), Some(11));
        assert_eq!(f.len(), 3);
        let mut runs = Vec::new();
        for pfn in [5, 6, 7, 9] {
            push_run(&mut runs, pfn, 1);
        }
        assert_eq!(runs, vec![(5, 3), (9, 1)]);
    }
}

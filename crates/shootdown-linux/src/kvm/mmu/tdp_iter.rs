//! arch/x86/kvm/mmu/tdp_iter.c: the pre-order walk the TDP MMU makes over a root's paging
//! structure (`for_each_tdp_pte_min_level`), one entry per iteration.
//!
//! Every entry of every page the walk enters is one iteration, present or not: the walk steps
//! down into a present non-leaf entry (above `min_level`), else sideways to the next entry of
//! the page, else up. `next_last_level_gfn` is where the walk stands at the lowest level; it
//! moves only with a sideways step. After a yield (`tdp_mmu_iter_cond_resched`) the walk
//! restarts from the root at `next_last_level_gfn` (`tdp_iter_restart`), so each yield costs a
//! descent of up to 4 levels, and a yield is allowed only once `next_last_level_gfn` moved past
//! `yielded_gfn` (forward progress).
//!
//! The iterator reads entries straight from EPT memory (`kvm_tdp_mmu_read_spte` is a
//! `READ_ONCE`); `pt_path` keeps the pages of the current path.

use shootdown_hw::ept::{ept_index, gfns_per_entry, EptMemory, Gfn, SpId, Spte, SpteKind};
use shootdown_hw::ept::{EPT_ENTRIES, EPT_ROOT_LEVEL};

/// `struct tdp_iter`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct TdpIter {
    /// The gfn the walk resumes at after a yield.
    pub next_last_level_gfn: Gfn,
    /// `next_last_level_gfn` at the last yield (or the start).
    pub yielded_gfn: Gfn,
    /// The page at each level of the current path (`pt_path[level - 1]`).
    pub pt_path: [SpId; EPT_ROOT_LEVEL as usize],
    /// The first gfn the current entry maps.
    pub gfn: Gfn,
    pub level: u8,
    pub min_level: u8,
    /// The walk has entries left (`iter->valid`).
    pub valid: bool,
    /// The last iteration yielded: the next one restarts from the root.
    pub yielded: bool,
}

fn round_gfn_for_level(gfn: Gfn, level: u8) -> Gfn {
    gfn & !(gfns_per_entry(level) - 1)
}

impl TdpIter {
    /// `tdp_iter_start(iter, root, min_level, start)`.
    pub fn start(root: SpId, min_level: u8, start: Gfn) -> TdpIter {
        let mut it = TdpIter {
            next_last_level_gfn: start,
            yielded_gfn: start,
            min_level,
            ..TdpIter::default()
        };
        it.pt_path[EPT_ROOT_LEVEL as usize - 1] = root;
        it.restart();
        it
    }

    /// `tdp_iter_restart()`: back to the root, at `next_last_level_gfn`.
    pub fn restart(&mut self) {
        self.yielded = false;
        self.yielded_gfn = self.next_last_level_gfn;
        self.level = EPT_ROOT_LEVEL;
        self.gfn = round_gfn_for_level(self.next_last_level_gfn, self.level);
        self.valid = true;
    }

    /// The current entry: its page and index (`iter->sptep`).
    pub fn sptep(&self) -> (SpId, u16) {
        (
            self.pt_path[self.level as usize - 1],
            ept_index(self.level, self.gfn),
        )
    }

    /// `iter->old_spte`, read afresh.
    pub fn old_spte(&self, ept: &EptMemory) -> Spte {
        let (sp, idx) = self.sptep();
        ept.spte(sp, idx)
    }

    /// Guest frames the current entry maps.
    pub fn span(&self) -> u64 {
        gfns_per_entry(self.level)
    }

    /// Has the walk advanced since it last yielded (`next_last_level_gfn != yielded_gfn`)?
    pub fn made_progress(&self) -> bool {
        self.next_last_level_gfn != self.yielded_gfn
    }

    /// `tdp_iter_next()`.
    pub fn next(&mut self, ept: &EptMemory) {
        if self.yielded {
            self.restart();
            return;
        }
        if self.try_step_down(ept) {
            return;
        }
        loop {
            if self.try_step_side() {
                return;
            }
            if !self.try_step_up() {
                break;
            }
        }
        self.valid = false;
    }

    fn try_step_down(&mut self, ept: &EptMemory) -> bool {
        if self.level == self.min_level {
            return false;
        }
        let SpteKind::Table(child) = self.old_spte(ept).kind else {
            return false;
        };
        self.level -= 1;
        self.pt_path[self.level as usize - 1] = child;
        self.gfn = round_gfn_for_level(self.next_last_level_gfn, self.level);
        true
    }

    fn try_step_side(&mut self) -> bool {
        if ept_index(self.level, self.gfn) as u64 == EPT_ENTRIES - 1 {
            return false;
        }
        self.gfn += gfns_per_entry(self.level);
        self.next_last_level_gfn = self.gfn;
        true
    }

    fn try_step_up(&mut self) -> bool {
        if self.level == EPT_ROOT_LEVEL {
            return false;
        }
        self.level += 1;
        self.gfn = round_gfn_for_level(self.gfn, self.level);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shootdown_hw::ept::MT_WB_IPAT;

    /// Root → PDPT 0 → PD 0 with a 2 MiB leaf at entry 1 and a PT at entry 0 with one 4 KiB
    /// leaf.
    fn tree() -> (EptMemory, SpId) {
        let mut m = EptMemory::default();
        let root = m.alloc(4, 0);
        let pdpt = m.alloc(3, 0);
        let pd = m.alloc(2, 0);
        let pt = m.alloc(1, 0);
        let leaf = SpteKind::Leaf {
            pfn: 0x1000,
            writable: true,
            mmu_writable: true,
            memtype: MT_WB_IPAT,
            exec: true,
            dirty: false,
            access_tracked: false,
        };
        m.set(root, 0, SpteKind::Table(pdpt), 1);
        m.set(pdpt, 0, SpteKind::Table(pd), 1);
        m.set(pd, 0, SpteKind::Table(pt), 1);
        m.set(pd, 1, leaf, 1);
        m.set(pt, 3, leaf, 1);
        (m, root)
    }

    fn count(m: &EptMemory, root: SpId, start: Gfn, end: Gfn) -> (u64, u64) {
        let mut it = TdpIter::start(root, 1, start);
        let (mut steps, mut leaves) = (0, 0);
        while it.valid && it.gfn < end {
            steps += 1;
            if matches!(it.old_spte(m).kind, SpteKind::Leaf { .. }) {
                leaves += 1;
            }
            it.next(m);
        }
        (steps, leaves)
    }

    #[test]
    fn every_entry_of_every_entered_page_is_an_iteration() {
        let (m, root) = tree();
        // 1 GiB = 0x40000 gfns: PML4 entry 0, PDPT entry 0, PD's 512 entries, the PT's 512.
        assert_eq!(count(&m, root, 0, 0x40000), (1 + 1 + 512 + 512, 2));
        // The whole 2^34-gfn space (MAXPHYADDR 46): 128 PML4 entries, 512 PDPT entries.
        assert_eq!(count(&m, root, 0, 1 << 34), (128 + 512 + 512 + 512, 2));
    }

    #[test]
    fn a_yield_restarts_from_the_root_where_the_walk_stood() {
        let (m, root) = tree();
        let mut it = TdpIter::start(root, 1, 0);
        for _ in 0..6 {
            it.next(&m);
        }
        // Root, PDPT, PD 0 → PT entries 0, 1, 2, 3.
        assert_eq!((it.level, it.gfn), (1, 3));
        assert!(it.made_progress());
        it.yielded = true;
        it.next(&m);
        assert_eq!((it.level, it.gfn, it.made_progress()), (4, 0, false));
        it.next(&m);
        it.next(&m);
        it.next(&m);
        assert_eq!((it.level, it.gfn, it.made_progress()), (1, 3, false));
        it.next(&m);
        assert!(it.made_progress());
    }
}

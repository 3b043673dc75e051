//! Page-table memory: what the hardware walker reads.
//!
//! Two levels are enough for every mechanism modelled here: leaf PTEs (one per 4 KiB virtual
//! page), grouped 512 to a *page-table page*, which the upper level (the PMD) points to. A
//! PMD entry may instead be a leaf itself (`pmd_trans_huge`: a 2 MiB page mapped by one entry,
//! no page-table page below it). A page-table page can be unlinked (PMD cleared) and later
//! freed; a walk that reaches a freed page — through a stale PMD or a paging-structure-cache
//! entry — is a use-after-free of the kind seed 002's lazy-TLB rework exposed
//! (docs/bugs/CATALOG.md N3), and that khugepaged's collapse can expose too.
//!
//! Every PTE carries a *version* (bumped by each change) and the epochs at which its recent
//! versions were superseded, so the [`crate::oracle`] can tell whether a cached translation was
//! already stale before a flush began.

use crate::pte_map::PteMap;
use serde::Serialize;
use std::collections::BTreeMap;

/// Virtual page number (virtual address >> 12).
pub type Vpn = u64;
/// Index of a page-table page within an address space (vpn / 512).
pub type PtIndex = u64;
/// Identity of a page-table page in physical memory.
pub type PtPageId = u32;

pub const PTRS_PER_PT: u64 = 512;

pub fn pt_index(vpn: Vpn) -> PtIndex {
    vpn / PTRS_PER_PT
}

/// How many superseded versions a PTE remembers the end epoch of.
pub const PTE_HISTORY: usize = 4;

/// A leaf page-table entry plus the history the oracle needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct Pte {
    pub pfn: u32,
    pub present: bool,
    pub writable: bool,
    pub dirty: bool,
    /// Bumped by every change.
    pub version: u32,
    /// `ended[j]`: the epoch at which version `version - 1 - j` was superseded.
    pub ended: [u64; PTE_HISTORY],
}

impl Pte {
    pub const NONE: Pte = Pte {
        pfn: 0,
        present: false,
        writable: false,
        dirty: false,
        version: 0,
        ended: [0; PTE_HISTORY],
    };

    /// Epoch at which `version` was superseded: `Some(exact)` if remembered, `Some(bound)` (an
    /// upper bound) for older versions, `None` if `version` is current.
    pub fn superseded_at(&self, version: u32) -> Option<u64> {
        superseded_at(self.version, &self.ended, version)
    }
}

/// Epoch at which `version` of an entry now at version `current` was superseded, given the end
/// epochs of its recent versions (`ended[j]` ended version `current - 1 - j`): exact if
/// remembered, an upper bound for older versions, `None` if `version` is current.
pub(crate) fn superseded_at(current: u32, ended: &[u64; PTE_HISTORY], version: u32) -> Option<u64> {
    if version >= current {
        return None;
    }
    let j = (current - 1 - version) as usize;
    Some(ended[j.min(PTE_HISTORY - 1)])
}

/// Result of a hardware walk of one address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Walk {
    /// No page-table page covers the address (PMD empty).
    NoTable,
    /// Reached the leaf through a live page-table page.
    Leaf { table: PtPageId, pte: Pte },
    /// The PMD entry is itself a present leaf (a 2 MiB page): no page-table page below it.
    Huge { pte: Pte },
    /// The walk went through a page-table page that has been freed.
    FreedTable(PtPageId),
}

/// One address space's page tables.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct AddressSpace {
    /// Leaf entries, including non-present ones that keep their version history.
    pub ptes: PteMap,
    /// PMD level: which page-table page covers each 512-page group.
    pub pmd: BTreeMap<PtIndex, PtPageId>,
    /// PMD leaf entries (2 MiB pages) by 512-page group, including non-present ones that keep
    /// their version history. A group is mapped by a page-table page in `pmd` or by a present
    /// leaf here, never both.
    pub huge: BTreeMap<PtIndex, Pte>,
}

impl AddressSpace {
    pub fn pte(&self, vpn: Vpn) -> Pte {
        self.ptes.get(vpn).copied().unwrap_or(Pte::NONE)
    }
    /// The PMD leaf entry of 512-page group `pt` (non-present if none).
    pub fn huge_pmd(&self, pt: PtIndex) -> Pte {
        self.huge.get(&pt).copied().unwrap_or(Pte::NONE)
    }
    /// The entry a translation of `vpn` is filled from: its PTE or, for a 2 MiB translation,
    /// its group's PMD leaf.
    pub fn leaf(&self, vpn: Vpn, huge: bool) -> Pte {
        if huge {
            self.huge_pmd(pt_index(vpn))
        } else {
            self.pte(vpn)
        }
    }
    /// Is group `pt` mapped by a present PMD leaf?
    pub fn is_huge(&self, pt: PtIndex) -> bool {
        self.huge.get(&pt).is_some_and(|p| p.present)
    }
}

/// Physical page-table pages: allocated, linked, freed.
#[derive(Debug, Default, PartialEq, Eq, Hash)]
pub struct PtPages {
    alive: Vec<bool>,
}

shootdown_engine::clone_by_fields!(PtPages { alive });

impl PtPages {
    pub fn alloc(&mut self) -> PtPageId {
        self.alive.push(true);
        (self.alive.len() - 1) as PtPageId
    }
    pub fn free(&mut self, id: PtPageId) {
        self.alive[id as usize] = false;
    }
    pub fn is_alive(&self, id: PtPageId) -> bool {
        self.alive.get(id as usize).copied().unwrap_or(false)
    }
    /// Walk `vpn` in `space` from the top (the PMD), as the hardware does on a TLB miss.
    pub fn walk(&self, space: &AddressSpace, vpn: Vpn) -> Walk {
        let pt = pt_index(vpn);
        match space.pmd.get(&pt) {
            Some(&t) => self.walk_table(space, t, vpn),
            None if space.is_huge(pt) => Walk::Huge {
                pte: space.huge_pmd(pt),
            },
            None => Walk::NoTable,
        }
    }
    /// Walk the leaf level starting from a known page-table page (a paging-structure-cache hit).
    pub fn walk_table(&self, space: &AddressSpace, table: PtPageId, vpn: Vpn) -> Walk {
        if !self.is_alive(table) {
            Walk::FreedTable(table)
        } else {
            Walk::Leaf {
                table,
                pte: space.pte(vpn),
            }
        }
    }
}

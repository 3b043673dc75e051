//! EPT page-table memory: the second translation stage (guest-physical → host-physical) that a
//! VM's vCPUs walk in hardware. It is page-table memory like a guest's page tables
//! ([`crate::pagetable`]): entries carry versions and the epochs their earlier versions were
//! superseded at, pages can be unlinked and freed, and a walk through a freed page is a
//! use-after-free the oracle reports. KVM's software view of these pages (shadow pages: role,
//! generation, root count, rmaps) lives in the kernel model; this is what the hardware sees.
//!
//! Levels follow the SDM: 4 (PML4, the root), 3 (PDPT), 2 (PD: 2 MiB leaves or links to page
//! tables), 1 (PT: 4 KiB leaves). An entry is non-present, a leaf, a link to a lower table, or
//! an MMIO SPTE (KVM's reserved-bit pattern: an EPT misconfiguration on access, carrying the
//! memslot generation it was created under).

use crate::pagetable::{superseded_at, PTE_HISTORY};
use std::collections::BTreeMap;

/// A guest frame number (guest-physical address >> 12).
pub type Gfn = u64;
/// Identity of an EPT page-table page (a KVM shadow page). Never reused, so a stale pointer to
/// a freed page is always recognisable.
pub type SpId = u32;

/// The memory type KVM gives every leaf when it does not honour guest MTRRs
/// (`vmx_get_mt_mask()` without non-coherent DMA): WB with "ignore guest PAT".
pub const MT_WB_IPAT: u8 = 6 | 8;

/// Entries per EPT page.
pub const EPT_ENTRIES: u64 = 512;
/// The root's level (4-level EPT).
pub const EPT_ROOT_LEVEL: u8 = 4;

/// Guest frames one entry at `level` maps (512^(level-1)).
pub fn gfns_per_entry(level: u8) -> u64 {
    1u64 << (9 * (level as u32 - 1))
}

/// The index of `gfn`'s entry in a page of `level`.
pub fn ept_index(level: u8, gfn: Gfn) -> u16 {
    ((gfn / gfns_per_entry(level)) % EPT_ENTRIES) as u16
}

/// What an SPTE holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SpteKind {
    /// Non-present (zapped, or never installed).
    None,
    /// A leaf: maps the entry's guest frames (4 KiB at level 1, 2 MiB at level 2) to host
    /// frames starting at `pfn`, with EPT memory type `memtype` (bits 2:0 the type, bit 3
    /// IPAT: [`MT_WB_IPAT`] unless guest MTRRs are honoured). `exec`: the X bit (KVM clears
    /// it in huge leaves under the iTLB multihit mitigation, `nx_huge_pages`). `writable`: the
    /// W bit; `mmu_writable`: KVM's software bits `shadow_host_writable_mask |
    /// shadow_mmu_writable_mask` (the host page is writable and nothing write-tracks the gfn),
    /// which let `fast_page_fault()` set W again without `mmu_lock` after dirty logging
    /// cleared it (`spte_can_locklessly_be_made_writable`). `dirty`: the D bit (bit 9), used
    /// only with EPT A/D bits on (EPTP bit 6): KVM sets it in every writable SPTE it makes,
    /// and the CPU sets it ([`EptMemory::set_dirty`]) on a write through a leaf without it.
    /// `access_tracked`: without A/D bits, KVM's aging cleared the R/W/X bits (saving R and X
    /// in software bits, `mark_spte_for_access_track`): the CPU sees no translation, KVM still
    /// a present SPTE that `fast_page_fault` restores.
    Leaf {
        pfn: u64,
        writable: bool,
        mmu_writable: bool,
        memtype: u8,
        exec: bool,
        dirty: bool,
        access_tracked: bool,
    },
    /// A link to a lower-level table.
    Table(SpId),
    /// An MMIO SPTE: `gen` is the (truncated) memslot generation it was created under.
    Mmio { gen: u64 },
    /// KVM's `REMOVED_SPTE` (`FROZEN_SPTE` in later kernels): a non-present value an atomic
    /// zap writes with `cmpxchg` before it flushes and clears the entry, so that concurrent
    /// walkers under the read lock leave it alone. The table the entry linked, if it did.
    Frozen(Option<SpId>),
}

impl SpteKind {
    /// This leaf with its W bit set to `w` (anything else unchanged).
    pub fn with_writable(mut self, w: bool) -> SpteKind {
        if let SpteKind::Leaf { writable, .. } = &mut self {
            *writable = w;
        }
        self
    }

    /// This leaf with its D bit set to `d` (anything else unchanged).
    pub fn with_dirty(mut self, d: bool) -> SpteKind {
        if let SpteKind::Leaf { dirty, .. } = &mut self {
            *dirty = d;
        }
        self
    }
}

/// One EPT entry plus the history the oracle needs (as [`crate::pagetable::Pte`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Spte {
    pub kind: SpteKind,
    /// Bumped by every change.
    pub version: u32,
    /// `ended[j]`: the epoch at which version `version - 1 - j` was superseded.
    pub ended: [u64; PTE_HISTORY],
}

impl Spte {
    pub const NONE: Spte = Spte {
        kind: SpteKind::None,
        version: 0,
        ended: [0; PTE_HISTORY],
    };

    /// Epoch at which `version` was superseded (see [`crate::pagetable::Pte::superseded_at`]).
    pub fn superseded_at(&self, version: u32) -> Option<u64> {
        superseded_at(self.version, &self.ended, version)
    }

    pub fn is_present(&self) -> bool {
        matches!(self.kind, SpteKind::Leaf { .. } | SpteKind::Table(_))
    }
}

/// One EPT page-table page.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct EptPage {
    pub alive: bool,
    pub level: u8,
    /// The first guest frame the page maps.
    pub gfn: Gfn,
    /// Entries that were ever written (absent = never-present).
    pub entries: BTreeMap<u16, Spte>,
    /// Where the page is linked (its parent page and entry), if it is.
    pub parent: Option<(SpId, u16)>,
    /// Oracle: the epoch at which the page was last unlinked from its parent (0 = never): a
    /// translation cached through it at or before that epoch is stale from then on.
    pub detached_at: u64,
}

/// Result of a hardware walk of one guest frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EptWalk {
    /// A leaf maps the frame: `sp`/`idx` locate the SPTE.
    Leaf {
        sp: SpId,
        idx: u16,
        level: u8,
        spte: Spte,
    },
    /// The walk stopped at a non-present entry (an EPT violation).
    NotPresent { sp: SpId, level: u8 },
    /// The walk reached an MMIO SPTE (an EPT misconfiguration).
    Mmio { sp: SpId, idx: u16, spte: Spte },
    /// The walk went through a page that has been freed.
    FreedTable(SpId),
}

/// Every EPT page of every VM (ids are global, so one arena serves all VMs). Each page is
/// [`HashCached`](shootdown_engine::HashCached): the explorer's states share the pages a step
/// did not write, and their digests.
#[derive(Debug, Default, PartialEq, Eq, Hash)]
pub struct EptMemory {
    pub pages: Vec<shootdown_engine::HashCached<EptPage>>,
}

shootdown_engine::clone_by_fields!(EptMemory { pages });

impl EptMemory {
    /// Allocate a page of `level` mapping from `gfn` (aligned down to the level).
    pub fn alloc(&mut self, level: u8, gfn: Gfn) -> SpId {
        let span = gfns_per_entry(level) * EPT_ENTRIES;
        self.pages.push(shootdown_engine::HashCached::new(EptPage {
            alive: true,
            level,
            gfn: gfn / span * span,
            entries: BTreeMap::new(),
            parent: None,
            detached_at: 0,
        }));
        (self.pages.len() - 1) as SpId
    }

    pub fn page(&self, sp: SpId) -> &EptPage {
        &self.pages[sp as usize]
    }

    pub fn is_alive(&self, sp: SpId) -> bool {
        self.pages.get(sp as usize).is_some_and(|p| p.alive)
    }

    pub fn spte(&self, sp: SpId, idx: u16) -> Spte {
        self.pages[sp as usize]
            .entries
            .get(&idx)
            .copied()
            .unwrap_or(Spte::NONE)
    }

    /// Set entry `idx` of `sp` to `kind` at oracle epoch `epoch` (its old value, if it was
    /// anything, is superseded then). Linking a table records its parent; unlinking one records
    /// when it was detached. Returns the old entry.
    pub fn set(&mut self, sp: SpId, idx: u16, kind: SpteKind, epoch: u64) -> Spte {
        let old = self.spte(sp, idx);
        if let SpteKind::Table(child) = old.kind {
            if kind != old.kind {
                let c = &mut self.pages[child as usize];
                c.parent = None;
                c.detached_at = epoch;
            }
        }
        if let SpteKind::Table(child) = kind {
            self.pages[child as usize].parent = Some((sp, idx));
        }
        let e = self.pages[sp as usize]
            .entries
            .entry(idx)
            .or_insert(Spte::NONE);
        e.ended.rotate_right(1);
        e.ended[0] = epoch;
        e.kind = kind;
        e.version += 1;
        old
    }

    /// The CPU's A/D assist (SDM 29.3.5): a write through leaf `idx` of `sp` that lacks D sets
    /// it with a locked read-modify-write of the entry. Only the bit changes: the entry's
    /// translation and version stay (a TLB entry filled from it is as current as before).
    /// Whether it set the bit.
    pub fn set_dirty(&mut self, sp: SpId, idx: u16) -> bool {
        let Some(e) = self.pages[sp as usize].entries.get_mut(&idx) else {
            return false;
        };
        match &mut e.kind {
            SpteKind::Leaf { dirty, .. } if !*dirty => {
                *dirty = true;
                true
            }
            _ => false,
        }
    }

    /// Free a page (KVM's `kvm_mmu_free_page`): a later walk through it is a use-after-free.
    pub fn free(&mut self, sp: SpId) {
        self.pages[sp as usize].alive = false;
    }

    /// Walk `gfn` from table `sp` (the root, or a table a paging-structure cache held) down to
    /// a leaf, a non-present entry or an MMIO SPTE.
    pub fn walk_from(&self, mut sp: SpId, gfn: Gfn) -> EptWalk {
        loop {
            let Some(p) = self.pages.get(sp as usize).filter(|p| p.alive) else {
                return EptWalk::FreedTable(sp);
            };
            let idx = ept_index(p.level, gfn);
            let spte = p.entries.get(&idx).copied().unwrap_or(Spte::NONE);
            match spte.kind {
                SpteKind::None | SpteKind::Frozen(_) => {
                    return EptWalk::NotPresent { sp, level: p.level }
                }
                SpteKind::Leaf { .. } => {
                    return EptWalk::Leaf {
                        sp,
                        idx,
                        level: p.level,
                        spte,
                    }
                }
                SpteKind::Mmio { .. } => return EptWalk::Mmio { sp, idx, spte },
                SpteKind::Table(child) => sp = child,
            }
        }
    }

    /// The epoch at which a translation cached from leaf `(sp, idx)` at `version`, filled at
    /// epoch `filled`, stopped being what the EPT says: the leaf's version was superseded, or
    /// a page on its path was unlinked after the fill. `None` if it is still current.
    pub fn stale_since(&self, sp: SpId, idx: u16, version: u32, filled: u64) -> Option<u64> {
        let mut since = self.spte(sp, idx).superseded_at(version);
        let mut p = Some(sp);
        while let Some(s) = p {
            let page = &self.pages[s as usize];
            if page.detached_at >= filled && page.detached_at > 0 {
                since = Some(since.map_or(page.detached_at, |x| x.min(page.detached_at)));
            }
            p = page.parent.map(|(parent, _)| parent);
        }
        since
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A root with one PDPT and one PD page, a 2 MiB leaf for gfn 0x200..0x400.
    fn small() -> (EptMemory, SpId, SpId, SpId) {
        let mut m = EptMemory::default();
        let root = m.alloc(4, 0);
        let pdpt = m.alloc(3, 0);
        let pd = m.alloc(2, 0);
        m.set(root, 0, SpteKind::Table(pdpt), 1);
        m.set(pdpt, 0, SpteKind::Table(pd), 2);
        m.set(
            pd,
            1,
            SpteKind::Leaf {
                pfn: 0x1000,
                writable: true,
                mmu_writable: true,
                memtype: MT_WB_IPAT,
                exec: true,
                dirty: false,
                access_tracked: false,
            },
            3,
        );
        (m, root, pdpt, pd)
    }

    #[test]
    fn walks_reach_leaves_holes_and_freed_pages() {
        let (mut m, root, pdpt, pd) = small();
        match m.walk_from(root, 0x234) {
            EptWalk::Leaf { sp, idx, level, .. } => assert_eq!((sp, idx, level), (pd, 1, 2)),
            w => panic!("{w:?}"),
        }
        assert_eq!(
            m.walk_from(root, 0x10),
            EptWalk::NotPresent { sp: pd, level: 2 }
        );
        m.set(pdpt, 0, SpteKind::None, 10);
        assert_eq!(m.page(pd).parent, None);
        assert_eq!(m.page(pd).detached_at, 10);
        m.free(pd);
        assert_eq!(m.walk_from(pd, 0x234), EptWalk::FreedTable(pd));
    }

    #[test]
    fn a_translation_is_stale_once_its_leaf_or_its_path_changes() {
        let (mut m, root, _pdpt, pd) = small();
        let EptWalk::Leaf { spte, .. } = m.walk_from(root, 0x200) else {
            panic!()
        };
        assert_eq!(m.stale_since(pd, 1, spte.version, 5), None);
        // Unlinking the PDPT from the root (epoch 7) cuts the path.
        m.set(root, 0, SpteKind::None, 7);
        assert_eq!(m.stale_since(pd, 1, spte.version, 5), Some(7));
        // A fill after the cut (through a path that no longer exists) is not stale by it.
        assert_eq!(m.stale_since(pd, 1, spte.version, 8), None);
        // Zapping the leaf at 9.
        m.set(pd, 1, SpteKind::None, 9);
        assert_eq!(m.stale_since(pd, 1, spte.version, 8), Some(9));
    }
}

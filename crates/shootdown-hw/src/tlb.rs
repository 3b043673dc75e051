//! A per-CPU TLB tagged by PCID, of finite capacity, plus a paging-structure cache (PSC).
//!
//! Semantics follow the SDM as summarised in docs/design/kernel-model.md §1.1:
//! * `INVLPG va` drops the entry for `va` in the current PCID and any global entry for `va`,
//!   and (conservatively, as the SDM allows) every PSC entry of the current PCID;
//! * a CR3 write without NOFLUSH drops every non-global entry (and PSC entry) of the new PCID;
//! * with NOFLUSH nothing is dropped.
//!
//! Entries record the mm they were filled for and the PTE version they were filled from, for
//! the oracle. Eviction when full picks a victim with the run's RNG (deterministic).
//!
//! A vCPU's TLB stands for the pCPU's TLB partition of its VPID. With EPT, its entries are
//! *combined* mappings (guest-linear → host-physical) tagged with the EPTP they were cached
//! under (the current one, [`Tlb::set_ept_tag`]), and an EPT paging-structure cache holds
//! pointers into the EPT. Guest INVLPG and CR3 writes act on the current tag; INVVPID
//! ([`Tlb::flush_all`]) on every linear and combined mapping of the vCPU; INVEPT on the
//! combined mappings and EPT paging-structure entries of one EPTP (single-context) or of all.

use crate::ept::{Gfn, SpId};
use crate::oracle::MmIndex;
use crate::pagetable::{PtIndex, PtPageId, Vpn};
use rustc_hash::FxHashMap;
use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};

/// Hardware PCID value (12 bits; bit 11 marks the PTI user half).
pub type Pcid = u16;

/// The second-stage context a translation was cached under: 0 = none (native, or a guest
/// whose EPT is not modelled), else the EPT root (EPTP) + 1.
pub type EptTag = u32;

/// The tag of translations cached under EPT root `root`.
pub fn ept_tag(root: SpId) -> EptTag {
    root + 1
}

/// Oracle: the EPT leaf a combined mapping was filled from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct EptUse {
    pub gfn: Gfn,
    pub sp: SpId,
    pub idx: u16,
    /// The SPTE version it was filled from.
    pub version: u32,
    /// The oracle epoch of the fill.
    pub filled: u64,
    /// The leaf's X bit: an instruction fetch uses the entry only if it is set (a fetch
    /// through a non-executable leaf walks, and exits).
    pub exec: bool,
    /// The leaf's D bit as the fill saw it (EPT A/D bits): a write through an entry without
    /// it walks again, so that the CPU sets D in the SPTE.
    pub dirty: bool,
}

/// One INVLPGB broadcast as Linux issues it (`__invlpgb`, arch/x86/include/asm/tlb.h; AMD
/// APM vol. 3): the non-global translations of `pcid` (all PCIDs if `None`) for the pages
/// `[start, end)` (all pages if `range` is `None`), performed by every CPU's TLB without an
/// interrupt, complete when the issuing CPU's TLBSYNC returns. With `final_only` ("final
/// translations only") the paging-structure caches keep their entries; with `include_global`
/// Global translations go too (the kernel's kernel-range and flush-all forms).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Invlpgb {
    pub pcid: Option<Pcid>,
    pub range: Option<(Vpn, Vpn)>,
    pub final_only: bool,
    pub include_global: bool,
}

impl Invlpgb {
    /// Every non-global translation of every PCID (`invlpgb_flush_all_nonglobals`).
    pub const ALL_NONGLOBALS: Invlpgb = Invlpgb {
        pcid: None,
        range: None,
        final_only: false,
        include_global: false,
    };
}

/// A cached translation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TlbEntry {
    pub pfn: u32,
    pub writable: bool,
    pub global: bool,
    /// Oracle: the mm whose page tables this was filled from.
    pub mm: MmIndex,
    /// Oracle: the PTE version it was filled from.
    pub version: u32,
    /// Oracle: for a combined mapping, the EPT leaf it was filled from.
    pub ept: Option<EptUse>,
    /// A 2 MiB translation (filled from a PMD leaf): it maps the whole 512-page group.
    pub huge: bool,
}

/// (tag, PCID, page): the page of a 2 MiB entry is [`huge_key`] of its group.
type Key = (EptTag, Pcid, Vpn);

/// Marks the key of a 2 MiB entry, which may coexist with a 4 KiB entry for its first page
/// (the SDM allows both after a page-size change; a lookup may use either).
const HUGE_KEY: Vpn = 1 << 63;

/// The key page of the 2 MiB entry that would map `vpn`.
fn huge_key(vpn: Vpn) -> Vpn {
    HUGE_KEY | (vpn & !(crate::pagetable::PTRS_PER_PT - 1))
}

/// Paging-structure cache: (PCID, table index) -> the page-table page it points at.
type PscMap = BTreeMap<(Pcid, PtIndex), PtPageId>;

/// EPT paging-structure cache: (tag, level of the table, guest frame >> (9 × level)) -> the EPT
/// page of that level that maps the frame.
type EptPscMap = BTreeMap<(EptTag, u8, u64), SpId>;

#[derive(Debug)]
pub struct Tlb {
    entries: Vec<(Key, TlbEntry)>,
    index: FxHashMap<Key, usize>,
    psc: PscMap,
    ept_psc: EptPscMap,
    /// The tag lookups, fills and guest flushes use now (the loaded EPTP).
    tag: EptTag,
    capacity: usize,
    psc_capacity: usize,
    /// A global entry may be cached (set by its fill, cleared by [`Tlb::flush_all`]): a lookup
    /// that misses under its PCID must then look for a global entry filled under another.
    /// Derived from `entries`, so not part of equality or the hash.
    globals: bool,
}

shootdown_engine::clone_by_fields!(Tlb {
    globals,
    entries,
    index,
    psc,
    ept_psc,
    tag,
    capacity,
    psc_capacity,
});

impl Tlb {
    pub fn new(capacity: usize, psc_capacity: usize) -> Self {
        Tlb {
            entries: Vec::new(),
            index: FxHashMap::default(),
            psc: BTreeMap::new(),
            ept_psc: BTreeMap::new(),
            tag: 0,
            capacity: capacity.max(1),
            psc_capacity: psc_capacity.max(1),
            globals: false,
        }
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Load an EPTP: lookups, fills and guest flushes use its tag from now on (VM entry).
    pub fn set_ept_tag(&mut self, tag: EptTag) {
        self.tag = tag;
    }

    pub fn ept_tag(&self) -> EptTag {
        self.tag
    }

    /// The entry translating `vpn` under `pcid`: a 4 KiB one, else a 2 MiB one covering it,
    /// else a global entry for `vpn` filled under any PCID (the SDM: a global translation is
    /// used whatever the current PCID).
    pub fn lookup(&self, pcid: Pcid, vpn: Vpn) -> Option<TlbEntry> {
        let own = self
            .index
            .get(&(self.tag, pcid, vpn))
            .or_else(|| self.index.get(&(self.tag, pcid, huge_key(vpn))))
            .map(|&i| self.entries[i].1);
        if own.is_some() || !self.globals {
            return own;
        }
        self.entries
            .iter()
            .find(|((t, _, v), e)| e.global && *t == self.tag && (*v == vpn || *v == huge_key(vpn)))
            .map(|(_, e)| *e)
    }

    /// Insert (or replace) an entry for `vpn` (of its 512-page group if `e.huge`); `victim` is
    /// a random number used if one must be evicted.
    pub fn insert(&mut self, pcid: Pcid, vpn: Vpn, e: TlbEntry, victim: u64) {
        let k = (self.tag, pcid, if e.huge { huge_key(vpn) } else { vpn });
        if let Some(&i) = self.index.get(&k) {
            self.entries[i].1 = e;
            return;
        }
        if self.entries.len() >= self.capacity {
            let i = (victim % self.entries.len() as u64) as usize;
            self.remove_at(i);
        }
        self.globals |= e.global;
        self.index.insert(k, self.entries.len());
        self.entries.push((k, e));
    }

    fn remove_at(&mut self, i: usize) {
        let (k, _) = self.entries.swap_remove(i);
        self.index.remove(&k);
        if i < self.entries.len() {
            let moved = self.entries[i].0;
            self.index.insert(moved, i);
        }
    }

    fn retain(&mut self, mut keep: impl FnMut(&Key, &TlbEntry) -> bool) {
        let before = self.entries.len();
        self.entries.retain(|(k, e)| keep(k, e));
        if self.entries.len() != before {
            self.index.clear();
            for (i, (k, _)) in self.entries.iter().enumerate() {
                self.index.insert(*k, i);
            }
        }
    }

    /// Paging-structure cache lookup.
    pub fn psc_lookup(&self, pcid: Pcid, pt: PtIndex) -> Option<PtPageId> {
        self.psc.get(&(pcid, pt)).copied()
    }
    pub fn psc_insert(&mut self, pcid: Pcid, pt: PtIndex, table: PtPageId) {
        if self.psc.len() >= self.psc_capacity && !self.psc.contains_key(&(pcid, pt)) {
            self.psc.pop_first();
        }
        self.psc.insert((pcid, pt), table);
    }

    /// INVLPG (or INVPCID single-address) of `vpn` in `pcid` (under the current tag): the
    /// entries that translate `vpn`, whatever their page size (a 2 MiB one goes whole).
    pub fn invlpg(&mut self, pcid: Pcid, vpn: Vpn) {
        for page in [vpn, huge_key(vpn)] {
            if let Some(&i) = self.index.get(&(self.tag, pcid, page)) {
                self.remove_at(i);
            }
        }
        // Global entries for the address go too.
        self.retain(|k, e| !(e.global && (k.2 == vpn || k.2 == huge_key(vpn))));
        self.psc.retain(|k, _| k.0 != pcid);
    }

    /// The part of INVLPGB (AMD) that one CPU's TLB performs: drop the non-global entries
    /// `b` names and, unless it asks for final translations only, the paging-structure
    /// entries of its PCID. Under the current tag, like a native flush.
    pub fn invlpgb(&mut self, b: &Invlpgb) {
        let tag = self.tag;
        if b.final_only {
            let psc = std::mem::take(&mut self.psc);
            self.invlpgb(&Invlpgb {
                final_only: false,
                ..*b
            });
            self.psc = psc;
            return;
        }
        let global = b.include_global;
        let group = crate::pagetable::PTRS_PER_PT;
        let pages = |k: &Key| {
            if k.2 & HUGE_KEY != 0 {
                let base = k.2 & !HUGE_KEY;
                (base, base + group)
            } else {
                (k.2, k.2 + 1)
            }
        };
        match (b.pcid, b.range) {
            (None, None) => {
                // Every translation of every PCID (`invlpgb_flush_all_nonglobals`; Global
                // ones too for `invlpgb_flush_all`).
                self.retain(|k, e| (e.global && !global) || k.0 != tag);
                self.psc.clear();
            }
            (None, Some((start, end))) => {
                // An address range in every PCID (`invlpgb_flush_addr_nosync`).
                self.retain(|k, e| {
                    let (first, last) = pages(k);
                    (e.global && !global) || k.0 != tag || last <= start || first >= end
                });
                self.psc.clear();
            }
            (Some(p), None) => self.flush_pcid(p),
            (Some(p), Some((start, end))) => {
                self.retain(|k, e| {
                    let (first, last) = pages(k);
                    (e.global && !global) || k.0 != tag || k.1 != p || last <= start || first >= end
                });
                self.psc.retain(|k, _| k.0 != p);
            }
        }
    }

    /// INVLPG on a CPU with the `invlpg_miss_global` erratum, PCIDs on: the entries of `pcid`
    /// for `vpn` go, Global ones (filled under any PCID) stay.
    pub fn invlpg_missing_globals(&mut self, pcid: Pcid, vpn: Vpn) {
        for page in [vpn, huge_key(vpn)] {
            if let Some(&i) = self.index.get(&(self.tag, pcid, page)) {
                if !self.entries[i].1.global {
                    self.remove_at(i);
                }
            }
        }
        self.psc.retain(|k, _| k.0 != pcid);
    }

    /// Drop every non-global entry and PSC entry tagged `pcid` under the current tag (CR3
    /// write without NOFLUSH, INVPCID single-context).
    pub fn flush_pcid(&mut self, pcid: Pcid) {
        let tag = self.tag;
        self.retain(|k, e| e.global || k.1 != pcid || k.0 != tag);
        self.psc.retain(|k, _| k.0 != pcid);
    }

    /// Drop every linear and combined mapping, global entries included, and the linear
    /// paging-structure cache (INVVPID single-context; natively CR4.PGE toggle or INVPCID
    /// all-incl-global). Guest-physical state (the EPT paging-structure cache) stays: only
    /// INVEPT drops it.
    pub fn flush_all(&mut self) {
        self.entries.clear();
        self.index.clear();
        self.psc.clear();
        self.globals = false;
    }

    /// INVEPT single-context: drop the combined mappings and EPT paging-structure entries
    /// cached under `tag`.
    pub fn invept_single(&mut self, tag: EptTag) {
        self.retain(|k, _| k.0 != tag);
        self.ept_psc.retain(|k, _| k.0 != tag);
    }

    /// INVEPT all-context: drop every combined mapping and the whole EPT paging-structure
    /// cache.
    pub fn invept_global(&mut self) {
        self.retain(|k, _| k.0 == 0);
        self.ept_psc.clear();
    }

    /// EPT paging-structure cache lookup: the deepest cached table mapping `gfn` under the
    /// current tag (a PT, else a PD), with its level.
    pub fn ept_psc_lookup(&self, gfn: Gfn) -> Option<(u8, SpId)> {
        (1..=2u8).find_map(|level| {
            let span = crate::ept::gfns_per_entry(level) * crate::ept::EPT_ENTRIES;
            self.ept_psc
                .get(&(self.tag, level, gfn / span))
                .map(|&sp| (level, sp))
        })
    }

    /// Cache the table `sp` of `level` that maps `gfn`, under the current tag.
    pub fn ept_psc_insert(&mut self, level: u8, gfn: Gfn, sp: SpId) {
        let span = crate::ept::gfns_per_entry(level) * crate::ept::EPT_ENTRIES;
        let k = (self.tag, level, gfn / span);
        if self.ept_psc.len() >= self.psc_capacity && !self.ept_psc.contains_key(&k) {
            self.ept_psc.pop_first();
        }
        self.ept_psc.insert(k, sp);
    }

    /// Every cached translation with its tag (for the oracle's checks at a lock release or a
    /// memslot deletion); a 2 MiB one by the first page of its group.
    pub fn entries(&self) -> impl Iterator<Item = (EptTag, Pcid, Vpn, &TlbEntry)> {
        self.entries
            .iter()
            .map(|((t, p, v), e)| (*t, *p, *v & !HUGE_KEY, e))
    }

    /// Every EPT paging-structure-cache entry: (tag, level, region, table).
    pub fn ept_psc_entries(&self) -> impl Iterator<Item = (EptTag, u8, u64, SpId)> + '_ {
        self.ept_psc.iter().map(|(&(t, l, r), &sp)| (t, l, r, sp))
    }

    fn canonical(&self) -> (Vec<(Key, TlbEntry)>, &PscMap, &EptPscMap, EptTag) {
        let mut v = self.entries.clone();
        v.sort_by_key(|(k, _)| *k);
        (v, &self.psc, &self.ept_psc, self.tag)
    }
}

impl PartialEq for Tlb {
    fn eq(&self, o: &Self) -> bool {
        self.canonical() == o.canonical()
    }
}
impl Eq for Tlb {}
/// splitmix64's finalizer: a strong mix of one word.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl Hash for Tlb {
    /// Order-independent without sorting or allocating (the explorer fingerprints every state):
    /// two sums of strongly mixed per-entry hashes, which equal TLBs share whatever the
    /// insertion order.
    fn hash<H: Hasher>(&self, h: &mut H) {
        let (mut a, mut b) = (0u64, 0u64);
        for (k, e) in &self.entries {
            let mut f = rustc_hash::FxHasher::default();
            (k, e).hash(&mut f);
            let x = f.finish();
            a = a.wrapping_add(mix(x));
            b = b.wrapping_add(mix(x ^ 0x9e37_79b9_7f4a_7c15));
        }
        h.write_usize(self.entries.len());
        h.write_u64(a);
        h.write_u64(b);
        self.psc.hash(h);
        self.ept_psc.hash(h);
        self.tag.hash(h);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    fn e(mm: u32) -> TlbEntry {
        TlbEntry {
            pfn: 1,
            writable: true,
            global: false,
            mm,
            version: 1,
            ept: None,
            huge: false,
        }
    }
    #[test]
    fn pcid_isolation_and_flushes() {
        let mut t = Tlb::new(8, 4);
        t.insert(1, 10, e(0), 0);
        t.insert(2, 10, e(1), 0);
        t.psc_insert(1, 0, 5);
        t.invlpg(1, 10);
        assert!(t.lookup(1, 10).is_none());
        assert!(t.lookup(2, 10).is_some());
        assert!(t.psc_lookup(1, 0).is_none());
        t.flush_pcid(2);
        assert!(t.is_empty());
    }
    #[test]
    fn a_2mib_entry_translates_its_group_and_any_invlpg_in_it_drops_it() {
        let mut t = Tlb::new(8, 4);
        let huge = TlbEntry { huge: true, ..e(0) };
        t.insert(1, 1024 + 7, huge, 0);
        t.insert(1, 1024, e(0), 0); // a 4 KiB entry for the group's first page coexists
        assert_eq!(t.len(), 2);
        assert!(t.lookup(1, 1024 + 511).is_some_and(|x| x.huge));
        assert!(
            !t.lookup(1, 1024).unwrap().huge,
            "the 4 KiB entry answers first"
        );
        assert!(t.lookup(1, 1536).is_none(), "next group");
        assert!(t.entries().all(|(_, _, v, _)| v == 1024));
        t.invlpg(1, 1024 + 300);
        assert!(t.lookup(1, 1024 + 5).is_none());
        assert!(
            t.lookup(1, 1024).is_some(),
            "INVLPG of another page keeps the 4 KiB entry"
        );
    }
    #[test]
    fn invlpgb_drops_its_pcid_and_range_and_keeps_globals() {
        let mut t = Tlb::new(16, 4);
        let g = TlbEntry {
            global: true,
            ..e(0)
        };
        t.insert(7, 10, e(0), 0);
        t.insert(7, 12, e(0), 0);
        t.insert(8, 10, e(1), 0);
        t.insert(7, 1024 + 3, TlbEntry { huge: true, ..e(0) }, 0);
        t.insert(7, 20, g, 0);
        t.psc_insert(7, 0, 5);
        // Pages [10, 11) of PCID 7, final translations only: the PSC entry stays.
        t.invlpgb(&Invlpgb {
            pcid: Some(7),
            range: Some((10, 11)),
            final_only: true,
            include_global: false,
        });
        assert!(t.lookup(7, 10).is_none());
        assert!(t.lookup(7, 12).is_some() && t.lookup(8, 10).is_some());
        assert!(t.psc_lookup(7, 0).is_some());
        // A range that reaches into a 2 MiB group drops the group's entry, and the PSC.
        t.invlpgb(&Invlpgb {
            pcid: Some(7),
            range: Some((1024 + 500, 1024 + 501)),
            final_only: false,
            include_global: false,
        });
        assert!(t.lookup(7, 1024 + 3).is_none());
        assert!(t.psc_lookup(7, 0).is_none());
        // Everything non-global of every PCID: the Global entry alone is left.
        t.invlpgb(&Invlpgb::ALL_NONGLOBALS);
        assert_eq!(t.len(), 1);
        assert!(t.lookup(9, 20).is_some_and(|x| x.global));
        // A kernel range including globals: gone from every PCID.
        t.invlpgb(&Invlpgb {
            pcid: None,
            range: Some((20, 21)),
            final_only: false,
            include_global: true,
        });
        assert!(t.is_empty());
    }
    #[test]
    fn a_global_entry_serves_every_pcid_and_survives_pcid_flushes() {
        let mut t = Tlb::new(8, 4);
        let g = TlbEntry {
            global: true,
            ..e(0)
        };
        t.insert(1, 10, g, 0);
        assert!(
            t.lookup(2, 10).is_some_and(|x| x.global),
            "found under another PCID"
        );
        assert!(t.lookup(2, 11).is_none());
        t.flush_pcid(1);
        t.flush_pcid(2);
        assert!(
            t.lookup(3, 10).is_some(),
            "a CR3 write keeps global entries"
        );
        t.invlpg(3, 10);
        assert!(t.lookup(1, 10).is_none(), "INVLPG in any PCID drops it");
        t.insert(1, 12, g, 0);
        t.flush_all();
        assert!(
            t.lookup(1, 12).is_none(),
            "CR4.PGE toggle / INVPCID all-incl-global"
        );
    }
    #[test]
    fn capacity_is_respected_and_order_independent_equality() {
        let mut a = Tlb::new(2, 4);
        a.insert(1, 1, e(0), 0);
        a.insert(1, 2, e(0), 0);
        a.insert(1, 3, e(0), 1);
        assert_eq!(a.len(), 2);
        assert!(a.lookup(1, 3).is_some());
        let mut b = Tlb::new(4, 4);
        let mut c = Tlb::new(4, 4);
        b.insert(1, 1, e(0), 0);
        b.insert(1, 2, e(0), 0);
        c.insert(1, 2, e(0), 0);
        c.insert(1, 1, e(0), 0);
        assert_eq!(b, c);
    }
}

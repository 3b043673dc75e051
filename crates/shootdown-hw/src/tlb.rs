//! A per-CPU TLB tagged by PCID, of finite capacity, plus a paging-structure cache (PSC).
//!
//! Semantics follow the SDM as summarised in kernel-model.md §1.1:
//! * `INVLPG va` drops the entry for `va` in the current PCID and any global entry for `va`,
//!   and (conservatively, as the SDM allows) every PSC entry of the current PCID;
//! * a CR3 write without NOFLUSH drops every non-global entry (and PSC entry) of the new PCID;
//! * with NOFLUSH nothing is dropped.
//!
//! Entries record the mm they were filled for and the PTE version they were filled from, for
//! the oracle. Eviction when full picks a victim with the run's RNG (deterministic).

use crate::oracle::MmIndex;
use crate::pagetable::{PtIndex, PtPageId, Vpn};
use rustc_hash::FxHashMap;
use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};

/// Hardware PCID value (12 bits; bit 11 marks the PTI user half).
pub type Pcid = u16;

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
}

type Key = (Pcid, Vpn);

/// Paging-structure cache: (PCID, table index) -> the page-table page it points at.
type PscMap = BTreeMap<(Pcid, PtIndex), PtPageId>;

#[derive(Clone, Debug)]
pub struct Tlb {
    entries: Vec<(Key, TlbEntry)>,
    index: FxHashMap<Key, usize>,
    psc: PscMap,
    capacity: usize,
    psc_capacity: usize,
}

impl Tlb {
    pub fn new(capacity: usize, psc_capacity: usize) -> Self {
        Tlb {
            entries: Vec::new(),
            index: FxHashMap::default(),
            psc: BTreeMap::new(),
            capacity: capacity.max(1),
            psc_capacity: psc_capacity.max(1),
        }
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn lookup(&self, pcid: Pcid, vpn: Vpn) -> Option<TlbEntry> {
        self.index.get(&(pcid, vpn)).map(|&i| self.entries[i].1)
    }

    /// Insert (or replace) an entry; `victim` is a random number used if one must be evicted.
    pub fn insert(&mut self, pcid: Pcid, vpn: Vpn, e: TlbEntry, victim: u64) {
        let k = (pcid, vpn);
        if let Some(&i) = self.index.get(&k) {
            self.entries[i].1 = e;
            return;
        }
        if self.entries.len() >= self.capacity {
            let i = (victim % self.entries.len() as u64) as usize;
            self.remove_at(i);
        }
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

    /// INVLPG (or INVPCID single-address) of `vpn` in `pcid`.
    pub fn invlpg(&mut self, pcid: Pcid, vpn: Vpn) {
        if let Some(&i) = self.index.get(&(pcid, vpn)) {
            self.remove_at(i);
        }
        // Global entries for the address go too.
        self.retain(|k, e| !(e.global && k.1 == vpn));
        self.psc.retain(|k, _| k.0 != pcid);
    }

    /// Drop every non-global entry and PSC entry tagged `pcid` (CR3 write without NOFLUSH,
    /// INVPCID single-context).
    pub fn flush_pcid(&mut self, pcid: Pcid) {
        self.retain(|k, e| e.global || k.0 != pcid);
        self.psc.retain(|k, _| k.0 != pcid);
    }

    /// Drop everything, global entries included (CR4.PGE toggle, INVPCID all-incl-global).
    pub fn flush_all(&mut self) {
        self.entries.clear();
        self.index.clear();
        self.psc.clear();
    }

    fn canonical(&self) -> (Vec<(Key, TlbEntry)>, &PscMap) {
        let mut v = self.entries.clone();
        v.sort_by_key(|(k, _)| *k);
        (v, &self.psc)
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

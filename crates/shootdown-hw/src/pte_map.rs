//! The leaf level of an address space's page tables: its PTEs by virtual page, kept as the
//! hardware keeps them, 512 to a page-table page.
//!
//! Why not one ordered map of pages: workload set-up maps files of millions of pages (seed
//! 000's sysbench maps 3 GiB of 4 KiB DAX pages, 786,432 PTEs, at every run), and building and
//! dropping a map of that many entries took 5–6 % of a whole run of seed 000's 48-thread row.
//! Grouped by page-table page, a fully mapped page is one array indexed by the page's offset;
//! the explorer's few-page address spaces stay a few small vectors.
//!
//! The map behaves exactly like the ordered map of pages it replaced: the same entries, in the
//! same order, with the same `Hash` (so fingerprints, and which states the explorer tells
//! apart, are unchanged).

use crate::pagetable::{pt_index, PtIndex, Pte, Vpn, PTRS_PER_PT};
use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};
use std::ops::Range;

/// PTEs by virtual page number, including non-present ones that keep their version history.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct PteMap {
    /// Page-table pages with at least one entry, by index (`vpn / 512`).
    tables: BTreeMap<PtIndex, Table>,
    /// Entries in all tables.
    len: usize,
}

/// One page-table page's entries: their offsets (`vpn % 512`, increasing) and the entries.
/// With all 512 present the offset is the index, and a lookup needs no search.
#[derive(Clone, Default, PartialEq, Eq)]
struct Table {
    offs: Vec<u16>,
    ptes: Vec<Pte>,
}

impl Table {
    fn find(&self, off: u16) -> Result<usize, usize> {
        if self.offs.len() == PTRS_PER_PT as usize {
            return Ok(off as usize);
        }
        self.offs.binary_search(&off)
    }

    /// This page's (page-table page `pt`'s) first virtual page, and the positions of its
    /// entries for the pages in `r`.
    fn slice(&self, pt: PtIndex, r: &Range<Vpn>) -> (Vpn, Range<usize>) {
        let (lo, hi) = within(pt, r);
        let a = self.offs.partition_point(|&o| (o as u64) < lo);
        let b = self.offs.partition_point(|&o| (o as u64) < hi);
        (pt * PTRS_PER_PT, a..b)
    }
}

/// The page-table pages that hold the pages in `r`.
fn tables_of(r: &Range<Vpn>) -> Range<PtIndex> {
    if r.start < r.end {
        pt_index(r.start)..pt_index(r.end - 1) + 1
    } else {
        0..0
    }
}

/// The offsets of `r` within page-table page `pt` (`r` overlaps it).
fn within(pt: PtIndex, r: &Range<Vpn>) -> (u64, u64) {
    let base = pt * PTRS_PER_PT;
    (
        r.start.saturating_sub(base),
        (r.end - base).min(PTRS_PER_PT),
    )
}

impl PteMap {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn get(&self, vpn: Vpn) -> Option<&Pte> {
        let t = self.tables.get(&pt_index(vpn))?;
        let i = t.find((vpn % PTRS_PER_PT) as u16).ok()?;
        Some(&t.ptes[i])
    }

    pub fn get_mut(&mut self, vpn: Vpn) -> Option<&mut Pte> {
        let t = self.tables.get_mut(&pt_index(vpn))?;
        let i = t.find((vpn % PTRS_PER_PT) as u16).ok()?;
        Some(&mut t.ptes[i])
    }

    /// The entry of `vpn`, first set to `pte` if there was none.
    pub fn get_or_insert(&mut self, vpn: Vpn, pte: Pte) -> &mut Pte {
        self.slot(vpn, pte).0
    }

    /// Set the entry of `vpn`; the one it replaced, if any.
    pub fn insert(&mut self, vpn: Vpn, pte: Pte) -> Option<Pte> {
        let (e, new) = self.slot(vpn, pte);
        (!new).then(|| std::mem::replace(e, pte))
    }

    /// The entry of `vpn`, and whether it was just made, as `pte`.
    fn slot(&mut self, vpn: Vpn, pte: Pte) -> (&mut Pte, bool) {
        let t = self.tables.entry(pt_index(vpn)).or_default();
        let off = (vpn % PTRS_PER_PT) as u16;
        match t.find(off) {
            Ok(i) => (&mut t.ptes[i], false),
            Err(i) => {
                t.offs.insert(i, off);
                t.ptes.insert(i, pte);
                self.len += 1;
                (&mut t.ptes[i], true)
            }
        }
    }

    /// Set every entry of `r` to `f(its entry, if any, vpn)`. A page-table page that `r`
    /// covers and that has no entries yet is built in one pass (workload set-up).
    pub fn map_range(&mut self, r: Range<Vpn>, f: impl Fn(Option<&Pte>, Vpn) -> Pte) {
        let mut vpn = r.start;
        while vpn < r.end {
            let pt = pt_index(vpn);
            let (lo, hi) = within(pt, &r);
            let base = pt * PTRS_PER_PT;
            if lo == 0 && hi == PTRS_PER_PT && !self.tables.contains_key(&pt) {
                self.tables.insert(
                    pt,
                    Table {
                        offs: (0..PTRS_PER_PT as u16).collect(),
                        ptes: (base..base + PTRS_PER_PT).map(|v| f(None, v)).collect(),
                    },
                );
                self.len += PTRS_PER_PT as usize;
            } else {
                for v in base + lo..base + hi {
                    let pte = f(self.get(v), v);
                    self.insert(v, pte);
                }
            }
            vpn = base + hi;
        }
    }

    /// Every entry, by page.
    pub fn iter(&self) -> impl Iterator<Item = (Vpn, &Pte)> + '_ {
        self.range(0..Vpn::MAX)
    }

    /// The entries of the pages in `r`, by page.
    pub fn range(&self, r: Range<Vpn>) -> impl Iterator<Item = (Vpn, &Pte)> + '_ {
        self.tables.range(tables_of(&r)).flat_map(move |(&pt, t)| {
            let (base, s) = t.slice(pt, &r);
            let offs = t.offs[s.clone()].iter();
            offs.zip(&t.ptes[s])
                .map(move |(&o, p)| (base + o as u64, p))
        })
    }

    /// The entries of the pages in `r`, by page, to change in place.
    pub fn range_mut(&mut self, r: Range<Vpn>) -> impl Iterator<Item = (Vpn, &mut Pte)> + '_ {
        self.tables
            .range_mut(tables_of(&r))
            .flat_map(move |(&pt, t)| {
                let (base, s) = t.slice(pt, &r);
                let offs = t.offs[s.clone()].iter();
                offs.zip(&mut t.ptes[s])
                    .map(move |(&o, p)| (base + o as u64, p))
            })
    }
}

/// As the ordered map of pages hashed: the number of entries, then each page and entry.
impl Hash for PteMap {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_usize(self.len);
        for (vpn, pte) in self.iter() {
            vpn.hash(state);
            pte.hash(state);
        }
    }
}

impl std::fmt::Debug for PteMap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::hash_map::DefaultHasher;

    #[derive(Clone, Debug)]
    enum Op {
        Insert(Vpn, u32),
        Touch(Vpn),
        Map(Vpn, u64),
        Bump(Vpn, u64),
    }

    /// Pages in a few page-table pages, so that tables fill up and ranges cross them.
    fn vpn() -> impl Strategy<Value = Vpn> {
        0u64..2048
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (vpn(), any::<u32>()).prop_map(|(v, p)| Op::Insert(v, p)),
            vpn().prop_map(Op::Touch),
            (vpn(), 0u64..1100).prop_map(|(v, n)| Op::Map(v, n)),
            (vpn(), 0u64..700).prop_map(|(v, n)| Op::Bump(v, n)),
        ]
    }

    fn pte(pfn: u32) -> Pte {
        Pte {
            pfn,
            present: true,
            ..Pte::NONE
        }
    }

    fn hash_of<T: Hash>(t: &T) -> u64 {
        let mut h = DefaultHasher::new();
        t.hash(&mut h);
        h.finish()
    }

    proptest! {
        /// The same operations on this map and on an ordered map of pages leave the same
        /// entries, in the same order, with the same hash, and answer every query alike.
        #[test]
        fn behaves_as_an_ordered_map(ops in proptest::collection::vec(op(), 0..60)) {
            let mut m = PteMap::default();
            let mut b: BTreeMap<Vpn, Pte> = BTreeMap::new();
            for op in ops {
                match op {
                    Op::Insert(v, p) => {
                        prop_assert_eq!(m.insert(v, pte(p)), b.insert(v, pte(p)));
                    }
                    Op::Touch(v) => {
                        m.get_or_insert(v, Pte::NONE).version += 1;
                        b.entry(v).or_insert(Pte::NONE).version += 1;
                    }
                    Op::Map(s, n) => {
                        let f = |old: Option<&Pte>, v: Vpn| Pte {
                            pfn: v as u32,
                            present: true,
                            ..old.copied().unwrap_or(Pte::NONE)
                        };
                        m.map_range(s..s + n, f);
                        for v in s..s + n {
                            let p = f(b.get(&v), v);
                            b.insert(v, p);
                        }
                    }
                    Op::Bump(s, n) => {
                        for (_, p) in m.range_mut(s..s + n) {
                            p.dirty = !p.dirty;
                        }
                        for (_, p) in b.range_mut(s..s + n) {
                            p.dirty = !p.dirty;
                        }
                        let got: Vec<(Vpn, Pte)> = m.range(s..s + n).map(|(v, p)| (v, *p)).collect();
                        let want: Vec<(Vpn, Pte)> = b.range(s..s + n).map(|(v, p)| (*v, *p)).collect();
                        prop_assert_eq!(got, want);
                    }
                }
                prop_assert_eq!(m.len(), b.len());
                for v in [0, 1, 511, 512, 777, 1023, 1024, 2047] {
                    prop_assert_eq!(m.get(v), b.get(&v));
                }
            }
            let got: Vec<(Vpn, Pte)> = m.iter().map(|(v, p)| (v, *p)).collect();
            let want: Vec<(Vpn, Pte)> = b.iter().map(|(v, p)| (*v, *p)).collect();
            prop_assert_eq!(got, want);
            prop_assert_eq!(hash_of(&m), hash_of(&b));
        }
    }

    /// Equal contents are equal maps, however they were built.
    #[test]
    fn equality_is_by_contents() {
        let mut a = PteMap::default();
        a.map_range(0..1024, |_, v| pte(v as u32));
        let mut b = PteMap::default();
        for v in (0..1024).rev() {
            b.insert(v, pte(v as u32));
        }
        assert_eq!(a, b);
        assert_eq!(hash_of(&a), hash_of(&b));
        b.get_mut(5).expect("mapped").dirty = true;
        assert_ne!(a, b);
    }
}

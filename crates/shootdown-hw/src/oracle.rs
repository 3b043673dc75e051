//! The coherence oracle's ground truth, shared by both drivers.
//!
//! *Epochs* order every PTE change and every flush start. When a flush of `mm` over a range
//! **returns**, every translation of that range whose PTE version had already been superseded
//! before the flush **began** becomes forbidden: a later use of it is a violation of
//! `INV-STALE` (docs/design/kernel-model.md N1; docs/bugs/CATALOG.md). Uses during a flush are legal — that is
//! what the flush is for. The oracle also checks `INV-ASID` (an entry tagged with a PCID that now
//! belongs to another mm) and, in the walker, `INV-PTFREE`.
//!
//! `INV-SYSRET` is the contract user space relies on, anchored on the *system call* rather than
//! on a flush: when `munmap`, `madvise(MADV_DONTNEED)`, `mprotect` (a downgrade) or `fdatasync`
//! on a DAX file returns to user space, no CPU may use a translation of the range it covered
//! whose PTE was changed before that return — whichever CPU or flush was supposed to remove
//! it. A path that skips its flush altogether (or relies on a flush another caller has still
//! pending) is invisible to `INV-STALE`, which needs a flush to return, and is caught here.
//!
//! The oracle is part of the model state (it is history the explorer must distinguish), which
//! is why it lives here and not in the checker crate: both drivers see every use through it.

use crate::ept::{EptMemory, Gfn};
use crate::pagetable::{Pte, Vpn};
use crate::tlb::EptUse;
use shootdown_engine::Violation;
use std::collections::BTreeMap;

/// Index of an mm (address space) in the model.
pub type MmIndex = u32;

/// An epoch per page, kept as disjoint maximal runs `start -> (end, epoch)` of pages with the
/// same epoch (a munmap or a 2 MiB-stride flush may cover gigabytes: no per-page map); pages
/// outside every run have epoch 0. Runs are maximal (no two touching runs share an epoch), so
/// equal maps are equal states.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
struct EpochRanges(BTreeMap<Vpn, (Vpn, u64)>);

impl EpochRanges {
    /// The epoch of `vpn`.
    fn at(&self, vpn: Vpn) -> u64 {
        match self.0.range(..=vpn).next_back() {
            Some((_, &(end, at))) if vpn < end => at,
            _ => 0,
        }
    }

    /// The least epoch of a page of `[start, end)` (0 if any page is outside every run).
    fn min_over(&self, start: Vpn, end: Vpn) -> u64 {
        let mut cur = start; // [start, cur) is accounted for
        let mut least = u64::MAX;
        let first = match self.0.range(..=start).next_back() {
            Some((&s, _)) => s,
            None => start,
        };
        for (&s, &(e, at)) in self.0.range(first..end) {
            if e <= cur {
                continue;
            }
            if s > cur {
                return 0;
            }
            least = least.min(at);
            cur = e;
            if cur >= end {
                return least;
            }
        }
        if cur < end {
            0
        } else {
            least
        }
    }

    /// Raise every page of `[start, end)` to at least `at`.
    fn raise(&mut self, start: Vpn, end: Vpn, at: u64) {
        if start >= end {
            return;
        }
        // The runs overlapping [start, end) or touching it (they may merge with it).
        let lo = match self.0.range(..start).next_back() {
            Some((&s, &(e, _))) if e >= start => s,
            _ => start,
        };
        let runs: Vec<(Vpn, (Vpn, u64))> = self.0.range(lo..=end).map(|(&s, &v)| (s, v)).collect();
        let mut pieces: Vec<(Vpn, Vpn, u64)> = Vec::with_capacity(runs.len() * 2 + 1);
        let mut cur = start; // [start, cur) is placed
        for &(s, (e, t)) in &runs {
            self.0.remove(&s);
            if s < start {
                pieces.push((s, start.min(e), t));
            }
            let (os, oe) = (s.max(start), e.min(end));
            if os < oe {
                if cur < os {
                    pieces.push((cur, os, at));
                }
                pieces.push((os, oe, t.max(at)));
                cur = oe;
            }
            if e > end {
                pieces.push((end.max(s), e, t));
            }
        }
        if cur < end {
            pieces.push((cur, end, at));
        }
        pieces.sort_unstable();
        let mut merged: Vec<(Vpn, Vpn, u64)> = Vec::with_capacity(pieces.len());
        for p in pieces {
            match merged.last_mut() {
                Some(last) if last.1 == p.0 && last.2 == p.2 => last.1 = p.1,
                _ => merged.push(p),
            }
        }
        for (s, e, t) in merged {
            self.0.insert(s, (e, t));
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
struct MmTruth {
    /// Begin epoch of the latest returned full flush of this mm.
    full_from: u64,
    /// Begin epoch of the latest returned flush covering each page.
    page_from: EpochRanges,
    /// `INV-SYSRET`: the epoch at which the latest system call covering each page returned.
    returned: EpochRanges,
}

/// The second stage of a VM: which invalidations of its EPT have returned.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
struct EptTruth {
    /// Begin epoch of the latest returned `kvm_flush_remote_tlbs` of this VM.
    full_from: u64,
    /// Begin epoch of the latest returned invalidation covering each guest frame (an MMU
    /// notifier's `invalidate_range_start`, after which the host may free the page).
    gfn_from: BTreeMap<Gfn, u64>,
}

/// Ground truth for the invariants checked at every translation use.
#[derive(Debug, Default, PartialEq, Eq, Hash)]
pub struct Oracle {
    epoch: u64,
    mms: Vec<MmTruth>,
    vms: Vec<EptTruth>,
}

shootdown_engine::clone_by_fields!(Oracle { epoch, mms, vms });

impl Oracle {
    pub fn new(nr_mms: usize) -> Self {
        Oracle {
            epoch: 1,
            mms: vec![MmTruth::default(); nr_mms],
            vms: Vec::new(),
        }
    }

    pub fn add_mm(&mut self) {
        self.mms.push(MmTruth::default());
    }

    /// VMs whose EPT is tracked.
    pub fn nr_vms(&self) -> usize {
        self.vms.len()
    }

    /// Track the EPT of one more VM (its index is the number of VMs tracked before).
    pub fn add_vm(&mut self) {
        self.vms.push(EptTruth::default());
    }

    /// The current epoch, advancing it: the moment of a change (an SPTE write, a page
    /// unlinked) or of an invalidation's start.
    pub fn tick(&mut self) -> u64 {
        let e = self.epoch;
        self.epoch += 1;
        e
    }

    /// The current epoch, without advancing it.
    pub fn now(&self) -> u64 {
        self.epoch
    }

    /// `kvm_flush_remote_tlbs` of VM `vm`, which began at `begin`, returned: every vCPU
    /// translation whose SPTE changed before that is gone.
    pub fn ept_flush_returned(&mut self, vm: usize, begin: u64) {
        let t = &mut self.vms[vm];
        t.full_from = t.full_from.max(begin);
    }

    /// An invalidation of guest frames `gfns` of VM `vm` that began at `begin` returned
    /// (`invalidate_range_start` of an MMU notifier: the host may now free the pages).
    pub fn ept_gfns_invalidated(&mut self, vm: usize, gfns: std::ops::Range<Gfn>, begin: u64) {
        let t = &mut self.vms[vm];
        for g in gfns {
            let slot = t.gfn_from.entry(g).or_insert(0);
            *slot = (*slot).max(begin);
        }
    }

    /// Was guest frame `gfn` of VM `vm` invalidated (an MMU-notifier invalidation that began
    /// after `epoch` has returned: the host may have freed the page)?
    pub fn gfn_invalidated_after(&self, vm: usize, gfn: Gfn, epoch: u64) -> bool {
        let t = &self.vms[vm];
        t.full_from.max(t.gfn_from.get(&gfn).copied().unwrap_or(0)) > epoch
    }

    /// Check one use of a combined mapping of VM `vm` filled from the EPT leaf `u`: a
    /// translation whose SPTE was zapped or downgraded (or whose path was cut) before an
    /// invalidation that has returned began is `INV-STALE`.
    pub fn check_ept_use(
        &self,
        vm: usize,
        vpn: Vpn,
        u: &EptUse,
        ept: &EptMemory,
    ) -> Result<(), Violation> {
        let Some(over) = ept.stale_since(u.sp, u.idx, u.version, u.filled) else {
            return Ok(());
        };
        let t = &self.vms[vm];
        let from = t
            .full_from
            .max(t.gfn_from.get(&u.gfn).copied().unwrap_or(0));
        if over < from {
            return Err(Violation {
                invariant: "INV-STALE",
                detail: format!(
                    "vm{vm} page {vpn:#x} -> gfn {:#x}: used a translation whose SPTE (EPT page #{} entry {}) changed before an invalidation that has returned",
                    u.gfn, u.sp, u.idx
                ),
            });
        }
        Ok(())
    }

    /// Record a change of `pte` (call after modifying its fields): bumps its version.
    pub fn pte_changed(&mut self, pte: &mut Pte) {
        pte.ended.rotate_right(1);
        pte.ended[0] = self.epoch;
        pte.version += 1;
        self.epoch += 1;
    }

    /// A flush is starting; returns its begin epoch (keep it in the flush's state).
    pub fn flush_begin(&mut self) -> u64 {
        self.tick()
    }

    /// A flush of `mm` that began at `begin` returned. `pages = None` means the whole mm.
    pub fn flush_returned(&mut self, mm: MmIndex, pages: Option<(Vpn, Vpn)>, begin: u64) {
        let t = &mut self.mms[mm as usize];
        match pages {
            None => t.full_from = t.full_from.max(begin),
            Some((s, e)) => t.page_from.raise(s, e, begin),
        }
    }

    /// `INV-FREEPAGE`'s quick test: has a flush of `mm` covering every page of `[start, end)`,
    /// begun at or after epoch `since`, returned?
    pub fn flushed_since(&self, mm: MmIndex, start: Vpn, end: Vpn, since: u64) -> bool {
        let t = &self.mms[mm as usize];
        t.full_from >= since || (start < end && t.page_from.min_over(start, end) >= since)
    }

    /// Is a TLB entry filled from version `entry_version` of `pte` (page `vpn` of `mm`) dead:
    /// its PTE changed, and a flush covering it that began afterwards has returned? (A use of
    /// it would be `INV-STALE`; an entry of the current version is live.)
    pub fn entry_flushed(&self, mm: MmIndex, vpn: Vpn, entry_version: u32, pte: &Pte) -> bool {
        let Some(over) = pte.superseded_at(entry_version) else {
            return false;
        };
        let t = &self.mms[mm as usize];
        over < t.full_from.max(t.page_from.at(vpn))
    }

    /// A system call that removed or downgraded translations of `mm` in `[start, end)`
    /// (`munmap`, `madvise(MADV_DONTNEED)`, `mprotect`, a DAX `fdatasync`'s cleaned pages)
    /// returns to user space now: from here on, a use of a translation of that range whose PTE
    /// was changed before now is `INV-SYSRET` (unless it already is `INV-STALE`).
    pub fn syscall_returned(&mut self, mm: MmIndex, start: Vpn, end: Vpn) {
        let now = self.epoch;
        self.mms[mm as usize].returned.raise(start, end, now);
    }

    /// Check one use, by a task of `cur_mm`, of a TLB entry filled from version `entry_version`
    /// of the PTE for `vpn` in `entry_mm`; `pte` is the PTE as it is now.
    pub fn check_use(
        &self,
        cur_mm: MmIndex,
        entry_mm: MmIndex,
        vpn: Vpn,
        entry_version: u32,
        pte: &Pte,
    ) -> Result<(), Violation> {
        if entry_mm != cur_mm {
            return Err(Violation {
                invariant: "INV-ASID",
                detail: format!("mm{cur_mm} used a TLB entry for page {vpn:#x} filled for mm{entry_mm} under the same PCID"),
            });
        }
        let Some(over) = pte.superseded_at(entry_version) else {
            return Ok(());
        };
        let t = &self.mms[cur_mm as usize];
        let from = t.full_from.max(t.page_from.at(vpn));
        if over < from {
            return Err(Violation {
                invariant: "INV-STALE",
                detail: format!(
                    "mm{cur_mm} page {vpn:#x}: used a translation (PTE version {entry_version}, now {}) that was changed before a flush that has returned",
                    pte.version
                ),
            });
        }
        if over < t.returned.at(vpn) {
            return Err(Violation {
                invariant: "INV-SYSRET",
                detail: format!(
                    "mm{cur_mm} page {vpn:#x}: used a translation (PTE version {entry_version}, now {}) that was removed or downgraded before a system call covering it returned to user space",
                    pte.version
                ),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn min_over_sees_gaps_and_the_least_run() {
        let mut r = EpochRanges::default();
        r.raise(10, 20, 5);
        r.raise(20, 30, 3);
        assert_eq!(r.min_over(12, 25), 3);
        assert_eq!(r.min_over(10, 20), 5);
        assert_eq!(r.min_over(5, 15), 0, "pages 5..10 were never flushed");
        assert_eq!(r.min_over(25, 35), 0, "pages 30..35 were never flushed");
        r.raise(30, 40, 7);
        assert_eq!(r.min_over(25, 35), 3);
    }
    #[test]
    fn stale_only_after_a_covering_flush_returns() {
        let mut o = Oracle::new(1);
        let mut pte = Pte::NONE;
        pte.present = true;
        o.pte_changed(&mut pte); // version 1: mapped
        let cached = pte.version;
        pte.present = false;
        o.pte_changed(&mut pte); // version 2: unmapped
        assert!(
            o.check_use(0, 0, 7, cached, &pte).is_ok(),
            "no flush yet: legal"
        );
        let b = o.flush_begin();
        assert!(
            o.check_use(0, 0, 7, cached, &pte).is_ok(),
            "flush in flight: legal"
        );
        o.flush_returned(0, Some((8, 9)), b);
        assert!(
            o.check_use(0, 0, 7, cached, &pte).is_ok(),
            "other page flushed"
        );
        o.flush_returned(0, Some((7, 8)), b);
        assert_eq!(
            o.check_use(0, 0, 7, cached, &pte).unwrap_err().invariant,
            "INV-STALE"
        );
    }
    #[test]
    fn change_after_flush_began_is_not_covered() {
        let mut o = Oracle::new(1);
        let mut pte = Pte::NONE;
        o.pte_changed(&mut pte);
        let cached = pte.version;
        let b = o.flush_begin();
        o.pte_changed(&mut pte);
        o.flush_returned(0, None, b);
        assert!(o.check_use(0, 0, 1, cached, &pte).is_ok());
    }
    #[test]
    fn foreign_entry_is_asid_violation() {
        let o = Oracle::new(2);
        assert_eq!(
            o.check_use(1, 0, 0, 0, &Pte::NONE).unwrap_err().invariant,
            "INV-ASID"
        );
    }

    #[test]
    fn sysret_only_for_changes_before_the_return_and_only_in_its_range() {
        let mut o = Oracle::new(1);
        let mut pte = Pte::NONE;
        o.pte_changed(&mut pte); // version 1: mapped
        let cached = pte.version;
        o.pte_changed(&mut pte); // zapped, no flush at all
        assert!(
            o.check_use(0, 0, 5, cached, &pte).is_ok(),
            "not returned yet"
        );
        o.syscall_returned(0, 0, 4);
        assert!(
            o.check_use(0, 0, 5, cached, &pte).is_ok(),
            "outside the range"
        );
        o.syscall_returned(0, 4, 6);
        assert_eq!(
            o.check_use(0, 0, 5, cached, &pte).unwrap_err().invariant,
            "INV-SYSRET"
        );
        // A change after the return is not the call's to have removed.
        let cached = pte.version;
        o.pte_changed(&mut pte);
        assert!(o.check_use(0, 0, 5, cached, &pte).is_ok());
    }

    proptest::proptest! {
        /// The run map answers as a per-page map of the maximum would, and stays canonical.
        #[test]
        fn epoch_ranges_match_a_per_page_max(
            calls in proptest::collection::vec((0u64..40, 1u64..12, 1u64..8), 1..20)
        ) {
            let mut t = EpochRanges::default();
            let mut naive = std::collections::BTreeMap::new();
            for (start, len, at) in calls {
                t.raise(start, start + len, at);
                for v in start..start + len {
                    let slot = naive.entry(v).or_insert(0);
                    *slot = (*slot).max(at);
                }
                for v in 0..60 {
                    proptest::prop_assert_eq!(t.at(v), naive.get(&v).copied().unwrap_or(0));
                }
                // Disjoint, sorted, maximal.
                let mut last: Option<(Vpn, u64)> = None;
                for (&s, &(e, at)) in &t.0 {
                    proptest::prop_assert!(e > s);
                    if let Some((le, lat)) = last {
                        proptest::prop_assert!(s >= le);
                        proptest::prop_assert!(!(s == le && at == lat), "touching runs with one epoch");
                    }
                    last = Some((e, at));
                }
            }
        }
    }
}

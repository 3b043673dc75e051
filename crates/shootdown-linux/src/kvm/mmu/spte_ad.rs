//! The dirty state of a leaf SPTE (arch/x86/kvm/mmu/spte.h, spte.c, tdp_mmu.c; v5.15): what
//! `is_dirty_spte()` reads, the D bit `make_spte()` sets, the hand-off to the page when a
//! dirty leaf stops being one (`__handle_changed_spte()` → `kvm_set_pfn_dirty()`, the legacy
//! MMU's `mmu_spte_update()` / `mmu_spte_clear_track_bits()`), and the oracle `INV-AD`.
//!
//! Bits of a present leaf can change without `mmu_lock`: W, set again by `fast_page_fault()`
//! (`cmpxchg64`) in an MMU-writable SPTE dirty logging write-protected, and D, set by the CPU
//! on a write through a leaf without it (EPT A/D bits, `ept_ad`). A writer under the lock that
//! works from a value it read earlier must therefore write with `xchg` and handle the value
//! that returns (`spte_has_volatile_bits()` decides when; the legacy MMU has done so since
//! v3.x, the TDP MMU since ba3a6120a4e7): a plain store loses such a bit, and KVM, seeing a
//! read-only or clean SPTE, skips `kvm_set_pfn_dirty()` — the page's only record of the write
//! when its host PTE was writable and clean (shmem), and with PML the missed D bit is a
//! missed dirty-log entry.
//!
//! Simplified: no accessed bits (aging without A/D bits is access tracking,
//! `access_track.rs`; `kvm_set_pfn_accessed()` is not modelled), so `INV-AD` watches the dirty
//! state only (`is_dirty_spte()`: D, or W); the page's dirty flag itself is not kept (the
//! hand-off is counted, `kvm.set_pfn_dirty`, from the value the write replaced).

use crate::counters::Counter;
use crate::machine::Machine;
use shootdown_engine::Violation;
use shootdown_hw::ept::{gfns_per_entry, SpId, SpteKind};

impl Machine {
    /// `is_dirty_spte()`: the D bit with EPT A/D bits, else W.
    pub(crate) fn is_dirty_spte(&self, kind: SpteKind) -> bool {
        match kind {
            SpteKind::Leaf {
                dirty, writable, ..
            } => {
                if self.opts.ept_ad {
                    dirty
                } else {
                    writable
                }
            }
            _ => false,
        }
    }

    /// `make_spte()`'s D bit: set with W (`spte |= spte_shadow_dirty_mask(spte)` for a
    /// writable SPTE), when EPT A/D bits are on. (So without PML, whose D clearing is the only
    /// way to a writable clean SPTE, the CPU's assist never fires.)
    pub(crate) fn make_spte_dirty(&self, writable: bool) -> bool {
        writable && self.opts.ept_ad
    }

    /// `__handle_changed_spte()`'s `if (was_leaf && is_dirty_spte(old_spte) && (!is_present ||
    /// !is_dirty_spte(new_spte) || pfn_changed)) kvm_set_pfn_dirty(spte_to_pfn(old_spte))` (the
    /// legacy MMU's `mmu_spte_update()` / `mmu_spte_clear_track_bits()` do the same).
    pub(crate) fn handle_changed_spte_dirty(&mut self, old: SpteKind, new: SpteKind) {
        let SpteKind::Leaf { pfn, .. } = old else {
            return;
        };
        if !self.is_dirty_spte(old) {
            return;
        }
        let keeps =
            matches!(new, SpteKind::Leaf { pfn: p, .. } if p == pfn) && self.is_dirty_spte(new);
        if !keeps {
            self.perf.counters.inc(Counter::KvmSetPfnDirty);
        }
    }

    /// A write of SPTE `idx` of `sp` under `mmu_lock` that hands `handle_changed_spte()`
    /// `believed` as the old value. Oracle `INV-AD`: a bit set in the leaf without `mmu_lock`
    /// since `believed` was read — W by `fast_page_fault()`, D by the CPU — is lost with the
    /// write (module doc).
    pub(crate) fn set_spte_believing(
        &mut self,
        vm: usize,
        sp: SpId,
        idx: u16,
        kind: SpteKind,
        believed: SpteKind,
    ) -> SpteKind {
        let now = self.ept.spte(sp, idx).kind;
        if let (SpteKind::Leaf { pfn, .. }, SpteKind::Leaf { pfn: p0, .. }) = (now, believed) {
            // Only a lost *dirty* state matters (`is_dirty_spte`): with A/D bits a W that a
            // fast fix set again is no loss, the SPTE's D (kept by the write-protect) says
            // dirty either way.
            let lost = (pfn == p0 && self.is_dirty_spte(now) && !self.is_dirty_spte(believed))
                .then_some(if self.opts.ept_ad {
                    "the D bit the CPU set"
                } else {
                    "the W bit fast_page_fault set"
                });
            if let Some(lost) = lost {
                let page = self.ept.page(sp);
                let gfn = page.gfn + idx as u64 * gfns_per_entry(page.level);
                self.violate(Violation {
                    invariant: "INV-AD",
                    detail: format!(
                        "a plain write of EPT page #{sp} entry {idx} (gfn {gfn:#x}) under mmu_lock used a value read before {lost} without mmu_lock: the bit is lost, and handle_changed_spte, seeing a clean SPTE, skips kvm_set_pfn_dirty({pfn:#x})"
                    ),
                });
            }
        }
        self.set_spte(vm, sp, idx, kind)
    }
}

//! Access tracking without EPT A/D bits (arch/x86/kvm/mmu/spte.c, mmu.c, tdp_mmu.c and
//! virt/kvm/kvm_main.c, v5.15). With `ept_ad` off KVM emulates the accessed bit: aging a page
//! makes its leaf SPTEs inaccessible (`mark_spte_for_access_track`: R/W/X cleared, R and X
//! saved in software bits, W not — its dirty state goes to the page first), and the next
//! access takes an EPT violation that `fast_page_fault` fixes without `mmu_lock`
//! (`restore_acc_track_spte`, and W again for a write to an MMU-writable SPTE).
//!
//! The host ages pages through the `clear_young` MMU notifier (reclaim's LRU aging, idle-page
//! tracking): `kvm_mmu_notifier_clear_young` → `kvm_handle_hva_range_no_flush` →
//! `kvm_age_gfn` under `mmu_lock` (the TDP MMU's write lock: `age_gfn_range`; the legacy MMU's
//! rmaps: `kvm_age_rmapp` → `mmu_spte_age`) — and, unlike `clear_flush_young`, it does **not**
//! flush: a vCPU may keep using (and writing through) its TLB entry of an aged page. That is
//! why write-protecting such an SPTE (already read-only) must still flush (b64d740ea7dd,
//! `dirty_log.rs`).
//!
//! Simplified: one step ages the whole range and drops the lock (scenarios age one page), each
//! SPTE with one atomic read-modify-write — safer than the kernel, whose legacy
//! `mmu_spte_age()` decides the page's dirty hand-off from a lockless read and whose TDP
//! `age_gfn_range()` stores its iterator's value (A4's pattern), so a W a fast fix sets in
//! between is not lost here; with A/D bits on, aging clears the accessed bit, which the model
//! does not keep (the step then only takes and drops the lock); `clear_flush_young` and
//! `test_young` are not modelled.

use crate::counters::Counter;
use crate::frame::{Flow, Frame};
use crate::kvm::mmu::rwlock::RwlockWait;
use crate::machine::Machine;
use shootdown_engine::Env;
use shootdown_hw::ept::{gfns_per_entry, EptWalk, Gfn, SpId, SpteKind};

/// `kvm_mmu_notifier_clear_young()` of the host pages behind guest frames
/// `[gfn, gfn + npages)`, by a host thread.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ClearYoung {
    pub pc: ClearYoungPc,
    pub gfn: Gfn,
    pub npages: u64,
    /// The TDP MMU's write lock, where its acquisition is.
    pub lock: RwlockWait,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ClearYoungPc {
    /// `srcu_read_lock`; `KVM_MMU_LOCK(kvm)`.
    Lock,
    /// `kvm_age_gfn()` over the range; `KVM_MMU_UNLOCK`; `srcu_read_unlock`; return, without a
    /// flush.
    Age,
}

impl ClearYoung {
    pub fn call(gfn: Gfn, npages: u64) -> Frame {
        Frame::ClearYoung(Box::new(ClearYoung {
            pc: ClearYoungPc::Lock,
            gfn,
            npages,
            lock: RwlockWait::Fast,
        }))
    }
}

/// `mark_spte_for_access_track()`: R/W/X cleared (the CPU sees no translation), MMU-writable
/// kept.
pub fn mark_spte_for_access_track(kind: SpteKind) -> SpteKind {
    match kind {
        SpteKind::Leaf { .. } => {
            let mut k = kind.with_writable(false);
            if let SpteKind::Leaf { access_tracked, .. } = &mut k {
                *access_tracked = true;
            }
            k
        }
        other => other,
    }
}

/// `restore_acc_track_spte()`: R and X back from the software bits; W stays clear.
pub fn restore_acc_track_spte(kind: SpteKind) -> SpteKind {
    let mut k = kind;
    if let SpteKind::Leaf { access_tracked, .. } = &mut k {
        *access_tracked = false;
    }
    k
}

impl Machine {
    /// One step of `kvm_mmu_notifier_clear_young()` by agent `me`.
    pub(crate) fn clear_young_step<E: Env>(
        &mut self,
        me: usize,
        s: &mut ClearYoung,
        env: &mut E,
    ) -> Flow {
        let vm = self.vm_of(me);
        match s.pc {
            ClearYoungPc::Lock => {
                let first = if self.opts.tdp_mmu {
                    s.lock == RwlockWait::Fast
                } else {
                    !self.mmu_lock_queued(me)
                };
                if first {
                    self.srcu_read_lock(me, env);
                }
                let spin = self.kvm_mmu_lock(me, &mut s.lock, false, env);
                if let Some(spin) = spin {
                    return spin;
                }
                s.pc = ClearYoungPc::Age;
                let (g, n) = (s.gfn, s.npages);
                self.say(|| {
                    format!(
                        "clear_young(gfns {g:#x}..{:#x}): srcu_read_lock; KVM_MMU_LOCK(kvm)",
                        g + n
                    )
                });
                Flow::Next
            }
            ClearYoungPc::Age => {
                let mut aged = Vec::new();
                if !self.opts.ept_ad {
                    for (sp, idx) in self.leaves_mapping(vm, s.gfn, s.npages) {
                        let kind = self.ept.spte(sp, idx).kind;
                        if let SpteKind::Leaf {
                            access_tracked: false,
                            ..
                        } = kind
                        {
                            // mmu_spte_age() / age_gfn_range(): the dirty state (W) to the
                            // page first (`kvm_set_pfn_dirty`, via handle_changed_spte).
                            self.set_spte_attrs(sp, idx, mark_spte_for_access_track(kind));
                            self.perf.counters.inc(Counter::KvmSptesAged);
                            aged.push((sp, idx));
                        }
                    }
                }
                self.kvm_mmu_unlock(me, false, env);
                self.srcu_read_unlock(me, env);
                let ad = self.opts.ept_ad;
                self.say(|| {
                    let what = if ad {
                        "kvm_age_gfn: the accessed bits (not modelled)".to_string()
                    } else if aged.is_empty() {
                        "kvm_age_gfn: no young SPTE".to_string()
                    } else {
                        let list: Vec<String> = aged
                            .iter()
                            .map(|(sp, idx)| format!("EPT page #{sp} entry {idx}"))
                            .collect();
                        format!(
                            "kvm_age_gfn: mark_spte_for_access_track({}): R/W/X cleared",
                            list.join(", ")
                        )
                    };
                    format!(
                        "{what}; KVM_MMU_UNLOCK; srcu_read_unlock; return (clear_young: no flush)"
                    )
                });
                Flow::Return
            }
        }
    }

    /// Would the next step only wait for `mmu_lock`?
    pub(crate) fn clear_young_waits(&self, me: usize, s: &ClearYoung) -> bool {
        s.pc == ClearYoungPc::Lock && self.kvm_mmu_lock_waits(me, s.lock, false)
    }

    /// The leaf SPTEs that map guest frames `[gfn, gfn + npages)` of VM `vm`: each TDP root's
    /// (`for_each_tdp_mmu_root` of both address spaces), or the rmaps' (4 KiB and 2 MiB).
    pub(crate) fn leaves_mapping(&self, vm: usize, gfn: Gfn, npages: u64) -> Vec<(SpId, u16)> {
        let mut out = Vec::new();
        for g in gfn..gfn + npages {
            if self.opts.tdp_mmu {
                for as_id in 0..2u8 {
                    for root in self.tdp_roots_of(vm, as_id) {
                        if let EptWalk::Leaf { sp, idx, .. } = self.ept.walk_from(root, g) {
                            if !out.contains(&(sp, idx)) {
                                out.push((sp, idx));
                            }
                        }
                    }
                }
            } else {
                for level in [1u8, 2] {
                    let base = g / gfns_per_entry(level) * gfns_per_entry(level);
                    if let Some(heads) = self.kvm(vm).mmu.rmap.get(&(level, base)) {
                        for &h in heads {
                            if !out.contains(&h) {
                                out.push(h);
                            }
                        }
                    }
                }
            }
        }
        out
    }
}

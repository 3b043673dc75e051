//! The invariants of KVM's translation coherence the oracle checks (docs/design/kernel-model.md §4.4,
//! §4.7; docs/bugs/CATALOG.md), in both drivers, besides `INV-STALE` and `INV-PTFREE` for SPTEs,
//! which the hardware access path checks like the guest's (`user.rs`, `shootdown_hw::oracle`):
//!
//! * `INV-FLUSH-OWED` — when `mmu_lock` is released (`spin_unlock`, a lock break), no vCPU can
//!   still use a translation through an SPTE zapped under it, unless the vCPU must flush before
//!   it next enters the guest;
//! * `INV-MMIO` — no access is emulated as MMIO from an MMIO SPTE or MMIO-cache entry derived
//!   from memslots older than those the vCPU's SRCU read section sees, where those map RAM;
//! * `INV-SLOT` — when a memslot deletion returns, no SPTE of the slot's address space maps a
//!   frame of the slot, no vCPU there can still use a translation of one, and no shadow page
//!   of the slot is left behind;
//! * `INV-STALE` (here, for MMU notifiers) — when `invalidate_range_start` returns, no SPTE
//!   maps a frame of the range (the host may free its page now; a fault that raced the zap
//!   must have retried, a lockless fix must have failed its `cmpxchg`);
//! * `INV-ADDR-SPACE` (`smm.rs`) — a vCPU uses only translations of its own address space: a
//!   guest access never goes through an EPT page of the other address space's role, nor
//!   reaches a host frame that the other address space's memslots map at the gfn where its
//!   own map another frame or none;
//! * `INV-MEMTYPE` (docs/design/kernel-model.md §5.4 T1, T2) — when a vCPU whose MTRR write or CR0.CD
//!   toggle made a zap request enters the guest again, no TDP MMU leaf it created in the range
//!   the change affects carries a memory type other than the one its state now gives every
//!   frame the leaf maps; and when a non-coherent device's assignment (and its zap) returns, no
//!   leaf at all does. (A change that makes no request is not judged: with
//!   `KVM_X86_QUIRK_CD_NW_CLEARED`, v6.5 by design leaves the WB+IPAT leaves made under
//!   CR0.CD=1 in place when the guest clears it.)

use crate::frame::Frame;
use crate::kvm::memslot::Memslot;
use crate::kvm::vmx::memtype_text;
use crate::kvm::Request;
use crate::machine::Machine;
use shootdown_engine::Violation;
use shootdown_hw::ept::{gfns_per_entry, Gfn, SpteKind};
use shootdown_hw::tlb::{ept_tag, EptUse};
use shootdown_hw::CpuId;

impl Machine {
    /// Oracle, at an `mmu_lock` release: `INV-FLUSH-OWED` if some vCPU of the VM could still
    /// use a translation through an SPTE zapped (or a table unlinked) under the lock — a stale
    /// entry in its TLB or EPT paging-structure cache under the root it runs on — and nothing
    /// makes it flush before it next enters the guest (a pending `KVM_REQ_TLB_FLUSH` or
    /// `KVM_REQ_MMU_RELOAD`, whose root reload flushes).
    pub(crate) fn check_flush_owed(&mut self, vm: usize) {
        let k = self.kvm(vm);
        if k.mmu.last_zap <= k.mmu.last_flush_begin {
            return;
        }
        let vcpus = k.vcpus.clone();
        let owed = Request::TlbFlush.bit() | Request::MmuReload.bit();
        for v in vcpus {
            let vc = &self.host_ref().vcpus[v];
            let Some(root) = vc.root else { continue };
            if vc.requests & owed != 0 {
                continue;
            }
            // KVM_REQ_MMU_RELOAD taken (kvm_check_request cleared it) and kvm_mmu_unload
            // waiting for the lock: the vCPU is outside the guest and flushes in kvm_mmu_load
            // before its next entry.
            if vc.stack.iter().any(|f| matches!(f, Frame::MmuUnload(_))) {
                continue;
            }
            let tag = ept_tag(root);
            let tlb = &self.cpus[v].tlb;
            let stale_entry = tlb.entries().find_map(|(t, _, vpn, e)| {
                let u = e.ept.as_ref()?;
                (t == tag
                    && self
                        .ept
                        .stale_since(u.sp, u.idx, u.version, u.filled)
                        .is_some())
                .then_some((vpn, u.gfn))
            });
            let stale_table = tlb.ept_psc_entries().find_map(|(t, _, _, sp)| {
                let p = self.ept.page(sp);
                (t == tag && (!p.alive || p.parent.is_none())).then_some(sp)
            });
            let detail = match (stale_entry, stale_table) {
                (Some((vpn, gfn)), _) => format!(
                    "mmu_lock released while vcpu{v} still caches page {vpn:#x} -> gfn {gfn:#x} through a zapped SPTE, with no flush done or pending"
                ),
                (None, Some(sp)) => format!(
                    "mmu_lock released while vcpu{v}'s EPT paging-structure cache still points to unlinked EPT page #{sp}, with no flush done or pending"
                ),
                (None, None) => continue,
            };
            self.violate(Violation {
                invariant: "INV-FLUSH-OWED",
                detail,
            });
            return;
        }
    }

    /// Oracle `INV-MMIO`: KVM emulates an access to `gfn` as MMIO from information (an MMIO SPTE
    /// or the MMIO cache) derived from memslot-set version `derived`; a violation if the set of
    /// the vCPU's address space published when its current SRCU read section began is newer
    /// and has RAM at `gfn`.
    pub(crate) fn check_mmio_emulation(&mut self, v: CpuId, gfn: Gfn, derived: u64) {
        let vm = self.vm_of(v);
        let as_id = self.vcpu_as_id(v);
        let seen = self.host_ref().vcpus[v].srcu_sees[as_id];
        let a = &self.kvm(vm).address_spaces[as_id];
        if seen <= derived {
            return;
        }
        let ram = a
            .set_of_version(seen)
            .is_some_and(|set| set.lookup(gfn).is_some());
        if ram {
            self.violate(Violation {
                invariant: "INV-MMIO",
                detail: format!(
                    "vcpu{v} emulated gfn {gfn:#x} as MMIO from memslots version {derived}, but version {seen}, published before its SRCU read section began, maps it as RAM"
                ),
            });
        }
    }

    /// Oracle, when a memslot deletion returns (docs/design/kernel-model.md §4.7 K5): `INV-SLOT` if an
    /// SPTE of the slot's address space `as_id` still maps a frame of `slot`, a vCPU on a root
    /// of that address space that will not reload or flush before entering still caches a
    /// translation of one, or a shadow page of the slot is neither live nor freed (zapped and
    /// leaked).
    pub(crate) fn check_memslot_deleted(&mut self, vm: usize, as_id: u8, slot: &Memslot) {
        let (start, end) = (slot.base_gfn, slot.end());
        let covers = |g: Gfn, n: u64| g < end && g + n > start;
        let k = self.kvm(vm);
        let mut problem = None;
        for (&sp, p) in &k.mmu.pages {
            if p.freed || p.as_id != as_id {
                continue;
            }
            let page = self.ept.page(sp);
            let span = gfns_per_entry(page.level);
            if let Some((&idx, _)) = page.entries.iter().find(|(&i, e)| {
                matches!(e.kind, SpteKind::Leaf { .. }) && covers(page.gfn + i as u64 * span, span)
            }) {
                problem = Some(format!(
                    "EPT page #{sp} entry {idx} still maps gfn {:#x} of deleted slot {}",
                    page.gfn + idx as u64 * span,
                    slot.id
                ));
                break;
            }
            if p.invalid && !p.active && p.root_count == 0 && covers(p.gfn, 1) {
                problem = Some(format!(
                    "shadow page #{sp} (gfn {:#x}) of deleted slot {} was zapped but never freed",
                    p.gfn, slot.id
                ));
                break;
            }
        }
        if problem.is_none() {
            let owed = Request::TlbFlush.bit() | Request::MmuReload.bit();
            for v in k.vcpus.clone() {
                let vc = &self.host_ref().vcpus[v];
                let Some(root) = vc.root else { continue };
                if vc.requests & owed != 0 || k.mmu.sp_as_id(root) != as_id {
                    continue;
                }
                let tag = ept_tag(root);
                if let Some((vpn, gfn)) = self.cpus[v].tlb.entries().find_map(|(t, _, vpn, e)| {
                    let u = e.ept.as_ref()?;
                    (t == tag && covers(u.gfn, 1)).then_some((vpn, u.gfn))
                }) {
                    problem = Some(format!(
                        "vcpu{v} still caches page {vpn:#x} -> gfn {gfn:#x} of deleted slot {}",
                        slot.id
                    ));
                    break;
                }
            }
        }
        if let Some(detail) = problem {
            self.violate(Violation {
                invariant: "INV-SLOT",
                detail: format!("memslot deletion returned, but {detail}"),
            });
        }
    }

    /// Oracle `INV-ADDR-SPACE`, at each guest access of vCPU `v` through the EPT leaf `u`
    /// (reaching host frame `pfn`, when the access walked): the leaf's page must be of the
    /// vCPU's address space, and the frame one its own memslots map at the gfn (any of the two
    /// sets, deleted slots included: a stale frame is `INV-SLOT`'s and `INV-STALE`'s) unless
    /// neither address space's do. Only a VM with SMM's address space is checked.
    pub(crate) fn check_address_space(&mut self, v: CpuId, u: &EptUse, pfn: Option<u64>) {
        let vm = self.vm_of(v);
        let k = self.kvm(vm);
        if !k.has_smm() {
            return;
        }
        let mine = self.vcpu_as_id(v);
        let name = |a: usize| if a == 1 { "SMM's" } else { "the normal" };
        let page_as = k.mmu.sp_as_id(u.sp) as usize;
        let gfn = u.gfn;
        let detail = if page_as != mine {
            format!(
                "vcpu{v} (in {} address space) used gfn {gfn:#x} through EPT page #{} of {} address space's role",
                name(mine),
                u.sp,
                name(page_as)
            )
        } else if let Some(pfn) = pfn {
            let maps = |a: usize| {
                k.address_spaces[a]
                    .sets
                    .iter()
                    .any(|set| set.slots.iter().any(|sl| sl.maps(gfn, pfn)))
            };
            let other = 1 - mine;
            if maps(mine) || !maps(other) {
                return;
            }
            format!(
                "vcpu{v} (in {} address space) reached host frame {pfn:#x} for gfn {gfn:#x}, which only {} address space's memslots map there",
                name(mine),
                name(other)
            )
        } else {
            return;
        };
        self.violate(Violation {
            invariant: "INV-ADDR-SPACE",
            detail,
        });
    }

    /// Oracle `INV-MEMTYPE`: every live TDP MMU leaf overlapping `range` (made by vCPU `by`,
    /// or by anyone) carries the memory type its maker's state now gives each frame it maps.
    pub(crate) fn check_memtype(&mut self, by: Option<usize>, (start, end): (Gfn, Gfn)) {
        let Some(vm) = self.host.as_ref().map(|_| by.map_or(0, |v| self.vm_of(v))) else {
            return;
        };
        let mut bad = None;
        for (&(sp, idx), &maker) in &self.kvm(vm).mmu.memtype_origin {
            if by.is_some_and(|v| v != maker as usize) || !self.ept.is_alive(sp) {
                continue;
            }
            let page = self.ept.page(sp);
            let SpteKind::Leaf { memtype, .. } = self.ept.spte(sp, idx).kind else {
                continue;
            };
            let n = gfns_per_entry(page.level);
            let g = page.gfn + idx as u64 * n;
            if g >= end || g + n <= start {
                continue;
            }
            if let Some(why) = self.leaf_memtype_wrong(maker as usize, g, n, memtype) {
                bad = Some(format!(
                    "vcpu{maker}'s SPTE for gfns {g:#x}..{:#x} has memory type {}, but {why}",
                    g + n,
                    memtype_text(memtype)
                ));
                break;
            }
        }
        if let Some(detail) = bad {
            let when = match by {
                Some(v) => format!("vcpu{v} re-enters the guest after its MTRR / CR0.CD change"),
                None => "the non-coherent DMA assignment returned".to_string(),
            };
            self.violate(Violation {
                invariant: "INV-MEMTYPE",
                detail: format!("{when}: {detail}"),
            });
        }
    }

    /// Oracle, as an MMU notifier's `invalidate_range_start` returns: `INV-STALE` if a leaf
    /// SPTE of any root still maps a host page behind guest frames `[gfn, gfn + npages)` (of
    /// address space 0, whose memslots the notifier's range was taken from; another address
    /// space may map the same gfns to other pages, e.g. SMRAM).
    pub(crate) fn check_gfns_unmapped(&mut self, vm: usize, gfn: Gfn, npages: u64) {
        use shootdown_hw::ept::{EptWalk, SpteKind, EPT_ROOT_LEVEL};
        if !self.opts.ept {
            return self.check_shadow_gfns_unmapped(vm, gfn, npages);
        }
        let k = self.kvm(vm);
        let host_pfn = |g: Gfn| {
            k.address_spaces[0]
                .active_set()
                .lookup(g)
                .map(|sl| sl.pfn_of(g))
        };
        // Every root: the TDP MMU's, or each live top-level shadow page (walked from the
        // EPT itself, not the rmaps: an SPTE the rmaps lost would escape them).
        let roots: Vec<shootdown_hw::ept::SpId> = if self.opts.tdp_mmu {
            k.tdp_roots.iter().map(|r| r.sp).collect()
        } else {
            k.mmu
                .pages
                .iter()
                .filter(|(_, p)| p.level == EPT_ROOT_LEVEL && !p.freed)
                .map(|(&sp, _)| sp)
                .collect()
        };
        let found = (gfn..gfn + npages).find_map(|g| {
            let pfn = host_pfn(g)?;
            roots
                .iter()
                .find_map(|&root| match self.ept.walk_from(root, g) {
                    EptWalk::Leaf {
                        sp,
                        idx,
                        level,
                        spte:
                            shootdown_hw::ept::Spte {
                                kind: SpteKind::Leaf { pfn: p, .. },
                                ..
                            },
                    } if p + g % gfns_per_entry(level) == pfn => Some((sp, idx, g)),
                    _ => None,
                })
        });
        if let Some((sp, idx, g)) = found {
            self.violate(Violation {
                invariant: "INV-STALE",
                detail: format!(
                    "invalidate_range_start returned while EPT page #{sp} entry {idx} still maps gfn {g:#x}: the host may free its page"
                ),
            });
        }
    }

    /// [`Machine::check_gfns_unmapped`] with shadow paging: `INV-STALE` if a level-1 shadow
    /// page still linked under a root has a present leaf onto the host page of a guest frame of
    /// the range (found by the leaves' host frames, not the rmaps the notifier walked).
    fn check_shadow_gfns_unmapped(&mut self, vm: usize, gfn: Gfn, npages: u64) {
        use shootdown_hw::ept::SpteKind;
        let k = self.kvm(vm);
        let slots = k.address_spaces[0].active_set();
        let pfns: std::collections::BTreeSet<u64> = (gfn..gfn + npages)
            .filter_map(|g| slots.lookup(g).map(|sl| sl.pfn_of(g)))
            .collect();
        let roots: Vec<shootdown_hw::ept::SpId> = k.shadow.roots.values().copied().collect();
        let found = k.shadow.leaves.keys().find_map(|&sp| {
            if !roots.iter().any(|&r| self.linked_under(sp, r)) {
                return None;
            }
            self.ept
                .page(sp)
                .entries
                .iter()
                .find_map(|(&idx, e)| match e.kind {
                    SpteKind::Leaf { pfn, .. } if pfns.contains(&pfn) => Some((sp, idx, pfn)),
                    _ => None,
                })
        });
        if let Some((sp, idx, pfn)) = found {
            self.violate(Violation {
                invariant: "INV-STALE",
                detail: format!(
                    "invalidate_range_start returned while shadow page #{sp} entry {idx} still maps host frame {pfn:#x}: the host may free it"
                ),
            });
        }
    }
}

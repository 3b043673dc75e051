//! arch/x86/kvm/mmu: the direct (EPT) MMU of a VM in its v5.x "legacy" form — shadow pages on
//! `active_mmu_pages` with `mmu_valid_gen`, the page hash, rmaps, and their zapping — plus the
//! fault paths that fill it (docs/design/kernel-model.md §4; docs/design/kvm-mmu-seeds.md §1.3).
//!
//! * [`fault`] — `tdp_page_fault` (an EPT violation) and `handle_mmio_page_fault` (an EPT
//!   misconfiguration), with MMIO SPTEs and the per-vCPU MMIO cache;
//! * [`spte`] — the MMIO SPTE generation and its checks; [`spte_ad`] — a leaf's dirty state
//!   (`is_dirty_spte`, `kvm_set_pfn_dirty`) and the oracle `INV-AD`;
//! * [`page`] — getting, linking, zapping (`kvm_mmu_prepare_zap_page`) and freeing
//!   (`kvm_mmu_commit_zap_page`) shadow pages; roots (`kvm_mmu_load` / `kvm_mmu_unload`);
//! * [`zap`] — what a memslot deletion zaps: `zap_all`, `fast_invalidate`, `slot_only`, and
//!   `kvm_mmu_remote_flush_or_zap`;
//! * [`lock`] — `mmu_lock`, with the oracle's check that no flush is owed when it is released;
//! * [`access_track`] — aging without A/D bits (`clear_young`) and its access-tracked SPTEs;
//! * [`nx_huge_pages`] — the iTLB multihit mitigation: no executable huge SPTEs, split pages
//!   tracked and zapped again by the recovery worker, in both MMUs;
//! * the TDP MMU (v5.10+, seed 004): [`rwlock`] (`mmu_lock` as a queued rwlock), [`tdp_iter`]
//!   (the walk), [`tdp_mmu`] (roots, `kvm_zap_gfn_range`, the read-lock fault), [`tdp_rcu`]
//!   (RCU-deferred freeing of the tables it removes).
//!
//! * shadow paging (EPT off): [`shadow`] (the shadow pages of guest page tables, unsync pages,
//!   `kvm_mmu_sync_roots`, the emulated PMD write) and [`paging_tmpl`] (`FNAME(page_fault)`,
//!   `FNAME(invlpg)`, `FNAME(sync_page)`).
//!
//! The EPT pages themselves (what the hardware walks) are `shootdown_hw::ept`; this is KVM's
//! software view of them (shadow pages live in the same arena). Simplifications: one MMU role, no limit on the number of shadow
//! pages (`make_mmu_pages_available` never recycles), no accessed bits.

pub mod access_track;
pub mod fast_pf;
pub mod fault;
pub mod lock;
pub mod nx_huge_pages;
pub mod page;
pub mod paging_tmpl;
pub mod rwlock;
pub mod shadow;
pub mod spte;
pub mod spte_ad;
pub mod tdp_iter;
pub mod tdp_mmu;
pub mod tdp_rcu;
pub mod zap;

use shootdown_hw::ept::{Gfn, SpId};
use std::collections::{BTreeMap, VecDeque};

/// KVM's metadata of one shadow page (`struct kvm_mmu_page`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ShadowPage {
    /// `sp->gfn`: the first guest frame the page maps.
    pub gfn: Gfn,
    /// `sp->role.level`.
    pub level: u8,
    /// `sp->role.invalid`: zapped (still alive while a root count holds it, or until freed).
    pub invalid: bool,
    /// `sp->mmu_valid_gen` (v5.0 / v5.3+ fast invalidate).
    pub mmu_valid_gen: u64,
    /// `sp->root_count`: vCPUs using it as their root.
    pub root_count: u32,
    /// `sp->mmio_cached`: it ever held an MMIO SPTE (v5.1's MMIO-only zap).
    pub mmio_cached: bool,
    /// On `active_mmu_pages` (else on an invalid list, waiting to be freed, or freed).
    pub active: bool,
    /// Freed (`kvm_mmu_free_page`).
    pub freed: bool,
    /// `sp->nx_huge_page_disallowed`: linked by an instruction fetch where a huge leaf could
    /// have gone (`nx_huge_pages.rs`).
    pub nx_huge_page_disallowed: bool,
    /// `kvm_mmu_role_as_id(sp->role)` (`role.smm`): the address space whose memslots the
    /// page's SPTEs translate; a page is only ever found for, and linked under, its own.
    pub as_id: u8,
}

/// One VM's MMU state (`kvm->arch`), all under `mmu_lock`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct KvmMmu {
    /// This VM's shadow pages (the ids are the EPT pages' ids).
    pub pages: BTreeMap<SpId, ShadowPage>,
    /// `active_mmu_pages`: newest at the front (the list head).
    pub active: VecDeque<SpId>,
    /// `mmu_page_hash`: pages by (gfn, level).
    pub hash: BTreeMap<(Gfn, u8), Vec<SpId>>,
    /// rmaps: the leaf SPTEs mapping each guest frame, by (level, first gfn of the leaf).
    pub rmap: BTreeMap<(u8, Gfn), Vec<(SpId, u16)>>,
    /// `kvm->arch.mmu_valid_gen`.
    pub mmu_valid_gen: u64,
    /// v5.0 `kvm->arch.zapped_obsolete_pages`: pages the fast zap prepared but has not freed.
    pub zapped_obsolete: Vec<SpId>,
    /// Oracle: the vCPU whose state gave each TDP MMU leaf its memory type (`vmx_get_mt_mask`
    /// is per vCPU).
    pub memtype_origin: BTreeMap<(SpId, u16), u32>,
    /// Oracle: the memslot-set version each MMIO SPTE was derived from.
    pub mmio_origin: BTreeMap<(SpId, u16), u64>,
    /// Oracle: epoch of the latest SPTE zap or unlink, and of the latest remote flush that began
    /// (a flush owed at an `mmu_lock` release is looked for only if the first is later).
    pub last_zap: u64,
    pub last_flush_begin: u64,
    /// `kvm->arch.possible_nx_huge_pages`, oldest first (its length is `nx_lpage_splits`).
    pub possible_nx_huge_pages: Vec<SpId>,
    /// The TDP MMU walks' RCU read sections and the removed tables waiting for a grace period.
    pub rcu: tdp_rcu::TdpMmuRcu,
}

impl KvmMmu {
    /// Record a new page `sp` mapping from `gfn` at `level` for address space `as_id` (valid,
    /// of the current generation).
    pub fn add_page(&mut self, sp: SpId, gfn: Gfn, level: u8, as_id: u8) {
        let gen = self.mmu_valid_gen;
        self.pages.insert(
            sp,
            ShadowPage {
                gfn,
                level,
                invalid: false,
                mmu_valid_gen: gen,
                root_count: 0,
                mmio_cached: false,
                active: true,
                freed: false,
                nx_huge_page_disallowed: false,
                as_id,
            },
        );
    }

    /// The address space of page `sp`'s role (0 for a page the MMU does not know).
    pub fn sp_as_id(&self, sp: SpId) -> u8 {
        self.pages.get(&sp).map_or(0, |p| p.as_id)
    }

    /// `is_obsolete_sp()`: created before the last fast invalidate.
    pub fn is_obsolete(&self, sp: SpId) -> bool {
        self.pages[&sp].mmu_valid_gen != self.mmu_valid_gen
    }
}

//! arch/x86/kvm/mmu/paging_tmpl.h for a 64-bit guest (`FNAME` = `paging64_`), the functions
//! that read the guest's page tables: the shadow page fault ([`ShadowPageFault`]:
//! `FNAME(walk_addr)`, then `FNAME(fetch)` under `mmu_lock`), a guest INVLPG
//! (`FNAME(invlpg)`) and the sync of an unsync page (`FNAME(sync_page)`), in their v5.15 form.
//! See `shadow.rs` for the shadow pages themselves and what is simplified.

use crate::counters::Counter;
use crate::frame::{Flow, Frame};
use crate::kvm::mmu::fault::Emulation;
use crate::machine::Machine;
use crate::state::Access;
use shootdown_engine::Env;
use shootdown_hw::ept::{ept_index, SpId, SpteKind, MT_WB_IPAT};
use shootdown_hw::pagetable::{pt_index, Pte, Vpn, Walk, PTRS_PER_PT};
use shootdown_hw::CpuId;

use super::shadow::{remove_rmap, Shadowed};
use crate::options::ShadowSyncFlush;

/// `PTE_PREFETCH_NUM`: the aligned group of guest PTEs a shadow fault prefetches from.
const PTE_PREFETCH_NUM: u16 = 8;

/// What `FNAME(walk_addr)` found for a guest-virtual page.
pub(crate) enum GuestWalk {
    /// A present guest PTE in page-table page `table`, or (`table = None`) a present 2 MiB
    /// PMD leaf (its frame offset for the page already applied to `gfn`).
    Mapped {
        table: Option<shootdown_hw::pagetable::PtPageId>,
        pte: Pte,
        gfn: u64,
    },
    /// No translation, or not one that allows the access: the guest gets the #PF.
    Fault,
}

/// `FNAME(page_fault)(vcpu, addr, error_code)` of a shadow-paging #PF exit, in two steps:
/// `FNAME(walk_addr)` reads the guest's tables without `mmu_lock` (a PTE that does not allow the
/// access: back to the guest, which takes its #PF on the next try, `kvm_inject_page_fault` in
/// effect; a frame without a memslot: emulated MMIO); then the `mmu_lock` section (one step):
/// `FNAME(gpte_changed)` re-reads the guest's entries and retries the fault if they changed
/// since the walk, else `FNAME(fetch)` gets the shadow pages (`kvm_mmu_get_page`, which syncs a
/// page it finds unsync), installs the leaf built from what the walk read (`mmu_set_spte`)
/// and prefetches its neighbours (`FNAME(pte_prefetch)`). Simplified: no `mmu_notifier_retry`
/// (the model's pfn lookup happens under `mmu_lock`, where no invalidation can be in flight).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ShadowPageFault {
    pub pc: ShadowPageFaultPc,
    pub vpn: Vpn,
    pub access: Access,
    /// What the walk read.
    pub walked: Option<Walked>,
}

/// The guest entries `FNAME(walk_addr)` read: its page-table page (`None`: a 2 MiB leaf), the
/// PTE's version, frame and write permission.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Walked {
    pub table: Option<shootdown_hw::pagetable::PtPageId>,
    pub version: u32,
    pub gfn: u64,
    pub writable: bool,
}

/// The steps of `FNAME(page_fault)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ShadowPageFaultPc {
    /// `FNAME(walk_addr)`, without `mmu_lock`.
    Walk,
    /// `mmu_lock`: `FNAME(gpte_changed)`, `FNAME(fetch)`, unlock.
    Fetch,
}

impl ShadowPageFault {
    pub fn call(vpn: Vpn, access: Access) -> Frame {
        Frame::ShadowPageFault(ShadowPageFault {
            pc: ShadowPageFaultPc::Walk,
            vpn,
            access,
            walked: None,
        })
    }
}

impl Machine {
    /// `FNAME(walk_addr)`: the guest's translation of `vpn` in mm `mm` as its page tables say
    /// now (a walk through a freed guest table finds nothing: the guest gets its #PF).
    pub(crate) fn fname_walk_addr(
        &self,
        mm: crate::state::MmId,
        vpn: Vpn,
        access: Access,
    ) -> GuestWalk {
        let space = &self.mms[mm as usize].space;
        let (table, pte, gfn) = match self.pt_pages.walk(space, vpn) {
            Walk::Leaf { table, pte } => (Some(table), pte, pte.pfn as u64),
            Walk::Huge { pte } => (None, pte, pte.pfn as u64 + vpn % PTRS_PER_PT),
            Walk::NoTable | Walk::FreedTable(_) => return GuestWalk::Fault,
        };
        if !pte.present || !access.allowed_by(pte.writable, true) {
            return GuestWalk::Fault;
        }
        GuestWalk::Mapped { table, pte, gfn }
    }

    /// One step of `FNAME(page_fault)` for vCPU `v` (see [`ShadowPageFault`]).
    pub(crate) fn shadow_page_fault_step<E: Env>(
        &mut self,
        v: CpuId,
        s: &mut ShadowPageFault,
        env: &mut E,
    ) -> Flow {
        let vm = self.vm_of(v);
        let mm = self.cpus[v].cr3_mm;
        let (vpn, access) = (s.vpn, s.access);
        match s.pc {
            ShadowPageFaultPc::Walk => {
                self.perf.counters.inc(Counter::KvmShadowFaults);
                self.charge(env, |c| c.ept_violation);
                let GuestWalk::Mapped { table, pte, gfn } = self.fname_walk_addr(mm, vpn, access)
                else {
                    self.say(|| {
                        format!("FNAME(walk_addr) mm{mm} page {vpn:#x}: the guest PTE does not allow the {}: back to the guest (#PF)", access.text())
                    });
                    return Flow::Return;
                };
                let slots = self.kvm(vm).address_spaces[0].active_set();
                if slots.lookup(gfn).is_none() {
                    let derived = slots.version;
                    self.host_mut().vcpus[v].emulate = Some(Emulation::Mmio { gfn, derived });
                    self.say(|| format!("FNAME(walk_addr) mm{mm} page {vpn:#x}: gfn {gfn:#x} has no memslot: emulate (MMIO)"));
                    return Flow::Return;
                }
                s.walked = Some(Walked {
                    table,
                    version: pte.version,
                    gfn,
                    writable: pte.writable,
                });
                s.pc = ShadowPageFaultPc::Fetch;
                self.say(|| {
                    format!("FNAME(walk_addr) mm{mm} page {vpn:#x}: guest PTE version {} -> gfn {gfn:#x} (no lock)", pte.version)
                });
                Flow::Next
            }
            ShadowPageFaultPc::Fetch => {
                let w = s.walked.expect("walked before the fetch");
                self.shadow_mmu_lock(vm);
                // FNAME(gpte_changed): the guest's entries as the walk read them?
                let now = match self.fname_walk_addr(mm, vpn, access) {
                    GuestWalk::Mapped { table, pte, gfn } => Some(Walked {
                        table,
                        version: pte.version,
                        gfn,
                        writable: pte.writable,
                    }),
                    GuestWalk::Fault => None,
                };
                if now != Some(w) {
                    self.perf.counters.inc(Counter::KvmFaultRetries);
                    self.say(|| {
                        format!("mmu_lock; FNAME(fetch) mm{mm} page {vpn:#x}: FNAME(gpte_changed): the guest PTE changed since the walk: unlock, retry")
                    });
                    return Flow::Return;
                }
                let slot = self.kvm(vm).address_spaces[0]
                    .active_set()
                    .lookup(w.gfn)
                    .cloned()
                    .expect(
                        "a memslot (checked by the walk; no memslot changes with shadow paging)",
                    );
                let root = self.host_ref().vcpus[v].root.expect("a root in the guest");
                let pmd = self.shadow_pmd_page(vm, mm, root, vpn, env);
                let pidx = ept_index(2, vpn);
                let sp = match self.ept.spte(pmd, pidx).kind {
                    SpteKind::Table(sp) => sp,
                    _ => {
                        let sp = self.shadow_get_page(v, mm, pt_index(vpn), w.table, env);
                        let e = self.oracle.tick();
                        self.ept.set(pmd, pidx, SpteKind::Table(sp), e);
                        sp
                    }
                };
                let idx = ept_index(1, vpn);
                let writable = w.writable && !slot.readonly;
                let pfn = slot.pfn_of(w.gfn);
                // mmu_set_spte(): a present leaf of another frame is dropped, and one that loses
                // W updated, each with a remote flush.
                let old = self.ept.spte(sp, idx).kind;
                let flush = matches!(old, SpteKind::Leaf { pfn: p, writable: ow, .. } if p != pfn || (ow && !writable));
                let leaf = Shadowed {
                    version: w.version,
                    gfn: w.gfn,
                    writable,
                    accessed: true,
                };
                self.shadow_set_leaf(vm, sp, idx, pfn, !slot.readonly, leaf);
                if flush {
                    self.kvm_shadow_flush_remote_tlbs(vm, env);
                }
                self.perf.counters.inc(Counter::KvmMmuPfFixed);
                self.charge(env, |c| c.spte_install);
                let prefetched = if w.table.is_some() {
                    self.fname_pte_prefetch(vm, mm, sp, idx, env)
                } else {
                    0
                };
                self.say(|| {
                    format!(
                        "mmu_lock; FNAME(fetch) mm{mm} page {vpn:#x}: shadow page #{sp} entry {idx} = pfn {pfn:#x} ({}, from guest PTE version {}){}; unlock",
                        if writable { "writable" } else { "read-only" },
                        w.version,
                        match prefetched {
                            0 => String::new(),
                            n => format!("; FNAME(pte_prefetch): {n} neighbour(s), not accessed"),
                        }
                    )
                });
                Flow::Return
            }
        }
    }

    /// `mmu_set_spte()` of leaf `idx` of level-1 page `sp`: host frame `pfn` (`host_writable`:
    /// the memslot lets the host page be written, `shadow_host_writable_mask`), built from the
    /// guest PTE `leaf` records (`rmap_add`: the SPTE joins its frame's rmap). Writing the same
    /// translation again changes no SPTE (`mmu_spte_update` of an identical value); KVM's
    /// record of the guest PTE moves on.
    fn shadow_set_leaf(
        &mut self,
        vm: usize,
        sp: SpId,
        idx: u16,
        pfn: u64,
        host_writable: bool,
        leaf: Shadowed,
    ) {
        let kind = SpteKind::Leaf {
            pfn,
            writable: leaf.writable,
            mmu_writable: host_writable,
            memtype: MT_WB_IPAT,
            exec: true,
            dirty: false,
            access_tracked: false,
        };
        if self.ept.spte(sp, idx).kind != kind {
            let e = self.oracle.tick();
            self.ept.set(sp, idx, kind, e);
        }
        let old = self.leaf_sp_mut(vm, sp).gptes.insert(idx, leaf);
        let rmap = &mut self.kvm_mut(vm).shadow.rmap;
        if let Some(o) = old.filter(|o| o.gfn != leaf.gfn) {
            remove_rmap(rmap, o.gfn, sp, idx);
        }
        rmap.entry(leaf.gfn).or_default().insert((sp, idx));
    }

    /// Drop leaf `idx` of `sp` (`drop_spte` / `mmu_page_zap_pte`, with `rmap_remove`). Whether
    /// it was present.
    pub(crate) fn shadow_drop_leaf<E: Env>(
        &mut self,
        vm: usize,
        sp: SpId,
        idx: u16,
        env: &mut E,
    ) -> bool {
        if let Some(o) = self.leaf_sp_mut(vm, sp).gptes.remove(&idx) {
            remove_rmap(&mut self.kvm_mut(vm).shadow.rmap, o.gfn, sp, idx);
        }
        if !self.ept.spte(sp, idx).is_present() {
            return false;
        }
        let e = self.oracle.tick();
        self.ept.set(sp, idx, SpteKind::None, e);
        self.charge(env, |c| c.spte_zap);
        true
    }

    /// `FNAME(prefetch_gpte)(vcpu, sp, spte, gpte, no_dirty_log)`: leaf `idx` of `sp` built
    /// speculatively (no accessed bit) from guest PTE `pte`, unless it is not present or maps
    /// a frame without a memslot. Whether it installed one.
    fn fname_prefetch_gpte(&mut self, vm: usize, sp: SpId, idx: u16, pte: Pte) -> bool {
        let gfn = pte.pfn as u64;
        let slot = match self.kvm(vm).address_spaces[0].active_set().lookup(gfn) {
            Some(sl) if pte.present => sl.clone(),
            _ => return false,
        };
        let leaf = Shadowed {
            version: pte.version,
            gfn,
            writable: pte.writable && !slot.readonly,
            accessed: false,
        };
        self.shadow_set_leaf(vm, sp, idx, slot.pfn_of(gfn), !slot.readonly, leaf);
        true
    }

    /// `FNAME(pte_prefetch)(vcpu, gw, sptep)` after a fault installed leaf `idx` of the
    /// indirect page `sp` (mm `mm`): the other entries of its aligned group of
    /// `PTE_PREFETCH_NUM` (8) get speculative SPTEs from their guest PTEs
    /// (`FNAME(prefetch_gpte)`, `mmu_set_spte` with `speculative`: no accessed bit), skipping
    /// those already present and stopping at the first guest PTE that is not present or maps
    /// a frame without a memslot. Returns how many it installed. Simplified: the guest PTEs
    /// are read here, under `mmu_lock`, not by the lockless walk (`gw->prefetch_ptes`), so
    /// they are never older than the faulting one's recheck; a direct page (a guest 2 MiB
    /// page) prefetches nothing (`__direct_pte_prefetch` is not modelled).
    fn fname_pte_prefetch<E: Env>(
        &mut self,
        vm: usize,
        mm: crate::state::MmId,
        sp: SpId,
        idx: u16,
        env: &mut E,
    ) -> u64 {
        let pt = self.kvm(vm).shadow.leaves[&sp].pt;
        let first = idx & !(PTE_PREFETCH_NUM - 1);
        let mut n = 0;
        for i in first..first + PTE_PREFETCH_NUM {
            if i == idx || self.ept.spte(sp, i).is_present() {
                continue;
            }
            let pte = self.mms[mm as usize].space.pte(pt * PTRS_PER_PT + i as u64);
            if !self.fname_prefetch_gpte(vm, sp, i, pte) {
                break;
            }
            self.charge(env, |c| c.spte_install);
            n += 1;
        }
        self.perf.counters.add(Counter::KvmPtePrefetch, n);
        n
    }

    /// `FNAME(sync_page)(vcpu, sp)` (v5.10–v5.15; `kvm_sync_page` around it clears
    /// `sp->unsync`, here derived): each SPTE is compared with its guest PTE as it is now. One
    /// no longer present, or mapping another frame, is dropped: with `shadow_sync_flush =
    /// "remote"` (f81602958c11) a remote flush is owed, with `"tlbs_dirty"` only
    /// `kvm->tlbs_dirty++`. One kept is rebuilt (`set_spte` with `can_unsync = false`,
    /// speculative: no accessed bit), and `mmu_spte_update` owes a flush if it loses its
    /// accessed bit or its write permission. Returns the flush owed and how many SPTEs are
    /// left (`nr_present`: with none, `kvm_sync_page` zaps the page). v5.15 flushes in
    /// `sync_page`, once per page; v5.16 returns the flag to the caller, as here: the same
    /// flush, once per sync.
    pub(crate) fn fname_sync_page<E: Env>(
        &mut self,
        vm: usize,
        sp: SpId,
        env: &mut E,
    ) -> (bool, u64) {
        let l = &self.kvm(vm).shadow.leaves[&sp];
        let (mm, pt) = (l.mm, l.pt);
        let entries: Vec<(u16, Shadowed)> = l.gptes.iter().map(|(&i, &s)| (i, s)).collect();
        let (mut flush, mut dirty, mut present) = (false, 0, 0);
        for (idx, old) in entries {
            let vpn = pt * PTRS_PER_PT + idx as u64;
            let pte = self.mms[mm as usize].space.pte(vpn);
            if !pte.present || pte.pfn as u64 != old.gfn {
                if self.shadow_drop_leaf(vm, sp, idx, env) {
                    match self.opts.shadow_sync_flush {
                        ShadowSyncFlush::Remote => flush = true,
                        ShadowSyncFlush::TlbsDirty => dirty += 1,
                    }
                }
                continue;
            }
            let SpteKind::Leaf {
                pfn,
                mmu_writable,
                writable: was_writable,
                ..
            } = self.ept.spte(sp, idx).kind
            else {
                continue;
            };
            present += 1;
            // make_spte() with the old SPTE's host-writable bit and the guest's permission.
            let writable = pte.writable && mmu_writable;
            flush |= old.accessed || (was_writable && !writable);
            let leaf = Shadowed {
                version: pte.version,
                gfn: old.gfn,
                writable,
                accessed: false,
            };
            self.shadow_set_leaf(vm, sp, idx, pfn, mmu_writable, leaf);
        }
        if dirty > 0 {
            self.kvm_mut(vm).shadow.tlbs_dirty += dirty;
            self.perf.counters.add(Counter::KvmTlbsDirty, dirty);
        }
        self.say(|| {
            format!(
                "FNAME(sync_page) shadow page #{sp} (mm{mm} pages {:#x}+512): {present} SPTE(s) kept{}{}",
                pt * PTRS_PER_PT,
                if dirty > 0 {
                    format!(", {dirty} dropped: kvm->tlbs_dirty += {dirty}, no flush")
                } else {
                    String::new()
                },
                if flush { "; a remote flush is owed" } else { "" }
            )
        });
        (flush, present)
    }

    /// `kvm_mmu_invlpg(vcpu, gva)` for a guest INVLPG (an exit with shadow paging):
    /// `FNAME(invlpg)` walks the root to the leaf for `vpn`; if its page is unsync, the SPTE
    /// is zapped (`mmu_page_zap_pte`, with `kvm_flush_remote_tlbs_with_address` if it was
    /// present) and rebuilt from the guest PTE as it is now (`FNAME(update_pte)`, a
    /// prefetch). A sync page is left alone: write-protection kept it current. Then the
    /// vCPU's own translation goes (`tlb_flush_gva`: INVVPID of the address).
    pub(crate) fn kvm_mmu_invlpg<E: Env>(&mut self, v: CpuId, vpn: Vpn, env: &mut E) {
        self.vm_exit(env);
        self.perf.counters.inc(Counter::KvmInvlpg);
        let what = self.kvm_mmu_invalidate_gva(v, vpn, env);
        let mm = self.cpus[v].cr3_mm;
        self.say(|| format!("INVLPG mm{mm} page {vpn:#x}: VM exit, kvm_mmu_invlpg: {what}"));
    }

    /// `kvm_mmu_invalidate_gva(vcpu, mmu, gva)` on the current root (an INVLPG, an INVPCID of
    /// one address, or the injection of a protection #PF): `tlb_flush_gva` (INVVPID of the
    /// address), then `FNAME(invlpg)`. Returns what it did, for the step's text.
    pub(crate) fn kvm_mmu_invalidate_gva<E: Env>(
        &mut self,
        v: CpuId,
        vpn: Vpn,
        env: &mut E,
    ) -> String {
        let vm = self.vm_of(v);
        let mm = self.cpus[v].cr3_mm;
        self.cpus[v].tlb.invlpgb(&shootdown_hw::tlb::Invlpgb {
            pcid: None,
            range: Some((vpn, vpn + 1)),
            final_only: false,
            include_global: true,
        });
        self.charge(env, |c| c.invlpg);
        let Some(root) = self.host_ref().vcpus[v].root else {
            return "no root".into();
        };
        self.shadow_mmu_lock(vm);
        let leaf = match self.ept.walk_from(root, vpn) {
            shootdown_hw::ept::EptWalk::Leaf {
                sp, idx, level: 1, ..
            } => Some((sp, idx)),
            _ => None,
        };
        let what = match leaf {
            Some((sp, idx))
                if self.sp_unsync(vm, sp) && !self.opts.mutants.shadow_invlpg_skips_sync() =>
            {
                let old = self.kvm(vm).shadow.leaves[&sp].gptes.get(&idx).copied();
                if self.shadow_drop_leaf(vm, sp, idx, env) {
                    self.kvm_shadow_flush_remote_tlbs(vm, env);
                }
                let pte = self.mms[mm as usize].space.pte(vpn);
                match old {
                    Some(_) if self.fname_prefetch_gpte(vm, sp, idx, pte) => {
                        format!("shadow page #{sp} is unsync: zap entry {idx}, kvm_flush_remote_tlbs, FNAME(update_pte) from guest PTE version {}", pte.version)
                    }
                    _ => format!(
                        "shadow page #{sp} is unsync: zap entry {idx}, kvm_flush_remote_tlbs"
                    ),
                }
            }
            Some((sp, _)) if self.sp_unsync(vm, sp) => {
                format!("shadow page #{sp} is unsync, but FNAME(invlpg) leaves it (mutant)")
            }
            Some((sp, _)) => format!("shadow page #{sp} is sync: nothing to do"),
            None => "no shadow leaf".to_string(),
        };
        format!("INVVPID of the address; {what}")
    }
}

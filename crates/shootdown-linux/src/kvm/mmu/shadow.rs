//! Shadow paging (`kvm_intel.ept=0`, option `ept = false`; arch/x86/kvm/mmu/mmu.c): without
//! EPT the CPU walks page tables KVM builds from the guest's own, mapping guest-virtual pages
//! straight to host frames. Each guest page table is shadowed by an *indirect* shadow page
//! (`role.direct = 0`, `sp->gfn` the guest table's frame); its SPTEs are built from the guest
//! PTEs by the fault path (`paging_tmpl.rs`, `FNAME(page_fault)`).
//!
//! KVM write-protects every guest page table it shadows, so that it sees the guest change it.
//! A level-1 table may instead go *unsync* (`mmu_try_to_unsync_pages` → `kvm_unsync_page`):
//! its frame becomes writable again and the guest changes its PTEs freely; KVM relies on the
//! guest flushing its TLB afterwards — `INVLPG` (`kvm_mmu_invlpg`, one PTE) or a CR3 load,
//! INVPCID, a PV flush (`kvm_mmu_sync_roots` → `mmu_sync_children` → `FNAME(sync_page)`) — to
//! bring the shadow back in line, as the architecture lets it cache the old translation until
//! then.
//!
//! The model's guest page tables have two levels (a PMD per mm, 4 KiB page-table pages), so a
//! shadow root is a 4-level page whose levels 4 and 3 stand for the guest's PGD and PUD (never
//! changed here) and whose level-2 pages shadow the PMD. Level-1 pages shadow page-table pages;
//! a guest 2 MiB page is mapped by a level-1 page with no guest table (`role.direct = 1` for a
//! guest large page), which is never unsync.
//!
//! `FNAME(sync_page)` pays for a dropped SPTE in its era's way (option `shadow_sync_flush`):
//! `kvm->tlbs_dirty++`, a debt the next `kvm_flush_remote_tlbs` or MMU-notifier invalidation
//! settles (a4ee1ca4a36e), or a remote flush at once (f81602958c11, v5.15).
//!
//! Where the model differs from v5.15 (`docs/checker-kvm.md` lists the same):
//! * **write tracking is exact and immediate** (safer). A guest write to a shadowed page
//!   table is the trap the kernel takes: for a level-1 table the first write unsyncs it
//!   (`kvm_unsync_page`), which the model notices at KVM's next look ([`Machine::sp_unsync`]:
//!   a PTE it shadows differs from what KVM read) and then keeps until `mmu_sync_children`;
//!   for the PMD (`kvm_mmu_pte_write`, which emulates the write) the entry's SPTE is zapped
//!   with a remote flush at the write ([`Machine::kvm_shadow_pmd_written`]). The guest
//!   kernel's own direct-map translations of its page tables are not modelled, so the remote
//!   flush that write-protecting a table owes (`rmap_write_protect`, f81602958c11) cannot be
//!   missed, and a write to a PTE KVM never shadowed unsyncs nothing;
//! * a vCPU's `mmu_lock` sections are one step each (the fault's lockless guest walk is a step
//!   of its own), and `kvm_flush_remote_tlbs` from one flushes every vCPU of the VM at once, as
//!   if the request, the kicks and the wait were instantaneous (safer). The lock's multi-step
//!   holder is a host thread's MMU-notifier invalidation (`kvm_unmap_rmapp` over the SPTEs'
//!   rmaps, [`ShadowMmu::rmap`]); while it holds or waits for the lock, a vCPU step that
//!   would enter a section waits whole ([`Machine::shadow_step_waits`]), so what the step
//!   does before its section (a CR3 write, the INVLPG's own flush) waits too — the vCPU's
//!   own state, which no other agent reads;
//! * the guest's A/D bits are not set by KVM's walk (the native model's CPU does not set them
//!   either), so a writable guest PTE makes a writable SPTE at once (no `protect_clean_gpte`);
//!   the SPTEs' own accessed bit is modelled ([`Shadowed::accessed`]);
//! * `FNAME(pte_prefetch)` reads the neighbouring guest PTEs under `mmu_lock`, not during
//!   the lockless walk; a direct page prefetches nothing; a guest 2 MiB page is always mapped
//!   by a new direct page after its PMD entry changed;
//! * the sync of an emptied page zaps it (`kvm_sync_page`, v5.10–v5.15; v6.4's
//!   `kvm_sync_spte` keeps it);
//! * one role per guest table (no `role.access` / CR0.WP / SMEP variants, no PAE quadrants),
//!   one root per guest mm (`prev_roots` keyed by mm and PCID), no INVPCID of a single or all
//!   contexts, no CR4.PGE toggles (the model's guest uses neither with shadow paging);
//! * the TLB entry filled from a 4 KiB SPTE of a guest 2 MiB page is a 2 MiB one, as for EPT.

use crate::counters::Counter;
use crate::machine::Machine;
use crate::state::MmId;
use shootdown_engine::Env;
use shootdown_hw::ept::{ept_index, SpId, SpteKind, EPT_ROOT_LEVEL};
use shootdown_hw::pagetable::{PtIndex, PtPageId, Vpn, PTRS_PER_PT};
use shootdown_hw::CpuId;
use std::collections::BTreeMap;

/// What one SPTE of a level-1 shadow page was built from (`sp->gfns[i]`, plus the guest PTE's
/// version for the oracle: a TLB entry filled from the SPTE carries it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Shadowed {
    /// The guest PTE's version when KVM last read it.
    pub version: u32,
    /// The guest frame it mapped then.
    pub gfn: u64,
    /// Its write permission then.
    pub writable: bool,
    /// The SPTE's accessed bit (`shadow_accessed_mask`, the guest-format A bit): set when a
    /// fault installs it and when the CPU walks through it; clear in an SPTE built
    /// speculatively (`FNAME(pte_prefetch)`, `FNAME(sync_page)`'s rebuild).
    pub accessed: bool,
}

/// A level-1 shadow page (`struct kvm_mmu_page` with `role.level = 1`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct LeafSp {
    /// The guest mm and 512-page group it maps.
    pub mm: MmId,
    pub pt: PtIndex,
    /// The guest page-table page it shadows (its `sp->gfn`); `None` for a guest 2 MiB page
    /// (a direct page: nothing to sync).
    pub table: Option<PtPageId>,
    /// The SPTEs KVM built, by index.
    pub gptes: BTreeMap<u16, Shadowed>,
    /// `sp->unsync`, once KVM noticed it (see [`Machine::sp_unsync`]): set until
    /// `mmu_sync_children` syncs the page, whatever its SPTEs look like meanwhile (an INVLPG's
    /// rebuild or `kvm_mmu_get_page`'s transient sync leave it set, as the kernel does).
    pub unsync: bool,
}

/// KVM's software view of a VM's shadow page tables.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct ShadowMmu {
    /// The shadow root of each guest mm (the page for its CR3, `mmu_alloc_shadow_roots`).
    pub roots: BTreeMap<MmId, SpId>,
    /// Levels 3 and 2 by (mm, level, first page): the guest's PUD and PMD pages.
    pub uppers: BTreeMap<(MmId, u8, Vpn), SpId>,
    /// Level-1 pages.
    pub leaves: BTreeMap<SpId, LeafSp>,
    /// The level-1 page of each guest page-table page (`kvm_mmu_get_page`'s hash lookup by
    /// gfn and role), and of each guest 2 MiB page by (mm, group).
    pub by_table: BTreeMap<PtPageId, SpId>,
    pub by_huge: BTreeMap<(MmId, PtIndex), SpId>,
    /// The rmaps of the level-1 SPTEs (`slot->arch.rmap[0]`): by guest frame, every SPTE
    /// that maps it, as (page, index). The MMU notifier finds a frame's SPTEs here.
    pub rmap: BTreeMap<u64, std::collections::BTreeSet<(SpId, u16)>>,
    /// `kvm->tlbs_dirty` (`shadow_sync_flush = "tlbs_dirty"`): SPTEs syncs dropped since the
    /// last `kvm_flush_remote_tlbs()`, which zeroes it.
    pub tlbs_dirty: u64,
    /// Zapped level-1 pages not yet freed (`invalid_list`): freed once the zap's remote flush
    /// is done, within the same `mmu_lock` section.
    pub invalid: Vec<SpId>,
}

/// `KVM_MMU_NUM_PREV_ROOTS`: the roots a vCPU keeps for CR3 switches.
const KVM_MMU_NUM_PREV_ROOTS: usize = 3;

/// The TLB tag of every vCPU with shadow paging: VPID tags guest translations by VPID and
/// PCID only, not by the shadow root (and each vCPU's TLB is its own already).
pub(crate) const SHADOW_TLB_TAG: shootdown_hw::tlb::EptTag = shootdown_hw::tlb::EptTag::MAX;

/// `rmap_remove()`: SPTE `(sp, idx)` leaves the rmap of guest frame `gfn`.
pub(crate) fn remove_rmap(
    rmap: &mut BTreeMap<u64, std::collections::BTreeSet<(SpId, u16)>>,
    gfn: u64,
    sp: SpId,
    idx: u16,
) {
    if let Some(r) = rmap.get_mut(&gfn) {
        r.remove(&(sp, idx));
        if r.is_empty() {
            rmap.remove(&gfn);
        }
    }
}

/// The first page an entry of a level-`level` page covering `vpn` maps.
fn span_base(level: u8, vpn: Vpn) -> Vpn {
    let span = shootdown_hw::ept::gfns_per_entry(level) * shootdown_hw::ept::EPT_ENTRIES;
    vpn / span * span
}

impl Machine {
    /// Does vCPU `v` run on shadow paging (a VM with a modelled MMU, EPT off)?
    pub(crate) fn shadow_paging(&self, v: CpuId) -> bool {
        !self.opts.ept && self.has_kvm_mmu(v)
    }

    /// Is VM `vm`'s `mmu_lock` held, or waited for, by an agent? (A vCPU never holds it past
    /// a step with shadow paging; a host thread's MMU-notifier invalidation does.)
    pub(crate) fn shadow_lock_busy(&self, vm: usize) -> bool {
        let l = &self.kvm(vm).mmu_lock;
        l.val != 0 || !l.queue.is_empty()
    }

    /// `spin_lock(&kvm->mmu_lock)` at the start of a vCPU's one-step shadow-paging section.
    /// The section runs whole in the step, so the lock word is not written; while another
    /// agent holds or waits for the lock the explorer does not offer the step at all (the
    /// vCPU spins before it: [`Machine::shadow_step_waits`] probes a copy for this mark).
    pub(crate) fn shadow_mmu_lock(&mut self, vm: usize) {
        if self.shadow_lock_busy(vm) {
            self.perf.shadow_lock_wanted = true;
        }
    }

    /// Must action `a` of a vCPU wait for `mmu_lock` before it runs? With shadow paging, while
    /// another agent holds or waits for the lock, a step that would enter a one-step section
    /// ([`Machine::shadow_mmu_lock`]) spins first, as the kernel's vCPU does in `spin_lock`
    /// after its exit, outside the guest. Found by running `a` on a copy of the machine; a kick
    /// IPI (`HostIrq`) never waits: it exits the vCPU, which the lock holder may be waiting for.
    pub(crate) fn shadow_step_waits(&self, a: crate::machine::Action) -> bool {
        use shootdown_engine::Model;
        let v = self.agent_of(a);
        if v >= self.cpus.len()
            || matches!(a, crate::machine::Action::HostIrq(_))
            || !self.shadow_paging(v)
            || !self.shadow_lock_busy(self.vm_of(v))
        {
            return false;
        }
        let mut m = self.clone();
        m.perf.shadow_lock_wanted = false;
        let _ = m.apply(a, &mut crate::describe::NullEnv);
        m.perf.shadow_lock_wanted
    }

    /// The shadow rmaps agree with KVM's records of its level-1 SPTEs, VM by VM: every record
    /// (page, index, guest frame) is in its frame's rmap, every rmap entry has its record, and
    /// every recorded SPTE is present. The first disagreement, for tests.
    pub fn shadow_rmap_mismatch(&self) -> Option<String> {
        let h = self.host.as_ref()?;
        for (vm, k) in h.kvms.iter().enumerate() {
            let Some(k) = &**k else { continue };
            let s = &k.shadow;
            for (&sp, l) in &s.leaves {
                for (&idx, r) in &l.gptes {
                    if !s.rmap.get(&r.gfn).is_some_and(|m| m.contains(&(sp, idx))) {
                        return Some(format!(
                            "vm{vm}: page #{sp} entry {idx} (gfn {:#x}) is in no rmap",
                            r.gfn
                        ));
                    }
                    if !self.ept.spte(sp, idx).is_present() {
                        return Some(format!(
                            "vm{vm}: page #{sp} entry {idx} is recorded but not present"
                        ));
                    }
                }
            }
            for (&gfn, m) in &s.rmap {
                for &(sp, idx) in m {
                    let rec = s.leaves.get(&sp).and_then(|l| l.gptes.get(&idx));
                    if rec.map(|r| r.gfn) != Some(gfn) {
                        return Some(format!("vm{vm}: rmap of gfn {gfn:#x} holds page #{sp} entry {idx}, recorded as {rec:?}"));
                    }
                }
            }
        }
        None
    }

    /// KVM's record of level-1 page `sp`.
    pub(crate) fn leaf_sp_mut(&mut self, vm: usize, sp: SpId) -> &mut LeafSp {
        self.kvm_mut(vm)
            .shadow
            .leaves
            .get_mut(&sp)
            .expect("a level-1 shadow page")
    }

    /// Is the level-1 page `sp` unsync? A page shadowing a guest table is, as soon as a PTE
    /// it shadows differs from what KVM read (the guest's first write to the table took the
    /// write-protection fault that unsyncs it: see the module documentation), and stays so
    /// until `mmu_sync_children` syncs it. `latch`: record it (`sp->unsync = 1`).
    pub(crate) fn sp_unsync(&mut self, vm: usize, sp: SpId) -> bool {
        let l = &self.kvm(vm).shadow.leaves[&sp];
        if l.table.is_none() {
            return false;
        }
        if l.unsync {
            return true;
        }
        let space = &self.mms[l.mm as usize].space;
        let changed = l.gptes.iter().any(|(&i, s)| {
            let pte = space.pte(l.pt * PTRS_PER_PT + i as u64);
            !pte.present || pte.version != s.version
        });
        if changed {
            self.leaf_sp_mut(vm, sp).unsync = true;
            self.perf.counters.inc(Counter::KvmMmuUnsync);
        }
        changed
    }

    /// `mmu_alloc_shadow_roots()` for the guest CR3 of vCPU `v` (its mm): the root page of
    /// that role, found or allocated. Returns it.
    pub(crate) fn mmu_alloc_shadow_roots<E: Env>(&mut self, v: CpuId, env: &mut E) -> SpId {
        let vm = self.vm_of(v);
        let mm = self.cpus[v].cr3_mm;
        if let Some(&root) = self.kvm(vm).shadow.roots.get(&mm) {
            return root;
        }
        let root = self.ept.alloc(EPT_ROOT_LEVEL, 0);
        self.perf.counters.inc(Counter::KvmMmuCacheMiss);
        self.charge(env, |c| c.sp_alloc);
        self.kvm_mut(vm).shadow.roots.insert(mm, root);
        root
    }

    /// Point vCPU `v` at the shadow root of its guest CR3 (`mmu_alloc_shadow_roots`, the root
    /// loaded as the hardware's CR3). Returns it.
    fn shadow_use_root<E: Env>(&mut self, v: CpuId, env: &mut E) -> SpId {
        let root = self.mmu_alloc_shadow_roots(v, env);
        self.charge(env, |c| c.mmu_root_load);
        let pgd = (self.cpus[v].cr3_mm, self.cpus[v].cr3_pcid);
        let vc = &mut self.host_mut().vcpus[v];
        vc.root = Some(root);
        vc.shadow_pgd = Some(pgd);
        self.cpus[v].tlb.set_ept_tag(SHADOW_TLB_TAG);
        root
    }

    /// `kvm_mmu_load()` with shadow paging, one `mmu_lock` section: the root of the guest's
    /// CR3, `kvm_mmu_sync_roots`, and `tlb_flush_current` (INVVPID). Returns the root and how
    /// many unsync pages it synced.
    pub(crate) fn kvm_mmu_load_shadow<E: Env>(&mut self, v: CpuId, env: &mut E) -> (SpId, u64) {
        self.shadow_mmu_lock(self.vm_of(v));
        let root = self.shadow_use_root(v, env);
        let synced = self.kvm_mmu_sync_roots(v, env);
        self.cpus[v].tlb.flush_all();
        self.charge(env, |c| c.invvpid_single);
        (root, synced)
    }

    /// The level-2 shadow page covering `vpn` under `root` (mm `mm`), allocating and linking
    /// the levels 3 and 2 it needs (`FNAME(fetch)`'s walk over the upper levels, whose guest
    /// tables the model never changes).
    pub(crate) fn shadow_pmd_page<E: Env>(
        &mut self,
        vm: usize,
        mm: MmId,
        root: SpId,
        vpn: Vpn,
        env: &mut E,
    ) -> SpId {
        let mut parent = root;
        for level in [3u8, 2] {
            let idx = ept_index(level + 1, vpn);
            if let SpteKind::Table(child) = self.ept.spte(parent, idx).kind {
                parent = child;
                continue;
            }
            let key = (mm, level, span_base(level, vpn));
            let child = match self.kvm(vm).shadow.uppers.get(&key) {
                Some(&c) => c,
                None => {
                    let c = self.ept.alloc(level, vpn);
                    self.perf.counters.inc(Counter::KvmMmuCacheMiss);
                    self.charge(env, |c| c.sp_alloc);
                    self.kvm_mut(vm).shadow.uppers.insert(key, c);
                    c
                }
            };
            let e = self.oracle.tick();
            self.ept.set(parent, idx, SpteKind::Table(child), e);
            parent = child;
        }
        parent
    }

    /// `kvm_mmu_get_page(vcpu, gfn of guest table `table`, level 1, direct = 0)` (or, for a
    /// guest 2 MiB page, the direct level-1 page of its group): the page from the hash, or a
    /// new one (`account_shadowed`: the guest table is write-tracked from now on). A page found
    /// unsync is synced first (`kvm_sync_page`), as the kernel does before linking it, with a
    /// flush of the vCPU's TLB (`KVM_REQ_TLB_FLUSH_CURRENT`). Returns it.
    pub(crate) fn shadow_get_page<E: Env>(
        &mut self,
        v: CpuId,
        mm: MmId,
        pt: PtIndex,
        table: Option<PtPageId>,
        env: &mut E,
    ) -> SpId {
        let vm = self.vm_of(v);
        let found = {
            let s = &self.kvm(vm).shadow;
            match table {
                Some(t) => s.by_table.get(&t).copied(),
                None => s.by_huge.get(&(mm, pt)).copied(),
            }
        };
        if let Some(sp) = found {
            if !self.sp_unsync(vm, sp) {
                return sp;
            }
            let (flush, zapped) = self.kvm_sync_page(vm, sp, env);
            if flush {
                self.kvm_shadow_flush_remote_tlbs(vm, env);
            }
            if !zapped {
                self.cpus[v].tlb.flush_all();
                self.charge(env, |c| c.invvpid_single);
                self.say(|| {
                    format!("kvm_mmu_get_page: shadow page #{sp} is unsync: kvm_sync_page; KVM_REQ_TLB_FLUSH_CURRENT")
                });
                return sp;
            }
            // Zapped: the kernel breaks out of the hash walk to build the page anew.
            self.free_zapped_shadow_pages(vm);
            self.say(|| {
                format!("kvm_mmu_get_page: shadow page #{sp} is unsync; kvm_sync_page left it empty: zapped, a new page is built")
            });
        }
        let sp = self.ept.alloc(1, pt * PTRS_PER_PT);
        self.perf.counters.inc(Counter::KvmMmuCacheMiss);
        self.perf.counters.inc(Counter::KvmShadowPages);
        self.charge(env, |c| c.sp_alloc);
        let s = &mut self.kvm_mut(vm).shadow;
        s.leaves.insert(
            sp,
            LeafSp {
                mm,
                pt,
                table,
                gptes: BTreeMap::new(),
                unsync: false,
            },
        );
        match table {
            Some(t) => s.by_table.insert(t, sp),
            None => s.by_huge.insert((mm, pt), sp),
        };
        sp
    }

    /// `kvm_mmu_sync_roots(vcpu)` (`KVM_REQ_MMU_SYNC`, a CR3 load that flushes, and a guest
    /// TLB flush since b53e84eed08b): `mmu_sync_children()` of the root — every unsync
    /// level-1 page linked under it is write-protected again and synced (`kvm_sync_page` →
    /// `FNAME(sync_page)`), and if a sync dropped or reduced an SPTE, `kvm_flush_remote_tlbs`.
    /// Returns how many pages it synced.
    pub(crate) fn kvm_mmu_sync_roots<E: Env>(&mut self, v: CpuId, env: &mut E) -> u64 {
        let vm = self.vm_of(v);
        self.shadow_mmu_lock(vm);
        let Some(root) = self.host_ref().vcpus[v].root else {
            return 0;
        };
        let linked: Vec<SpId> = self
            .kvm(vm)
            .shadow
            .leaves
            .keys()
            .copied()
            .filter(|&sp| self.linked_under(sp, root))
            .collect();
        let unsync: Vec<SpId> = linked
            .into_iter()
            .filter(|&sp| self.sp_unsync(vm, sp))
            .collect();
        let mut flush = false;
        for &sp in &unsync {
            // kvm_unlink_unsync_page(): synced, write-protected again (or zapped).
            let (f, zapped) = self.kvm_sync_page(vm, sp, env);
            flush |= f;
            if !zapped {
                self.leaf_sp_mut(vm, sp).unsync = false;
            }
        }
        if flush {
            self.kvm_shadow_flush_remote_tlbs(vm, env);
        }
        self.free_zapped_shadow_pages(vm);
        self.perf
            .counters
            .add(Counter::KvmSyncPage, unsync.len() as u64);
        unsync.len() as u64
    }

    /// `kvm_sync_page(vcpu, sp, invalid_list)` (v5.10–v5.15): `FNAME(sync_page)`, and a page
    /// it leaves with no SPTE is zapped (`kvm_mmu_prepare_zap_page`; its commit flushes every
    /// vCPU before the page is freed, [`Machine::free_zapped_shadow_pages`]). Returns the flush
    /// owed (a zap owes one) and whether the page was zapped.
    pub(crate) fn kvm_sync_page<E: Env>(
        &mut self,
        vm: usize,
        sp: SpId,
        env: &mut E,
    ) -> (bool, bool) {
        let (flush, present) = self.fname_sync_page(vm, sp, env);
        if present > 0 {
            return (flush, false);
        }
        self.shadow_prepare_zap_leaf_page(vm, sp, env);
        self.perf.counters.inc(Counter::KvmSyncZap);
        self.say(|| format!("kvm_sync_page: shadow page #{sp} has no SPTE left: kvm_mmu_prepare_zap_page (unlinked; freed after the remote flush)"));
        (true, true)
    }

    /// `kvm_mmu_prepare_zap_page()` of level-1 page `sp`: its SPTEs dropped, its parent's
    /// entry cleared, KVM's records of it gone (`unaccount_shadowed`: its guest table is no
    /// longer write-tracked), the page kept on `invalid_list` until the caller has flushed.
    fn shadow_prepare_zap_leaf_page<E: Env>(&mut self, vm: usize, sp: SpId, env: &mut E) {
        let idxs: Vec<u16> = self.kvm(vm).shadow.leaves[&sp]
            .gptes
            .keys()
            .copied()
            .collect();
        for idx in idxs {
            self.shadow_drop_leaf(vm, sp, idx, env);
        }
        if let Some((parent, pidx)) = self.ept.page(sp).parent {
            let e = self.oracle.tick();
            self.ept.set(parent, pidx, SpteKind::None, e);
        }
        let s = &mut self.kvm_mut(vm).shadow;
        let l = s.leaves.remove(&sp).expect("a level-1 shadow page");
        match l.table {
            Some(t) => s.by_table.remove(&t),
            None => s.by_huge.remove(&(l.mm, l.pt)),
        };
        s.invalid.push(sp);
        self.charge(env, |c| c.spte_zap);
    }

    /// `kvm_mmu_commit_zap_page()`'s free, after its `kvm_flush_remote_tlbs()`: the pages
    /// zapped since are freed.
    pub(crate) fn free_zapped_shadow_pages(&mut self, vm: usize) {
        for sp in std::mem::take(&mut self.kvm_mut(vm).shadow.invalid) {
            self.ept.free(sp);
        }
    }

    /// Is shadow page `sp` linked, through its parents, under `root`?
    pub(crate) fn linked_under(&self, mut sp: SpId, root: SpId) -> bool {
        loop {
            if sp == root {
                return true;
            }
            match self.ept.page(sp).parent {
                Some((p, _)) => sp = p,
                None => return false,
            }
        }
    }

    /// The guest wrote PMD entry `pt` of mm `mm` (linked or unlinked a page-table page, or
    /// changed a 2 MiB leaf): the write-protection fault on the shadowed PMD page, emulated
    /// (`kvm_mmu_pte_write`): the entry's SPTE in every shadow root of the mm is zapped
    /// (`mmu_page_zap_pte`: the child page is unlinked, not freed), and since it was present,
    /// `kvm_flush_remote_tlbs` (`need_remote_flush`). Nothing to do without shadow paging.
    pub(crate) fn kvm_shadow_pmd_written<E: Env>(&mut self, mm: MmId, pt: PtIndex, env: &mut E) {
        if self.opts.ept || !self.has_any_kvm_mmu() {
            return;
        }
        let vpn = pt * PTRS_PER_PT;
        let vms: Vec<usize> = (0..self.host_ref().kvms.len())
            .filter(|&vm| self.host_ref().kvms[vm].is_some())
            .collect();
        for vm in vms {
            let Some(&pmd) = self.kvm(vm).shadow.uppers.get(&(mm, 2, span_base(2, vpn))) else {
                continue;
            };
            self.shadow_mmu_lock(vm);
            // The PMD page is write-tracked: the write exits and is emulated. With no SPTE for
            // the entry, the kernel's local flush request finds nothing of it to flush.
            self.vm_exit(env);
            self.perf.counters.inc(Counter::KvmMmuPteWrite);
            let idx = ept_index(2, vpn);
            let SpteKind::Table(child) = self.ept.spte(pmd, idx).kind else {
                continue;
            };
            let e = self.oracle.tick();
            self.ept.set(pmd, idx, SpteKind::None, e);
            // A guest 2 MiB page's direct page is not found again: the kernel's hash would
            // find it for the same frame and role, whose SPTEs map the same frames; the model
            // builds a new one, so that its records are of the new PMD entry.
            if self
                .kvm(vm)
                .shadow
                .leaves
                .get(&child)
                .is_some_and(|l| l.table.is_none())
            {
                self.kvm_mut(vm).shadow.by_huge.remove(&(mm, pt));
            }
            self.charge(env, |c| c.spte_zap);
            self.say(|| {
                format!("guest PMD write (mm{mm} pages {vpn:#x}+512): write-protected: kvm_mmu_pte_write zaps the shadow PMD entry; kvm_flush_remote_tlbs")
            });
            self.kvm_shadow_flush_remote_tlbs(vm, env);
        }
    }

    /// `kvm_unmap_hva_range()` with shadow paging, under the notifier's `mmu_lock`:
    /// `kvm_unmap_rmapp` of each guest frame in `[start, end)` — every SPTE its rmap holds is
    /// dropped. Returns how many (the flush the caller owes if any).
    pub(crate) fn shadow_unmap_gfn_range<E: Env>(
        &mut self,
        vm: usize,
        start: u64,
        end: u64,
        env: &mut E,
    ) -> u64 {
        let sptes: Vec<(SpId, u16)> = self
            .kvm(vm)
            .shadow
            .rmap
            .range(start..end)
            .flat_map(|(_, r)| r.iter().copied())
            .collect();
        let mut n = 0;
        for (sp, idx) in sptes {
            n += u64::from(self.shadow_drop_leaf(vm, sp, idx, env));
        }
        n
    }

    /// `kvm_flush_remote_tlbs(kvm)` from a shadow-paging `mmu_lock` section, in one step: every
    /// vCPU of the VM loses its guest translations (the request, the kicks and the wait for
    /// guest mode to be left are not modelled separately).
    pub(crate) fn kvm_shadow_flush_remote_tlbs<E: Env>(&mut self, vm: usize, env: &mut E) {
        let begin = self.oracle.flush_begin();
        for c in self.kvm(vm).vcpus.clone() {
            self.cpus[c].tlb.flush_all();
        }
        self.oracle.ept_flush_returned(vm, begin);
        // The cmpxchg of the count read before the request: nothing syncs meanwhile here.
        self.kvm_mut(vm).shadow.tlbs_dirty = 0;
        self.perf.counters.inc(Counter::KvmRemoteTlbFlush);
        self.charge(env, |c| c.invvpid_single);
    }
}

impl Machine {
    /// A guest CR3 load on vCPU `v` with shadow paging (CR3-load exiting: `handle_cr` →
    /// `kvm_set_cr3`, v5.15), after the CPU-side effect the caller modelled (CR3 now names
    /// the new mm and PCID). A new CR3 goes through `kvm_mmu_new_pgd`: `fast_pgd_switch` keeps
    /// the current root among `prev_roots` and reuses a cached root of the new CR3 as it is
    /// (no sync: its unsync pages stay unsync, which the guest allows until it flushes);
    /// without one the root is freed and `kvm_mmu_load` gets the new CR3's (found in the
    /// hash), syncs it and flushes. Unless NOFLUSH (`flush`), `kvm_invalidate_pcid` then raises
    /// `KVM_REQ_MMU_SYNC` and `KVM_REQ_TLB_FLUSH_CURRENT` (serviced before the entry:
    /// `kvm_mmu_sync_roots`, INVVPID) and frees the cached roots of that PCID (with PCIDs
    /// off, every one: every CR3 load flushes then).
    pub(crate) fn kvm_shadow_cr3_load<E: Env>(&mut self, v: CpuId, flush: bool, env: &mut E) {
        if !self.shadow_paging(v) {
            return;
        }
        self.vm_exit(env);
        let pgd = (self.cpus[v].cr3_mm, self.cpus[v].cr3_pcid);
        let cur = self.host_ref().vcpus[v].shadow_pgd;
        let mut how = String::new();
        if cur != Some(pgd) {
            let vc = &mut self.host_mut().vcpus[v];
            let hit = vc.prev_roots.iter().position(|&p| p == pgd);
            if let Some(c) = cur {
                vc.prev_roots.insert(0, c);
            }
            if let Some(i) = hit {
                vc.prev_roots.remove(i + usize::from(cur.is_some()));
            }
            vc.prev_roots.truncate(KVM_MMU_NUM_PREV_ROOTS);
            how = if hit.is_some() {
                let root = self.shadow_use_root(v, env);
                format!("fast_pgd_switch: cached root #{root}; ")
            } else {
                let (root, synced) = self.kvm_mmu_load_shadow(v, env);
                format!("no cached root: kvm_mmu_load of root #{root} ({synced} unsync page(s) synced, INVVPID); ")
            };
        }
        if !flush {
            self.say(|| format!("CR3 load (NOFLUSH): VM exit, kvm_set_cr3: {how}no flush"));
            return;
        }
        let pcid = pgd.1;
        self.host_mut().vcpus[v]
            .prev_roots
            .retain(|&(_, p)| p != pcid);
        let synced = self.kvm_mmu_sync_roots(v, env);
        self.cpus[v].tlb.flush_all();
        self.charge(env, |c| c.invvpid_single);
        self.say(|| {
            format!("CR3 load: VM exit, kvm_set_cr3: {how}kvm_invalidate_pcid: KVM_REQ_MMU_SYNC (kvm_mmu_sync_roots: {synced} unsync page(s) synced), KVM_REQ_TLB_FLUSH_CURRENT (INVVPID), cached roots of PCID {pcid} freed")
        });
    }

    /// `kvm_vcpu_flush_tlb_guest()` with shadow paging: the guest asked for its TLB to be
    /// flushed (`KVM_VCPU_FLUSH_TLB` in its steal-time area, the PV flush; or
    /// `KVM_REQ_TLB_FLUSH_GUEST`), which from the guest's side makes every change to its
    /// PTEs visible, so the unsync pages are synced first: v5.13–v5.15 unload the MMU
    /// (b53e84eed08b: the roots and every cached root go, and the next `kvm_mmu_load` syncs
    /// the current CR3's before the entry), v5.16+ `kvm_mmu_sync_roots` and
    /// `kvm_mmu_sync_prev_roots` (61b05a9fd4ae, which frees the cached roots with unsync
    /// pages). Modelled: the sync of the current root, and every cached root dropped. The
    /// `flush_tlb_guest_skips_sync` mutant (A6) is the form before b53e84eed08b: only the
    /// hardware flush. Returns a description for the step's text.
    pub(crate) fn kvm_vcpu_flush_tlb_guest_shadow<E: Env>(
        &mut self,
        v: CpuId,
        env: &mut E,
    ) -> String {
        if self.opts.mutants.flush_tlb_guest_skips_sync() {
            return "no kvm_mmu_sync_roots (before b53e84eed08b)".into();
        }
        self.host_mut().vcpus[v].prev_roots.clear();
        let synced = self.kvm_mmu_sync_roots(v, env);
        format!("kvm_mmu_unload, then kvm_mmu_load: {synced} unsync page(s) synced")
    }
}

//! Shadow pages of the direct MMU (arch/x86/kvm/mmu.c): getting one (`kvm_mmu_get_page`,
//! hash lookup or allocation), installing and dropping SPTEs (`mmu_set_spte`, `drop_spte`,
//! rmaps), zapping a page (`kvm_mmu_prepare_zap_page`: unlink its children and parents, move it
//! to an invalid list, or keep it while it is a root in use), freeing the zapped pages only
//! after a remote flush (`kvm_mmu_commit_zap_page`), and a vCPU's root (`kvm_mmu_load`,
//! `kvm_mmu_unload`).

use crate::counters::Counter;
use crate::frame::{Flow, Frame};
use crate::kvm::kvm_main::FlushRemoteTlbs;
use crate::machine::Machine;
use shootdown_engine::Env;
use shootdown_hw::ept::{gfns_per_entry, Gfn, SpId, SpteKind, EPT_ENTRIES, EPT_ROOT_LEVEL};
use shootdown_hw::tlb::ept_tag;
use shootdown_hw::CpuId;

impl Machine {
    /// `kvm_mmu_get_page(vcpu, gfn, level, direct)`: a valid page for the region of `gfn` at
    /// `level` in address space `as_id` (the role's `smm`) from the hash (`for_each_valid_sp`:
    /// skipping zapped pages, obsolete ones — a page is obsolete only after a fast invalidate,
    /// so v5.1, which dropped the test, behaves the same — and pages of another role), or a new
    /// one at the head of `active_mmu_pages`. The `sp_role_ignores_smm` mutant matches a page
    /// of either address space.
    pub(crate) fn kvm_mmu_get_page<E: Env>(
        &mut self,
        vm: usize,
        gfn: Gfn,
        level: u8,
        as_id: u8,
        env: &mut E,
    ) -> SpId {
        let span = gfns_per_entry(level) * EPT_ENTRIES;
        let base = gfn / span * span;
        let any_role = self.opts.mutants.sp_role_ignores_smm();
        let mmu = &self.kvm(vm).mmu;
        if let Some(&sp) = mmu.hash.get(&(base, level)).and_then(|v| {
            v.iter().find(|&&sp| {
                let p = &mmu.pages[&sp];
                !p.invalid && !mmu.is_obsolete(sp) && (any_role || p.as_id == as_id)
            })
        }) {
            return sp;
        }
        let sp = self.ept.alloc(level, base);
        self.perf.counters.inc(Counter::KvmMmuCacheMiss);
        self.charge(env, |c| c.sp_alloc);
        let mmu = &mut self.kvm_mut(vm).mmu;
        mmu.add_page(sp, base, level, as_id);
        mmu.active.push_front(sp);
        mmu.hash.entry((base, level)).or_default().push(sp);
        sp
    }

    /// Write SPTE `idx` of `sp` (under `mmu_lock`), keeping the rmaps and the oracle's record
    /// of zaps in step. Returns the old kind.
    pub(crate) fn set_spte(&mut self, vm: usize, sp: SpId, idx: u16, kind: SpteKind) -> SpteKind {
        let e = self.oracle.tick();
        let page = self.ept.page(sp);
        let (level, gfn) = (
            page.level,
            page.gfn + idx as u64 * gfns_per_entry(page.level),
        );
        let old = self.ept.set(sp, idx, kind, e).kind;
        let mmu = &mut self.kvm_mut(vm).mmu;
        if let SpteKind::Leaf { .. } = old {
            if let Some(r) = mmu.rmap.get_mut(&(level, gfn)) {
                r.retain(|&x| x != (sp, idx));
                if r.is_empty() {
                    mmu.rmap.remove(&(level, gfn));
                }
            }
        }
        if let SpteKind::Leaf { .. } = kind {
            mmu.rmap.entry((level, gfn)).or_default().push((sp, idx));
        }
        if matches!(old, SpteKind::Leaf { .. } | SpteKind::Table(_)) {
            mmu.last_zap = e;
        }
        self.handle_changed_spte_dirty(old, kind);
        let mmu = &mut self.kvm_mut(vm).mmu;
        if !matches!(kind, SpteKind::Mmio { .. }) {
            mmu.mmio_origin.remove(&(sp, idx));
        }
        mmu.memtype_origin.remove(&(sp, idx));
        old
    }

    /// Change a leaf's W or D bit (dirty logging's write-protect or D-bit clearing,
    /// `fast_page_fault`'s fix, a write fault's upgrade): the SPTE changes (its version
    /// advances) but maps the same frame, so nothing is zapped (no `INV-FLUSH-OWED` debt; the
    /// flush a write-protect needs is dirty logging's, `INV-DIRTYLOG`) and the rmaps and the
    /// memory-type record stay. A dirty leaf made clean hands its state to the page.
    pub(crate) fn set_spte_attrs(&mut self, sp: SpId, idx: u16, kind: SpteKind) {
        let e = self.oracle.tick();
        let old = self.ept.set(sp, idx, kind, e).kind;
        debug_assert!(
            matches!((old, kind), (SpteKind::Leaf { pfn: a, .. }, SpteKind::Leaf { pfn: b, .. }) if a == b)
        );
        self.handle_changed_spte_dirty(old, kind);
    }

    /// `drop_spte()` (a leaf) or `drop_parent_pte()` (a link: the child stays, orphaned).
    pub(crate) fn zap_spte<E: Env>(&mut self, vm: usize, sp: SpId, idx: u16, env: &mut E) {
        self.set_spte(vm, sp, idx, SpteKind::None);
        self.charge(env, |c| c.spte_zap);
    }

    /// Zap every leaf SPTE that maps guest frames `[start, end)` through the rmaps (4 KiB and
    /// 2 MiB leaves), in every address space (`kvm_handle_hva_range` walks each one's
    /// memslots). Returns how many were zapped.
    pub(crate) fn unmap_gfn_range<E: Env>(
        &mut self,
        vm: usize,
        start: Gfn,
        end: Gfn,
        env: &mut E,
    ) -> u64 {
        let heads: Vec<(u8, Gfn)> = self
            .kvm(vm)
            .mmu
            .rmap
            .keys()
            .copied()
            .filter(|&(level, g)| g < end && g + gfns_per_entry(level) > start)
            .collect();
        let mut n = 0;
        for h in heads {
            n += self.zap_rmap(vm, h, None, env);
        }
        n
    }

    /// `kvm_zap_rmapp()`: zap every leaf SPTE of one rmap head — of address space `as_id`'s
    /// pages only, if given. Returns how many. (The model keeps one rmap per level and gfn
    /// for both address spaces; the kernel's rmaps are per memslot, so a slot's walk sees only
    /// its own address space's SPTEs.)
    pub(crate) fn zap_rmap<E: Env>(
        &mut self,
        vm: usize,
        head: (u8, Gfn),
        as_id: Option<u8>,
        env: &mut E,
    ) -> u64 {
        let mmu = &self.kvm(vm).mmu;
        let sptes: Vec<(SpId, u16)> = mmu
            .rmap
            .get(&head)
            .map(|r| {
                r.iter()
                    .copied()
                    .filter(|&(sp, _)| as_id.map_or(true, |a| mmu.sp_as_id(sp) == a))
                    .collect()
            })
            .unwrap_or_default();
        for &(sp, idx) in &sptes {
            self.zap_spte(vm, sp, idx, env);
        }
        sptes.len() as u64
    }

    /// `kvm_mmu_prepare_zap_page(kvm, sp, invalid_list)`: unlink the page's children (its SPTEs)
    /// and its parent, mark it invalid; move it to `list` — or, a root still in use, to the
    /// head of `active_mmu_pages`, to be freed when its last user drops it. Returns whether a
    /// valid root was zapped (the caller then makes every vCPU reload: `kvm_reload_remote_mmus`).
    /// Agent `me` zaps; the trace shows it as the kernel's `kvm_mmu_prepare_zap_page`
    /// tracepoint (an instant on `me`'s track).
    pub(crate) fn prepare_zap_page<E: Env>(
        &mut self,
        me: usize,
        vm: usize,
        sp: SpId,
        list: &mut Vec<SpId>,
        env: &mut E,
    ) -> bool {
        self.perf.counters.inc(Counter::KvmMmuShadowZapped);
        if env.tracing() && self.traces_host(me) {
            let p = self.ept.page(sp);
            env.trace(shootdown_engine::trace::TraceEvent::Instant {
                agent: me,
                name: "kvm_mmu_prepare_zap_page",
                detail: Some(format!("sp #{sp} gfn {:#x} level {}", p.gfn, p.level)),
            });
        }
        self.charge(env, |c| c.sp_zap);
        let entries: Vec<u16> = self.ept.page(sp).entries.keys().copied().collect();
        for idx in entries {
            if self.ept.spte(sp, idx).kind != SpteKind::None {
                self.zap_spte(vm, sp, idx, env);
            }
        }
        if let Some((parent, idx)) = self.ept.page(sp).parent {
            self.zap_spte(vm, parent, idx, env);
        }
        // An NX split page is no longer tracked for recovery.
        self.unaccount_nx_huge_page(vm, sp);
        let mmu = &mut self.kvm_mut(vm).mmu;
        let p = mmu.pages.get_mut(&sp).expect("a shadow page of this VM");
        let was_valid = !p.invalid;
        p.invalid = true;
        mmu.active.retain(|&x| x != sp);
        if p.root_count == 0 {
            p.active = false;
            list.push(sp);
            false
        } else {
            mmu.active.push_front(sp);
            was_valid
        }
    }

    /// `kvm_mmu_free_page()` of a zapped page.
    fn free_shadow_page<E: Env>(&mut self, vm: usize, sp: SpId, env: &mut E) {
        self.ept.free(sp);
        self.charge(env, |c| c.sp_free);
        let mmu = &mut self.kvm_mut(vm).mmu;
        let p = mmu.pages.get_mut(&sp).expect("a shadow page of this VM");
        p.freed = true;
        let key = (p.gfn, p.level);
        if let Some(v) = mmu.hash.get_mut(&key) {
            v.retain(|&x| x != sp);
            if v.is_empty() {
                mmu.hash.remove(&key);
            }
        }
    }
}

/// `kvm_mmu_commit_zap_page(kvm, invalid_list)`: a remote flush (which waits for every vCPU to
/// leave guest mode and any lockless walk), then free the pages.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct CommitZap {
    pub pc: CommitZapPc,
    pub list: Vec<SpId>,
}

shootdown_engine::clone_by_fields!(CommitZap { pc, list });

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CommitZapPc {
    /// `kvm_flush_remote_tlbs()` (nothing if the list is empty).
    Flush,
    /// Free every page of the list.
    Free,
}

impl CommitZap {
    pub fn call(list: Vec<SpId>) -> Frame {
        Frame::CommitZap(Box::new(CommitZap {
            pc: CommitZapPc::Flush,
            list,
        }))
    }
}

/// `kvm_mmu_load(vcpu)` of a direct root: allocate or find it under `mmu_lock`, count the
/// vCPU as its user, point the EPTP at it and flush that EPTP's stale entries.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct MmuLoad {
    pub pc: MmuLoadPc,
    /// With the TDP MMU: where the `write_lock` is.
    pub lock: crate::kvm::mmu::rwlock::RwlockWait,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MmuLoadPc {
    /// `spin_lock(&kvm->mmu_lock)`.
    Lock,
    /// `mmu_alloc_direct_roots()`: `kvm_mmu_get_page(gfn 0, root level)`, `root_count++`,
    /// unlock; `kvm_mmu_load_cr3()` and `tlb_flush` (INVEPT single-context of the new EPTP).
    Alloc,
}

/// `kvm_mmu_unload(vcpu)` (`KVM_REQ_MMU_RELOAD`, and `kvm_mmu_reset_context` on an SMM
/// transition): drop the vCPU's root under `mmu_lock`; a root that was zapped while in use is
/// prepared for freeing and committed (flushed, freed). A TDP MMU root (`kvm_tdp_mmu_put_root`,
/// under the lock held for write as v6.6's `kvm_mmu_free_roots` takes it) only loses the
/// vCPU's reference: the model never invalidates TDP roots, so the last one is never put.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct MmuUnload {
    pub pc: MmuUnloadPc,
    /// Where the TDP MMU's `write_lock` is.
    pub lock: crate::kvm::mmu::rwlock::RwlockWait,
}

impl MmuUnload {
    pub fn call() -> Frame {
        Frame::MmuUnload(MmuUnload {
            pc: MmuUnloadPc::Lock,
            lock: Default::default(),
        })
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MmuUnloadPc {
    /// `spin_lock(&kvm->mmu_lock)`.
    Lock,
    /// `mmu_free_root_page()`: `root_count--`; the last user of a zapped root prepares it; then
    /// `kvm_mmu_commit_zap_page()`.
    Free,
    /// `spin_unlock`.
    Unlock,
}

impl Machine {
    /// One step of `kvm_mmu_commit_zap_page()`.
    pub(crate) fn commit_zap_step<E: Env>(
        &mut self,
        me: usize,
        s: &mut CommitZap,
        env: &mut E,
    ) -> Flow {
        match s.pc {
            CommitZapPc::Flush => {
                if s.list.is_empty() {
                    self.summary(|| "nothing zapped: nothing to flush or free".into());
                    return Flow::Return;
                }
                s.pc = CommitZapPc::Free;
                let n = s.list.len();
                self.summary(|| format!("kvm_mmu_commit_zap_page: {n} page(s): flush first"));
                Flow::Call(FlushRemoteTlbs::call())
            }
            CommitZapPc::Free => {
                let vm = self.vm_of(me);
                for sp in std::mem::take(&mut s.list) {
                    self.free_shadow_page(vm, sp, env);
                }
                self.summary(|| "free the zapped shadow pages".into());
                Flow::Return
            }
        }
    }

    /// One step of `kvm_mmu_load()` for vCPU `v`.
    pub(crate) fn mmu_load_step<E: Env>(&mut self, v: CpuId, s: &mut MmuLoad, env: &mut E) -> Flow {
        match s.pc {
            MmuLoadPc::Lock if !self.opts.ept => {
                // Shadow paging, one mmu_lock section (`shadow.rs`): mmu_alloc_shadow_roots()
                // for the guest's CR3, kvm_mmu_sync_roots(), the CR3 write and a VPID flush.
                let (root, synced) = self.kvm_mmu_load_shadow(v, env);
                let mm = self.cpus[v].cr3_mm;
                self.say(|| {
                    format!("kvm_mmu_load: shadow root #{root} for the guest's CR3 (mm{mm}); kvm_mmu_sync_roots: {synced} unsync page(s) synced; INVVPID")
                });
                Flow::Return
            }
            MmuLoadPc::Lock => {
                let spin = self.kvm_mmu_lock(v, &mut s.lock, false, env);
                if let Some(spin) = spin {
                    return spin;
                }
                s.pc = MmuLoadPc::Alloc;
                Flow::Next
            }
            MmuLoadPc::Alloc => {
                // mmu_alloc_direct_roots(): the TDP MMU's root of the address space
                // (kvm_tdp_mmu_get_vcpu_root_hpa), or the legacy MMU's direct root page.
                let vm = self.vm_of(v);
                // The root of the vCPU's role: address space 1's in SMM.
                let tdp = self.opts.tdp_mmu;
                let as_id = self.vcpu_as_id(v) as u8;
                let root = if tdp {
                    self.kvm_tdp_mmu_get_vcpu_root(vm, as_id, env)
                } else {
                    let root = self.kvm_mmu_get_page(vm, 0, EPT_ROOT_LEVEL, as_id, env);
                    self.kvm_mut(vm)
                        .mmu
                        .pages
                        .get_mut(&root)
                        .expect("root")
                        .root_count += 1;
                    root
                };
                self.charge(env, |c| c.mmu_root_load);
                if tdp {
                    self.mmu_write_unlock(v, env);
                } else {
                    self.mmu_lock_release(v, env);
                }
                self.host_mut().vcpus[v].root = Some(root);
                self.cpus[v].tlb.set_ept_tag(ept_tag(root));
                self.invept_single(v, root, env);
                let (kind, unlock) = if tdp {
                    ("TDP MMU ", "write_unlock")
                } else {
                    ("", "unlock")
                };
                let role = if as_id == 1 { "SMM " } else { "" };
                self.say(|| {
                    format!("{role}{kind}root = EPT page #{root}, {unlock}; INVEPT single-context of the new EPTP")
                });
                Flow::Return
            }
        }
    }

    /// One step of `kvm_mmu_unload()` for vCPU `v`.
    pub(crate) fn mmu_unload_step<E: Env>(
        &mut self,
        v: CpuId,
        s: &mut MmuUnload,
        env: &mut E,
    ) -> Flow {
        let tdp = self.opts.tdp_mmu;
        match s.pc {
            MmuUnloadPc::Lock => {
                if self.host_ref().vcpus[v].root.is_none() {
                    return Flow::Return;
                }
                let spin = if tdp {
                    self.mmu_write_lock(v, &mut s.lock, env)
                } else {
                    self.mmu_lock_acquire(v, env)
                };
                if let Some(spin) = spin {
                    return spin;
                }
                s.pc = MmuUnloadPc::Free;
                Flow::Next
            }
            MmuUnloadPc::Free if tdp => {
                let vm = self.vm_of(v);
                let root = self.host_mut().vcpus[v].root.take().expect("a root");
                if let Some(r) = self.kvm_mut(vm).tdp_roots.iter_mut().find(|r| r.sp == root) {
                    r.refcount = r.refcount.saturating_sub(1);
                }
                self.say(|| format!("kvm_tdp_mmu_put_root(EPT page #{root})"));
                s.pc = MmuUnloadPc::Unlock;
                Flow::Next
            }
            MmuUnloadPc::Free => {
                let vm = self.vm_of(v);
                let root = self.host_mut().vcpus[v].root.take().expect("a root");
                let p = self.kvm_mut(vm).mmu.pages.get_mut(&root).expect("root");
                p.root_count -= 1;
                let last_of_zapped = p.root_count == 0 && p.invalid;
                let mut list = Vec::new();
                if last_of_zapped {
                    self.kvm_mut(vm).mmu.active.retain(|&x| x != root);
                    let p = self.kvm_mut(vm).mmu.pages.get_mut(&root).expect("root");
                    p.active = false;
                    list.push(root);
                }
                self.say(|| {
                    format!(
                        "drop root EPT page #{root}{}",
                        if last_of_zapped {
                            " (last user of a zapped root: free it)"
                        } else {
                            ""
                        }
                    )
                });
                s.pc = MmuUnloadPc::Unlock;
                Flow::Call(CommitZap::call(list))
            }
            MmuUnloadPc::Unlock => {
                if tdp {
                    self.mmu_write_unlock(v, env);
                } else {
                    self.mmu_lock_release(v, env);
                }
                let unlock = if tdp {
                    "write_unlock(&kvm->mmu_lock)"
                } else {
                    "spin_unlock(&kvm->mmu_lock)"
                };
                self.say(|| unlock.into());
                Flow::Return
            }
        }
    }

    /// `vmx_flush_tlb()` with EPT for vCPU `v` running on `root`: INVEPT single-context of its
    /// EPTP (v5.x `KVM_REQ_TLB_FLUSH` and every root load).
    pub(crate) fn invept_single<E: Env>(&mut self, v: CpuId, root: SpId, env: &mut E) {
        self.cpus[v].tlb.invept_single(ept_tag(root));
        self.perf.counters.inc(Counter::KvmTlbFlush);
        self.charge(env, |c| c.invept);
    }

    /// `kvm_vcpu_flush_tlb_all()` in mainline: INVEPT all-context.
    pub(crate) fn invept_global<E: Env>(&mut self, v: CpuId, env: &mut E) {
        self.cpus[v].tlb.invept_global();
        self.perf.counters.inc(Counter::KvmTlbFlush);
        self.charge(env, |c| c.invept);
    }
}

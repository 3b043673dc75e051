//! The fault paths of the direct MMU (arch/x86/kvm/mmu.c, v5.x): an EPT violation goes to
//! `tdp_page_fault` (memslot lookup under SRCU, `mmu_notifier_seq` snapshot, `mmu_lock`, the
//! retry check, `__direct_map` installing 4 KiB or 2 MiB leaves — or, for a frame no memslot
//! covers, an MMIO SPTE and an entry in the per-vCPU MMIO cache); an EPT misconfiguration (an
//! MMIO SPTE) goes to `handle_mmio_page_fault` (the MMIO cache, a lockless walk,
//! `check_mmio_spte`) and falls back to `tdp_page_fault` when the SPTE is stale
//! (docs/design/kernel-model.md §4.4; docs/design/kvm-mmu-seeds.md §1.2).
//!
//! (`fast_page_fault`, which runs first for some faults, is `fast_pf.rs`.)
//!
//! Simplifications: no async page faults, gfn-to-pfn is one step (a
//! memslot lookup; no GUP), no write tracking, the RO-slot write path (`KVM_PFN_ERR_RO_FAULT`)
//! is an emulated write.

use crate::counters::Counter;
use crate::frame::{Flow, Frame};
use crate::kvm::kvm_main::{gen_text, FlushRemoteTlbs};
use crate::kvm::memslot::GEN_UPDATE_IN_PROGRESS;
use crate::kvm::mmu::spte::{check_mmio_spte, mmio_spte_gen};
use crate::kvm::{mode, MmioCache};
use crate::machine::Machine;
use crate::mem::Loc;
use crate::options::KvmVersion;
use crate::state::Access;
use shootdown_engine::{Env, Violation};
use shootdown_hw::ept::{
    ept_index, gfns_per_entry, EptWalk, Gfn, SpteKind, EPT_ROOT_LEVEL, MT_WB_IPAT,
};
use shootdown_hw::CpuId;

/// What the fault found behind the guest frame (`try_async_pf` → `__gfn_to_pfn_memslot`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FaultTarget {
    /// No memslot, or one being deleted (`KVM_PFN_NOSLOT`): an MMIO SPTE.
    NoSlot,
    /// RAM: host frame `pfn` of the faulting frame, mapped at `level` (2 = a 2 MiB leaf the
    /// slot covers whole on huge host pages).
    Ram { pfn: u64, writable: bool, level: u8 },
    /// A write to a read-only slot (`KVM_PFN_ERR_RO_FAULT`): emulated, nothing mapped.
    RomWrite,
}

/// An access KVM emulates instead of letting the guest retry it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Emulation {
    /// MMIO (a `KVM_EXIT_MMIO` to the VMM) of `gfn`, decided from memslot-set version
    /// `derived` (oracle).
    Mmio { gfn: Gfn, derived: u64 },
    /// A write to a ROM slot, dropped by the VMM.
    RomWrite { gfn: Gfn },
    /// The fault failed with -ENOMEM (`alloc_fail`): `KVM_RUN` returns it to the VMM, which
    /// calls `KVM_RUN` again (QEMU would stop the VM instead; the model's VMM treats it as
    /// transient, so that what follows the failure is explored).
    RunFailed,
}

/// `tdp_page_fault(vcpu, gpa, error_code)`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TdpPageFault {
    pub pc: TdpPageFaultPc,
    pub gfn: Gfn,
    pub write: bool,
    /// An instruction fetch (`fault->exec`).
    pub exec: bool,
    /// `mmu_seq = kvm->mmu_notifier_seq` before the lookup.
    pub mmu_seq: u64,
    pub target: FaultTarget,
    /// Oracle: the memslot-set version the lookup used.
    pub derived: u64,
}

/// The steps of `tdp_page_fault()`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TdpPageFaultPc {
    /// Snapshot `mmu_notifier_seq`, look the frame up in the memslots (`try_async_pf`, under
    /// SRCU).
    Lookup,
    /// `handle_abnormal_pfn()`: for a frame without a slot, `vcpu_cache_mmio_info()` (which
    /// reads the memslots' generation afresh).
    CacheMmio,
    /// `spin_lock(&kvm->mmu_lock)`.
    Lock,
    /// `mmu_notifier_retry()`; `__direct_map()`; `spin_unlock` — unless the map replaced a
    /// present SPTE, which `mmu_set_spte()`/`drop_large_spte()` flush for first.
    Map,
    /// `kvm_flush_remote_tlbs()` done for a replaced SPTE: `spin_unlock(&kvm->mmu_lock)`.
    Unlock,
}

impl TdpPageFault {
    pub fn call(gfn: Gfn, access: Access) -> Frame {
        Frame::TdpPageFault(Box::new(TdpPageFault {
            pc: TdpPageFaultPc::Lookup,
            gfn,
            write: access.is_write(),
            exec: access.is_fetch(),
            mmu_seq: 0,
            target: FaultTarget::NoSlot,
            derived: 0,
        }))
    }
}

/// `handle_mmio_page_fault(vcpu, addr, direct)` (an EPT misconfiguration).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct MmioPageFault {
    pub pc: MmioPageFaultPc,
    pub gfn: Gfn,
    /// The MMIO SPTE the lockless walk found: its generation and (oracle) derivation.
    pub found: Option<(u64, u64)>,
}

/// The steps of `handle_mmio_page_fault()`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MmioPageFaultPc {
    /// `mmio_info_in_cache()`.
    Cache,
    /// `walk_shadow_page_lockless_begin()` (interrupts off, `vcpu->mode =
    /// READING_SHADOW_PAGE_TABLES` with a full barrier) and the walk.
    Walk,
    /// `walk_shadow_page_lockless_end()`.
    WalkEnd,
    /// `check_mmio_spte()`: emulate, or fall back to the page-fault path.
    Check,
    /// Back from the page-fault path: return.
    Done,
}

impl MmioPageFault {
    pub fn call(gfn: Gfn) -> Frame {
        Frame::MmioPageFault(MmioPageFault {
            pc: MmioPageFaultPc::Cache,
            gfn,
            found: None,
        })
    }
}

impl Machine {
    /// `mmu_topup_memory_caches()` at the start of vCPU `v`'s page fault: fails (-ENOMEM) on
    /// the vCPU's first attempt if `alloc_fail` names it; then the fault returns the error
    /// with nothing changed (the caches are filled before `mmu_lock` so that nothing under it
    /// can fail).
    pub(crate) fn mmu_topup_memory_caches_fails(&mut self, v: CpuId) -> bool {
        if !self.mmu_topup_failure_pending(v) {
            return false;
        }
        self.host_mut().vcpus[v].alloc_failed = true;
        self.perf.counters.inc(Counter::KvmAllocFailures);
        true
    }

    /// The fault of vCPU `v` returns -ENOMEM (saying `what`): `KVM_RUN` returns it to the VMM.
    pub(crate) fn fault_returns_enomem(&mut self, v: CpuId, what: impl FnOnce() -> String) -> Flow {
        self.host_mut().vcpus[v].emulate = Some(Emulation::RunFailed);
        self.say(what);
        Flow::Return
    }

    /// Would vCPU `v`'s next `mmu_topup_memory_caches()` fail?
    pub(crate) fn mmu_topup_failure_pending(&self, v: CpuId) -> bool {
        use crate::options::AllocSite;
        let idx = v - self.kvm(self.vm_of(v)).vcpus.start;
        self.opts
            .alloc_fail
            .fails(AllocSite::MmuTopupMemoryCaches, idx)
            && !self.host_ref().vcpus[v].alloc_failed
    }

    /// `__kvm_memslots(kvm, as_id)->generation` as agent `me` reads it now.
    pub(crate) fn load_memslots_gen<E: Env>(
        &mut self,
        me: usize,
        as_id: usize,
        env: &mut E,
    ) -> u64 {
        let vm = self.vm_of(me) as u32;
        let a = as_id as u32;
        let set = self.load(env, me, Loc::Memslots(vm, a)) as u8;
        self.load(env, me, Loc::SlotsGen(vm, a, set))
    }

    /// The address space whose memslots vCPU `v`'s fault looks up: its own
    /// (`kvm_vcpu_gfn_to_memslot`), or 0 with the `smm_fault_uses_as0` mutant
    /// (`gfn_to_memslot(vcpu->kvm, gfn)`).
    pub(crate) fn fault_as_id(&self, v: CpuId) -> usize {
        if self.opts.mutants.smm_fault_uses_as0() {
            0
        } else {
            self.vcpu_as_id(v)
        }
    }

    /// `vcpu_cache_mmio_info(vcpu, gva, gfn, access)`: remember that `gfn` is MMIO under the
    /// current generation — unless an update is in progress (v5.1+; the K7 mutant and v5.0
    /// cache anyway, with the in-progress generation). The generation is address space 0's
    /// (`kvm_memslots(vcpu->kvm)`) whatever the vCPU's, as in the kernel (`smm.rs`).
    fn vcpu_cache_mmio_info<E: Env>(&mut self, v: CpuId, gfn: Gfn, derived: u64, env: &mut E) {
        let gen = self.load_memslots_gen(v, 0, env);
        let in_progress = match self.opts.kvm {
            KvmVersion::V5_0 => false,
            _ => gen & GEN_UPDATE_IN_PROGRESS != 0 && !self.opts.mutants.mmio_cache_in_progress(),
        };
        if in_progress {
            self.say(|| "memslots in flux: MMIO info not cached".into());
            return;
        }
        self.host_mut().vcpus[v].mmio = Some(MmioCache { gfn, gen, derived });
        self.say(|| format!("vcpu_cache_mmio_info(gfn {gfn:#x}, gen {})", gen_text(gen)));
    }

    /// One step of `tdp_page_fault()` on vCPU `v`.
    pub(crate) fn tdp_page_fault_step<E: Env>(
        &mut self,
        v: CpuId,
        s: &mut TdpPageFault,
        env: &mut E,
    ) -> Flow {
        use TdpPageFaultPc::*;
        let vm = self.vm_of(v);
        let gfn = s.gfn;
        match s.pc {
            Lookup => {
                self.perf.counters.inc(Counter::KvmEptViolations);
                self.charge(env, |c| c.ept_violation);
                if self.mmu_topup_memory_caches_fails(v) {
                    return self.fault_returns_enomem(v, || {
                        format!("tdp_page_fault(gfn {gfn:#x}): mmu_topup_memory_caches: -ENOMEM")
                    });
                }
                s.mmu_seq = self.load(env, v, Loc::MmuNotifierSeq(vm as u32));
                let a = self.fault_as_id(v);
                let set = self.load(env, v, Loc::Memslots(vm as u32, a as u32)) as usize;
                let slots = &self.kvm(vm).address_spaces[a].sets[set];
                s.derived = slots.version;
                s.target = target_in(slots, gfn, s.write);
                let what = match s.target {
                    FaultTarget::NoSlot => "no memslot: MMIO".to_string(),
                    FaultTarget::RomWrite => "a write to a read-only memslot".to_string(),
                    FaultTarget::Ram { level, .. } => {
                        format!("RAM ({})", if level == 2 { "2 MiB" } else { "4 KiB" })
                    }
                };
                let seq = s.mmu_seq;
                self.say(|| {
                    format!("tdp_page_fault(gfn {gfn:#x}): mmu_seq = {seq}; memslot lookup: {what}")
                });
                if s.target == FaultTarget::RomWrite {
                    self.host_mut().vcpus[v].emulate = Some(Emulation::RomWrite { gfn });
                    return Flow::Return;
                }
                s.pc = if s.target == FaultTarget::NoSlot {
                    CacheMmio
                } else {
                    Lock
                };
                Flow::Next
            }
            CacheMmio => {
                self.vcpu_cache_mmio_info(v, gfn, s.derived, env);
                s.pc = Lock;
                Flow::Next
            }
            Lock => {
                if let Some(spin) = self.mmu_lock_acquire(v, env) {
                    return spin;
                }
                s.pc = Map;
                Flow::Next
            }
            Map => {
                let count = self.load(env, v, Loc::MmuNotifierCount(vm as u32));
                let seq = self.load(env, v, Loc::MmuNotifierSeq(vm as u32));
                if count != 0 || seq != s.mmu_seq {
                    self.mmu_lock_release(v, env);
                    self.perf.counters.inc(Counter::KvmFaultRetries);
                    self.say(|| {
                        format!("mmu_notifier_retry (count {count}, seq {seq}): unlock, retry the access")
                    });
                    return Flow::Return;
                }
                let (what, flush) = self.direct_map(v, s, env);
                self.charge(env, |c| c.spte_install);
                // set_spte(): a writable SPTE of a slot that logs dirty pages marks its gfn.
                if matches!(s.target, FaultTarget::Ram { writable: true, .. })
                    && !self.make_spte_leaves_mark_to_pml()
                {
                    let a = self.fault_as_id(v);
                    self.mark_page_dirty_in_slot(v, a, gfn, env);
                }
                if flush {
                    // The replaced SPTE may be cached by any vCPU: flush under the lock.
                    self.say(|| format!("__direct_map: {what}: kvm_flush_remote_tlbs"));
                    s.pc = Unlock;
                    return Flow::Call(FlushRemoteTlbs::call());
                }
                self.mmu_lock_release(v, env);
                self.say(|| format!("__direct_map: {what}; spin_unlock(&kvm->mmu_lock)"));
                self.tdp_page_fault_done(v, s);
                Flow::Return
            }
            Unlock => {
                self.mmu_lock_release(v, env);
                self.say(|| "spin_unlock(&kvm->mmu_lock)".into());
                self.tdp_page_fault_done(v, s);
                Flow::Return
            }
        }
    }

    /// `tdp_page_fault()` returns: a frame without a slot is emulated as MMIO.
    fn tdp_page_fault_done(&mut self, v: CpuId, s: &TdpPageFault) {
        if s.target == FaultTarget::NoSlot {
            self.host_mut().vcpus[v].emulate = Some(Emulation::Mmio {
                gfn: s.gfn,
                derived: s.derived,
            });
        }
    }

    /// `__direct_map()`: walk from the vCPU's root, getting and linking the missing tables, and
    /// install the leaf (or the MMIO SPTE). Returns what it did, in words, and whether it
    /// replaced a present SPTE (so the caller owes `kvm_flush_remote_tlbs()`).
    fn direct_map<E: Env>(&mut self, v: CpuId, s: &TdpPageFault, env: &mut E) -> (String, bool) {
        let vm = self.vm_of(v);
        let Some(root) = self.host_ref().vcpus[v].root else {
            return ("no root: nothing to map".into(), false);
        };
        // make_mmio_spte(): the generation of the vCPU's memslots (kvm_vcpu_memslots).
        let gen = match s.target {
            FaultTarget::NoSlot => Some(self.load_memslots_gen(v, self.vcpu_as_id(v), env)),
            _ => None,
        };
        // kvm_mmu_hugepage_adjust() / disallowed_hugepage_adjust() (`nx_huge_pages.rs`).
        let mut target = s.target;
        let mut nx = None;
        if let FaultTarget::Ram { level, .. } = &mut target {
            let (goal, f) = self.nx_hugepage_adjust(vm, root, s.gfn, *level, s.exec);
            *level = goal;
            nx = Some(f);
        }
        let Some(nx) = nx.filter(|f| f.disallowed) else {
            return self.map_gfn(vm, root, s.gfn, target, gen, s.derived, env);
        };
        let before = self.table_at_level2(root, s.gfn);
        let r = self.map_gfn(vm, root, s.gfn, target, gen, s.derived, env);
        // link_shadow_page() of the table where the huge leaf would go: account it.
        if let Some(child) = self.table_at_level2(root, s.gfn) {
            if before != Some(child) {
                self.account_nx_huge_page(vm, child, nx, 2);
            }
        }
        r
    }

    /// Map `gfn` under `root` (`__direct_map` with `mmu_lock` held): link the missing tables,
    /// install the leaf for `target` — or, without a slot, an MMIO SPTE carrying generation
    /// `gen` (derived, for the oracle, from memslot-set version `derived`). Returns what it did
    /// and whether a present SPTE was dropped or made read-only on the way, which the kernel
    /// flushes for before it drops the lock: `drop_large_spte()` (a 2 MiB leaf where a table
    /// goes), and `mmu_set_spte()` replacing a table with a leaf, a leaf of another pfn (or
    /// with an MMIO SPTE, whose pfn is `KVM_PFN_NOSLOT`), or a writable leaf with a read-only
    /// one (`mmu_spte_update()`).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn map_gfn<E: Env>(
        &mut self,
        vm: usize,
        root: shootdown_hw::ept::SpId,
        gfn: Gfn,
        target: FaultTarget,
        gen: Option<u64>,
        derived: u64,
        env: &mut E,
    ) -> (String, bool) {
        let mut sp = root;
        let mut flush = false;
        let target_level = match target {
            FaultTarget::Ram { level, .. } => level,
            _ => 1,
        };
        for level in (target_level + 1..=EPT_ROOT_LEVEL).rev() {
            let idx = ept_index(level, gfn);
            match self.ept.spte(sp, idx).kind {
                SpteKind::Table(child) => {
                    sp = child;
                    continue;
                }
                // drop_large_spte(): a 2 MiB leaf where a table is now wanted.
                SpteKind::Leaf { .. } => {
                    self.zap_spte(vm, sp, idx, env);
                    flush = !self.opts.mutants.huge_spte_split_skips_flush();
                }
                // Not shadow-present: simply overwritten by the link.
                SpteKind::Mmio { .. } => self.zap_spte(vm, sp, idx, env),
                SpteKind::None | SpteKind::Frozen(_) => {}
            }
            // The child takes the role of its parent (`kvm_mmu_child_role`): the root's.
            let as_id = self.kvm(vm).mmu.sp_as_id(root);
            let child = self.kvm_mmu_get_page(vm, gfn, level - 1, as_id, env);
            self.set_spte(vm, sp, idx, SpteKind::Table(child));
            sp = child;
        }
        let idx = ept_index(target_level, gfn);
        match target {
            FaultTarget::Ram {
                pfn,
                writable,
                level,
            } => {
                let span = gfns_per_entry(level);
                let leaf_pfn = pfn - (gfn % span);
                let kind = SpteKind::Leaf {
                    pfn: leaf_pfn,
                    writable,
                    mmu_writable: writable,
                    memtype: MT_WB_IPAT,
                    exec: self.spte_exec(level),
                    dirty: self.make_spte_dirty(writable),
                    access_tracked: false,
                };
                let old = self.ept.spte(sp, idx).kind;
                if old == kind {
                    return (
                        format!("gfn {gfn:#x} already mapped (another vCPU fixed it)"),
                        flush,
                    );
                }
                flush |= match old {
                    SpteKind::Table(_) => true,
                    SpteKind::Leaf {
                        pfn: p,
                        writable: w,
                        ..
                    } => p != leaf_pfn || (w && !writable),
                    _ => false,
                };
                match old {
                    // mmu_spte_update() of a present leaf of the same frame: W set again
                    // (a write fault after dirty logging's write-protect).
                    SpteKind::Leaf { writable: w, .. } if old.with_writable(!w) == kind => {
                        self.set_spte_attrs(sp, idx, kind)
                    }
                    _ => {
                        self.set_spte(vm, sp, idx, kind);
                    }
                }
                self.perf.counters.inc(Counter::KvmMmuPfFixed);
                let what = format!(
                    "map gfn {gfn:#x} -> pfn {leaf_pfn:#x} ({}, EPT page #{sp} entry {idx})",
                    if level == 2 { "2 MiB" } else { "4 KiB" }
                );
                (what, flush)
            }
            _ => {
                let sg = mmio_spte_gen(self.opts.kvm, gen.unwrap_or(0), self.opts.mmio_gen_bits.0);
                let old = self.set_spte(vm, sp, idx, SpteKind::Mmio { gen: sg });
                flush |= matches!(old, SpteKind::Leaf { .. } | SpteKind::Table(_));
                let mmu = &mut self.kvm_mut(vm).mmu;
                mmu.mmio_origin.insert((sp, idx), derived);
                mmu.pages.get_mut(&sp).expect("page").mmio_cached = true;
                let what = format!(
                    "MMIO SPTE for gfn {gfn:#x} with generation {sg} (EPT page #{sp} entry {idx})"
                );
                (what, flush)
            }
        }
    }

    /// What the memslots of `vm`'s address space `as_id` (the active set) say about `gfn`, as
    /// `try_async_pf` would find it.
    pub(crate) fn fault_target(
        &self,
        vm: usize,
        as_id: usize,
        gfn: Gfn,
        write: bool,
    ) -> FaultTarget {
        let slots = self.kvm(vm).address_spaces[as_id].active_set();
        target_in(slots, gfn, write)
    }

    /// One step of `handle_mmio_page_fault()` on vCPU `v`.
    pub(crate) fn mmio_page_fault_step<E: Env>(
        &mut self,
        v: CpuId,
        s: &mut MmioPageFault,
        env: &mut E,
    ) -> Flow {
        use MmioPageFaultPc::*;
        let gfn = s.gfn;
        match s.pc {
            Cache => {
                self.perf.counters.inc(Counter::KvmMmioExits);
                let cache = self.host_ref().vcpus[v].mmio;
                if let Some(c) = cache.filter(|c| c.gfn == gfn) {
                    // vcpu_match_mmio_gen(): address space 0's generation.
                    let gen = self.load_memslots_gen(v, 0, env);
                    if c.gen == gen {
                        self.say(|| {
                            format!(
                                "mmio_info_in_cache(gfn {gfn:#x}): hit (generation {}): emulate",
                                gen_text(gen)
                            )
                        });
                        self.host_mut().vcpus[v].emulate = Some(Emulation::Mmio {
                            gfn,
                            derived: c.derived,
                        });
                        return Flow::Return;
                    }
                }
                self.say(|| format!("handle_mmio_page_fault(gfn {gfn:#x}): not in the MMIO cache"));
                s.pc = Walk;
                Flow::Next
            }
            Walk => {
                self.host_mut().vcpus[v].irqs_off = true;
                self.rmw(env, v, Loc::VcpuMode(v as u32), |_| {
                    mode::READING_SHADOW_PAGE_TABLES
                });
                let vm = self.vm_of(v);
                s.found = None;
                let what = match self.host_ref().vcpus[v].root {
                    None => "no root".to_string(),
                    Some(root) => match self.ept.walk_from(root, gfn) {
                        EptWalk::FreedTable(sp) => {
                            self.violate(Violation {
                                invariant: "INV-PTFREE",
                                detail: format!(
                                    "vcpu{v}'s lockless walk of gfn {gfn:#x} went through freed EPT page #{sp}"
                                ),
                            });
                            "a freed page".to_string()
                        }
                        EptWalk::Mmio { sp, idx, spte } => {
                            let SpteKind::Mmio { gen } = spte.kind else {
                                unreachable!()
                            };
                            let derived = self.kvm(vm).mmu.mmio_origin.get(&(sp, idx)).copied();
                            s.found = Some((gen, derived.unwrap_or(0)));
                            format!("an MMIO SPTE of generation {gen}")
                        }
                        EptWalk::Leaf { .. } => "a present SPTE".to_string(),
                        EptWalk::NotPresent { .. } => "no SPTE".to_string(),
                    },
                };
                self.say(|| {
                    format!("walk_shadow_page_lockless_begin (READING_SHADOW_PAGE_TABLES): gfn {gfn:#x} has {what}")
                });
                s.pc = WalkEnd;
                Flow::Next
            }
            WalkEnd => {
                self.store(env, v, Loc::VcpuMode(v as u32), mode::OUTSIDE_GUEST_MODE);
                self.host_mut().vcpus[v].irqs_off = false;
                self.say(|| "walk_shadow_page_lockless_end (OUTSIDE_GUEST_MODE)".into());
                s.pc = Check;
                Flow::Next
            }
            Check => {
                let Some((sg, derived)) = s.found else {
                    self.summary(|| "no MMIO SPTE (zapped meanwhile): retry the access".into());
                    return Flow::Return;
                };
                // check_mmio_spte(): the generation of the vCPU's memslots.
                let gen = self.load_memslots_gen(v, self.vcpu_as_id(v), env);
                if check_mmio_spte(self.opts.kvm, gen, sg, self.opts.mmio_gen_bits.0) {
                    self.say(|| {
                        format!(
                            "check_mmio_spte: generation {} matches the SPTE's {sg}: emulate",
                            gen_text(gen)
                        )
                    });
                    self.vcpu_cache_mmio_info(v, gfn, derived, env);
                    self.host_mut().vcpus[v].emulate = Some(Emulation::Mmio { gfn, derived });
                    return Flow::Return;
                }
                self.say(|| {
                    format!(
                        "check_mmio_spte: generation {} vs the SPTE's {sg}: stale, tdp_page_fault",
                        gen_text(gen)
                    )
                });
                s.pc = Done;
                Flow::Call(TdpPageFault::call(gfn, Access::Read))
            }
            Done => Flow::Return,
        }
    }
}

/// `__gfn_to_pfn_memslot()` on a memslot set: what backs `gfn`, and at which level the fault
/// path maps it (`transparent_hugepage_adjust`: 2 MiB when the slot's host pages are huge and
/// the slot covers the whole 2 MiB region).
fn target_in(slots: &crate::kvm::memslot::MemslotSet, gfn: Gfn, write: bool) -> FaultTarget {
    match slots.lookup(gfn) {
        None => FaultTarget::NoSlot,
        Some(sl) if sl.readonly && write => FaultTarget::RomWrite,
        Some(sl) => {
            let span = gfns_per_entry(2);
            let region = gfn / span * span;
            // kvm_mmu_hugepage_adjust(): a slot that logs dirty pages is mapped 4 KiB only.
            let huge =
                sl.huge && !sl.dirty_log && sl.base_gfn <= region && region + span <= sl.end();
            FaultTarget::Ram {
                pfn: sl.pfn_of(gfn),
                writable: !sl.readonly,
                level: if huge { 2 } else { 1 },
            }
        }
    }
}

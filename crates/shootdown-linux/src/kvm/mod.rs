//! KVM: what a vCPU thread and the VMM's threads run on the host side, mirroring the kernel's
//! layout — [`kvm_main`] is virt/kvm/kvm_main.c (preempt notifiers, requests and kicks,
//! `kvm_flush_remote_tlbs`, memslot updates, SRCU, MMU notifiers), [`x86`] is
//! arch/x86/kvm/x86.c (`vcpu_run` / `vcpu_enter_guest`, steal time), [`vmx`] is
//! arch/x86/kvm/vmx (VM exit and entry, INVVPID, INVEPT), [`mmu`] is arch/x86/kvm/mmu (the EPT
//! fault path, MMIO SPTEs, shadow pages and their zapping), [`memslot`] the memslot sets, and
//! [`oracle`] the KVM invariants the oracle checks. The host that schedules the threads is
//! [`crate::host`].
//!
//! **PV TLB flush** (seed 001; docs/design/kernel-model.md §3.3–§3.5): `VcpuPut(v)` is H1+H2 (the host
//! preempts the vCPU thread: VM exit, `kvm_sched_out` → `kvm_arch_vcpu_put` →
//! `kvm_steal_time_set_preempted`); the thread then waits in `vcpu_run` ([`VcpuRun`], a frame on
//! the vCPU's host stack) and its next `Step` is H3..H7 (`vcpu_load`, `record_steal_time`
//! exchanges the byte with 0 and flushes the vCPU's guest TLB if `KVM_VCPU_FLUSH_TLB` was set,
//! then VM entry) — one atomic step, or two with the K2 mutant; `VcpuIoctl(v)` (explorer only)
//! is a `vcpu_load`+`vcpu_put` pair without entering the guest. Host accesses to the
//! steal-time byte go straight to memory: VM exits and the host's locked operations around them
//! order them; the guest side goes through the vCPU's store buffer like any guest access.
//!
//! **KVM MMU** (seed 003; docs/design/kernel-model.md §4): a VM may have its second translation stage
//! modelled ([`Kvm`]): memslots, an EPT of direct shadow pages under `mmu_lock`, and the
//! `vcpu_enter_guest` handshake with `vcpu->mode` and requests. Its guest accesses then walk
//! the EPT too; an EPT violation or misconfiguration exits to KVM, whose fault path runs as
//! frames on the vCPU's host stack.
//!
//! **TDP MMU and guest memory types** (seed 004; docs/design/kernel-model.md §4.6, §5): with `tdp_mmu` the
//! EPT is the TDP MMU's (`mmu::tdp_mmu`, `mmu_lock` a rwlock); [`mtrr`] is the guest's MTRRs and
//! the memory types they give, [`mtrr_zap`] the zaps an MTRR write or a CR0.CD toggle asks for
//! (and patch 9's serialized list), `vmx::vmx_get_mt_mask` the type baked into each leaf.

pub mod dirty_log;
pub mod hyperv;
pub mod kvm_main;
pub mod memslot;
pub mod mmu;
pub mod mtrr;
pub mod mtrr_zap;
pub mod oracle;
pub mod pml;
pub mod smm;
pub mod st_cache;
pub mod vmx;
pub mod x86;

use crate::frame::Frame;
use memslot::AddressSpace;
use mmu::KvmMmu;
use shootdown_hw::ept::{Gfn, SpId};
pub use x86::{Exit, VcpuRun, VcpuRunPc};

/// `KVM_VCPU_PREEMPTED`.
pub const KVM_VCPU_PREEMPTED: u64 = 1 << 0;
/// `KVM_VCPU_FLUSH_TLB`.
pub const KVM_VCPU_FLUSH_TLB: u64 = 1 << 1;

/// `vcpu->mode`.
pub mod mode {
    pub const OUTSIDE_GUEST_MODE: u64 = 0;
    pub const IN_GUEST_MODE: u64 = 1;
    pub const EXITING_GUEST_MODE: u64 = 2;
    pub const READING_SHADOW_PAGE_TABLES: u64 = 3;
}

/// A vCPU request (`KVM_REQ_*`): its bit in `vcpu->requests`. Both are `KVM_REQUEST_WAIT |
/// KVM_REQUEST_NO_WAKEUP`: the requester IPIs every vCPU not outside guest mode and waits for
/// it to acknowledge; blocked vCPUs are not woken (they see the bit at their next entry).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Request {
    /// `KVM_REQ_TLB_FLUSH`: flush the vCPU's TLB before it re-enters (INVEPT).
    TlbFlush = 0,
    /// `KVM_REQ_MMU_RELOAD` (v5.x; `KVM_REQ_MMU_FREE_OBSOLETE_ROOTS` in mainline): drop the
    /// root and load a new one before re-entering.
    MmuReload = 1,
    /// `KVM_REQ_TLB_FLUSH_GUEST`: flush the guest's translations (the VPID), before entry.
    TlbFlushGuest = 2,
    /// `KVM_REQ_HV_TLB_FLUSH` (v6.3+): flush what the vCPU's Hyper-V flush FIFO holds.
    HvTlbFlush = 3,
}

impl Request {
    pub fn bit(self) -> u64 {
        1 << self as u64
    }
    pub fn name(self) -> &'static str {
        match self {
            Request::TlbFlush => "KVM_REQ_TLB_FLUSH",
            Request::MmuReload => "KVM_REQ_MMU_RELOAD",
            Request::TlbFlushGuest => "KVM_REQ_TLB_FLUSH_GUEST",
            Request::HvTlbFlush => "KVM_REQ_HV_TLB_FLUSH",
        }
    }
}

/// Where a vCPU thread is, for the host scheduler.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ThreadState {
    /// Current on its pCPU: running guest code, or host code of `vcpu_run` (its host stack is
    /// not empty).
    Running,
    /// Preempted: runnable, waiting for its pCPU (or picked by the host scheduler, which runs
    /// its `vcpu_run` when the switch is done).
    Runnable,
    /// Blocked in `kvm_vcpu_block` after a HLT exit (timed driver only).
    Blocked,
}

/// The per-vCPU MMIO cache (`vcpu->arch.mmio_gfn`, `mmio_gen`; direct MMU: no gva).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MmioCache {
    pub gfn: Gfn,
    /// The memslot generation recorded with it.
    pub gen: u64,
    /// Oracle: the version of the memslot set the "no slot here" it caches was derived from.
    pub derived: u64,
}

/// One vCPU: `struct kvm_vcpu` as far as the model goes, and its thread.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct Vcpu {
    pub vm: u32,
    pub pcpu: u32,
    pub thread: ThreadState,
    /// Host-side kernel frames of the vCPU thread (`vcpu_run` …): the vCPU runs guest code only
    /// while this is empty.
    pub stack: Vec<Frame>,
    /// The host's copy of the steal-time `preempted` byte (`vcpu->arch.st.steal.preempted`,
    /// later `vcpu->arch.st.preempted`): the "already preempted" shadow, and with the K2 mutant
    /// the copy `record_steal_time` works on.
    pub st_preempted: u8,
    /// Preemptions so far (counted only under an explorer bound).
    pub preemptions: u8,
    /// `vcpu->mode` (`Loc::VcpuMode`), with a KVM MMU.
    pub mode: u64,
    /// `vcpu->requests` (`Loc::VcpuRequests`): a bit per [`Request`].
    pub requests: u64,
    /// `vcpu->arch.mmu->root_hpa`: the EPT root the vCPU runs on (`None` = `INVALID_PAGE`).
    pub root: Option<SpId>,
    /// The per-vCPU MMIO cache.
    pub mmio: Option<MmioCache>,
    /// The vCPU's SRCU read section on `kvm->srcu` (`Loc::SrcuReader`): 1 + the index it
    /// entered with (`vcpu->srcu_idx`), 0 outside one.
    pub srcu: u64,
    /// Oracle: per address space, the version of the memslot set published when the current
    /// read section began (what the section is guaranteed to see at least).
    pub srcu_sees: [u64; memslot::KVM_ADDRESS_SPACE_NUM as usize],
    /// In System Management Mode (`vcpu->arch.hflags & HF_SMM_MASK`): the vCPU's memslots are
    /// address space 1's (`kvm_arch_vcpu_memslots_id`) and its MMU role has `smm` set
    /// ([`smm`]).
    pub smm: bool,
    /// The guest frame of the vCPU's steal-time area (`MSR_KVM_STEAL_TIME`, written at boot),
    /// where the VM's memslots are modelled ([`st_cache`]); `None`: not modelled.
    pub st_gfn: Option<Gfn>,
    /// `vcpu->arch.st.cache` (a `gfn_to_pfn_cache` or `gfn_to_hva_cache`, by version).
    pub st_cache: Option<st_cache::GuestCache>,
    /// Host interrupts disabled on the vCPU thread (between `local_irq_disable` and VM entry,
    /// and in a lockless shadow-page walk): a kick IPI waits.
    pub irqs_off: bool,
    /// A host IPI (a kick from `kvm_make_all_cpus_request`) is pending on the vCPU's pCPU, from
    /// these senders (agents).
    pub kicks: Vec<u32>,
    /// Shoot4U (`shoot4u.rs`): how many of the pending host IPIs run `flush_tlb_func_shoot4u`
    /// (flush this vCPU's VPID) rather than `ack_flush`.
    pub shoot4u_flushes: u8,
    /// `vcpu->arch.hyperv->tlb_flush_fifo` (v6.3+, `hyperv.rs`): what `KVM_REQ_HV_TLB_FLUSH`
    /// flushes at the next entry.
    pub hv_tlb_flush_fifo: Vec<hyperv::HvFlushEntry>,
    /// What the fault paths left for `vcpu_run` to emulate.
    pub emulate: Option<mmu::fault::Emulation>,
    /// The guest's MTRRs (`vcpu->arch.mtrr_state`; all zero at reset: disabled).
    pub mtrr: mtrr::MtrrState,
    /// Guest CR0.CD (1 at reset).
    pub cr0_cd: bool,
    /// Oracle: guest frames whose memory type this vCPU's last MTRR write or CR0.CD change may
    /// have changed; checked (INV-MEMTYPE) when it next enters the guest.
    pub memtype_check: Option<(Gfn, Gfn)>,
    /// `alloc_fail`: this vCPU's one injected allocation failure has happened.
    pub alloc_failed: bool,
    /// The vCPU's PML log (`vmx->pml_pg`, `pml.rs`): gfns the CPU logged, not yet drained.
    pub pml: Vec<Gfn>,
    /// Shadow paging: the guest CR3 (its mm and PCID) the current root is for, and
    /// `mmu->prev_roots` (most recent first, at most `KVM_MMU_NUM_PREV_ROOTS`): roots a
    /// CR3 switch may reuse without a sync (`kvm/mmu/shadow.rs`).
    pub shadow_pgd: Option<(u32, u16)>,
    pub prev_roots: Vec<(u32, u16)>,
}

shootdown_engine::clone_by_fields!(Vcpu {
    vm,
    pcpu,
    thread,
    stack,
    st_preempted,
    preemptions,
    mode,
    requests,
    root,
    mmio,
    srcu,
    srcu_sees,
    smm,
    st_gfn,
    st_cache,
    irqs_off,
    kicks,
    shoot4u_flushes,
    hv_tlb_flush_fifo,
    emulate,
    mtrr,
    cr0_cd,
    memtype_check,
    alloc_failed,
    pml,
    shadow_pgd,
    prev_roots,
});

impl Vcpu {
    /// A vCPU of VM `vm` on pCPU `pcpu`, running in the guest.
    pub fn new(vm: u32, pcpu: u32) -> Vcpu {
        Vcpu {
            vm,
            pcpu,
            thread: ThreadState::Running,
            stack: Vec::new(),
            st_preempted: 0,
            preemptions: 0,
            mode: mode::IN_GUEST_MODE,
            requests: 0,
            root: None,
            mmio: None,
            srcu: 0,
            srcu_sees: [0; memslot::KVM_ADDRESS_SPACE_NUM as usize],
            smm: false,
            st_gfn: None,
            st_cache: None,
            irqs_off: false,
            kicks: Vec::new(),
            shoot4u_flushes: 0,
            hv_tlb_flush_fifo: Vec::new(),
            emulate: None,
            mtrr: mtrr::MtrrState::default(),
            cr0_cd: true,
            memtype_check: None,
            alloc_failed: false,
            pml: Vec::new(),
            shadow_pgd: None,
            prev_roots: Vec::new(),
        }
    }

    /// Running guest code: current on its pCPU with no host frame.
    pub fn in_guest(&self) -> bool {
        self.thread == ThreadState::Running && self.stack.is_empty()
    }
}

/// `struct kvm` of a VM whose MMU is modelled.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct Kvm {
    /// Memslots per address space (`kvm->memslots[as]`): the normal one, and SMM's (SMRAM
    /// over the normal map) when the VM has one ([`Kvm::enable_smm`]).
    pub address_spaces: Vec<AddressSpace>,
    /// `kvm->mmu_lock` as the v5.x spinlock (legacy MMU).
    pub mmu_lock: mmu::lock::QueuedSpinlock,
    /// `kvm->mmu_lock` as the rwlock it is with the TDP MMU.
    pub mmu_rwlock: mmu::rwlock::QueuedRwlock,
    /// `kvm->slots_lock` (a mutex serializing memslot updates): the holder agent + 1, or 0.
    pub slots_lock: u64,
    /// `kvm->srcu`'s current index (`Loc::SrcuIdx`): a grace period flips it and waits for the
    /// readers that entered with the old one.
    pub srcu_idx: u64,
    /// `kvm->mmu_notifier_seq` / `mmu_invalidate_seq` (`Loc::MmuNotifierSeq`).
    pub mmu_notifier_seq: u64,
    /// `kvm->mmu_notifier_count` / `mmu_invalidate_in_progress` (`Loc::MmuNotifierCount`).
    pub mmu_notifier_count: u64,
    /// The MMU: shadow pages, their lists and rmaps.
    pub mmu: KvmMmu,
    /// The vCPUs of the VM (CPU indices).
    pub vcpus: std::ops::Range<usize>,
    /// TDP MMU roots (`kvm->arch.tdp_mmu_roots`).
    pub tdp_roots: Vec<mmu::tdp_mmu::TdpRoot>,
    /// `mmu_invalidate_range_start` / `_end`: host virtual addresses (6.1–6.6; faults compare
    /// their `hva`), valid while `mmu_notifier_count` (`mmu_invalidate_in_progress`) is not
    /// zero.
    pub mmu_invalidate_range: (u64, u64),
    /// Patch 9: `mtrr_zap_list` (ranges, length ascending then start descending), its lock
    /// `mtrr_zap_list_lock` (`Loc::MtrrZapListLock`) and `mtrr_zapping` (`Loc::MtrrZapping`).
    pub mtrr_zap_list: Vec<mtrr::GfnRange>,
    pub mtrr_zap_list_lock: u64,
    pub mtrr_zapping: u64,
    /// `kvm_arch_has_noncoherent_dma()` (`Loc::NoncoherentDma`): a device without snoop
    /// control is assigned, so KVM honours the guest's memory types (seed 004).
    pub noncoherent_dma: bool,
    /// `tdp_mmu_max_gfn_exclusive()`: one past the largest gfn the host's physical-address
    /// width allows (2^34 with 46 bits; checker scenarios narrow it to keep walks short).
    pub max_gfn: Gfn,
    /// Oracle: memslots whose deletion has returned (the VMM may have unmapped their memory),
    /// as (address space, slot).
    pub freed_slots: Vec<(u8, memslot::Memslot)>,
    /// The dirty bitmaps of slots that log dirty pages, and the oracle's writes owed.
    pub dirty_log: dirty_log::DirtyLog,
    /// Shadow paging (EPT off): the shadow pages of the guest's page tables.
    pub shadow: mmu::shadow::ShadowMmu,
}

shootdown_engine::clone_by_fields!(Kvm {
    address_spaces,
    mmu_lock,
    mmu_rwlock,
    slots_lock,
    srcu_idx,
    mmu_notifier_seq,
    mmu_notifier_count,
    mmu,
    vcpus,
    tdp_roots,
    mmu_invalidate_range,
    mtrr_zap_list,
    mtrr_zap_list_lock,
    mtrr_zapping,
    noncoherent_dma,
    max_gfn,
    freed_slots,
    dirty_log,
    shadow,
});

impl Kvm {
    /// A VM with memslots `slots` in address space 0.
    /// `all_set`: `KVM_DIRTY_LOG_INITIALLY_SET` (the logged slots' bitmaps start all set).
    pub fn new(slots: Vec<memslot::Memslot>, vcpus: std::ops::Range<usize>, all_set: bool) -> Kvm {
        let mut dirty_log = dirty_log::DirtyLog::default();
        for sl in slots.iter().filter(|sl| sl.dirty_log) {
            dirty_log.alloc(0, sl, all_set);
        }
        Kvm {
            address_spaces: vec![AddressSpace::new(0, slots)],
            mmu_lock: Default::default(),
            mmu_rwlock: Default::default(),
            slots_lock: 0,
            srcu_idx: 0,
            mmu_notifier_seq: 0,
            mmu_notifier_count: 0,
            mmu: KvmMmu::default(),
            vcpus,
            tdp_roots: Vec::new(),
            mmu_invalidate_range: (0, 0),
            mtrr_zap_list: Vec::new(),
            mtrr_zap_list_lock: 0,
            mtrr_zapping: 0,
            noncoherent_dma: false,
            max_gfn: mmu::tdp_mmu::TDP_MMU_MAX_GFN_EXCLUSIVE,
            freed_slots: Vec::new(),
            dirty_log,
            shadow: Default::default(),
        }
    }

    /// Give the VM address space 1 (SMM) with memslots `slots` (QEMU's `smram` address space:
    /// SMRAM over an alias of the normal map). Its first generation is 1, as
    /// `kvm_create_vm` numbers each address space's.
    pub fn enable_smm(&mut self, slots: Vec<memslot::Memslot>, all_set: bool) {
        self.address_spaces.truncate(1);
        for sl in slots.iter().filter(|sl| sl.dirty_log) {
            self.dirty_log.alloc(1, sl, all_set);
        }
        self.address_spaces.push(AddressSpace::new(1, slots));
    }

    /// Does the VM have SMM's address space?
    pub fn has_smm(&self) -> bool {
        self.address_spaces.len() > 1
    }
}

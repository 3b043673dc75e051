//! Kernel call frames. Each kernel function the model runs is a frame with a program counter
//! (`pc`, an enum naming its steps) and its locals; one call of its step function executes one
//! atomic step (one shared access, one IPI, one flush…) and says what happens next ([`Flow`]).
//! Frames live on the task's kernel stack (so a task can block mid-syscall) or on the CPU's
//! interrupt stack.
//!
//! Each frame's struct and step enum live with its function, in the file of its concept
//! (`FlushMmRange` in `tlb.rs`, `SmpCallMany` in `smp.rs`, …); this file only gathers them.
//! Writing each function as explicit steps is what lets the timed driver and the explorer run
//! exactly the same protocol code.

use crate::kvm::dirty_log::GetDirtyLog;
use crate::kvm::kvm_main::{
    FlushRemoteTlbs, InstallMemslots, MakeAllCpusRequest, MmuNotifierInvalidate, SetMemoryRegion,
    SynchronizeSrcu,
};
use crate::kvm::mmu::access_track::ClearYoung;
use crate::kvm::mmu::fast_pf::FastPageFault;
use crate::kvm::mmu::fault::{MmioPageFault, TdpPageFault};
use crate::kvm::mmu::nx_huge_pages::NxRecover;
use crate::kvm::mmu::page::{CommitZap, MmuLoad, MmuUnload};
use crate::kvm::mmu::tdp_mmu::{TdpMmuPageFault, ZapGfnRange};
use crate::kvm::mmu::zap::ZapMemslot;
use crate::kvm::mtrr_zap::{MtrrZapRequest, NoncoherentDmaStart};
use crate::kvm::VcpuRun;
use crate::page_lists::{BulkPages, PageListLocked};
use crate::paravirt::PvFlushTlbMulti;
use crate::perf::{FrameHint, Peer, PeerHint};
use crate::sched::{RwSemDown, Schedule, SemId};
use crate::smp::{CallFunctionIrq, SmpCallMany};
use crate::switch_mm::SwitchMm;
use crate::syscalls::Syscall;
use crate::tlb::{FlushFunc, FlushMmRange};

/// What a step asks of its caller.
#[derive(Debug)]
pub enum Flow {
    /// The frame continues (its `pc` says where).
    Next,
    /// Call a function; the frame continues after it returns.
    Call(Frame),
    /// The function returned.
    Return,
    /// Busy-wait: nothing changed; retry when the location with this wake key changes
    /// (see `mem::spin_key`).
    Spin(u64),
    /// Halt until woken (a PV spinlock waiter in `pv_wait`, timed driver only).
    Halt,
}

/// Which CPUs a cross call runs `func` on (the `cond_func` of `on_each_cpu_cond_mask`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CallCond {
    /// Every CPU of the mask (`smp_call_function_many`, `on_each_cpu_mask`).
    All,
    /// `tlb_is_not_lazy()`: skip CPUs whose `is_lazy` is set.
    NotLazy,
    /// Mainline `should_flush_tlb()`.
    ShouldFlush,
}

#[derive(Debug, PartialEq, Eq, Hash)]
pub enum Frame {
    // The three large frames are boxed so that a `Frame` stays small: the timed driver pops
    // and pushes the top frame on every step, and they are created once per flush.
    FlushMmRange(Box<FlushMmRange>),
    FlushFunc(FlushFunc),
    SmpCallMany(Box<SmpCallMany>),
    CallFunctionIrq(CallFunctionIrq),
    SwitchMm(SwitchMm),
    Schedule(Schedule),
    RwSemDown(RwSemDown),
    Syscall(Syscall),
    /// Guest PV flush (seed 001).
    PvFlushTlbMulti(Box<PvFlushTlbMulti>),
    /// Shoot4U's hypercall (a research design).
    Shoot4u(Box<crate::shoot4u::Shoot4u>),
    /// A guest's Hyper-V enlightened flush hypercall (`hyperv.rs`).
    HvFlushTlbMulti(Box<crate::hyperv::HvFlushTlbMulti>),
    /// Host (KVM): a vCPU thread's way back into the guest.
    VcpuRun(VcpuRun),
    /// Host (KVM): requests, flushes, SRCU, memslots, MMU notifiers (kvm_main.c).
    MakeAllCpusRequest(Box<MakeAllCpusRequest>),
    FlushRemoteTlbs(FlushRemoteTlbs),
    SynchronizeSrcu(SynchronizeSrcu),
    InstallMemslots(InstallMemslots),
    SetMemoryRegion(Box<SetMemoryRegion>),
    MmuNotifierInvalidate(Box<MmuNotifierInvalidate>),
    /// Host (KVM MMU): fault paths, roots, zaps (arch/x86/kvm/mmu).
    TdpPageFault(Box<TdpPageFault>),
    MmioPageFault(MmioPageFault),
    /// Host (KVM shadow paging): `FNAME(page_fault)` (`kvm/mmu/paging_tmpl.rs`).
    ShadowPageFault(crate::kvm::mmu::paging_tmpl::ShadowPageFault),
    MmuLoad(MmuLoad),
    MmuUnload(MmuUnload),
    CommitZap(Box<CommitZap>),
    ZapMemslot(Box<ZapMemslot>),
    /// Host (KVM TDP MMU, seed 004): `kvm_zap_gfn_range`, the TDP MMU fault, and the zap
    /// request an MTRR or CR0.CD change makes (patch 9's list).
    ZapGfnRange(Box<ZapGfnRange>),
    TdpMmuPageFault(Box<TdpMmuPageFault>),
    /// Host (KVM, either MMU): the NX huge page recovery worker's zap.
    NxRecover(Box<NxRecover>),
    /// Host (KVM, either MMU): `fast_page_fault` and `KVM_GET_DIRTY_LOG` (`dirty_log.rs`).
    FastPageFault(Box<FastPageFault>),
    GetDirtyLog(Box<GetDirtyLog>),
    /// Host (KVM, either MMU): the `clear_young` MMU notifier (`access_track.rs`).
    ClearYoung(Box<ClearYoung>),
    MtrrZapRequest(Box<MtrrZapRequest>),
    NoncoherentDmaStart(NoncoherentDmaStart),
    /// Guest mm: faults and frees charged in bulk, and their page-list sections
    /// (`page_lists.rs`).
    BulkPages(BulkPages),
    PageListLocked(PageListLocked),
    /// LATR: a scheduler tick draining saved flushes (`latr.rs`).
    LatrTick(crate::latr::LatrTick),
}

shootdown_engine::clone_by_variants!(Frame {
    FlushMmRange,
    FlushFunc,
    SmpCallMany,
    CallFunctionIrq,
    SwitchMm,
    Schedule,
    RwSemDown,
    Syscall,
    PvFlushTlbMulti,
    Shoot4u,
    HvFlushTlbMulti,
    VcpuRun,
    MakeAllCpusRequest,
    FlushRemoteTlbs,
    SynchronizeSrcu,
    InstallMemslots,
    SetMemoryRegion,
    MmuNotifierInvalidate,
    TdpPageFault,
    MmioPageFault,
    ShadowPageFault,
    MmuLoad,
    MmuUnload,
    CommitZap,
    ZapMemslot,
    ZapGfnRange,
    TdpMmuPageFault,
    NxRecover,
    FastPageFault,
    GetDirtyLog,
    ClearYoung,
    MtrrZapRequest,
    NoncoherentDmaStart,
    BulkPages,
    PageListLocked,
    LatrTick,
});

// Every step of the timed driver moves the top frame off its stack and back: keep it small
// (the large frames are boxed above).
#[cfg(target_pointer_width = "64")]
const _: () = assert!(std::mem::size_of::<Frame>() <= 72);

impl Frame {
    /// Where this frame is (in its stack's buffer) and what its next step reads first: a
    /// prefetch hint ([`FrameHint`]), never dereferenced.
    pub(crate) fn hint(&self) -> FrameHint {
        fn at<T>(r: &T) -> usize {
            r as *const T as usize
        }
        fn boxed<T>(b: &T) -> (usize, u32) {
            (at(b), std::mem::size_of::<T>() as u32)
        }
        let (boxed, boxed_len) = match self {
            Frame::FlushMmRange(b) => boxed(&**b),
            Frame::SmpCallMany(b) => boxed(&**b),
            Frame::PvFlushTlbMulti(b) => boxed(&**b),
            Frame::Shoot4u(b) => boxed(&**b),
            Frame::HvFlushTlbMulti(b) => boxed(&**b),
            Frame::MakeAllCpusRequest(b) => boxed(&**b),
            Frame::SetMemoryRegion(b) => boxed(&**b),
            Frame::MmuNotifierInvalidate(b) => boxed(&**b),
            Frame::TdpPageFault(b) => boxed(&**b),
            Frame::CommitZap(b) => boxed(&**b),
            Frame::ZapMemslot(b) => boxed(&**b),
            Frame::ZapGfnRange(b) => boxed(&**b),
            Frame::TdpMmuPageFault(b) => boxed(&**b),
            Frame::NxRecover(b) => boxed(&**b),
            Frame::FastPageFault(b) => boxed(&**b),
            Frame::GetDirtyLog(b) => boxed(&**b),
            Frame::ClearYoung(b) => boxed(&**b),
            Frame::MtrrZapRequest(b) => boxed(&**b),
            Frame::FlushFunc(_)
            | Frame::CallFunctionIrq(_)
            | Frame::SwitchMm(_)
            | Frame::Schedule(_)
            | Frame::RwSemDown(_)
            | Frame::Syscall(_)
            | Frame::VcpuRun(_)
            | Frame::FlushRemoteTlbs(_)
            | Frame::SynchronizeSrcu(_)
            | Frame::InstallMemslots(_)
            | Frame::MmioPageFault(_)
            | Frame::ShadowPageFault(_)
            | Frame::MmuLoad(_)
            | Frame::MmuUnload(_)
            | Frame::NoncoherentDmaStart(_)
            | Frame::BulkPages(_)
            | Frame::PageListLocked(_)
            | Frame::LatrTick(_) => (0, 0),
        };
        let (element, peer) = match self {
            Frame::SmpCallMany(s) => s.next_target().map(|t| (at(t), Peer::Target(*t))),
            Frame::CallFunctionIrq(s) => s.next_entry().map(|k| (at(k), Peer::Sender(k.src))),
            _ => None,
        }
        .map_or((0, PeerHint::NONE), |(e, p)| (e, PeerHint::new(p)));
        FrameHint {
            slot: at(self),
            boxed,
            boxed_len,
            peer,
            element,
        }
    }

    /// Interrupts are disabled while this frame is on top (switch_mm, the flush handler, the
    /// scheduler and interrupt handlers run with IRQs off).
    pub fn irqs_off(&self) -> bool {
        match self {
            Frame::FlushFunc(_)
            | Frame::SwitchMm(_)
            | Frame::Schedule(_)
            | Frame::CallFunctionIrq(_)
            | Frame::PageListLocked(_)
            | Frame::LatrTick(_)
            | Frame::Shoot4u(_)
            | Frame::HvFlushTlbMulti(_)
            // On a guest stack only inside the Hyper-V flush hypercall: the vCPU is in KVM.
            | Frame::MakeAllCpusRequest(_) => true,
            Frame::Syscall(s) => s.irqs_off(),
            _ => false,
        }
    }

    /// Kernel name of the function.
    pub fn name(&self) -> &'static str {
        match self {
            Frame::FlushMmRange(f) if f.batch_targets.is_some() => "arch_tlbbatch_flush",
            Frame::FlushMmRange(_) => "flush_tlb_mm_range",
            Frame::FlushFunc(_) => "flush_tlb_func",
            Frame::SmpCallMany(_) => "smp_call_function_many_cond",
            Frame::CallFunctionIrq(_) => "call_function_interrupt",
            Frame::SwitchMm(_) => "switch_mm_irqs_off",
            Frame::Schedule(_) => "__schedule",
            Frame::RwSemDown(RwSemDown {
                write: true,
                sem: SemId::MmapSem(_),
                ..
            }) => "down_write(mmap_sem)",
            Frame::RwSemDown(RwSemDown {
                sem: SemId::MmapSem(_),
                ..
            }) => "down_read(mmap_sem)",
            Frame::RwSemDown(RwSemDown { write: true, .. }) => "i_mmap_lock_write",
            Frame::RwSemDown(_) => "i_mmap_lock_read",
            Frame::PvFlushTlbMulti(_) => "kvm_flush_tlb_multi",
            Frame::Shoot4u(_) => "shoot4u_flush_tlb_others",
            Frame::HvFlushTlbMulti(_) => "hyperv_flush_tlb_multi",
            Frame::VcpuRun(_) => "vcpu_run",
            Frame::MakeAllCpusRequest(s) if s.mask.is_some() => "kvm_make_vcpus_request_mask",
            Frame::MakeAllCpusRequest(_) => "kvm_make_all_cpus_request",
            Frame::FlushRemoteTlbs(_) => "kvm_flush_remote_tlbs",
            Frame::SynchronizeSrcu(_) => "synchronize_srcu_expedited",
            Frame::InstallMemslots(_) => "install_new_memslots",
            Frame::SetMemoryRegion(_) => "__kvm_set_memory_region",
            Frame::MmuNotifierInvalidate(_) => "kvm_mmu_notifier_invalidate_range",
            Frame::TdpPageFault(_) => "tdp_page_fault",
            Frame::MmioPageFault(_) => "handle_mmio_page_fault",
            Frame::ShadowPageFault(_) => "FNAME(page_fault)",
            Frame::MmuLoad(_) => "kvm_mmu_load",
            Frame::MmuUnload(_) => "kvm_mmu_unload",
            Frame::CommitZap(_) => "kvm_mmu_commit_zap_page",
            Frame::ZapMemslot(z) => match z.strategy {
                _ if z.mmio_only => "kvm_mmu_zap_mmio_sptes",
                crate::options::MemslotZap::FastInvalidate => "kvm_mmu_invalidate_zap_all_pages",
                crate::options::MemslotZap::SlotOnly => "kvm_mmu_invalidate_zap_pages_in_memslot",
                crate::options::MemslotZap::ZapAll => "kvm_mmu_zap_all",
            },
            Frame::ZapGfnRange(z) if z.notifier => "kvm_tdp_mmu_unmap_gfn_range",
            Frame::ZapGfnRange(_) => "kvm_zap_gfn_range",
            Frame::TdpMmuPageFault(_) => "kvm_tdp_page_fault",
            Frame::NxRecover(_) => "kvm_recover_nx_huge_pages",
            Frame::FastPageFault(_) => "fast_page_fault",
            Frame::GetDirtyLog(s) if s.clear => "kvm_clear_dirty_log_protect",
            Frame::GetDirtyLog(_) => "kvm_get_dirty_log_protect",
            Frame::ClearYoung(_) => "kvm_mmu_notifier_clear_young",
            Frame::MtrrZapRequest(z) if z.listed => "kvm_mtrr_zap_gfn_range",
            Frame::MtrrZapRequest(_) => "update_mtrr/kvm_post_set_cr0",
            Frame::NoncoherentDmaStart(_) => "kvm_arch_register_noncoherent_dma",
            Frame::Syscall(s) => s.name(),
            Frame::BulkPages(b) => b.name(),
            Frame::PageListLocked(s) => s.section.name(),
            Frame::LatrTick(_) => "native_flush_saved_states",
        }
    }

    /// The step the frame is at, by name (for diagnostic dumps).
    pub fn step_name(&self) -> String {
        match self {
            Frame::FlushMmRange(s) => format!("{:?}", s.pc),
            Frame::FlushFunc(s) => format!("{:?}", s.pc),
            Frame::SmpCallMany(s) => format!("{:?}", s.pc),
            Frame::CallFunctionIrq(s) => format!("{:?}", s.pc),
            Frame::SwitchMm(s) => format!("{:?}", s.pc),
            Frame::Schedule(s) => format!("{:?}", s.pc),
            Frame::RwSemDown(s) => format!("{:?}", s.pc),
            Frame::PvFlushTlbMulti(s) => format!("{:?}", s.pc),
            Frame::Shoot4u(s) => format!("{:?}", s.pc),
            Frame::HvFlushTlbMulti(s) => format!("{:?}", s.pc),
            Frame::VcpuRun(s) => format!("{:?}", s.pc),
            Frame::MakeAllCpusRequest(s) => format!("{:?}", s.pc),
            Frame::FlushRemoteTlbs(s) => format!("{:?}", s.pc),
            Frame::SynchronizeSrcu(s) => format!("{:?}", s.pc),
            Frame::InstallMemslots(s) => format!("{:?}", s.pc),
            Frame::SetMemoryRegion(s) => format!("{:?}", s.pc),
            Frame::MmuNotifierInvalidate(s) => format!("{:?}", s.pc),
            Frame::TdpPageFault(s) => format!("{:?}", s.pc),
            Frame::MmioPageFault(s) => format!("{:?}", s.pc),
            Frame::ShadowPageFault(s) => format!("{:?}", s.pc),
            Frame::MmuLoad(s) => format!("{:?}", s.pc),
            Frame::MmuUnload(s) => format!("{:?}", s.pc),
            Frame::CommitZap(s) => format!("{:?}", s.pc),
            Frame::ZapMemslot(s) => format!("{:?}", s.pc),
            Frame::ZapGfnRange(s) => format!("{:?}", s.pc),
            Frame::TdpMmuPageFault(s) => format!("{:?}", s.pc),
            Frame::NxRecover(s) => format!("{:?}", s.pc),
            Frame::FastPageFault(s) => format!("{:?}", s.pc),
            Frame::GetDirtyLog(s) => format!("{:?}", s.pc),
            Frame::ClearYoung(s) => format!("{:?}", s.pc),
            Frame::MtrrZapRequest(s) => format!("{:?}", s.pc),
            Frame::NoncoherentDmaStart(s) => format!("{:?}", s.pc),
            Frame::Syscall(s) => s.step_name(),
            Frame::BulkPages(s) => format!("{:?}", s.pc),
            Frame::PageListLocked(s) => format!("{:?}", s.pc),
            Frame::LatrTick(s) => format!("{:?}", s.pc),
        }
    }
}

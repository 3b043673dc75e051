//! Kernel call frames. Each kernel function the model runs is a frame with a program counter
//! (`pc`) and its locals; one call of its step function executes one atomic step (one shared
//! access, one IPI, one flush…) and says what happens next ([`Flow`]). Frames live on the task's
//! kernel stack (so a task can block mid-syscall) or on the CPU's interrupt stack.
//!
//! Writing each function as explicit steps is what lets the timed driver and the explorer run
//! exactly the same protocol code.

use crate::state::{CsdKey, FlushTlbInfo, MmId, TaskId};
use shootdown_hw::pagetable::Vpn;
use shootdown_hw::CpuId;

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

/// `flush_tlb_mm_range()` (or, with `batch`, `arch_tlbbatch_flush()`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct FlushMmRange {
    pub pc: u8,
    pub mm: MmId,
    pub info: FlushTlbInfo,
    /// Oracle: epoch at which the flush began.
    pub begin: u64,
    /// `arch_tlbbatch_flush`: targets precomputed, `tlb_gen` already bumped.
    pub batch_targets: Option<Vec<CpuId>>,
}

/// `flush_tlb_func()` on one CPU, for a request from `info.initiator`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct FlushFunc {
    pub pc: u8,
    pub info: FlushTlbInfo,
    pub local: bool,
    pub local_gen: u64,
    pub mm_gen: u64,
    pub asid: u16,
    pub mm: MmId,
}

impl FlushFunc {
    /// A call of `flush_tlb_func(info)`: `local` from the initiator itself, else from an IPI
    /// (or `on_each_cpu_mask`'s local call of `flush_tlb_func_remote`).
    pub fn call(info: FlushTlbInfo, local: bool) -> Frame {
        Frame::FlushFunc(FlushFunc {
            pc: 0,
            info,
            local,
            local_gen: 0,
            mm_gen: 0,
            asid: 0,
            mm: 0,
        })
    }
}

/// `smp_call_function_many_cond()` running `flush_tlb_func` (the only cross call modelled).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SmpCallMany {
    pub pc: u8,
    pub info: FlushTlbInfo,
    pub cond: CallCond,
    /// Remote candidates (the mask minus this CPU), in order.
    pub candidates: Vec<CpuId>,
    pub i: usize,
    /// Targets whose csd was queued (waited on).
    pub queued: Vec<CpuId>,
    /// Targets that need an IPI (their queue was empty).
    pub ipi: Vec<CpuId>,
    /// `SCF_RUN_LOCAL`: also run on this CPU, between sending and waiting.
    pub run_local: bool,
    /// O1 mutant: bump `tlb_gen` in the local part.
    pub inc_gen_locally: bool,
    /// Pre-v5.6 `on_each_cpu_cond_mask()`: run `func` on this CPU too, after waiting for the
    /// remote ones (`on_each_cpu_mask()`).
    pub local_after: bool,
}

/// The guest's paravirtual `kvm_flush_tlb_others()` / `kvm_flush_tlb_multi()`
/// (arch/x86/kernel/kvm.c): filter out preempted vCPUs, then the native cross call with the rest.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PvFlushTlbMulti {
    pub pc: u8,
    /// The native call to make afterwards; its `candidates` are the remote CPUs of the mask.
    pub call: SmpCallMany,
    /// Next candidate to look at.
    pub i: usize,
    /// The byte read by step G1 for the current candidate.
    pub seen: u8,
    /// Candidates that still need the IPI (`flushmask`).
    pub keep: Vec<CpuId>,
}

/// The CALL_FUNCTION vector handler: `__flush_smp_call_function_queue()`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CallFunctionIrq {
    pub pc: u8,
    pub entries: Vec<CsdKey>,
    pub i: usize,
}

/// `switch_mm_irqs_off(prev, next)`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SwitchMm {
    pub pc: u8,
    pub next: MmId,
    pub prev: u64,
    pub was_lazy: bool,
    pub gen: u64,
    pub asid: u16,
    pub need_flush: bool,
}

/// `__schedule()` + `context_switch()`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Schedule {
    pub pc: u8,
    pub prev: TaskId,
    pub next: TaskId,
}

/// System calls and exceptions.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Syscall {
    PageFault {
        pc: u8,
        vpn: Vpn,
        write: bool,
    },
    Madvise {
        pc: u8,
        start: Vpn,
        npages: u64,
    },
    Munmap {
        pc: u8,
        start: Vpn,
        npages: u64,
    },
    Mmap {
        pc: u8,
    },
    Mprotect {
        pc: u8,
        start: Vpn,
        npages: u64,
        writable: bool,
    },
    /// `todo`: the entries tagged TOWRITE when the call started (`tag_pages_for_writeback`).
    /// With `msync`, the call is `msync(MS_SYNC)` over the whole mapping of the file.
    Fdatasync {
        pc: u8,
        /// The `Machine::dax_files` index of the file.
        file: u32,
        msync: bool,
        todo: Vec<Vpn>,
        i: usize,
    },
    ReclaimUnmap {
        pc: u8,
        start: Vpn,
        npages: u64,
        targets: Vec<CpuId>,
        begin: u64,
    },
    SetAffinity {
        pc: u8,
        cpu: CpuId,
    },
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Frame {
    // The three large frames are boxed so that a `Frame` stays small: the timed driver pops
    // and pushes the top frame on every step, and they are created once per flush.
    FlushMmRange(Box<FlushMmRange>),
    FlushFunc(FlushFunc),
    SmpCallMany(Box<SmpCallMany>),
    CallFunctionIrq(CallFunctionIrq),
    SwitchMm(SwitchMm),
    Schedule(Schedule),
    /// `down_read()` / `down_write()` on `mmap_sem`: pc 0 tries, pc 1 = woken with the lock.
    RwSemDown {
        pc: u8,
        mm: MmId,
        write: bool,
    },
    Syscall(Syscall),
    /// Guest PV flush (seed 001).
    PvFlushTlbMulti(Box<PvFlushTlbMulti>),
}

// Every step of the timed driver moves the top frame off its stack and back: keep it small
// (the large frames are boxed above).
#[cfg(target_pointer_width = "64")]
const _: () = assert!(std::mem::size_of::<Frame>() <= 72);

impl Frame {
    /// Interrupts are disabled while this frame is on top (switch_mm, the flush handler, the
    /// scheduler and interrupt handlers run with IRQs off).
    pub fn irqs_off(&self) -> bool {
        matches!(
            self,
            Frame::FlushFunc(_)
                | Frame::SwitchMm(_)
                | Frame::Schedule(_)
                | Frame::CallFunctionIrq(_)
                // Holding the DAX mapping's xa_lock (xa_lock_irq).
                | Frame::Syscall(Syscall::PageFault { pc: 6, .. })
                | Frame::Syscall(Syscall::Fdatasync { pc: 4 | 6 | 8, .. })
        )
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
            Frame::RwSemDown { write: true, .. } => "down_write(mmap_sem)",
            Frame::RwSemDown { .. } => "down_read(mmap_sem)",
            Frame::PvFlushTlbMulti(_) => "kvm_flush_tlb_multi",
            Frame::Syscall(s) => match s {
                Syscall::PageFault { .. } => "handle_mm_fault",
                Syscall::Madvise { .. } => "madvise(MADV_DONTNEED)",
                Syscall::Munmap { .. } => "munmap",
                Syscall::Mmap { .. } => "mmap",
                Syscall::Mprotect { .. } => "mprotect",
                Syscall::Fdatasync { msync: true, .. } => "msync(MS_SYNC)",
                Syscall::Fdatasync { .. } => "fdatasync",
                Syscall::ReclaimUnmap { .. } => "try_to_unmap(TTU_BATCH_FLUSH)",
                Syscall::SetAffinity { .. } => "sched_setaffinity",
            },
        }
    }
}

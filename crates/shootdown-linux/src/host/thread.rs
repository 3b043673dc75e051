//! Host threads that are not vCPUs: the VMM's thread that updates memslots (QEMU handling a
//! guest's BAR writes: `KVM_SET_USER_MEMORY_REGION`) and a thread whose memory management
//! invalidates the host pages behind guest memory (reclaim, migration: the MMU notifiers). They
//! are agents like the vCPUs: a program of [`HostOp`]s, kernel frames on their own stack, a store
//! buffer, a pCPU of their own.

use crate::frame::Frame;
use crate::mem::Loc;
use serde::Serialize;
use shootdown_hw::ept::Gfn;
use shootdown_hw::store_buffer::StoreBuffer;

/// What a host thread does next: its program is a list of these.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum HostOp {
    /// `KVM_SET_USER_MEMORY_REGION` creating memslot `id` over guest frames
    /// `[base_gfn, base_gfn + npages)` of address space `as_id` (`mem->slot >> 16`: 1 is SMM's),
    /// backed by host frames from `pfn` (the VMM maps a BAR, a ROM, or SMRAM).
    MemslotCreate {
        as_id: u8,
        id: u16,
        base_gfn: Gfn,
        npages: u64,
        readonly: bool,
        huge: bool,
        pfn: u64,
    },
    /// `KVM_SET_USER_MEMORY_REGION` with no pages: delete memslot `id` of address space
    /// `as_id`.
    MemslotDelete {
        as_id: u8,
        id: u16,
    },
    /// An MMU-notifier invalidation of the host pages behind guest frames
    /// `[gfn, gfn + npages)`: `invalidate_range_start` (after which the host may free them),
    /// then `invalidate_range_end`.
    InvalidateGfns {
        gfn: Gfn,
        npages: u64,
    },
    /// `KVM_GET_DIRTY_LOG` of memslot `id` of address space `as_id`: harvest its dirty bitmap
    /// and write-protect the pages in it (`dirty_log.rs`).
    GetDirtyLog {
        as_id: u8,
        id: u16,
    },
    /// `KVM_CLEAR_DIRTY_LOG` of all of memslot `id` with the bitmap the last
    /// `KVM_GET_DIRTY_LOG` fetched (`manual_dirty_log_protect`).
    ClearDirtyLog {
        as_id: u8,
        id: u16,
    },
    /// `KVM_SET_USER_MEMORY_REGION` of memslot `id` with `KVM_MEM_LOG_DIRTY_PAGES` added (a
    /// flags-only change): its dirty bitmap is allocated and its SPTEs write-protected
    /// (`kvm_mmu_slot_apply_flags`, `dirty_log.rs`).
    EnableDirtyLog {
        as_id: u8,
        id: u16,
    },
    /// The `clear_young` MMU notifier over the host pages behind guest frames
    /// `[gfn, gfn + npages)`: KVM ages their SPTEs, without a flush (`access_track.rs`).
    ClearYoung {
        gfn: Gfn,
        npages: u64,
    },
    /// One run of the VM's NX huge page recovery worker (`kvm_nx_huge_page_recovery_worker`,
    /// a kthread per VM): `kvm_recover_nx_huge_pages()`.
    NxRecover,
    /// The VMM assigns a device without snoop control (VFIO registers it with KVM): KVM starts
    /// honouring the guest's memory types and zaps (seed 004's patch 5).
    AssignNoncoherentDma,
    /// Userspace work of the VMM between its ioctls.
    Compute {
        ns: u64,
    },
    /// Record a timestamp (cycle boundaries).
    Mark,
    /// Jump to op `to`; `times` = how many more jumps (None = forever).
    Loop {
        to: u16,
        times: Option<u32>,
    },
    Exit,
}

/// A host thread (agent `cpus + index`).
#[derive(Debug, PartialEq, Eq)]
pub struct HostThread {
    pub name: String,
    /// The VM whose ioctls it makes.
    pub vm: u32,
    /// The pCPU it runs on (caches, IPI distances).
    pub pcpu: u32,
    pub stack: Vec<Frame>,
    pub program: Vec<HostOp>,
    pub pc: u16,
    /// Remaining iterations of the loop op at each pc (lazily created).
    pub loop_left: Vec<(u16, u32)>,
    pub sb: StoreBuffer<Loc>,
    /// Its SRCU read section on `kvm->srcu` (`Loc::SrcuReader`): begin epoch, 0 outside.
    pub srcu: u64,
    pub done: bool,
}

shootdown_engine::state_fields!(HostThread {
    vm,
    pcpu,
    stack,
    pc,
    loop_left,
    sb,
    srcu,
    done,
} fixed {
    name,
    program,
});

impl HostThread {
    pub fn new(name: &str, vm: u32, pcpu: u32, program: Vec<HostOp>) -> HostThread {
        HostThread {
            name: name.to_string(),
            vm,
            pcpu,
            stack: Vec::new(),
            program,
            pc: 0,
            loop_left: Vec::new(),
            sb: StoreBuffer::default(),
            srcu: 0,
            done: false,
        }
    }
}

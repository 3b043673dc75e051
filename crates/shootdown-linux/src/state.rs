//! Kernel state: `struct mm_struct` (the parts that matter), `cpu_tlbstate`, tasks, the
//! cross-call data (`call_single_data`, `flush_tlb_info`), and `mmap_sem`.

use crate::frame::Frame;
use serde::Serialize;
use shootdown_hw::pagetable::{AddressSpace, PtPageId, Vpn};
use shootdown_hw::store_buffer::StoreBuffer;
use shootdown_hw::tlb::Tlb;
use shootdown_hw::CpuId;
use std::collections::{BTreeSet, VecDeque};

/// Index of an mm. `INIT_MM` (0) is `init_mm`: kernel page tables only, never in a cpumask.
pub type MmId = u32;
pub const INIT_MM: MmId = 0;
/// `LOADED_MM_SWITCHING`: the value `cpu_tlbstate.loaded_mm` holds while switch_mm is between
/// its cpumask update and its CR3 write (mainline).
pub const LOADED_MM_SWITCHING: u64 = u64::MAX;

pub type TaskId = u32;

/// `TLB_NR_DYN_ASIDS`.
pub const TLB_NR_DYN_ASIDS: usize = 6;
/// `TLB_FLUSH_ALL` as an end address.
pub const TLB_FLUSH_ALL: Vpn = u64::MAX;
/// `TLB_GENERATION_INVALID`.
pub const TLB_GENERATION_INVALID: u64 = 0;

/// `struct mm_struct` for our purposes.
#[derive(Debug, PartialEq, Eq)]
pub struct Mm {
    /// `mm->context.ctx_id`: unique, never reused.
    pub ctx_id: u64,
    /// `mm->context.tlb_gen`: bumped by every flush request (`inc_mm_tlb_gen`).
    pub tlb_gen: u64,
    /// `mm_cpumask(mm)`, one bit per CPU.
    pub cpumask: Vec<u64>,
    pub space: AddressSpace,
    /// `mmap_sem` (now `mmap_lock`).
    pub mmap_sem: RwSem,
    /// Page-table pages unlinked and waiting to be freed after the flush.
    pub tables_to_free: Vec<PtPageId>,
    /// `mm->context.next_trim_cpumask` (v6.14+ lazy cpumask trimming): the next time (in ns)
    /// a flush may trim; `init_new_context` sets it a second (HZ) after the mm's creation,
    /// here time 0.
    pub next_trim_ns: u64,
    /// `mm->tlb_flush_pending`: mmu_gathers (or `change_protection`s) in progress.
    pub tlb_flush_pending: u64,
    /// `mm->tlb_flush_batched`: reclaim batches queued with this mm (low 32 bits) and, in
    /// mainline, those `flush_tlb_batched_pending()` has flushed (high 32 bits); a bool in
    /// v4.13 (see `options::BatchedPending`).
    pub tlb_flush_batched: u64,
    /// The page-table locks held (split PTLs: one per page-table page, by its index).
    pub ptl_held: std::collections::BTreeMap<u64, u64>,
    /// `mm->mm_users`: users of the address space (its threads, and a kernel thread's
    /// `mmget_not_zero` while it works on it; `mm_refs.rs`).
    pub mm_users: u32,
    /// `mm->mm_count`: references to the `mm_struct` and its page tables (one for all the
    /// users together, one per lazy-TLB `active_mm` and per `mmgrab`); `__mmdrop` at 0.
    pub mm_count: u32,
    /// The file-backed VMAs (`vma.rs`), by start; anonymous memory has none.
    pub vmas: Vec<crate::vma::Vma>,
    /// Non-present PTEs that still name a page (migration entries, `migrate_device.rs`):
    /// page -> the frame being migrated. Kept beside the page table, which holds only present
    /// entries' frames.
    pub swap_ptes: std::collections::BTreeMap<Vpn, u32>,
    /// `mm->context.global_asid` (v6.15+, `Loc::GlobalAsid`): the ASID the mm uses on every
    /// CPU once it is active on several (0: none; `global_asid.rs`).
    pub global_asid: u16,
    /// `mm->context.asid_transition` (`Loc::AsidTransition`): CPUs may still run the mm on a
    /// dynamic ASID.
    pub asid_transition: bool,
    pub name: String,
}

shootdown_engine::state_fields!(Mm {
    ctx_id,
    tlb_gen,
    cpumask,
    space,
    mmap_sem,
    tables_to_free,
    next_trim_ns,
    tlb_flush_pending,
    tlb_flush_batched,
    ptl_held,
    mm_users,
    mm_count,
    vmas,
    swap_ptes,
    global_asid,
    asid_transition,
} fixed {
    name,
});

impl Mm {
    pub fn new(ctx_id: u64, nr_cpus: usize, name: String) -> Self {
        Mm {
            ctx_id,
            tlb_gen: 1,
            cpumask: vec![0; nr_cpus.div_ceil(64).max(1)],
            space: AddressSpace::default(),
            mmap_sem: RwSem::default(),
            tables_to_free: Vec::new(),
            next_trim_ns: 1_000_000_000,
            tlb_flush_pending: 0,
            tlb_flush_batched: 0,
            ptl_held: Default::default(),
            mm_users: 0,
            mm_count: 1,
            vmas: Vec::new(),
            swap_ptes: Default::default(),
            global_asid: 0,
            asid_transition: false,
            name,
        }
    }
    pub fn cpumask_test(&self, cpu: CpuId) -> bool {
        self.cpumask[cpu / 64] & (1 << (cpu % 64)) != 0
    }
    pub fn cpumask_assign(&mut self, cpu: CpuId, on: bool) {
        if on {
            self.cpumask[cpu / 64] |= 1 << (cpu % 64);
        } else {
            self.cpumask[cpu / 64] &= !(1 << (cpu % 64));
        }
    }
    /// CPUs whose bit is set, ascending.
    pub fn cpumask_cpus(&self) -> Vec<CpuId> {
        let mut v = Vec::new();
        for (i, w) in self.cpumask.iter().enumerate() {
            let mut bits = *w;
            while bits != 0 {
                v.push(i * 64 + bits.trailing_zeros() as usize);
                bits &= bits - 1;
            }
        }
        v
    }
}

/// A blocking reader/writer semaphore (`struct rw_semaphore`), FIFO hand-off to waiters.
#[derive(Debug, Default, PartialEq, Eq, Hash)]
pub struct RwSem {
    pub readers: u32,
    pub writer: bool,
    /// Waiting tasks and whether each wants write.
    pub waiters: VecDeque<(TaskId, bool)>,
}

shootdown_engine::clone_by_fields!(RwSem {
    readers,
    writer,
    waiters,
});

/// One ASID slot of `cpu_tlbstate.ctxs[]`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct TlbContext {
    pub ctx_id: u64,
    pub tlb_gen: u64,
}

/// `cpu_tlbstate` (+ `cpu_tlbstate_shared.is_lazy`). `loaded_mm` and `is_lazy` are read by
/// other CPUs and live in memory (see `mem.rs`); the rest is CPU-private.
///
/// `repr(C)`, the scalars first: they share a cache line with the `Cpu`'s call queue, the
/// ASID slots follow.
#[derive(Clone, Debug, PartialEq, Eq)]
#[repr(C)]
pub struct TlbState {
    pub loaded_mm: u64,
    pub loaded_mm_asid: u16,
    pub next_asid: u16,
    pub is_lazy: bool,
    /// v4.12 `cpu_tlbstate.state`: true = TLBSTATE_LAZY.
    pub legacy_lazy: bool,
    /// PTI: user PCIDs whose flush is deferred to the next return to user (bit per ASID).
    pub user_pcid_flush_mask: u16,
    /// In-context flushes (`pti_user_flush = "deferred"`, a research design): the user range
    /// the next return to user INVLPGs (`user_flush_start/end/stride_shift`); an end of
    /// `TLB_FLUSH_ALL` is a full user-PCID flush, as it always is without the design.
    pub user_flush_start: Vpn,
    pub user_flush_end: Vpn,
    pub user_flush_stride_shift: u8,
    pub ctxs: [TlbContext; TLB_NR_DYN_ASIDS],
}

/// Hashed as one run of words (every CPU's `cpu_tlbstate` is in every fingerprint: one write
/// instead of nineteen).
impl std::hash::Hash for TlbState {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        let TlbState {
            loaded_mm,
            loaded_mm_asid,
            next_asid,
            ctxs,
            is_lazy,
            legacy_lazy,
            user_pcid_flush_mask,
            user_flush_start,
            user_flush_end,
            user_flush_stride_shift,
        } = self;
        let mut w = [0u64; 4 + 2 * TLB_NR_DYN_ASIDS];
        w[0] = *loaded_mm;
        w[1] = u64::from(*loaded_mm_asid)
            | u64::from(*next_asid) << 16
            | u64::from(*user_pcid_flush_mask) << 32
            | u64::from(*is_lazy) << 48
            | u64::from(*legacy_lazy) << 49
            | u64::from(*user_flush_stride_shift) << 50;
        w[2] = *user_flush_start;
        w[3] = *user_flush_end;
        for (i, c) in ctxs.iter().enumerate() {
            w[4 + 2 * i] = c.ctx_id;
            w[5 + 2 * i] = c.tlb_gen;
        }
        u64::hash_slice(&w, h);
    }
}

impl Default for TlbState {
    fn default() -> Self {
        TlbState {
            loaded_mm: INIT_MM as u64,
            loaded_mm_asid: 0,
            next_asid: 1,
            ctxs: [TlbContext::default(); TLB_NR_DYN_ASIDS],
            is_lazy: false,
            legacy_lazy: false,
            user_pcid_flush_mask: 0,
            user_flush_start: 0,
            user_flush_end: TLB_FLUSH_ALL,
            user_flush_stride_shift: 0,
        }
    }
}

/// `struct flush_tlb_info`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct FlushTlbInfo {
    /// None: "whatever mm is loaded" (batched unmap flush).
    pub mm: Option<MmId>,
    pub start: Vpn,
    /// `TLB_FLUSH_ALL` for a full flush.
    pub end: Vpn,
    pub new_tlb_gen: u64,
    /// `stride_shift` in pages (0: 4 KiB, 9: 2 MiB): the INVLPG step of a partial flush.
    pub stride_shift: u8,
    pub freed_tables: bool,
    pub trim_cpumask: bool,
    pub initiator: CpuId,
    /// `flush_tlb_kernel_range()`'s request (`do_kernel_range_flush` / `do_flush_tlb_all`):
    /// kernel mappings, every CPU, no generations (`kernel_map.rs`).
    pub kernel: bool,
}

/// A `call_single_data` of a `cfd` (sender, target): only its lock bit matters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CsdKey {
    pub src: CpuId,
    pub dst: CpuId,
}

/// The lock bits of every `call_single_data` (a bitmap of targets per sender, sized for the
/// machine up front so that equal sets are equal states): O(1) per test, set and clear, where
/// a flush to thousands of CPUs locks thousands of them.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct CsdLocks {
    /// `words` words of target bits per sender, senders one after another; empty while no
    /// lock is held (no allocation to copy in the explorer's states, and equal sets are equal).
    bits: Vec<u64>,
    words: usize,
    nr_cpus: usize,
    held: usize,
}

shootdown_engine::clone_by_fields!(CsdLocks {
    bits,
    words,
    nr_cpus,
    held,
});

impl CsdLocks {
    /// No lock held, on a machine of `nr_cpus` CPUs.
    pub fn new(nr_cpus: usize) -> CsdLocks {
        CsdLocks {
            bits: Vec::new(),
            words: nr_cpus.div_ceil(64),
            nr_cpus,
            held: 0,
        }
    }
    fn at(&self, k: CsdKey) -> (usize, u64) {
        (k.src * self.words + k.dst / 64, 1 << (k.dst % 64))
    }
    /// Start fetching `k`'s bit into the host's cache (a hint for the timed driver).
    #[inline]
    pub fn prefetch(&self, k: CsdKey) {
        if let Some(w) = self.bits.get(self.at(k).0) {
            shootdown_engine::prefetch(w);
        }
    }
    pub fn contains(&self, k: CsdKey) -> bool {
        let (i, b) = self.at(k);
        self.bits.get(i).is_some_and(|w| w & b != 0)
    }
    pub fn insert(&mut self, k: CsdKey) {
        if self.bits.is_empty() {
            self.bits = vec![0; self.words * self.nr_cpus];
        }
        let (i, b) = self.at(k);
        if self.bits[i] & b == 0 {
            self.bits[i] |= b;
            self.held += 1;
        }
    }
    pub fn remove(&mut self, k: CsdKey) {
        if !self.contains(k) {
            return;
        }
        let (i, b) = self.at(k);
        self.bits[i] &= !b;
        self.held -= 1;
        if self.held == 0 {
            self.bits = Vec::new();
        }
    }
    /// The locked ones, by sender then target.
    pub fn iter(&self) -> impl Iterator<Item = CsdKey> + '_ {
        let words = self.words.max(1);
        self.bits.iter().enumerate().flat_map(move |(i, &w)| {
            (0..64)
                .filter(move |b| w & (1 << b) != 0)
                .map(move |b| CsdKey {
                    src: i / words,
                    dst: (i % words) * 64 + b,
                })
        })
    }
    /// The same locks with every CPU renamed by `f` (symmetry reduction).
    pub fn renamed(&self, f: impl Fn(CsdKey) -> CsdKey) -> CsdLocks {
        let mut out = CsdLocks::new(self.nr_cpus);
        for k in self.iter() {
            out.insert(f(k));
        }
        out
    }
}

/// Physical CPU state.
///
/// Laid out hot-first (`repr(C)`): the fields nearly every step of this CPU reads — whether an
/// IPI is pending, interrupts, the current task, the interrupt stack, the call queue — lead,
/// so that with [`HashCached`](shootdown_engine::HashCached)'s header they share the first
/// cache line or two (a step of one of thousands of CPUs misses on every line it touches); the
/// TLB, touched only by translations and flushes, comes last. The fingerprint hashes the
/// fields in the order `state_fields!` lists them, whatever the layout.
#[derive(Debug, PartialEq, Eq)]
#[repr(C)]
pub struct Cpu {
    /// CALL_FUNCTION vector pending.
    pub ipi_pending: bool,
    pub need_resched: bool,
    /// Halted in the idle loop (for the wake-up cost).
    pub halted: bool,
    /// Depth of IRQ-disabled sections (0 = interrupts enabled).
    pub irq_off: u32,
    pub curr: TaskId,
    pub idle_task: TaskId,
    /// mm whose page tables CR3 points to, and the loaded hardware PCID.
    pub cr3_mm: MmId,
    pub cr3_pcid: u16,
    /// Interrupt stack: frames of the handler being run.
    pub irq_stack: Vec<Frame>,
    /// `call_single_queue`: csds queued for this CPU (llist, newest first).
    pub call_queue: Vec<CsdKey>,
    pub tlbstate: TlbState,
    pub runqueue: VecDeque<TaskId>,
    /// TSO store buffer.
    pub sb: StoreBuffer<crate::mem::Loc>,
    pub tlb: Tlb,
    /// NMIs the explorer may still deliver to this CPU (a scenario's `[[nmi]]`, `nmi.rs`).
    pub nmis_left: u8,
    /// The user stack page an NMI's `perf_callchain_user` reads, in whatever mm is `current`'s
    /// (explorer; the timed driver reads the page the task touched last).
    pub nmi_vpn: Option<Vpn>,
    /// INVLPGBs this CPU issued that its TLBSYNC has not waited for (`global_asid.rs`): each
    /// CPU's TLB performs them at the issuer's TLBSYNC, the latest the architecture allows.
    pub invlpgb_pending: Vec<shootdown_hw::tlb::Invlpgb>,
}

shootdown_engine::state_fields!(Cpu {
    nmis_left,
    nmi_vpn,
    tlb,
    cr3_mm,
    cr3_pcid,
    tlbstate,
    irq_stack,
    irq_off,
    ipi_pending,
    call_queue,
    curr,
    idle_task,
    runqueue,
    need_resched,
    sb,
    halted,
    invlpgb_pending,
} fixed {});

/// What an access asks of a translation: a write needs the W bit, an instruction fetch the X
/// bit (in a VM, of the EPT leaf: the guest's own pages are all executable in this model).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum Access {
    Read,
    Write,
    Fetch,
}

impl Access {
    pub fn from_write(write: bool) -> Access {
        if write {
            Access::Write
        } else {
            Access::Read
        }
    }
    pub fn is_write(self) -> bool {
        self == Access::Write
    }
    pub fn is_fetch(self) -> bool {
        self == Access::Fetch
    }
    /// Does a translation with these permissions serve this access?
    pub fn allowed_by(self, writable: bool, exec: bool) -> bool {
        match self {
            Access::Read => true,
            Access::Write => writable,
            Access::Fetch => exec,
        }
    }
    /// As a counterexample says it.
    pub fn text(self) -> &'static str {
        match self {
            Access::Read => "read",
            Access::Write => "write",
            Access::Fetch => "fetch",
        }
    }
}

/// What a user-mode task does next: its program is a list of these.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum UserOp {
    /// Access one page.
    Touch {
        vpn: Vpn,
        write: bool,
    },
    /// Execute code from one page: an instruction fetch (a read that needs execute
    /// permission: in a VM, the EPT leaf's X bit).
    Exec {
        vpn: Vpn,
    },
    /// Access `npages` consecutive pages, one step each.
    TouchRange {
        start: Vpn,
        npages: u64,
        write: bool,
    },
    /// Access `regions` regions of `pages` pages each, from `start`, one region per step: each
    /// region through its first page (its representative), whose access takes the full path
    /// (TLB, guest walk, EPT walk, guest or EPT faults); the region's other `pages - 1` pages
    /// are charged as what each would cost, without being modelled one by one. That is a plain
    /// TLB-missing access (`tlb_miss_walk + user_touch_page`) when the representative needed no
    /// fault or when one 2 MiB EPT leaf maps the whole region; otherwise (4 KiB leaves, every
    /// one of them re-faulted alike) the time the representative's access took. The region's
    /// other pages then evict the representative from the TLB, as a working set far beyond the
    /// TLB's reach does. Used for working sets of gigabytes (seed 003's mmtest).
    TouchRegions {
        start: Vpn,
        regions: u64,
        pages: u64,
        write: bool,
    },
    /// Write `npages` consecutive pages at a random block-aligned offset in `[start, start+span)`.
    TouchRandomBlock {
        start: Vpn,
        span: u64,
        npages: u64,
    },
    /// Pure user computation.
    Compute {
        ns: u64,
    },
    /// `npages` anonymous page faults whose translations are not modelled one by one: their
    /// cost, and (option `page_lists`) their allocations from the per-CPU list and their
    /// `lru_cache_add`s (`page_lists.rs`).
    AnonFaults {
        npages: u32,
    },
    /// The freeing half of a zap's `tlb_finish_mmu` for `npages` pages charged in bulk (after
    /// their PTEs were cleared and the TLBs flushed): `lru_add_drain`, `release_pages`, and
    /// the per-CPU list.
    FreePages {
        npages: u32,
    },
    Mmap {
        start: Vpn,
        npages: u64,
    },
    /// `mmap(start, npages, PROT_READ | PROT_WRITE, MAP_SHARED or, with `private`,
    /// MAP_PRIVATE, file, 0)`: link a VMA of file `file` (a `Machine::files` index), not
    /// populated (`vma.rs`).
    MmapFile {
        start: Vpn,
        npages: u64,
        file: u32,
        private: bool,
    },
    Munmap {
        start: Vpn,
        npages: u64,
    },
    MadviseDontneed {
        start: Vpn,
        npages: u64,
    },
    Mprotect {
        start: Vpn,
        npages: u64,
        writable: bool,
    },
    /// `fdatasync()` on DAX file `file` (a [`DaxFile`] index): write-protect and flush its dirty
    /// entries.
    Fdatasync {
        file: u32,
    },
    /// sysbench fileio's `file_get_rnd_request()` on the process-wide [`FileioGen`]: the next
    /// request is a random block write or, after every `fsync_freq` writes, an fsync of each file
    /// in turn. Leaves the request in the task (`op_base` / `fsync_file`).
    FileioNext,
    /// Execute the request [`UserOp::FileioNext`] chose: write the block (`npages` translations,
    /// then `copy_pages` × 4 KiB copied under them) or `fdatasync()` the file.
    FileioExec {
        npages: u64,
        copy_pages: u64,
    },
    /// Reclaim-style batched unmap (`try_to_unmap` + `arch_tlbbatch_flush`) of pages: of the
    /// task's own mm (direct reclaim), or, from a kernel thread, of `mm` (kswapd).
    ReclaimUnmap {
        start: Vpn,
        npages: u64,
        mm: Option<MmId>,
    },
    /// `sched_setaffinity(0, {cpu})`.
    SetAffinity {
        cpu: CpuId,
    },
    /// Move to the next CPU in the task's `cpus` ring (seed 002's ping-pong).
    SetAffinityNext,
    /// khugepaged (a kernel thread's op): collapse the 512-page group at `start` of `mm`, mapped
    /// by a page-table page, into one PMD leaf.
    /// A kernel thread: `mmget_not_zero(mm)`, then `kthread_use_mm(mm)`: it runs on `mm` and
    /// its `touch`es are uaccess to it (vhost, io_uring's SQPOLL thread, `mm_refs.rs`). If
    /// the mm has no users left it takes nothing and its touches fail (`-EFAULT`).
    UseMm {
        mm: MmId,
    },
    /// A kernel thread: `kthread_unuse_mm()` of the mm it uses, then `mmput()`.
    UnuseMm,
    /// Kernel code (in any task) reads a vmalloc'd kernel page (`kernel_map.rs`).
    KernelTouch {
        vpn: Vpn,
    },
    /// `mremap(start, npages, npages, MREMAP_MAYMOVE | MREMAP_FIXED, new_start)`
    /// (`mremap.rs`).
    Mremap {
        start: Vpn,
        npages: u64,
        new_start: Vpn,
    },
    /// `ftruncate()` of file `file` (a `Machine::files` index) to `npages` pages
    /// (`truncate.rs`).
    Truncate {
        file: u32,
        npages: u64,
    },
    /// A driver revokes every mapping of device file `file` (`unmap_mapping_range`).
    RevokeMapping {
        file: u32,
    },
    /// A driver's `migrate_vma` of the caller's pages `[start, start + npages)`
    /// (`migrate_device.rs`).
    MigrateVma {
        start: Vpn,
        npages: u64,
    },
    /// An EFI runtime-service call through `efi_mm` (`efi.rs`).
    EfiCall {
        efi_mm: MmId,
    },
    /// `text_poke()` of kernel page `page` through `poking_mm` (`text_poke.rs`).
    TextPoke {
        poking_mm: MmId,
        page: Vpn,
    },
    /// `vunmap_range()`: clear kernel PTEs, then `flush_tlb_kernel_range()`.
    VunmapRange {
        start: Vpn,
        npages: u64,
    },
    Collapse {
        mm: MmId,
        start: Vpn,
    },
    /// Count one workload event (the metric).
    Event,
    /// Record a timestamp for this task (cycle boundaries for steady-state rates).
    Mark,
    /// User-mode copying of `pages` × 4 KiB of data that needs no new translation (the rest of a
    /// block already mapped by one huge entry).
    CopyPages {
        pages: u64,
    },
    /// Execute CPUID: always a VM exit under VMX (KVM emulates it); the VM-exit microbenchmark.
    Cpuid,
    /// Boot (seed 004, `boot.rs`): the guest writes an MTRR MSR (a WRMSR exit).
    Wrmsr {
        msr: u32,
        value: u64,
    },
    /// Boot: the VMM sets an MTRR MSR of this vCPU (`KVM_SET_MSRS`, e.g. QEMU's reset put).
    SetMsr {
        msr: u32,
        value: u64,
    },
    /// Boot: the guest sets CR0.CD to `cd` (a CR exit).
    SetCr0Cd {
        cd: bool,
    },
    /// The guest raises an SMI on its own vCPU (a write to the APM control port): the vCPU
    /// enters SMM (`kvm/smm.rs`).
    Smi,
    /// RSM: the vCPU leaves SMM.
    Rsm,
    /// Boot: take a guest spinlock (a [`crate::Machine::add_guest_word`] word).
    GuestSpinLock {
        lock: u32,
    },
    GuestSpinUnlock {
        lock: u32,
    },
    /// Boot: wait until `parties` tasks (this one included) have arrived at rendezvous `word`
    /// in this round.
    Rendezvous {
        word: u32,
        parties: u32,
    },
    /// `write()` of one message to pipe `pipe` (a [`crate::Machine::add_pipe`] number):
    /// sleeps while it is full (`pipe.rs`).
    PipeWrite {
        pipe: u32,
    },
    /// `read()` of one message from pipe `pipe`: sleeps while it is empty.
    PipeRead {
        pipe: u32,
    },
    /// A kernel module's cross call (the `ipi_benchmark` module): `smp_call_function_single`
    /// or `smp_call_function_many` of `func` to `to`, with `wait = 1` (`smp.rs`).
    CrossCall {
        to: crate::smp::CrossCallTo,
        func: crate::smp::CallFunc,
    },
    /// `pause()` (or a futex wait nobody wakes): enter the kernel and sleep for good. The CPU
    /// then runs its idle task with this task's mm still loaded (`enter_lazy_tlb`): the
    /// *sleeping sibling* of `shootdown validate`'s cases.
    Pause,
    /// The end of a loop over pages: the task's `page_index` (added to the page of every
    /// `Touch`, `Exec` and `MadviseDontneed`) moves to the next page and the task jumps back
    /// to op `to`, or, after `pages` pages, `page_index` returns to 0 and the task goes on
    /// (will-it-scale's `for (i = 0; i < size; i += pgsize)`).
    NextPage {
        to: u16,
        pages: u64,
    },
    /// Jump to op `to`; `times` = how many more jumps (None = forever).
    Loop {
        to: u16,
        times: Option<u32>,
    },
    Exit,
}

/// A program's loop op at `*pc`: jump to `to`, `times` more times (`None` = forever), counting
/// the jumps left in `left` (one entry per loop op being run).
pub fn take_loop(pc: &mut u16, left: &mut Vec<(u16, u32)>, to: u16, times: Option<u32>) {
    let Some(n) = times else {
        *pc = to;
        return;
    };
    let here = *pc;
    let i = match left.iter().position(|(p, _)| *p == here) {
        Some(i) => i,
        None => {
            left.push((here, n));
            left.len() - 1
        }
    };
    if left[i].1 > 0 {
        left[i].1 -= 1;
        *pc = to;
    } else {
        left.remove(i);
        *pc += 1;
    }
}

/// Scheduling state of a task.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TaskState {
    Running,
    Runnable,
    Blocked,
    Dead,
}

/// A task (thread). Kernel frames of a task live on its own stack, so a task can block in the
/// middle of a system call and resume there.
///
/// Laid out hot-first (`repr(C)`, see [`Cpu`]): the stack and scheduling state every step
/// reads, then the user program's progress, then the rest.
#[derive(Debug, PartialEq, Eq)]
#[repr(C)]
pub struct Task {
    pub stack: Vec<Frame>,
    /// `current->mm`. None: a kernel thread (idle) — runs on whatever mm is loaded (lazy TLB)
    /// — unless it borrowed one (`kthread_use_mm`), or a task past `exit_mm()`.
    pub mm: Option<MmId>,
    /// `task->active_mm`: the mm it runs on (its own, or a kernel thread's lazy one, holding a
    /// reference: `mm_refs.rs`). None only while handed over in a context switch.
    pub active_mm: Option<MmId>,
    /// `PF_KTHREAD`: never returns to user space.
    pub kthread: bool,
    pub cpu: CpuId,
    pub state: TaskState,
    /// `p->on_cpu`: still being switched out somewhere; may not be picked yet.
    pub on_cpu: bool,
    pub pc: u16,
    /// Progress inside a multi-page op.
    pub op_progress: u64,
    /// The page a [`UserOp::NextPage`] loop is at: added to the page `Touch`, `Exec` and
    /// `MadviseDontneed` name.
    pub page_index: u64,
    pub program: Vec<UserOp>,
    /// Remaining iterations of the loop op at each pc (lazily created).
    pub loop_left: Vec<(u16, u32)>,
    /// Random block chosen for the current TouchRandomBlock / FileioExec op.
    pub op_base: Option<Vpn>,
    /// When the current TouchRegions region's first attempt began (its access faulted).
    pub op_started: Option<shootdown_engine::Time>,
    /// File the current FileioExec op fsyncs.
    pub fsync_file: Option<u32>,
    /// CPUs for SetAffinityNext.
    pub cpus: Vec<CpuId>,
    /// The running unmap's mmu_gather: the frames of the pages it cleared, freed after its
    /// flush, and the oracle epoch the clearing happened before (`page_alloc.rs`). Kept here
    /// rather than in the call's frame, which stays small.
    pub gathered: Vec<crate::page_alloc::FrameRun>,
    pub zapped_before: u64,
    /// LATR saved the flush of the call this task is in (`latr.rs`): its return makes no
    /// `INV-SYSRET` promise.
    pub latr_saved: bool,
    pub name: String,
}

impl Task {
    /// A task on `cpu` that has not run yet: runnable, at the start of `program`, allowed on
    /// `cpu` only.
    pub fn new(name: String, mm: Option<MmId>, cpu: CpuId, program: Vec<UserOp>) -> Task {
        Task {
            stack: Vec::new(),
            mm,
            active_mm: Some(mm.unwrap_or(INIT_MM)),
            kthread: mm.is_none(),
            cpu,
            state: TaskState::Runnable,
            on_cpu: false,
            pc: 0,
            op_progress: 0,
            page_index: 0,
            program,
            loop_left: Vec::new(),
            op_base: None,
            op_started: None,
            fsync_file: None,
            cpus: vec![cpu],
            gathered: Vec::new(),
            zapped_before: 0,
            latr_saved: false,
            name,
        }
    }
}

// The program and name are fixed for a run and left out of the fingerprint. (A task is
// `HashCached` in the machine: hashed again only when a step changed it.)
shootdown_engine::state_fields!(Task {
    mm,
    active_mm,
    state,
    cpu,
    stack,
    pc,
    loop_left,
    op_progress,
    page_index,
    op_base,
    op_started,
    fsync_file,
    cpus,
    on_cpu,
    gathered,
    zapped_before,
    latr_saved,
} fixed {
    name,
    program,
    kthread,
});

/// A file on a DAX filesystem (ext4-DAX) mapped into an mm at `[start, start + npages)`: its
/// `struct address_space` as far as writeback goes — the xarray's dirty tags and `xa_lock`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct DaxFile {
    pub mm: MmId,
    pub start: Vpn,
    pub npages: u64,
    /// Entries written since their last writeback (`PAGECACHE_TAG_DIRTY`).
    pub dirty: BTreeSet<Vpn>,
    /// `mapping->i_pages.xa_lock`: 0 free, else holder CPU + 1.
    pub xa_lock: u64,
}

/// sysbench fileio's request generator (user space, `sb_fileio.c`: `file_get_rnd_request()`),
/// whose state is process-wide: `req_performed`, `is_dirty` and `fsynced_file` are plain globals
/// every thread writes, next to each other (one cache line), and every request ends with a
/// `pthread_mutex_unlock(&sb_globals.exec_mutex)` (an atomic exchange on another line).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct FileioGen {
    /// The [`DaxFile`]s (`--file-num` of them), in file order.
    pub files: Vec<u32>,
    /// Mapping entries per file (4 KiB pages, or 2 MiB entries with DAX PMDs).
    pub units_per_file: u64,
    /// Entries one block spans (a block never straddles two entries' worth of translations
    /// with PMDs: 1).
    pub units_per_block: u64,
    /// `--file-fsync-freq`.
    pub fsync_freq: u64,
    pub req_performed: u64,
    pub is_dirty: bool,
    pub fsynced_file: u32,
}

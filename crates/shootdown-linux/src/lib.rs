//! # shootdown-linux
//!
//! The x86 Linux kernel's translation-coherence machinery as an executable model: `mm`
//! (`ctx_id`, `tlb_gen`, `mm_cpumask`), `cpu_tlbstate`, `switch_mm_irqs_off`, lazy TLB,
//! `flush_tlb_mm_range` and `flush_tlb_func`, `smp_call_function_many`, the batched unmap flush,
//! the scheduler and `mmap_sem`, and the mm system calls that cause flushes. [`smt`] prices
//! hyper-threads sharing a core.
//!
//! One file per concept, like the kernel: [`tlb`] is arch/x86/mm/tlb.c, [`smp`] is kernel/smp.c,
//! [`switch_mm`] the switch and lazy-TLB paths, [`sched`] the scheduler, [`syscalls`] mm/ and the
//! fault path, [`user`] user mode and the hardware access path, [`spinlock`] the kernel's
//! spinlocks (native, test-and-set and paravirtual) and [`page_lists`] the per-CPU page lists
//! with `zone->lock` and `lru_lock` behind them. Each kernel function is a
//! [`frame::Frame`] executed one atomic step at a time, so the timed driver and the explorer run
//! the same code. Versions (before/after/mainline) and historical bugs are [`options::Options`].
//!
//! Virtualization (issue #4): with a host ([`host`]) the CPUs are the vCPUs of VMs run as
//! host threads on pCPUs; [`paravirt`] is the guest's PV TLB flush (arch/x86/kernel/kvm.c) and
//! [`kvm`] the host side of KVM (`kvm_main.c`, `x86.c`, `vmx/`), [`host`] the host that schedules
//! vCPU threads on pCPUs.

pub mod apic;
pub mod boot;
pub mod busy;
pub mod checker_support;
pub mod components;
pub mod counters;
pub mod debug;
pub mod describe;
pub mod efi;
pub mod fair;
pub mod frame;
pub mod global_asid;
pub mod host;
pub mod huge_memory;
pub mod hyperv;
pub mod kernel_map;
pub mod khugepaged;
pub mod kvm;
pub mod latr;
pub mod machine;
pub mod mem;
pub mod migrate_device;
pub mod mm_refs;
mod mmu_gather;
pub mod mremap;
pub mod nmi;
pub mod options;
pub mod page_alloc;
pub mod page_lists;
pub mod paravirt;
pub mod perf;
pub mod pipe;
pub mod prefetch;
pub mod sched;
pub mod setup;
pub mod shoot4u;
pub mod smp;
pub mod smt;
pub mod spinlock;
pub mod stack;
pub mod state;
pub mod switch_mm;
pub mod syscalls;
pub mod text_poke;
pub mod tlb;
pub mod truncate;
pub mod user;
pub mod vma;

pub use counters::{Counter, Counters, COUNTER_NAMES};
pub use host::HostConfig;
pub use machine::{Action, Machine};
pub use mem::MemoryModel;
pub use options::{
    Count, HvTlbFlush, Idle, LazyTlb, Mutants, OptValue, Options, Sched, ShadowSyncFlush, SmpCall,
    SpinlockKind, StealTimeMap,
};
pub use state::{DaxFile, FileioGen, MmId, TaskId, UserOp, INIT_MM};

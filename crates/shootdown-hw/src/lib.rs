//! # shootdown-hw
//!
//! The x86 hardware the kernel model runs on:
//! * [`topology`] — sockets, cores, SMT threads; distance classes for IPIs and cache lines;
//! * [`profile`] — the cost profile: what each hardware and kernel operation costs on a machine;
//! * [`tlb`] — a per-CPU TLB tagged by PCID, of finite capacity, with a paging-structure cache;
//! * [`pagetable`] — page-table memory (PTEs with versions, page-table pages that can be freed);
//!   [`pte_map`] — its leaf entries, 512 to a page-table page;
//! * [`ept`] — EPT page-table memory, the second translation stage of a VM;
//! * [`oracle`] — ground truth: which translations a use may no longer rely on;
//! * [`store_buffer`] — x86-TSO per-CPU FIFO store buffers;
//! * [`cacheline`] — a MESI-like directory that prices remote cache-line transfers.

pub mod cacheline;
pub mod ept;
pub mod oracle;
pub mod pagetable;
pub mod profile;
pub mod pte_map;
pub mod store_buffer;
pub mod tlb;
pub mod topology;

pub use profile::{CostProfile, Features};
pub use topology::{CpuId, Distance, Topology, MAX_CPUS};

//! Cost profiles: what every modelled operation costs on one machine.
//!
//! A profile describes a *machine* (e.g. the 2-socket Haswell-X of seed 000), never a table:
//! every experiment on that machine shares it. Values come from `profiles/*.toml`, where each
//! one carries its source or is marked `assumed`; this module only defines the keys (once, in
//! [`cost_keys!`]) so that loaders can reject unknown keys and report missing ones.

use serde::Serialize;
use shootdown_engine::Time;
use std::collections::BTreeMap;

macro_rules! cost_keys {
    ($( $(#[doc = $doc:literal])* $name:ident ),* $(,)?) => {
        /// Cost of each operation, in simulated time. See `profiles/base.toml` for sources.
        #[derive(Clone, Debug, PartialEq, Serialize)]
        pub struct Costs {
            $( $(#[doc = $doc])* pub $name: Time, )*
        }

        /// Every cost key with its one-line meaning.
        pub const COST_KEYS: &[(&str, &str)] = &[ $( (stringify!($name), concat!($($doc),*)) ),* ];

        impl Costs {
            /// Build from `key → nanoseconds`; every key must be present, none unknown, none
            /// negative, non-finite or above [`MAX_COST_NS`]. Errors are `(key, reason)`.
            pub fn from_ns_map(map: &BTreeMap<String, f64>) -> Result<Costs, (String, String)> {
                for (k, v) in map {
                    if !COST_KEYS.iter().any(|(n, _)| n == k) {
                        return Err((k.clone(), "unknown cost key".into()));
                    }
                    // One second bounds every cost: far above any real one, and low enough that
                    // sums of costs cannot overflow simulated time.
                    if !v.is_finite() || !(0.0..=MAX_COST_NS).contains(v) {
                        return Err((k.clone(), format!("cost must be a number of ns between 0 and {MAX_COST_NS} (got {})", show_number(*v))));
                    }
                }
                Ok(Costs {
                    $( $name: Time::from_ns_f64(*map.get(stringify!($name))
                        .ok_or_else(|| (stringify!($name).to_string(), "missing cost (no value here or in any inherited profile)".to_string()))?), )*
                })
            }
        }
    };
}

/// A number as an error message shows it: huge ones in exponent form, which `Display` would
/// spell out digit by digit.
pub fn show_number(v: f64) -> String {
    if v.abs() >= 1e12 {
        format!("{v:e}")
    } else {
        format!("{v}")
    }
}

/// The largest cost a profile may give, in ns (one second).
pub const MAX_COST_NS: f64 = 1e9;

cost_keys! {
    /// Access to a shared kernel cache line already held by this CPU.
    l1_hit,
    /// Read of a line another CPU holds Shared (or clean in the LLC).
    line_shared_read,
    /// Transfer of a line last written by the SMT sibling.
    line_same_core,
    /// Transfer of a line last written by another core of the same socket.
    line_same_socket,
    /// Transfer of a line last written by a core of the same socket behind another
    /// last-level cache (another CCX on AMD; never charged where one LLC serves a socket).
    line_cross_llc,
    /// Transfer of a line last written by a core of the other socket.
    line_cross_socket,
    /// Extra cost of a locked read-modify-write (LOCK prefix, drains the store buffer).
    atomic_rmw,
    /// One INVLPG (hundreds of cycles: seed 000; ~100 ns: tlb_single_page_flush_ceiling comment).
    invlpg,
    /// One INVPCID single-address (the user PCID under PTI).
    invpcid_single,
    /// MOV to CR3 that flushes the target PCID (excluding the refills that follow).
    cr3_write_flush,
    /// MOV to CR3 with the NOFLUSH bit.
    cr3_write_noflush,
    /// One TLB miss: a page walk that refills an entry.
    tlb_miss_walk,
    /// Sending an IPI: the ICR write (per call).
    ipi_send,
    /// Each additional IPI target of one send.
    ipi_send_per_target,
    /// From ICR write to the handler starting on a CPU of the same socket.
    ipi_latency_same_socket,
    /// From ICR write to the handler starting on a CPU of the other socket.
    ipi_latency_cross_socket,
    /// Interrupt entry on the receiving CPU up to its handler, in either mode: vectoring,
    /// register save, `irq_enter`, the EOI write (`ipi_entering_ack_irq`).
    irq_entry,
    /// Interrupt exit after the handler, in either mode: `irq_exit`, register restore, IRET. A
    /// CALL_FUNCTION initiator waiting on its csd has been released before it (`csd_unlock`
    /// runs right after the function).
    irq_exit,
    /// Extra interrupt entry work when the interrupt arrives in user mode (`swapgs`, PTI's
    /// switch to the kernel CR3).
    irq_user_entry,
    /// Extra return work when the interrupt returns to user mode (PTI's user CR3, MDS's VERW,
    /// `prepare_exit_to_usermode`).
    irq_user_exit,
    /// An NMI: entry plus exit (the paranoid, nesting-safe path) and perf's overflow handler with its sample record, besides reading the user stack (a TLB lookup or walk).
    nmi_entry_exit,
    /// Extra latency before a halted (idle, not polling) CPU runs its interrupt handler.
    idle_wakeup,
    /// A polling idle CPU (idle=poll) noticing TIF_NEED_RESCHED.
    poll_idle_notice,
    /// System call entry plus exit (PTI CR3 switches, Spectre/MDS mitigations when on).
    syscall_entry_exit,
    /// Page-fault exception entry plus exit and fault dispatch.
    page_fault_entry_exit,
    /// The scheduler's pick-next and register switch (excluding switch_mm).
    context_switch,
    /// try_to_wake_up at the waker (enqueue, preemption check).
    wakeup,
    /// sched_setaffinity on the current task, including the stopper-thread migration.
    sched_setaffinity,
    /// Allocating a page (buddy allocator).
    page_alloc,
    /// Zeroing a 4 KiB page.
    page_zero,
    /// Freeing a page (or queueing it to a pagevec/RCU batch).
    page_free,
    /// Writing one PTE plus its rmap/accounting bookkeeping.
    pte_update,
    /// User code touching (writing) one 4 KiB page that is mapped.
    user_touch_page,
    /// Per dirty page DAX writeback work in fdatasync besides the TLB flush (radix-tree walk, cache flush of the pfn, pfn_mkclean).
    dax_writeback_page,
    /// mmap() VMA work.
    mmap_syscall,
    /// munmap()/madvise() VMA and range-walk overhead per call.
    unmap_base,
    /// Freeing one page-table page.
    pgtable_free,
    /// One iteration of a busy-wait loop (cpu_relax) when nothing changes.
    spin_poll,
    /// Per page under `lru_lock`: putting it on or taking it off the LRU list (flags, list
    /// links, LRU sizes), beyond the lock's and the list's line transfers.
    lru_page,
    /// Per page under `zone->lock`: moving it between the per-CPU list and the buddy
    /// allocator's free areas.
    buddy_page,
    /// KVM: one VM exit plus the common exit-handling path plus VM entry (VMX round trip), excluding the emulation of the exit reason and the VMX-instruction error checks.
    vm_exit_entry,
    /// KVM: one extra instruction on the fast path of a VMREAD/VMWRITE error check (SETcc, CMP, JMP...): see the `vmx_insn_error_check` option.
    vmx_insn_error_check,
    /// KVM: emulating CPUID after the exit (kvm_emulate_cpuid).
    cpuid_emulation,
    /// KVM: INVVPID single-context (flush every guest-linear translation of one vCPU, all guest PCIDs), excluding refills.
    invvpid_single,
    /// Host: switching the pCPU from one vCPU thread to another (schedule, kvm_sched_out/vcpu_put, kvm_sched_in/vcpu_load, VMPTRLD, MSR switching).
    vcpu_context_switch,
    /// Host: waking a halted vCPU thread (kvm_vcpu_kick of a blocked vCPU, try_to_wake_up, return from kvm_vcpu_block) until it can enter the guest.
    vcpu_wakeup,
    /// Work under a DAX mapping's `xa_lock` per locked section (xarray walk, entry lock bit,
    /// tag update): held by every DAX write fault and twice per `dax_writeback_one`.
    xa_lock_hold,
    /// kmalloc + kfree of the temporary cpumask `on_each_cpu_cond_mask()` allocated per call
    /// before v5.6 (`zalloc_cpumask_var(GFP_ATOMIC)`).
    cpumask_alloc,
    /// The fixed part of `fsync()`/`fdatasync()` on a DAX file besides syscall entry/exit and
    /// per-entry writeback: `ext4_sync_file()`'s jbd2 checks and `blkdev_issue_flush()`.
    fsync_base,
    /// KVM MMU: an EPT violation's handling outside `mmu_lock` (`kvm_mmu_page_fault`, the memslot lookup, `gfn_to_pfn`), besides the exit itself.
    ept_violation,
    /// KVM MMU: `__direct_map` under `mmu_lock` for one fault (walk, install the leaf SPTE, rmap), besides new shadow pages.
    spte_install,
    /// KVM MMU: allocating and hashing one new shadow page (`kvm_mmu_get_page` missing the hash).
    sp_alloc,
    /// KVM MMU: zapping one SPTE (`drop_spte`: clear it, its A/D bits and its rmap entry).
    spte_zap,
    /// KVM MMU: `kvm_mmu_prepare_zap_page` of one shadow page besides its SPTEs (unlink, accounting, list move).
    sp_zap,
    /// KVM MMU: freeing one zapped shadow page (`kvm_mmu_free_page`).
    sp_free,
    /// KVM MMU: one step of a walk over a memslot's rmaps or the page hash.
    rmap_walk_step,
    /// KVM TDP MMU: one iteration of the TDP iterator in a zap (`tdp_iter_next` and the checks of the entry), besides zapping it.
    tdp_iter_step,
    /// KVM TDP MMU: one yield of `mmu_lock` by a zap (`tdp_mmu_iter_cond_resched`: RCU unlock, unlock, `cpu_relax`, besides waiting to take it again).
    mmu_lock_yield,
    /// KVM: handling an MTRR MSR write or a CR0 write in KVM (`kvm_set_msr_common`/`kvm_set_cr0`, the instruction's emulation), besides the exit and any zap.
    msr_cr_write,
    /// KVM: INVEPT (single- or all-context), excluding the refills.
    invept,
    /// KVM MMU: `kvm_mmu_load` of a direct root (`mmu_alloc_direct_roots`, the EPTP write), excluding INVEPT.
    mmu_root_load,
    /// KVM: `synchronize_srcu_expedited`'s own cost besides waiting for the readers (the expedited grace period's IPIs and polling).
    srcu_sync_expedited,
    /// KVM: one `install_new_memslots` besides the SRCU wait (copy of the memslots array, `update_memslots`).
    memslot_install,
    /// VMM: QEMU's handling of one BAR mapping change besides the KVM ioctl (the config-space exit to userspace, the memory transaction and listener).
    vmm_memslot_update,
    /// KVM: emulating one MMIO access (`x86_emulate_instruction`, `KVM_EXIT_MMIO` to the VMM and back).
    mmio_emulation,
    /// Issuing one INVLPGB (AMD): the broadcast itself completes asynchronously.
    invlpgb,
    /// TLBSYNC: waiting until every INVLPGB this CPU issued is done on every CPU.
    tlbsync,
}

/// Hardware features and capacities of the machine.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Features {
    /// CR4.PCIDE: ASIDs tag TLB entries (6 dynamic ASIDs per CPU).
    pub pcid: bool,
    /// INVPCID instruction (user-PCID flushes under PTI without deferral).
    pub invpcid: bool,
    /// Page-table isolation: a user PCID beside each kernel PCID; every user flush twice.
    pub pti: bool,
    /// TLB capacity in entries (per logical CPU; the STLB).
    pub tlb_entries: usize,
    /// Paging-structure-cache capacity in entries.
    pub psc_entries: usize,
    /// Memory-level parallelism: how many independent cache misses a core overlaps (its line
    /// fill buffers). A loop of independent loads to remote lines pays each miss / this.
    pub mlp: usize,
    /// How much longer a logical CPU's core-bound work takes while its SMT sibling is also
    /// executing, in thousandths (1000 = no slowdown, 1600 = 1.6×). Two hyperthreads share one
    /// core's execution units: each gets a part of it. Line transfers and IPI latency are
    /// not core-bound and do not stretch.
    pub smt_slowdown_permille: u32,
    /// The erratum of Alder Lake and Raptor Lake cores: with CR4.PCIDE set, INVLPG may leave
    /// Global translations of the address cached (Intel's RPL017 / ADL063; Linux ce0b15d11ad8).
    pub invlpg_miss_global: bool,
    /// AMD's INVLPGB and TLBSYNC (CPUID 0x8000_0008 EBX[3]; Zen 3 and later): broadcast TLB
    /// invalidation without interrupts.
    pub invlpgb: bool,
    /// Pages one INVLPGB may name (`invlpgb_count_max`: CPUID 0x8000_0008 EDX[15:0] + 1).
    pub invlpgb_count_max: u16,
}

/// A machine: features plus costs.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CostProfile {
    pub name: String,
    pub features: Features,
    pub costs: Costs,
    /// Costs fitted to published numbers: cost key → the cells it was fitted on
    /// (`EXPERIMENT/VARIANT` or `EXPERIMENT/VARIANT/ROW`). Every other cell is a prediction.
    pub fitted: BTreeMap<String, Vec<String>>,
}

impl CostProfile {
    /// A profile where every cost is `ns` nanoseconds: for unit tests and checker scenarios
    /// (the explorer ignores costs; only the features matter there).
    pub fn uniform(name: &str, ns: f64, features: Features) -> CostProfile {
        let map: BTreeMap<String, f64> =
            COST_KEYS.iter().map(|(k, _)| (k.to_string(), ns)).collect();
        CostProfile {
            name: name.into(),
            features,
            costs: Costs::from_ns_map(&map).expect("all keys"),
            fitted: BTreeMap::new(),
        }
    }
}

impl Features {
    /// A modern x86 CPU: PCID and INVPCID, no PTI, a 1536-entry STLB.
    pub fn modern() -> Features {
        Features {
            pcid: true,
            invpcid: true,
            pti: false,
            tlb_entries: 1536,
            psc_entries: 32,
            mlp: 1,
            smt_slowdown_permille: 1000,
            invlpg_miss_global: false,
            invlpgb: false,
            invlpgb_count_max: 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    fn full() -> BTreeMap<String, f64> {
        COST_KEYS
            .iter()
            .map(|(k, _)| (k.to_string(), 1.0))
            .collect()
    }
    #[test]
    fn all_keys_required() {
        let mut m = full();
        assert!(Costs::from_ns_map(&m).is_ok());
        m.remove("invlpg");
        assert_eq!(Costs::from_ns_map(&m).unwrap_err().0, "invlpg");
    }
    #[test]
    fn rejects_negative_huge_and_unknown() {
        let mut m = full();
        m.insert("invlpg".into(), -3.0);
        let e = Costs::from_ns_map(&m).unwrap_err();
        assert_eq!(e.0, "invlpg");
        assert!(e.1.contains("between 0 and 1000000000 (got -3)"), "{}", e.1);
        // Too large for simulated time to add up: bounded like the negatives.
        m.insert("invlpg".into(), 1e300);
        assert!(Costs::from_ns_map(&m).unwrap_err().1.contains("got 1e300"));
        let mut m = full();
        m.insert("warp_drive".into(), 1.0);
        assert_eq!(Costs::from_ns_map(&m).unwrap_err().0, "warp_drive");
    }
}

//! Per-run counters, named like the kernel's (`/proc/vmstat` `nr_tlb_*`, the "TLB shootdowns"
//! line of `/proc/interrupts`, `tlb:tlb_flush` trace-event reasons).

use serde::Serialize;

macro_rules! counters {
    ($( $(#[doc = $doc:literal])* $var:ident = $name:literal ),* $(,)?) => {
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        #[repr(usize)]
        pub enum Counter { $( $(#[doc = $doc])* $var, )* }
        pub const COUNTER_NAMES: &[&str] = &[ $( $name ),* ];
    };
}

counters! {
    /// vmstat `nr_tlb_remote_flush`: flush requests that had remote targets (initiator side).
    NrTlbRemoteFlush = "nr_tlb_remote_flush",
    /// vmstat `nr_tlb_remote_flush_received`.
    NrTlbRemoteFlushReceived = "nr_tlb_remote_flush_received",
    /// vmstat `nr_tlb_local_flush_all`.
    NrTlbLocalFlushAll = "nr_tlb_local_flush_all",
    /// vmstat `nr_tlb_local_flush_one`.
    NrTlbLocalFlushOne = "nr_tlb_local_flush_one",
    /// /proc/interrupts "TLB shootdowns": flush handlers run from an IPI.
    TlbShootdowns = "tlb_shootdowns",
    /// INVLPGB instructions issued (v6.15+ broadcast flushes, `global_asid.rs`).
    Invlpgb = "tlb.invlpgb",
    /// TLBSYNC instructions (each waits for the issuing CPU's INVLPGBs).
    Tlbsync = "tlb.tlbsync",
    /// LATR: flushes saved instead of IPIs (`latr.rs`).
    LatrSaved = "tlb.latr_saved",
    /// LATR: scheduler ticks that drained saved flushes.
    LatrTicks = "tlb.latr_ticks",
    /// LATR: saved flushes run by a tick (`flush_tlb_func` on a CPU the state named).
    LatrFlushes = "tlb.latr_flushes",
    /// Early acknowledgement: flush csds a target unlocked before running `flush_tlb_func`.
    EarlyAcks = "smp.early_acks",
    /// In-context flushes: user-PCID ranges a shootdown deferred to the return to user.
    UserFlushDeferred = "tlb.user_flush_deferred",
    /// In-context flushes: deferred user ranges widened to a full user-PCID flush.
    UserFlushDeferredFull = "tlb.user_flush_deferred_full",
    /// Shoot4U: `KVM_HC_SHOOT4U` hypercalls (`shoot4u.rs`).
    Shoot4uHypercalls = "kvm.shoot4u_hypercalls",
    /// Hyper-V enlightened flushes: `HvFlushVirtualAddressList/Space` hypercalls (`hyperv.rs`).
    HvFlushHypercalls = "kvm.hv_flush_hypercalls",
    /// Global ASIDs handed out (`use_global_asid`).
    GlobalAsidsAssigned = "tlb.global_asids_assigned",
    /// Flushes of an mm in ASID transition that found a CPU still on a dynamic ASID and sent
    /// IPIs (`finish_asid_transition` → `flush_tlb_multi`).
    AsidTransitionIpis = "tlb.asid_transition_ipis",
    /// CALL_FUNCTION IPIs sent (ICR writes' targets).
    CallFunctionIpis = "call_function_ipis",
    /// tlb:tlb_flush reason TLB_FLUSH_ON_TASK_SWITCH (flushing CR3 load in switch_mm).
    FlushOnTaskSwitch = "tlb_flush.task_switch",
    /// tlb:tlb_flush reason TLB_REMOTE_SHOOTDOWN.
    FlushRemoteShootdown = "tlb_flush.remote_shootdown",
    /// tlb:tlb_flush reason TLB_LOCAL_SHOOTDOWN.
    FlushLocalShootdown = "tlb_flush.local_shootdown",
    /// tlb:tlb_flush reason TLB_LOCAL_MM_SHOOTDOWN.
    FlushLocalMmShootdown = "tlb_flush.local_mm_shootdown",
    /// tlb:tlb_flush reason TLB_REMOTE_SEND_IPI (pages asked of remote CPUs).
    FlushRemoteSendIpi = "tlb_flush.remote_send_ipi",
    /// Flush handler calls that returned early because the CPU was already up to date.
    FlushSkippedUpToDate = "flush_tlb_func.up_to_date",
    /// Lazy CPUs switched to init_mm by a flush (`leave_mm` / `switch_mm_irqs_off(NULL, &init_mm)`).
    LeaveMm = "leave_mm",
    /// CPUs removed from an mm_cpumask by a flush IPI (mainline trimming).
    CpumaskTrimmed = "cpumask_trimmed",
    InvlpgCount = "invlpg",
    Cr3Writes = "cr3_writes",
    TlbMisses = "dtlb_misses",
    PageFaults = "page_faults",
    ContextSwitches = "context_switches",
    /// EEVDF (`sched = "eevdf"`): wake-ups that preempted the running task
    /// (`check_preempt_wakeup_fair` → `resched_curr`).
    WakeupPreemptions = "sched.wakeup_preemptions",
    Migrations = "migrations",
    MmapSemContended = "mmap_sem_contended",
    /// Guest mm: `lru_lock` sections run (`page_lists.rs`).
    LruLock = "lru_lock",
    /// Guest mm: `zone->lock` sections run.
    ZoneLock = "zone_lock",
    /// Guest mm: `lru_lock` sections that found the lock taken.
    LruLockContended = "lru_lock_contended",
    /// Guest mm: `zone->lock` sections that found the lock taken.
    ZoneLockContended = "zone_lock_contended",
    /// Guest: `KVM_HC_SCHED_YIELD` hypercalls after a call-function IPI (`pv_sched_yield`).
    PvSchedYield = "kvm.pv_sched_yield",
    /// Host: of those, the ones whose target was ready and got the yield (`kvm_vcpu_yield_to`).
    PvSchedYieldTo = "kvm.pv_sched_yield_to",
    /// Guest: PV spinlock waiters that halted in `pv_wait` (`spinlock.rs`).
    PvWait = "pv_wait",
    /// Guest: `pv_kick`s of a halted waiter by an unlocker (`KVM_HC_KICK_CPU`).
    PvKick = "pv_kick",
    /// Guest: PV spinlocks taken by a newcomer while waiters queued (`pv_lock_stealing`).
    PvLockStealing = "pv_lock_stealing",
    /// KVM: VM exits (ICR writes, interrupt injection and EOI without APICv, HLT, CPUID,
    /// host preemptions).
    KvmExits = "kvm.exits",
    /// KVM: HLT exits that blocked the vCPU thread.
    KvmHaltExits = "kvm.halt_exits",
    /// KVM: halts whose thread polled first (`halt_attempted_poll`).
    HaltAttemptedPoll = "kvm.halt_attempted_poll",
    /// KVM: polls a kick ended (`halt_successful_poll`): no wake-up, no context switch.
    HaltSuccessfulPoll = "kvm.halt_successful_poll",
    /// KVM: guest TLB flushes done by the host before entry (`kvm_vcpu_flush_tlb` for PV flush).
    KvmTlbFlush = "kvm.tlb_flush",
    /// Guest: vCPUs a PV flush skipped because they were preempted (`KVM_VCPU_FLUSH_TLB` set).
    PvTlbFlushSkipped = "kvm.pv_tlb_flush_skipped",
    /// Host: vCPU threads preempted (time slice, wake-up preemption, housekeeping).
    HostPreemptions = "host.vcpu_preemptions",
    /// Host: housekeeping-task runs.
    HostHousekeeping = "host.housekeeping",
    /// Host: halted vCPU threads woken by a kick.
    VcpuWakeups = "host.vcpu_wakeups",
    /// KVM: PAUSE-loop exits (`handle_pause`).
    PleExits = "kvm.pause_exits",
    /// KVM: PLE exits whose `kvm_vcpu_on_spin` found no vCPU to boost.
    PleNoCandidate = "kvm.ple_no_candidate",
    /// KVM: directed yields from a PLE exit (`directed_yield_successful`, v5.13's stat).
    DirectedYields = "kvm.directed_yield_successful",
    /// Host: `yield_to` targets CFS did not run: their vruntime was more than `wakeup_gran`
    /// past their run queue's leftmost (`pick_next_entity` ignores the next buddy).
    YieldBuddyUnfair = "host.yield_buddy_unfair",
    /// Host: IPIs that reached a vCPU whose thread was preempted (taken when it runs again).
    IpisToPreemptedVcpus = "host.ipis_to_preempted_vcpus",
    /// Host: total microseconds those IPIs waited for their vCPU to be loaded again.
    PreemptedIpiWaitUs = "host.preempted_ipi_wait_us",
    /// KVM stat `remote_tlb_flush`: `kvm_flush_remote_tlbs` calls.
    KvmRemoteTlbFlush = "kvm.remote_tlb_flush",
    /// Kick IPIs sent by `kvm_make_all_cpus_request` (to vCPUs not outside guest mode).
    KvmKickIpis = "kvm.kick_ipis",
    /// KVM stat `mmu_shadow_zapped`: shadow pages prepared for zapping.
    KvmMmuShadowZapped = "kvm.mmu_shadow_zapped",
    /// KVM stat `mmu_cache_miss`: shadow pages allocated (`kvm_mmu_get_page` missed the hash).
    KvmMmuCacheMiss = "kvm.mmu_cache_miss",
    /// KVM stat `mmu_pf_fixed`: leaf SPTEs the fault path installed.
    KvmMmuPfFixed = "kvm.mmu_pf_fixed",
    /// KVM stat `mmu_recycled`: shadow pages recycled for lack of room (never, in this model:
    /// no limit on shadow pages).
    KvmMmuRecycled = "kvm.mmu_recycled",
    /// Memslot sets published (`install_new_memslots`: two per deletion, one per creation).
    KvmMemslotUpdates = "kvm.memslot_updates",
    /// Shadow paging: guest page faults KVM handled (`FNAME(page_fault)`: exits for a
    /// missing or read-only SPTE whose guest PTE allows the access).
    KvmShadowFaults = "kvm.shadow_faults",
    /// Shadow paging: level-1 shadow pages allocated for guest page tables (and guest 2 MiB
    /// pages).
    KvmShadowPages = "kvm.shadow_pages",
    /// Shadow paging: level-1 pages gone unsync (KVM stat `mmu_unsync`): the guest wrote a
    /// page table KVM shadows.
    KvmMmuUnsync = "kvm.mmu_unsync",
    /// Shadow paging: unsync pages synced (`kvm_sync_page` from `mmu_sync_children`).
    KvmSyncPage = "kvm.sync_page",
    /// Shadow paging (timed driver): vCPU steps that waited for `mmu_lock`, which a host
    /// thread's MMU-notifier invalidation held or waited for.
    KvmShadowLockWaits = "kvm.shadow_lock_waits",
    /// Shadow paging: SPTEs `FNAME(pte_prefetch)` installed beside a fault's.
    KvmPtePrefetch = "kvm.pte_prefetch",
    /// Shadow paging, `shadow_sync_flush = "tlbs_dirty"`: SPTEs a sync dropped without a flush
    /// (`kvm->tlbs_dirty++`).
    KvmTlbsDirty = "kvm.tlbs_dirty",
    /// Shadow paging: synced pages left with no SPTE, zapped (`kvm_mmu_prepare_zap_page` from
    /// `kvm_sync_page`).
    KvmSyncZap = "kvm.sync_zap",
    /// Shadow paging: guest INVLPGs handled (`kvm_mmu_invlpg`; KVM stat `invlpg`).
    KvmInvlpg = "kvm.invlpg",
    /// Shadow paging: emulated writes to a write-protected guest page table
    /// (`kvm_mmu_pte_write`; KVM stat `mmu_pte_write`).
    KvmMmuPteWrite = "kvm.mmu_pte_write",
    /// EPT violations handled (`tdp_page_fault` calls).
    KvmEptViolations = "kvm.ept_violations",
    /// Faults that retried because an invalidation raced with them (`mmu_notifier_retry`).
    KvmFaultRetries = "kvm.fault_retries",
    /// EPT misconfigurations (MMIO exits into `handle_mmio_page_fault`).
    KvmMmioExits = "kvm.mmio_exits",
    /// Accesses emulated as MMIO (`KVM_EXIT_MMIO`).
    KvmMmioEmulated = "kvm.mmio_emulated",
    /// vmstat `thp_fault_alloc`: faults that mapped a 2 MiB page.
    ThpFaultAlloc = "thp_fault_alloc",
    /// vmstat `thp_split_pmd`: PMD leaves split into page tables.
    ThpSplitPmd = "thp_split_pmd",
    /// vmstat `thp_collapse_alloc`: khugepaged collapses.
    ThpCollapseAlloc = "thp_collapse_alloc",
    /// `mmu_lock` acquisitions that had to wait.
    KvmMmuLockContended = "kvm.mmu_lock_contended",
    /// Lock breaks (`cond_resched_lock` dropping `mmu_lock`) in zaps.
    KvmMmuLockBreaks = "kvm.mmu_lock_breaks",
    /// `mmu_lock` taken for read (TDP MMU faults; patch 12's zaps).
    KvmMmuReadLocks = "kvm.mmu_lock_read",
    /// `mmu_lock` taken for write (with the TDP MMU).
    KvmMmuWriteLocks = "kvm.mmu_lock_write",
    /// Yields of the TDP MMU iterator (`tdp_mmu_iter_cond_resched` dropping `mmu_lock`).
    KvmTdpMmuYields = "kvm.tdp_mmu_yields",
    /// Steps of the TDP MMU iterator in zaps (entries visited).
    KvmTdpIterSteps = "kvm.tdp_iter_steps",
    /// SPTEs zapped by `kvm_zap_gfn_range()`: leaves, and before v5.18 (`tdp_zap`) whole
    /// tables.
    KvmTdpSptesZapped = "kvm.tdp_sptes_zapped",
    /// Allocations made to fail (`alloc_fail`): each a fault that returned -ENOMEM.
    KvmAllocFailures = "kvm.alloc_failures",
    /// `fast_page_fault()`s that set W again in a write-protected SPTE with `cmpxchg64`.
    KvmFastPfFixed = "kvm.fast_pf_fixed",
    /// Leaf SPTEs `clear_young` made access-tracked (no A/D bits).
    KvmSptesAged = "kvm.sptes_aged",
    /// Access-tracked SPTEs `fast_page_fault` restored.
    KvmAccessTrackRestored = "kvm.access_track_restored",
    /// The CPU's A/D assists that set an EPT D bit (`ept_ad`).
    KvmEptDirtyAssists = "kvm.ept_dirty_assists",
    /// `kvm_set_pfn_dirty()` calls: a dirty leaf SPTE (D, or W without A/D bits) zapped,
    /// write-protected or cleaned, its dirty state handed to the page.
    KvmSetPfnDirty = "kvm.set_pfn_dirty",
    /// GPAs the CPU logged into a vCPU's PML buffer.
    KvmPmlLogged = "kvm.pml_logged",
    /// Logged GPAs `vmx_flush_pml_buffer()` drained into the dirty bitmap at a VM exit.
    KvmPmlFlushed = "kvm.pml_flushed",
    /// `mark_page_dirty_in_slot()` calls on a slot that logs dirty pages (bits set, or set
    /// again).
    KvmDirtyPagesMarked = "kvm.dirty_pages_marked",
    /// `KVM_GET_DIRTY_LOG` ioctls that returned a bitmap, and the dirty pages they returned.
    KvmDirtyLogHarvests = "kvm.dirty_log_harvests",
    KvmDirtyPagesHarvested = "kvm.dirty_pages_harvested",
    /// TDP MMU page-table pages freed after a zap removed them (at once in v5.10, after an RCU
    /// grace period from v5.12; NX recovery and patch 12 too).
    KvmTdpTablesFreed = "kvm.tdp_tables_freed",
    /// Zap requests for guest MTRR / CR0.CD changes (seed 004's "zap cnt": calls to
    /// `kvm_zap_gfn_range()` or, with patch 9, `kvm_mtrr_zap_gfn_range()` at the trigger sites).
    KvmMtrrZapRequests = "kvm.mtrr_zap_requests",
    /// `kvm_zap_gfn_range()` executions (fewer than the requests with patch 9's list).
    KvmZapGfnRange = "kvm.zap_gfn_range",
    /// KVM: page tables linked by an instruction fetch where a huge page was possible
    /// (`nx_lpage_splits`, counted as they are tracked; `nx_huge_pages`).
    KvmNxLpageSplits = "kvm.nx_lpage_splits",
    /// KVM: split page tables the NX recovery worker zapped (`kvm_recover_nx_huge_pages`).
    KvmNxRecovered = "kvm.nx_recovered",
    /// KVM: fills of a vCPU's steal-time cache (`kvm_cache_gfn_to_pfn` /
    /// `kvm_gfn_to_hva_cache_init`).
    KvmStealTimeCacheFills = "kvm.steal_time_cache_fills",
    /// KVM: SMM entries and exits (`kvm_smm_changed`: SMIs taken and RSMs emulated).
    KvmSmmTransitions = "kvm.smm_transitions",
    /// KVM: MMU-notifier invalidations (`kvm_mmu_notifier_invalidate_range_start`), either MMU.
    KvmMmuNotifierInvalidations = "kvm.mmu_notifier_invalidations",
    /// Nanoseconds vCPUs spent in those requests (seed 004's "zap cycles" at 3.1 GHz):
    /// waiting for `mmu_lock`, spinning on `mtrr_zapping`, zapping.
    KvmMtrrZapNs = "kvm.mtrr_zap_ns",
    /// Guest MTRR MSR writes (guest WRMSR and the VMM's `KVM_SET_MSRS`).
    KvmMtrrWrites = "kvm.mtrr_writes",
    /// Guest CR0.CD toggles.
    KvmCr0CdToggles = "kvm.cr0_cd_toggles",
    /// /proc/interrupts "Non-maskable interrupts": NMIs taken (perf samples, `nmi.rs`).
    Nmis = "nmi",
    /// NMIs whose `perf_callchain_user` read the user stack (`nmi_uaccess_okay()` passed or
    /// was not checked).
    NmiUaccessReads = "nmi.uaccess_reads",
    /// NMIs whose `perf_callchain_user` returned before reading: `current` had no mm, or
    /// `nmi_uaccess_okay()` said no (mid-switch).
    NmiUaccessSkipped = "nmi.uaccess_skipped",
    /// EFI runtime-service calls through `efi_mm` (`efi.rs`).
    EfiCalls = "efi.runtime_calls",
    /// Faults past the end of a file or on a revoked device mapping (`VM_FAULT_SIGBUS`).
    Sigbus = "sigbus",
    /// `mremap()` calls (`mremap.rs`), and the PTEs they moved.
    Mremaps = "mremap",
    MremapPtesMoved = "mremap.ptes_moved",
    /// `unmap_mapping_range()` walks of a file's `i_mmap` (truncate, a driver's revoke), and
    /// page-cache pages truncate freed.
    UnmapMappingRange = "unmap_mapping_range",
    TruncatedPages = "truncate.pages_freed",
    /// `migrate_vma` pages migrated (`migrate_device.rs`), and migration-entry faults waited.
    MigratedPages = "migrate_vma.pages",
    MigrationEntryWaits = "migration_entry_wait",
    /// Workload events (the metric).
    Events = "events",
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct Counters(pub Vec<u64>);

impl Counters {
    pub fn new() -> Self {
        Counters(vec![0; COUNTER_NAMES.len()])
    }
    #[inline]
    pub fn inc(&mut self, c: Counter) {
        self.0[c as usize] += 1;
    }
    #[inline]
    pub fn add(&mut self, c: Counter, n: u64) {
        self.0[c as usize] += n;
    }
    pub fn get(&self, c: Counter) -> u64 {
        self.0[c as usize]
    }
    /// (name, value) pairs.
    pub fn named(&self) -> Vec<(&'static str, u64)> {
        COUNTER_NAMES
            .iter()
            .copied()
            .zip(self.0.iter().copied())
            .collect()
    }
}

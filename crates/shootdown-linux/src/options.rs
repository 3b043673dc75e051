//! Kernel configuration: each seed series is a set of named options with its *before* and
//! *after* behaviour (and mainline's where it differs); historical bugs are options too
//! ([`Mutants`]), so the checker can be shown to find them. Experiment files select these by
//! name (`smp_call = "concurrent"`), see [`Options::set`].
//!
//! Every option is declared once, in the [`options!`] table at the end of this file (its key,
//! type, default, accepted values and documentation), and every mutant once, in the
//! [`mutants!`] table (its name, catalog id and documentation): the struct fields, the key
//! tables shown in errors and docs, and the parsers all come from those two tables.

use serde::Serialize;

/// A value given for an option key.
#[derive(Clone, Debug)]
pub enum OptValue {
    Str(String),
    Bool(bool),
    Int(i64),
}

/// How one option's value is read from an [`OptValue`]; the error is the reason (the caller
/// adds file and key).
pub trait OptionValue: Sized {
    fn parse(v: &OptValue) -> Result<Self, String>;
}

impl OptionValue for bool {
    fn parse(v: &OptValue) -> Result<bool, String> {
        match v {
            OptValue::Bool(b) => Ok(*b),
            _ => Err("expected true or false".into()),
        }
    }
}

/// A count or duration that must be at least 1 (pages, microseconds).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct AtLeastOne(pub u64);

impl OptionValue for AtLeastOne {
    fn parse(v: &OptValue) -> Result<AtLeastOne, String> {
        match v {
            OptValue::Int(i) if *i >= 1 => Ok(AtLeastOne(*i as u64)),
            OptValue::Int(i) => Err(format!("must be at least 1 (got {i})")),
            _ => Err("expected an integer".into()),
        }
    }
}

/// A count or rate that may be 0 (off).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct Count(pub u64);

impl OptionValue for Count {
    fn parse(v: &OptValue) -> Result<Count, String> {
        match v {
            OptValue::Int(i) if *i >= 0 => Ok(Count(*i as u64)),
            OptValue::Int(i) => Err(format!("must be at least 0 (got {i})")),
            _ => Err("expected an integer".into()),
        }
    }
}

/// An enum whose variants are selected by name in experiment files: the names are declared
/// once, beside the variants.
macro_rules! named_enum {
    ($(#[doc = $doc:literal])* pub enum $name:ident {
        $( $(#[doc = $vdoc:literal])* $var:ident = $s:literal, )+
    }) => {
        $(#[doc = $doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
        pub enum $name { $( $(#[doc = $vdoc])* $var, )+ }

        impl $name {
            /// The names experiment files use, in declaration order.
            pub const NAMES: &'static [&'static str] = &[$($s),+];
            /// The name experiment files use for this value.
            pub fn name(self) -> &'static str {
                match self { $( $name::$var => $s, )+ }
            }
        }

        impl OptionValue for $name {
            fn parse(v: &OptValue) -> Result<$name, String> {
                let OptValue::Str(s) = v else {
                    return Err("expected a string".into());
                };
                match s.as_str() {
                    $( $s => Ok($name::$var), )+
                    o => Err(format!(
                        "unknown value '{o}' (expected {})",
                        $name::NAMES.join(" | ")
                    )),
                }
            }
        }
    };
}

named_enum! {
    /// How `smp_call_function_many` orders the local call against the remote ones (seed 000).
    pub enum SmpCall {
        /// v5.12 and earlier: `flush_tlb_mm_range` flushes locally, then `flush_tlb_others` IPIs
        /// the remote CPUs and waits (kernel/smp.c `smp_call_function_many_cond` never runs
        /// locally).
        RemoteThenLocal = "remote_then_local",
        /// Nadav Amit's series (v5.13): `flush_tlb_multi` queues and IPIs the remote CPUs, runs
        /// the local flush while they work, then waits (`SCF_RUN_LOCAL`).
        Concurrent = "concurrent",
    }
}

named_enum! {
    /// `tlb_finish_mmu()` when another mmu_gather of the mm is in progress
    /// (`mm_tlb_flush_nested()`: `mm->tlb_flush_pending > 1`). Two `madvise(MADV_DONTNEED)`s of
    /// one range under `mmap_sem` read: the second finds the PTEs already clear and, with nothing
    /// gathered, would return before the first one's flush. (v4.12 and earlier had no check:
    /// the mutant `tlb_finish_mmu_ignores_nested`.)
    pub enum MmuGather {
        /// v4.13–v5.1 (99baac21e458): a nested gather force-flushes its whole range.
        V4_13 = "v4_13",
        /// v5.2+ (7a30df49f63a): a nested gather flushes the whole mm, as if it freed tables.
        Mainline = "mainline",
    }
}

named_enum! {
    /// `flush_tlb_batched_pending()` under the PTL of `zap_pte_range` / `change_pte_range`:
    /// reclaim's batched unmap (`try_to_unmap_one` with `TTU_BATCH_FLUSH`) clears PTEs and
    /// defers their flush; a caller that then finds them clear must not return before it.
    /// (v4.12 and earlier had no check: the mutant `no_flush_tlb_batched_pending`.)
    pub enum BatchedPending {
        /// v4.13 (3ea277194daa): `mm->tlb_flush_batched` is a bool, set by reclaim and cleared
        /// after the `flush_tlb_mm()`; a batch queued during that flush is forgotten.
        V4_13 = "v4_13",
        /// Mainline: `mm->tlb_flush_batched` counts pending and flushed batches; the flush is
        /// marked done only if no batch was queued meanwhile (`atomic_cmpxchg`).
        Mainline = "mainline",
    }
}

named_enum! {
    /// `/sys/kernel/mm/transparent_hugepage/enabled`: may an anonymous page fault map a whole
    /// 2 MiB page with one PMD leaf?
    pub enum Thp {
        /// Every fault maps one 4 KiB page.
        Never = "never",
        /// A fault in a 512-page group that has neither a page-table page nor a PMD leaf maps
        /// the whole group with a PMD leaf (`do_huge_pmd_anonymous_page`). The model assumes
        /// the VMA covers the aligned group (it keeps no VMAs).
        Always = "always",
    }
}

named_enum! {
    /// How `flush_tlb_mm_range()` counts a range against `tlb_single_page_flush_ceiling` and
    /// steps its INVLPGs.
    pub enum FlushStride {
        /// Before v4.20: in 4 KiB pages whatever the page size, so a range of 2 MiB leaves
        /// above 33 × 4 KiB is a full flush.
        V4_19 = "v4_19",
        /// v4.20+ ("x86/mm: Page size aware flush_tlb_mm_range()"): `stride_shift` from
        /// `tlb_get_unmap_shift()`: an unmap that cleared only PMD leaves counts and flushes
        /// one INVLPG per 2 MiB.
        Mainline = "mainline",
    }
}

named_enum! {
    /// The `freed_tables` argument x86's `flush_tlb_range(vma, start, end)` passes to
    /// `flush_tlb_mm_range()`. khugepaged's `pmdp_collapse_flush()` uses it to flush a PMD
    /// that pointed to a page-table page it then frees; without `freed_tables` the flush skips
    /// lazy CPUs, whose paging-structure caches may still point to the table.
    pub enum FlushTlbRange {
        /// v4.20–v6.14: `freed_tables = false`.
        V6_14 = "v6_14",
        /// v6.15+ (3ef938c35035, Jann Horn, "x86/mm: Fix flush_tlb_range() when used for
        /// zapping normal PMDs"; backported to the 5.4–6.13 stable trees as CVE-2025-22045):
        /// `freed_tables = true`, as arm64 always assumed.
        Mainline = "mainline",
    }
}

named_enum! {
    /// Where `move_ptes()` (mremap) flushes the old range (`mremap.rs`).
    pub enum MremapTlbFlush {
        /// v4.18 and earlier (since 5d1904204c99, v4.9): a moved *dirty* PTE is flushed before
        /// the old PTL is dropped (after the new one); clean ones set `need_flush` and
        /// `move_page_tables()` flushes once at its end, after every PTL is dropped. A
        /// truncate can then zap the moved PTE at its new address, flush that, and free the
        /// page while a CPU still caches the old address (CVE-2018-18281).
        V4_18 = "v4_18",
        /// v4.19+ (eb66ae030829, "mremap: properly flush TLB before releasing the page"): any
        /// moved present PTE is flushed with both PTLs still held.
        Mainline = "mainline",
    }
}

named_enum! {
    /// Where `migrate_vma_collect_pmd()` flushes the PTEs it replaced by migration entries
    /// (`migrate_device.rs`).
    pub enum MigrateVmaFlush {
        /// v4.14–v5.18: `flush_tlb_range()` after `pte_unmap_unlock()`. A racing
        /// `madvise(MADV_DONTNEED)` then finds a non-present entry, flushes nothing and
        /// returns while a CPU can still use the page. (From v5.19, 6c287605fd56, an
        /// anon-exclusive page is cleared with `ptep_clear_flush()` under the PTL; the window
        /// stayed open for shared anonymous pages until the fix.)
        V5_18 = "v5_18",
        /// 60bae7370896 ("mm/migrate_device.c: flush TLB while holding PTL", September 2022,
        /// also in the 5.19 stable series): the flush is done before the PTL is dropped.
        Mainline = "mainline",
    }
}

named_enum! {
    /// How a kernel thread borrows an mm (`mm_refs.rs`).
    pub enum KthreadUseMm {
        /// v5.7 and earlier, mm/mmu_context.c `use_mm()`: `tsk->active_mm` and `tsk->mm` set
        /// with interrupts on, then `switch_mm()` (x86: interrupts off inside); `unuse_mm()`
        /// keeps the borrowed reference as the lazy one.
        V5_7 = "v5_7",
        /// v5.8+ (38cf307c1f20, "mm: fix kthread_use_mm() vs TLB invalidate"): the assignment
        /// and `switch_mm_irqs_off()` under `local_irq_disable()`; `kthread_unuse_mm()` takes a
        /// lazy-TLB reference (`mmgrab_lazy_tlb`) and drops the borrowed one.
        Mainline = "mainline",
    }
}

named_enum! {
    /// Lazy-TLB design (seed 002 and what followed; docs/design/kernel-model.md §1.5–1.8).
    pub enum LazyTlb {
        /// v4.12 (V0): `cpu_tlbstate.state` OK/LAZY; lazy CPUs stay in `mm_cpumask`, the first
        /// flush IPI makes them `leave_mm()` to init_mm.
        Legacy = "legacy",
        /// Andy Lutomirski's rework, seed 002 (V1, v4.14-rc1): entering lazy mode clears the
        /// CPU's bit in `mm_cpumask`; `(ctx_id, tlb_gen)` tells on switch-back whether a flush
        /// was missed.
        TlbGen = "tlb_gen",
        /// v4.20–v5.x (V3/V4, Rik van Riel; its cpumask rule, clearing the old mm's bit at a
        /// switch, lasted until v6.12): lazy CPUs stay in the mask with `is_lazy` set;
        /// flushes skip them (`tlb_is_not_lazy`) unless page tables were freed, when they switch
        /// to init_mm.
        IsLazy = "is_lazy",
        /// v6.13 (209954cbc7d0, "Update mm_cpumask lazily"): switching away keeps the old mm's
        /// cpumask bit; a flush IPIs every non-lazy CPU of the mask (`tlb_is_not_lazy`), and one
        /// that reaches a CPU running another mm clears that CPU's bit; the bit is set only if
        /// clear, so with it already set no locked instruction orders the switch's stores
        /// (`is_lazy = false`) before its `tlb_gen` load. Simplified: `LOADED_MM_SWITCHING` is
        /// announced where v6.17 does (first), not after the `tlb_gen` read as v6.13 did; the
        /// other later changes of the mainline form (e.g. `flush_tlb_func`'s up-to-date skip)
        /// are kept: only the cpumask rules differ.
        V6_13 = "v6_13",
        /// v6.17, before 83b0177a6c48: `should_flush_tlb()` (6db2526c1d69, v6.14) skips CPUs
        /// running another mm unless the flush trims (`should_trim_cpumask`: at most once a
        /// second per mm), `LOADED_MM_SWITCHING` first; still no `smp_mb()` when the bit is
        /// already set, so the `loaded_mm` store can pass the `tlb_gen` load under TSO.
        V6_17 = "v6_17",
        /// Current mainline (V5, v6.18+): v6.17's rules plus `smp_mb()` in `switch_mm_irqs_off`
        /// when the cpumask bit was already set (83b0177a6c48).
        Mainline = "mainline",
    }
}

impl LazyTlb {
    /// Lazy CPUs stay in `mm_cpumask` with `cpu_tlbstate_shared.is_lazy` set.
    pub fn has_is_lazy(self) -> bool {
        !matches!(self, LazyTlb::Legacy | LazyTlb::TlbGen)
    }
    /// Switching away keeps the old mm's cpumask bit, and flush IPIs to a CPU running another
    /// mm clear it (v6.13+).
    pub fn trims_lazily(self) -> bool {
        matches!(self, LazyTlb::V6_13 | LazyTlb::V6_17 | LazyTlb::Mainline)
    }
    /// `should_flush_tlb()` with `should_trim_cpumask()`'s once-a-second trim (6db2526c1d69,
    /// v6.14+).
    pub fn trims_once_a_second(self) -> bool {
        matches!(self, LazyTlb::V6_17 | LazyTlb::Mainline)
    }
}

named_enum! {
    /// LATR, lazy translation coherence (Kumar et al., ASPLOS'18; a research design, never
    /// merged: `latr.rs`): munmap's and madvise's flushes are saved for the other CPUs' next
    /// scheduler tick instead of IPIing them.
    pub enum Latr {
        /// Every flush IPIs (the kernel).
        Off = "off",
        /// The artifact's default configuration (`LAZY_MEM_FREE=n`): the call frees its pages
        /// and page tables when it returns, before the other CPUs have drained the state.
        Latr = "latr",
        /// With `LAZY_MEM_FREE`: the call's pages and page tables are freed only when every CPU
        /// the state names has drained it.
        LazyFree = "lazy_free",
    }
}

named_enum! {
    /// Early acknowledgement of flush IPIs (Nadav Amit's "x86: Flush remote TLBs concurrently
    /// and async", RFC v2, May 2019, patches 10-11, and Amit, Tai and Wei, "Don't shoot down TLB
    /// shootdowns!", EuroSys'20; a research design, never merged: `smp.rs`). The responder
    /// copies the flush request inlined in the csd, sets `async_func_in_progress`, unlocks the
    /// csd, and only then runs `flush_tlb_func`; `nmi_uaccess_okay()` refuses user reads while
    /// `async_func_in_progress` names the flush. Flushes that free page tables, and
    /// `flush_tlb_kernel_range`, stay synchronous (unlock after the flush).
    pub enum EarlyAck {
        /// The kernel: every flush csd is unlocked after `flush_tlb_func` ran.
        Off = "off",
        /// The RFC as posted: the flush is sent with `wait = 0`, so the initiator returns
        /// without waiting even for the acknowledgement (its author's own remark in the
        /// thread); only its next call's `csd_lock` waits for the unlock.
        RfcV2 = "rfc_v2",
        /// The design as the thread and the paper describe it: the initiator waits in
        /// `csd_lock_wait` for each target's early unlock.
        Acked = "acked",
    }
}

named_enum! {
    /// Where, under PTI, a flush of user-PCID entries runs (`tlb.rs`, `user.rs`).
    pub enum PtiUserFlush {
        /// The kernel (v4.15+): `flush_tlb_func`'s partial flush does INVLPG in the kernel PCID
        /// and INVPCID in the user PCID for each page at once (or, without INVPCID, marks the
        /// whole user PCID in `user_pcid_flush_mask` for the return to user).
        Immediate = "immediate",
        /// In-context flushes (Nadav Amit's RFC v2 "x86/mm/tlb: Defer PTI flushes", Aug 2019;
        /// the EuroSys'20 paper's in-context flushes; a research design, never merged): a
        /// shootdown's handler flushes only the kernel PCID and records the user range in
        /// `cpu_tlbstate` (`user_flush_start/end/stride_shift`), merged with one already
        /// recorded when it starts at or above it, has its stride and stays under the
        /// ceiling, else widened to a full flush; the return to user (`SWITCH_TO_USER_CR3`)
        /// then INVLPGs the range in the user PCID. Not on the initiating CPU, and not for a
        /// flush that frees page tables.
        Deferred = "deferred",
    }
}

named_enum! {
    /// A guest's Hyper-V enlightened TLB flush on KVM (`hyperv.rs`, `kvm/hyperv.rs`): the
    /// guest's `hyperv_flush_tlb_multi` hypercall and KVM's `kvm_hv_flush_tlb`, by version.
    pub enum HvTlbFlush {
        /// No enlightenment: the guest flushes by IPIs.
        Off = "off",
        /// v4.18 (KVM's first `kvm_hv_flush_tlb`): `KVM_REQ_TLB_FLUSH` of each target vCPU,
        /// with `KVM_REQUEST_WAIT`; the guest sends every CPU of the mask.
        V4_18 = "v4_18",
        /// After 0baedd792713 ("make Hyper-V PV TLB flush use tlb_flush_guest()") until
        /// 1ebfaa11ebb5 (v5.16): `KVM_REQ_TLB_FLUSH_GUEST` without `KVM_REQUEST_WAIT`, so the
        /// hypercall returns before the kicked vCPUs have left the guest.
        V5_10 = "v5_10",
        /// v6.3+: `KVM_REQ_HV_TLB_FLUSH` with `KVM_REQUEST_WAIT` and the per-vCPU FIFO of
        /// addresses to flush (a flush-all entry when it is full); the guest leaves lazy CPUs
        /// out unless page tables were freed.
        Mainline = "mainline",
    }
}

named_enum! {
    /// The guest (or native) kernel's scheduler for its tasks (`sched.rs`, `fair.rs`).
    pub enum Sched {
        /// The model's simplification: one FIFO runqueue per CPU, a woken task waits for the
        /// CPU's next scheduling point, preemption only after `sched_timeslice_us`.
        Fifo = "fifo",
        /// v6.6+ EEVDF (`fair.rs`): lag, eligibility and deadlines; a woken task preempts the
        /// running one when `pick_eevdf` picks it. Timed runs only.
        Eevdf = "eevdf",
    }
}

named_enum! {
    /// How a guest kernel's `spin_lock` waits (`spinlock.rs`; v4.15's `kvm_spinlock_init`).
    pub enum SpinlockKind {
        /// Native queued spinlock (FIFO, waiters spin).
        Queued = "queued",
        /// `virt_spin_lock()`: unfair test-and-set (a guest without PV spinlocks).
        Tas = "tas",
        /// Paravirtual queued spinlock: spin, then halt in `pv_wait`; kicked by the unlocker.
        Pv = "pv",
    }
}

named_enum! {
    /// What the idle loop does (kernel command line `idle=`).
    pub enum Idle {
        /// HLT/MWAIT: an IPI wakes the CPU, paying `idle_wakeup`.
        Halt = "halt",
        /// `idle=poll`: spins on TIF_NEED_RESCHED; a reschedule needs no IPI (seed 002's guest).
        Poll = "poll",
    }
}

named_enum! {
    /// The fast path of each VMREAD/VMWRITE after the VMX instruction (seed 000's second cover
    /// letter, docs/design/kernel-model.md §6): how many instructions check for VMfail on success.
    pub enum VmxInsnErrorCheck {
        /// v5.4+ (`asm goto`: one hinted `JNA`/`JA` to an out-of-line error path), or ≤v5.2 with
        /// a compiler that has flag outputs (`CC_SET` becomes one Jcc): 1 instruction.
        Jcc = "jcc",
        /// v5.3-rc with flag outputs: the objtool fix added an unconditional `JMP` over the
        /// inline `call kvm_spurious_fault`: 2 instructions.
        JccJmp = "jcc_jmp",
        /// ≤v5.2 without flag outputs: `CC_SET` materialises the flag (`SETcc`), then
        /// `CMP`/`TEST` + `Jcc`: 3 instructions.
        SetccCmpJcc = "setcc_cmp_jcc",
        /// v5.3-rc without flag outputs: `SETcc` + `CMP` + `Jcc` + `JMP`: 4 instructions.
        SetccCmpJccJmp = "setcc_cmp_jcc_jmp",
    }
}

impl VmxInsnErrorCheck {
    /// Fast-path instructions after each VMX instruction.
    pub fn instructions(self) -> u64 {
        match self {
            VmxInsnErrorCheck::Jcc => 1,
            VmxInsnErrorCheck::JccJmp => 2,
            VmxInsnErrorCheck::SetccCmpJcc => 3,
            VmxInsnErrorCheck::SetccCmpJccJmp => 4,
        }
    }
}

named_enum! {
    /// Which host `vcpu_put`s mark a vCPU preempted in its steal-time area (docs/design/kernel-model.md
    /// §3.3).
    pub enum SetPreempted {
        /// v4.16–v5.x: `kvm_arch_vcpu_put` calls `kvm_steal_time_set_preempted` on every put,
        /// including when the vCPU thread blocks in HLT (so PV flush skips halted vCPUs too).
        EveryPut = "every_put",
        /// Later kernels: only when the vCPU thread was preempted while runnable
        /// (`vcpu->preempted`).
        Involuntary = "involuntary",
    }
}

named_enum! {
    /// The KVM around the MMU (seed 003; docs/design/kernel-model.md §4.3–§4.5): how memslot updates mark
    /// and publish the generation, what the MMIO cache and MMIO SPTEs accept, what a
    /// `KVM_REQ_TLB_FLUSH` flushes, and the form of each memslot zap strategy.
    pub enum KvmVersion {
        /// v5.0, before seed 003: the generation is odd while an update is in progress (+1, then
        /// +3); `kvm_arch_memslots_updated()` runs after the new generation is visible (K6);
        /// the MMIO cache records an in-progress generation (K7); `fast_invalidate` is
        /// Xiao Guangrong's 2013 form (`mmu_valid_gen++`, `KVM_REQ_MMU_RELOAD` to every vCPU
        /// under `mmu_lock`, obsolete pages zapped in batches of 10 with lock breaks that do not
        /// flush, parked on `zapped_obsolete_pages`).
        V5_0 = "v5_0",
        /// v5.1, after seed 003: bit 63 marks an update in progress, the arch hook runs before
        /// the generation is stored, nothing is cached while an update is in flux; `slot_only`
        /// is the 2019 form (rmap walk whose lock breaks do not flush, then a per-gfn hash walk
        /// that flushes or commits before each break).
        V5_1 = "v5_1",
        /// Current mainline (legacy shadow MMU paths): as v5.1, plus a memslot swap waits for
        /// in-flight MMU-notifier invalidations, `KVM_REQ_TLB_FLUSH` is INVEPT all-context, and
        /// `slot_only` (`kvm_mmu_zap_memslot`) carries its pending flush into every lock break.
        Mainline = "mainline",
    }
}

named_enum! {
    /// How `FNAME(sync_page)` pays for the SPTEs it drops (shadow paging; `kvm/mmu/shadow.rs`).
    /// A dropped SPTE may still be cached in another vCPU's TLB: the guest will flush it, but
    /// the host must not free the page behind it before then.
    pub enum ShadowSyncFlush {
        /// a4ee1ca4a36e (2011) until f81602958c11: only `kvm->tlbs_dirty++`; the flush is left
        /// to the next `kvm_flush_remote_tlbs()` (which zeroes the count) and to the MMU
        /// notifier, whose `invalidate_range_start` flushes while the count is non-zero.
        TlbsDirty = "tlbs_dirty",
        /// f81602958c11 (v5.15) on: the sync flushes every vCPU before it returns
        /// (`SET_SPTE_NEED_REMOTE_TLB_FLUSH`), as rmap-based write protection, which finds no
        /// SPTE to protect, relies on.
        Remote = "remote",
    }
}

named_enum! {
    /// What `kvm_arch_flush_shadow_memslot()` zaps when a memslot is deleted or moved
    /// (docs/design/kernel-model.md §4.5; the form of each follows `kvm`).
    pub enum MemslotZap {
        /// `kvm_mmu_zap_all()`: every shadow page, with lock breaks (the v5.3-rc revert; can
        /// livelock against faulting vCPUs).
        ZapAll = "zap_all",
        /// `kvm_mmu_invalidate_zap_all_pages()` / `kvm_mmu_zap_all_fast()`: obsolete every page
        /// at once (a new `mmu_valid_gen`), make every vCPU drop its root, zap the obsolete
        /// pages (≤v5.0, v5.3+; mainline's default with `KVM_X86_QUIRK_SLOT_ZAP_ALL`).
        FastInvalidate = "fast_invalidate",
        /// Zap only the slot's SPTEs and shadow pages (v5.1–v5.2, seed 003's patch; mainline
        /// without the quirk).
        SlotOnly = "slot_only",
    }
}

named_enum! {
    /// Which guest MTRR and CR0.CD changes make KVM zap SPTEs while it honours guest MTRRs (EPT
    /// with non-coherent DMA; seed 004, docs/design/kvm-mmu-seeds.md §2.2). The zap covers what the memory
    /// type of a leaf SPTE (`vmx_get_mt_mask`) may have depended on.
    pub enum MtrrZap {
        /// v6.5 (seed 004's Base1): `update_mtrr()` zaps on every MTRR MSR write (MTRRs
        /// disabled: only `MTRRdefType`), whatever CR0.CD; a CR0.CD toggle zaps only without
        /// `KVM_X86_QUIRK_CD_NW_CLEARED` (QEMU leaves the quirk on: no zap).
        V6_5 = "v6_5",
        /// Base2 = v6.5 + Yan Zhao's patches 6–8 (never merged as posted): MTRR writes while
        /// CR0.CD=1 do not zap; every CR0.CD toggle zaps; with the quirk, CR0.CD=1 maps WB
        /// without IPAT.
        Base2 = "base2",
        /// v6.11+ (0a7b73559b39): KVM no longer virtualizes guest MTRRs or CR0.CD memory
        /// types; neither zaps.
        Mainline = "mainline",
    }
}

named_enum! {
    /// What a CR0.CD toggle zaps when it zaps (seed 004's patch 10).
    pub enum CdZapRange {
        /// Everything: `[0, ~0)`.
        All = "all",
        /// Patch 10: everything only when CR0.CD=1's memory type differs from the MTRR default
        /// type; else `[0, 1 MiB)` if a fixed range differs from it, and each variable range
        /// that does.
        FineGrained = "fine_grained",
    }
}

named_enum! {
    /// Which `mmu_lock` mode the TDP MMU part of `kvm_zap_gfn_range()` runs under (seed 004's
    /// patch 12).
    pub enum ZapLock {
        /// v6.5: the write lock throughout, yielding on contention
        /// (`tdp_mmu_iter_cond_resched`) with any pending flush done first.
        Write = "write",
        /// Patch 12: `invalidate_begin` under the write lock, then the TDP walk under the
        /// read lock with atomic zaps (a freeze, a remote flush per zapped SPTE, then the
        /// clear), then `invalidate_end` under the write lock again.
        Read = "read",
    }
}

named_enum! {
    /// The form of `kvm_zap_gfn_range()`'s TDP MMU walk under the write lock
    /// (`zap_gfn_range()` until v5.17, `tdp_mmu_zap_leafs()` from v5.18), and how a table it
    /// removes is flushed for and freed (`kvm/mmu/tdp_mmu.rs`, `kvm/mmu/tdp_rcu.rs`).
    pub enum TdpZap {
        /// v5.10–v5.11: every present entry that lies wholly inside the range is zapped,
        /// tables too; a removed table (`handle_changed_spte`) is flushed for over its range
        /// and freed at once, under the spinlock; a yield flushes first.
        V5_10 = "v5_10",
        /// v5.12–v5.14 (7cca2d0b7e7d): as v5.10 under the rwlock and RCU: each root's walk is
        /// an RCU read section, `handle_removed_tdp_mmu_page` flushes the table's range and
        /// then `call_rcu`s it, and a yield drops RCU before its flush.
        V5_12 = "v5_12",
        /// v5.15–v5.17 (0103098fb4f1): as v5.12, and a zap of everything (`zap_all`) walks
        /// the root's own entries only (`min_level` = the root level): zapping a top-level
        /// table takes its subtree with it. With the iterator fixed by 3a0f64de479c (v5.16;
        /// plain v5.15 is mutant `tdp_iter_advances_after_restart`, K15).
        V5_15 = "v5_15",
        /// v5.18+ (f47e5bbbc92f): leaves only; no table is freed, so the caller's flush
        /// comes after RCU is dropped.
        Mainline = "mainline",
    }
}

named_enum! {
    /// How the NX huge page recovery worker (`kvm_recover_nx_huge_pages`) flushes for the TDP
    /// MMU tables it zaps.
    pub enum NxRecoveryFlush {
        /// v5.10–v5.11 (`kvm_recover_nx_lpages`): the TDP MMU zap's "flush needed" is ignored
        /// and only `kvm_mmu_commit_zap_page()` runs, which flushes for shadow pages alone; the
        /// unlinked table is freed at once (fixed by 048f49809c52, v5.12).
        V5_10 = "v5_10",
        /// v5.12+: `kvm_mmu_remote_flush_or_zap(kvm, &invalid_list, flush)`.
        Mainline = "mainline",
    }
}

named_enum! {
    /// How the host maps a vCPU's steal-time area (`vcpu->arch.st.cache`, `kvm/st_cache.rs`).
    pub enum StealTimeMap {
        /// v5.6–v5.15 (917248144db5): a `gfn_to_pfn_cache` through `kvm_map_gfn()`, refreshed
        /// only when the memslot generation moves; an MMU-notifier invalidation of the page
        /// leaves it in place (fixed by 7e2175ebd695).
        V5_6 = "v5_6",
        /// v5.16+ (7e2175ebd695): a `gfn_to_hva_cache`, accessed as user memory of the VMM.
        Mainline = "mainline",
    }
}

/// An allocation made to fail (`alloc_fail = "SITE:VCPU,VCPU…"`): the first attempt of each
/// listed vCPU at that site fails with -ENOMEM, where the kernel handles the failure; later
/// attempts succeed (the host has reclaimed memory meanwhile).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct AllocFail {
    pub site: AllocSite,
    /// The vCPUs (bit i: vCPU i of the VM) whose first attempt fails.
    pub vcpus: u64,
}

named_enum! {
    /// Where an allocation failure can be injected (`AllocFail`).
    pub enum AllocSite {
        /// Nothing fails.
        None = "none",
        /// `mmu_topup_memory_caches()` at the start of a page fault, before `mmu_lock` (both
        /// MMUs): the fault returns -ENOMEM, `KVM_RUN` returns it to the VMM.
        MmuTopupMemoryCaches = "mmu_topup_memory_caches",
    }
}

impl Default for AllocFail {
    fn default() -> Self {
        AllocFail {
            site: AllocSite::None,
            vcpus: 0,
        }
    }
}

impl AllocFail {
    /// Does the first attempt of vCPU `v` (of its VM) at `site` fail?
    pub fn fails(&self, site: AllocSite, v: usize) -> bool {
        self.site == site && v < 64 && self.vcpus & (1 << v) != 0
    }
}

impl OptionValue for AllocFail {
    fn parse(v: &OptValue) -> Result<AllocFail, String> {
        let OptValue::Str(s) = v else {
            return Err(
                "expected \"none\" or \"SITE:VCPU,…\" (e.g. \"mmu_topup_memory_caches:0,1\")"
                    .into(),
            );
        };
        let (site, list) = s.split_once(':').unwrap_or((s.as_str(), ""));
        let site = AllocSite::parse(&OptValue::Str(site.trim().to_string()))?;
        let mut vcpus = 0u64;
        for t in list.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            match t.parse::<u32>() {
                Ok(i) if i < 64 => vcpus |= 1 << i,
                _ => return Err(format!("'{t}' is not a vCPU index (0..63)")),
            }
        }
        match (site, vcpus) {
            (AllocSite::None, 0) => Ok(AllocFail::default()),
            (AllocSite::None, _) => Err("\"none\" takes no vCPUs".into()),
            (_, 0) => Err(format!(
                "name the vCPUs whose allocation fails: \"{}:0,1\"",
                site.name()
            )),
            _ => Ok(AllocFail { site, vcpus }),
        }
    }
}

/// Width of the memslot generation kept in MMIO SPTEs (19 bits from v5.1, 20 before):
/// scenarios narrow it so that a wrap takes a few updates.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(transparent)]
pub struct MmioGenBits(pub u8);

impl OptionValue for MmioGenBits {
    fn parse(v: &OptValue) -> Result<MmioGenBits, String> {
        match v {
            OptValue::Int(i) if (2..=20).contains(i) => Ok(MmioGenBits(*i as u8)),
            OptValue::Int(i) => Err(format!("must be between 2 and 20 (got {i})")),
            _ => Err("expected an integer".into()),
        }
    }
}

/// Where the model records that it ran mutated code: set when the model's code asks an enabled
/// mutant whether it is on (any thread, any driver). The checker gives each check a flag of its
/// own ([`Mutants::track`]) and reads it after, so that a mutant whose code no explored
/// interleaving reaches is reported, not taken as harmless — and two checks at once in one
/// process (a test binary's threads) do not share it. Copies of the options share the flag;
/// it takes no part in comparing, hashing or printing them.
#[derive(Clone, Copy)]
pub struct RanFlag(&'static std::sync::atomic::AtomicBool);

/// The flag of options no check tracks.
static UNTRACKED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

impl Default for RanFlag {
    fn default() -> Self {
        RanFlag(&UNTRACKED)
    }
}
impl PartialEq for RanFlag {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}
impl Eq for RanFlag {}
impl std::hash::Hash for RanFlag {
    fn hash<H: std::hash::Hasher>(&self, _: &mut H) {}
}
impl std::fmt::Debug for RanFlag {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RanFlag")
    }
}

/// The mutant table: each historical bug or seeded mistake is declared once, with its name,
/// its catalog id (`""` for a seeded mistake) and what the broken code does.
macro_rules! mutants {
    ($( $(#[doc = $doc:literal])* $field:ident = $bug:literal, )+) => {
        /// Historical bugs and seeded mistakes, each re-creatable as an option. All off = the
        /// fixed protocol. See `docs/checker.md`: its Results table gives each mutant's catalog
        /// id, the invariant it breaks and its counterexample's length; `shootdown check --list`
        /// shows the ids too.
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize)]
        pub struct Mutants {
            $( $(#[doc = $doc])* pub $field: bool, )+
            /// Whether mutated code ran ([`RanFlag`]).
            #[serde(skip)]
            pub ran: RanFlag,
        }

        /// The names mutants are selected by, with the catalog id each re-creates (or `""`).
        pub const MUTANT_NAMES: &[(&str, &str)] = &[ $( (stringify!($field), $bug), )+ ];

        /// Whether each mutant is on, as the model's code asks it: a `true` answer means the
        /// mutated code runs, which [`Mutants::ran`] then reports.
        impl Mutants {
            $(
                #[inline]
                pub fn $field(&self) -> bool {
                    if self.$field {
                        self.ran.0.store(true, std::sync::atomic::Ordering::Relaxed);
                    }
                    self.$field
                }
            )+
        }

        impl Mutants {
            /// Give these options (and every copy made from now on) a fresh flag of their own
            /// for [`Mutants::ran`]. (One flag of one byte is leaked per call: a check's.)
            pub fn track(&mut self) {
                self.ran = RanFlag(Box::leak(Box::new(std::sync::atomic::AtomicBool::new(false))));
            }

            /// Whether mutated code ran since [`Mutants::track`].
            pub fn ran(&self) -> bool {
                self.ran.0.load(std::sync::atomic::Ordering::Relaxed)
            }

            /// Enable a mutant by name.
            pub fn enable(&mut self, name: &str) -> Result<(), String> {
                match name {
                    $( stringify!($field) => self.$field = true, )+
                    _ => {
                        let names: Vec<_> = MUTANT_NAMES.iter().map(|m| m.0).collect();
                        return Err(format!(
                            "unknown mutant '{name}' (known: {})",
                            names.join(", ")
                        ));
                    }
                }
                Ok(())
            }
        }
    };
}

mutants! {
    /// N1: on page-table batch allocation failure, free the table right after a "sync" IPI that
    /// invalidates nothing, before the flush.
    free_tables_before_flush = "N1",
    /// N3: lazy CPUs are never IPI'd, even when page tables are freed.
    lazy_ignores_freed_tables = "N3",
    /// N5 (CVE-2025-37964): `should_flush_tlb()` tests only `loaded_mm == info->mm`, not
    /// `LOADED_MM_SWITCHING`.
    should_flush_ignores_switching = "N5",
    /// N8: `flush_tlb_func()`'s "already up to date" shortcut treats `new_tlb_gen == 0` (batched
    /// flush: TLB_GENERATION_INVALID) as a real generation.
    batch_flush_gen_zero = "N8",
    /// O1 (FreeBSD r362031 in Linux terms): the concurrent flush increments `tlb_gen` only in its
    /// local part, after reading `mm_cpumask` and sending the IPIs.
    inc_tlb_gen_after_ipis = "O1",
    /// `switch_mm_irqs_off` reads `next->context.tlb_gen` before setting its bit in
    /// `mm_cpumask`.
    switch_mm_gen_before_cpumask = "",
    /// `flush_tlb_func` flushes only the request's range even when more than one generation is
    /// owed (drops the `new_tlb_gen == local_tlb_gen + 1` condition).
    partial_flush_when_full_owed = "",
    /// Mainline `switch_mm_irqs_off` without the explicit `smp_mb()` when the cpumask bit is
    /// already set (only visible under TSO): the barrier 83b0177a6c48 added in v6.18
    /// (`lazy_tlb = "v6_17"` is that kernel's whole form).
    switch_mm_no_barrier = "",
    /// K1 (CVE-2019-3016 part a, before 8c6de56a42e0): `kvm_steal_time_set_preempted()` writes
    /// `KVM_VCPU_PREEMPTED` over the guest's steal-time byte on every `vcpu_put`, ignoring the
    /// host shadow that says it already did: a second put before the next entry erases a
    /// `KVM_VCPU_FLUSH_TLB` the guest set in between.
    pv_set_preempted_clobbers_flush = "K1",
    /// K2 (CVE-2019-3016 part b, before b043138246a4): `record_steal_time()` reads the whole
    /// steal-time struct into a host copy, clears `preempted` in the copy (flushing if the copy
    /// had `KVM_VCPU_FLUSH_TLB`) and writes the copy back: a flag set by the guest in between is
    /// lost.
    pv_record_steal_time_nonatomic = "K2",
    /// K6 (before 152482580a1b): `install_new_memslots()` stores the new generation and only
    /// then calls `kvm_arch_memslots_updated()`, which zaps MMIO SPTEs when the MMIO generation
    /// wrapped: in between, a vCPU can validate an ancient MMIO SPTE against the wrapped
    /// generation.
    memslots_updated_after_gen = "K6",
    /// K7 (before ddfd1730fd82): `vcpu_cache_mmio_info()` caches an MMIO access while a memslot
    /// update is in progress, with the in-progress generation, which still matches after the
    /// vCPU sees the new memslots.
    mmio_cache_in_progress = "K7",
    /// K10 (a21136345cb6, fixed in v5.1-rc6): `kvm_mmu_remote_flush_or_zap()` bails out when no
    /// flush was asked for and the invalid list is *not* empty (an inverted `list_empty()`):
    /// the prepared pages are neither flushed nor freed before `mmu_lock` is dropped.
    remote_flush_or_zap_inverted = "K10",
    /// Seed 003 v1's "zap vs flush priority bug" (F1 in docs/design/kvm-mmu-seeds.md §4; the v1 body was
    /// not retrieved, this is its likely shape): `kvm_mmu_remote_flush_or_zap()` honours a
    /// requested flush first and returns, leaving a non-empty invalid list uncommitted (the
    /// zapped pages leak).
    remote_flush_or_zap_flush_first = "",
    /// Seed 003's slot-only zap as merged in v5.1 (4e103134b862, `slot_handle_all_level(...,
    /// lock_flush_tlb = false)`) on mainline's code: its walk of the slot's rmaps breaks
    /// `mmu_lock` with SPTEs zapped and not flushed. Another invalidation of those frames (an
    /// MMU notifier) then finds them gone, flushes nothing and lets the host free the pages
    /// while a vCPU still caches them. (`kvm = "v5_1"` has this behaviour too.)
    slot_zap_rmap_break_without_flush = "",
    /// A2: before 99baac21e458 (v4.13): `tlb_finish_mmu()` has no `mm_tlb_flush_nested()` check. A
    /// `madvise(MADV_DONTNEED)` that finds the PTEs already cleared by a concurrent one gathers
    /// nothing, flushes nothing and returns while the other's flush is still on its way.
    tlb_finish_mmu_ignores_nested = "A2",
    /// A3: before 3ea277194daa (v4.13): no `flush_tlb_batched_pending()`. A call that finds PTEs
    /// reclaim cleared with its flush deferred (`TTU_BATCH_FLUSH`) changes nothing, flushes
    /// nothing and returns before reclaim's batched flush.
    no_flush_tlb_batched_pending = "A3",
    /// A1: before v6.15 (3ef938c35035, "x86/mm: Fix flush_tlb_range() when used for zapping normal
    /// PMDs", CVE-2025-22045): x86's `flush_tlb_range()` passes `freed_tables = false` (as
    /// `flush_tlb_range = "v6_14"`), so
    /// khugepaged's `pmdp_collapse_flush()` skips lazy CPUs and then frees the page table
    /// their paging-structure caches may still point to.
    flush_tlb_range_without_freed_tables = "A1",
    /// K12 (1af4a96025b3, fixed by a835429cda91 in v5.12): the TDP MMU's GFN-range zap walks
    /// each root with a flush flag of its own, and a yield flushes only that root's: SPTEs
    /// zapped in an earlier root stay unflushed while `mmu_lock` is dropped.
    tdp_zap_yield_drops_prior_flush = "K12",
    /// Seeded on `tdp_zap = "v5_12"` (bb95dfb9e2df of v5.18 without bd29677952fa, which
    /// v5.18 merged first "in anticipation of" it): `handle_removed_tdp_mmu_page()` leaves the
    /// flush to its caller and only `call_rcu`s the table, while the walk still drops RCU
    /// before its flush, at a yield and at the end of each root: the grace period can end and
    /// free the table while a vCPU's paging-structure cache still points into it.
    tdp_removed_pt_defers_flush = "",
    /// Seeded (with `alloc_fail = "mmu_topup_memory_caches:…"`): the TDP MMU fault tops up its
    /// memory caches after `read_lock(&kvm->mmu_lock)` (an allocation moved under the lock),
    /// and its -ENOMEM path returns without `read_unlock`: the next writer waits forever.
    topup_failure_skips_read_unlock = "",
    /// Seeded (dirty logging): `fast_pf_fix_direct_spte()` sets W with a plain store of the
    /// value its lockless walk read instead of `cmpxchg64`, so a zap or write-protect that
    /// ran in between is overwritten: the SPTE comes back, writable.
    fast_pf_plain_store = "",
    /// A4 (fixed by ba3a6120a4e7, 2022; Fixes 2f2fad0897cb, v5.10): under the write lock the
    /// TDP MMU wrote an SPTE with a plain store and handed `__handle_changed_spte()` the value
    /// its iterator read on reaching the entry (`iter->old_spte`). A W bit `fast_page_fault()`
    /// set since without `mmu_lock` (or a D bit the CPU set) is lost with it: KVM sees a
    /// clean SPTE and skips `kvm_set_pfn_dirty()`.
    tdp_mmu_write_spte_plain = "A4",
    /// A5 (fixed by b64d740ea7dd, v6.0): turning dirty logging on flushes only if
    /// `kvm_mmu_slot_remove_write_access()` changed an SPTE. An SPTE that aging made
    /// access-tracked is already read-only, but `clear_young` did not flush: a vCPU keeps a
    /// writable TLB entry and its writes reach no dirty bitmap.
    enable_dirty_log_flush_if_wrprot = "A5",
    /// Shadow paging: `kvm_vcpu_flush_tlb_guest()` only flushes the hardware TLB (INVVPID),
    /// as before b53e84eed08b: a PV flush (`KVM_VCPU_FLUSH_TLB`, or
    /// `KVM_REQ_TLB_FLUSH_GUEST`) leaves the unsync pages unsynced, and the vCPU refills its
    /// TLB from an SPTE built from a guest PTE the initiator changed and flushed.
    flush_tlb_guest_skips_sync = "A6",
    /// Seeded (shadow paging): `FNAME(invlpg)` leaves an unsync page's SPTE as it is and only
    /// flushes the address from the vCPU's TLB: the next access refills it from the SPTE
    /// built before the guest changed its PTE.
    shadow_invlpg_skips_sync = "",
    /// Seeded (shadow paging, `shadow_sync_flush = "tlbs_dirty"`): `invalidate_range_start`
    /// flushes only when its own unmap zapped an SPTE, not while `kvm->tlbs_dirty` counts SPTEs
    /// a sync dropped without a flush: a vCPU that still caches one uses the host page after
    /// the notifier returned (the hazard a4ee1ca4a36e's comment in `FNAME(sync_page)` names).
    notifier_ignores_tlbs_dirty = "",
    /// Seeded (`dirty_log_initially_set`): turning logging on skips the write-protect, as
    /// initially-all-set allows, but leaves the new bitmap clear: a page written through its
    /// still-writable SPTE is in no bitmap, and no `KVM_CLEAR_DIRTY_LOG` protects it.
    initially_set_bitmap_clear = "",
    /// Seeded (PML): `make_spte()` sets D with W in a slot that logs dirty pages but leaves
    /// the page's dirty mark to PML, which logs only writes that set D: a write through that
    /// SPTE logs nothing.
    pml_make_spte_skips_mark = "",
    /// Seeded (dirty logging): `kvm_get_dirty_log_protect()` write-protects the harvested
    /// pages but does not flush before the bitmap is copied out: a vCPU keeps writing through
    /// its writable TLB entry, unmarked, after the VMM read the page.
    get_dirty_log_skips_flush = "",
    /// K15, CVE-2021-47094 (0103098fb4f1, fixed by 3a0f64de479c in v5.16): after a yield,
    /// `tdp_mmu_iter_cond_resched()` restarts the iterator and the walk's loop then advances
    /// it. A zap of everything on `tdp_zap = "v5_15"` walks top-level entries only, so the
    /// entry the walk yielded at is skipped with its subtree, unzapped.
    tdp_iter_advances_after_restart = "K15",
    /// K14 (fixed by 6d3085e4d89a in v6.1), in the catalog recipe's second form:
    /// `kvm_zap_gfn_range()` marks no invalidation in progress (the code before edb298c663fc;
    /// from it to v6.0 the mark was a GFN range compared with host virtual addresses, which only
    /// a ranged zap misses). A fault that decided from the old state installs its SPTE while
    /// the zap has yielded, behind the walk.
    zap_gfn_range_no_invalidate = "K14",
    /// Seeded (issue #42, `INV-FREEPAGE`): `zap_pte_range()` frees each page as it clears its
    /// PTE (`free_page_and_swap_cache()` instead of `__tlb_remove_page()` into the gather), so
    /// the page may be reused while another CPU's TLB still maps it, before the flush.
    free_pages_before_flush = "",
    /// Seeded (issue #40): `handle_pause` marks the spinning vCPU preempted in its steal-time
    /// area before `kvm_vcpu_on_spin` (so that the guest's PV flush skips it while it yields).
    /// When `schedule()` finds nothing else to run, the vCPU goes back into the guest without
    /// `vcpu_load`, so no `record_steal_time` consumes the `KVM_VCPU_FLUSH_TLB` another vCPU
    /// set instead of its IPI.
    ple_yield_marks_preempted = "",
    /// Seeded: `zap_huge_pmd()` clears the PMD leaf without `tlb_remove_pmd_tlb_entry()`, so
    /// the gather records neither the range nor `cleared_pmds`; an unmap of only 2 MiB pages
    /// then flushes nothing.
    zap_huge_pmd_not_gathered = "",
    /// Seeded (issue #42, NMIs): `switch_mm_irqs_off()` writes CR3 without first setting
    /// `loaded_mm = LOADED_MM_SWITCHING`, the half of 4012e77a903d that `nmi_uaccess_okay()`
    /// relies on: an NMI between the CR3 write and the `loaded_mm` store finds `loaded_mm ==
    /// current->mm` and reads the user stack through the next mm's page tables.
    loaded_mm_switching_omitted = "",
    /// Seeded (issue #42, `mm_count`): `kthread_unuse_mm()` drops the reference
    /// `kthread_use_mm()` took but takes no lazy-TLB one (`mmgrab_lazy_tlb`), though the
    /// kernel thread goes on running lazily on the mm: when the mm's last user exits,
    /// `__mmdrop` frees its page tables while that CPU's CR3 still points to them.
    kthread_unuse_mm_drops_lazy_ref = "",
    /// Seeded (issue #42, kernel mappings): `flush_tlb_kernel_range()` sends its IPIs through
    /// the lazy filter of user flushes (`should_flush_tlb`/`tlb_is_not_lazy`) instead of
    /// `on_each_cpu()`: a CPU idle in lazy TLB mode keeps a Global kernel translation that the
    /// next task on it uses after the unmap returned.
    flush_tlb_kernel_range_skips_lazy = "",
    /// Seeded (issue #42, temporary mms): `__text_poke()` clears the poking PTE and switches
    /// back without `flush_tlb_mm_range(poking_mm, …)`: `tlb_gen` is not bumped, the next
    /// poke's switch to `poking_mm` reuses its ASID without a flush, and its write goes through
    /// the previous page's stale alias.
    text_poke_skips_flush = "",
    /// Seeded (issue #42, mremap): `move_ptes()` flushes the *new* range instead of the old
    /// one: the CPUs that cached the old addresses keep them, and a truncate frees the page
    /// under them.
    move_ptes_flushes_new_range = "",
    /// Seeded (issue #42, truncate): `truncate_pagecache()` truncates the page cache
    /// (`truncate_inode_pages`) before `unmap_mapping_range()` zaps and flushes the mappings,
    /// and frees each page without the `folio_mapped()` check (`truncate_cleanup_folio`'s
    /// unmap): a page still mapped, and cached by CPUs, is freed.
    truncate_frees_mapped_pages = "",
    /// Seeded (issue #42, migrate_vma): `migrate_vma_collect_pmd()` installs the migration
    /// entries without flushing at all: the copy is made and the source page freed while CPUs
    /// can still write it.
    migrate_vma_skips_collect_flush = "",
    /// Seeded (issue #42, VM_PFNMAP): `zap_page_range_single()` skips `tlb_finish_mmu`'s flush
    /// for a VM_PFNMAP VMA ("no struct pages to free"): a driver's revoke returns while a CPU
    /// can still reach the device memory.
    pfnmap_zap_skips_flush = "",
    /// Seeded (issue #42, EFI): `efi_leave_mm()` goes back to the caller's mm by reloading
    /// its ASID (NOFLUSH) and `loaded_mm` instead of `switch_mm()`: the flushes of that mm
    /// that skipped this CPU while `efi_mm` was loaded are never caught up.
    efi_leave_mm_restores_cr3 = "",
    /// Seeded (issue #41, the TDP MMU's MMU notifier): `invalidate_range_start` zaps the
    /// range's leaf SPTEs in the TDP roots but returns without `kvm_flush_remote_tlbs`: the host
    /// frees the pages while a vCPU's TLB still maps them.
    tdp_notifier_skips_flush = "",
    /// Seeded (issue #41, NX huge pages): the fault that must replace a huge SPTE with a page
    /// table (an instruction fetch under `nx_huge_pages`) drops the huge SPTE without its
    /// flush (`drop_large_spte` / `tdp_mmu_zap_spte_atomic` without
    /// `kvm_flush_remote_tlbs_gfn`): other vCPUs keep the huge translation after `mmu_lock`
    /// is released.
    huge_spte_split_skips_flush = "",
    /// Seeded (issue #43, INVLPGB): `broadcast_tlb_flush()` returns without `__tlbsync()`:
    /// the INVLPGBs may still be in flight on other CPUs when the flush (and the syscall
    /// that asked for it) returns.
    broadcast_skips_tlbsync = "",
    /// Seeded (issue #43, global ASIDs): `finish_asid_transition()` clears `asid_transition`
    /// without looking for CPUs still running the mm on a dynamic ASID: broadcasts (to the
    /// global PCID only) never reach their TLBs, and no IPI moves them over.
    asid_transition_cleared_early = "",
    /// Seeded (issue #43, INVLPGB): `broadcast_tlb_flush()` sets INVLPGB's "final translations
    /// only" flag even when page tables are freed: paging-structure caches, a lazy CPU's
    /// included (no IPI reaches it on this path), keep pointing to the freed tables.
    invlpgb_final_only = "",
    /// Seeded (issue #41, the steal-time cache): `record_steal_time()` reuses the
    /// `gfn_to_hva_cache` without comparing `slots->generation`: after the VMM deletes the
    /// memslot (and may unmap its memory), the host goes on writing through the old mapping.
    steal_time_cache_ignores_generation = "",
    /// Seeded (issue #41, SMM): `kvm_smm_changed()` sets or clears `HF_SMM_MASK` without
    /// `kvm_mmu_reset_context()`: the vCPU keeps the root of the role it left, so in SMM its
    /// faults fill SMRAM's frames into the normal address space's EPT (and out of SMM the
    /// reverse).
    smm_change_keeps_root = "",
    /// Seeded (issue #41, SMM): the fault path looks the gfn up with `gfn_to_memslot(kvm, gfn)`
    /// (address space 0) instead of `kvm_vcpu_gfn_to_memslot()`: a vCPU in SMM maps the normal
    /// address space's frame, not SMRAM, into its SMM root.
    smm_fault_uses_as0 = "",
    /// Seeded (issue #41, SMM; the shadow MMU): `kvm_mmu_get_page()`'s hash lookup compares the
    /// gfn and level but not the role's `smm` bit, so a vCPU entering SMM gets the normal
    /// address space's root and tables (the role bit 699023e23965 added).
    sp_role_ignores_smm = "",
    /// Seeded (issue #43, LATR): a tick that drains a saved state clears the state's whole
    /// mask (`cpumask_clear` for `cpumask_clear_cpu`): the state is retired and its pages
    /// freed while another CPU it named has not flushed yet.
    latr_drain_clears_whole_mask = "",
    /// Seeded (issue #43, early acknowledgement): `nmi_uaccess_okay()` without the RFC's
    /// `async_func_in_progress` test: an NMI between a CPU's early unlock and its flush reads
    /// user memory through a translation the initiator already considers gone.
    early_ack_nmi_unchecked = "",
    /// Seeded (issue #43, early acknowledgement): a flush that frees page tables is
    /// acknowledged early too (the RFC keeps it synchronous, "since otherwise speculative page
    /// walks might cause machine-checks"): the initiator frees the table while the target's
    /// page walker can still use its paging-structure entries.
    early_ack_freed_tables = "",
    /// Seeded (issue #43, in-context flushes): `flush_user_tlb_deferred()` merges a range that
    /// starts below the recorded one without moving the start: the pages below it are never
    /// flushed from the user PCID.
    deferred_user_flush_merge_ignores_start = "",
    /// Seeded (issue #43, Shoot4U): `kvm_pv_shoot4u_op()` sends its host IPIs with
    /// `smp_call_function_single(…, wait = 0)`: the hypercall returns before a target's pCPU
    /// has flushed its VPID.
    shoot4u_no_wait = "",
    /// Seeded (issue #41, Hyper-V flush): `kvm_make_vcpus_request_mask()` reads a vCPU's mode
    /// (`kvm_request_needs_ipi`) before it sets the request bit: a vCPU that enters the guest
    /// in between sees no request at entry and is not kicked either.
    vcpu_request_mode_first = "",
    /// Seeded (issue #41, Hyper-V flush): the v6.3+ guest's `hyperv_flush_tlb_multi()` leaves
    /// lazy CPUs out of the processor set even when the flush frees page tables: a lazy vCPU
    /// keeps its paging-structure entries for a table the initiator then frees.
    hv_flush_skips_lazy_freed_tables = "",
}

/// The option table: each option is declared once, with its key (the field name), its type,
/// its default (current mainline behaviour), what it accepts (for the key table; enums list
/// their names themselves) and its documentation.
macro_rules! options {
    ($( $(#[doc = $doc:literal])* $field:ident : $ty:ty = $default:expr, accepts = $accepts:expr; )+) => {
        /// The whole kernel configuration of a run.
        #[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
        pub struct Options {
            $( $(#[doc = $doc])* pub $field: $ty, )+
            pub mutants: Mutants,
        }

        impl Default for Options {
            /// Current mainline behaviour.
            fn default() -> Self {
                Options { $( $field: $default, )+ mutants: Mutants::default() }
            }
        }

        /// Every option key with its accepted values, for documentation and error messages.
        pub fn option_keys() -> Vec<(&'static str, String)> {
            let mut keys = vec![ $( (stringify!($field), String::from($accepts)), )+ ];
            keys.push((
                "mutant",
                "a mutant name (see `shootdown check --list`), or several separated by commas"
                    .into(),
            ));
            keys
        }

        impl Options {
            /// Set one option from an experiment file; the error is the reason (the caller adds
            /// file and key).
            pub fn set(&mut self, key: &str, v: &OptValue) -> Result<(), String> {
                match key {
                    $( stringify!($field) => self.$field = <$ty as OptionValue>::parse(v)?, )+
                    "mutant" => {
                        let OptValue::Str(s) = v else {
                            return Err("expected a string".into());
                        };
                        for name in s.split(',').map(str::trim).filter(|n| !n.is_empty()) {
                            self.mutants.enable(name)?;
                        }
                    }
                    _ => {
                        let keys: Vec<_> = option_keys().into_iter().map(|k| k.0).collect();
                        return Err(format!("unknown option (known: {})", keys.join(", ")));
                    }
                }
                Ok(())
            }
        }
    };
}

/// The accepted values of a named enum, for the key table.
fn names(n: &[&str]) -> String {
    n.join(" | ")
}

options! {
    smp_call: SmpCall = SmpCall::Concurrent, accepts = names(SmpCall::NAMES);
    lazy_tlb: LazyTlb = LazyTlb::Mainline, accepts = names(LazyTlb::NAMES);
    /// v6.15+ (`CONFIG_BROADCAST_TLB_FLUSH`): on a CPU with INVLPGB, an mm active on several
    /// CPUs gets a global ASID and its flushes are broadcast (INVLPGB + TLBSYNC) instead of
    /// IPIs (`global_asid.rs`). No effect on a CPU without INVLPGB.
    broadcast_tlb_flush: bool = true,
        accepts = "true | false (INVLPGB and global ASIDs where the CPU has them: v6.15+)";
    /// v6.15+: `consider_global_asid()` gives an mm a global ASID when at least this many CPUs
    /// run it, not lazily (`mm_active_cpus_exceeds(mm, 3)`: 4). Checker scenarios lower it.
    global_asid_min_cpus: Count = Count(4),
        accepts = "integer >= 1 (CPUs running an mm before it gets a global ASID; 4 in the kernel)";
    /// LATR (a research design, `latr.rs`): munmap/madvise flushes saved for the other CPUs'
    /// ticks instead of IPIs.
    latr: Latr = Latr::Off,
        accepts = format!("{} (LATR's lazy shootdowns: a research design)", names(Latr::NAMES));
    /// Early acknowledgement of flush IPIs (a research design, `smp.rs`).
    early_ack: EarlyAck = EarlyAck::Off,
        accepts = format!("{} (flush IPIs acknowledged before the flush: a research design)", names(EarlyAck::NAMES));
    /// Under PTI: user-PCID flushes at once or deferred to the return to user (a research
    /// design, `tlb.rs`).
    pti_user_flush: PtiUserFlush = PtiUserFlush::Immediate,
        accepts = format!("{} (PTI user-PCID flushes deferred to the return to user: a research design)", names(PtiUserFlush::NAMES));
    /// Nadav's "Privatize cpu_tlbstate": `is_lazy` in its own cache line
    /// (`cpu_tlbstate_shared`) instead of the line `switch_mm` writes on every context switch.
    tlbstate_shared: bool = true, accepts = "true | false";
    /// Nadav's "Do not make is_lazy dirty for no reason": write `is_lazy = false` only if set.
    is_lazy_write_conditional: bool = true, accepts = "true | false";
    /// Before v5.6, `on_each_cpu_cond_mask()` (the lazy filter of `native_flush_tlb_others`)
    /// allocated a temporary cpumask per call and, via `on_each_cpu_mask()`, also ran the
    /// function on the calling CPU after the remote ones (a no-op catch-up check for a flush
    /// that already ran locally). Nadav's series open-coded the filter.
    smp_cond_alloc_mask: bool = false,
        accepts = "true | false (on_each_cpu_cond_mask allocates a cpumask and re-runs locally: before v5.6)";
    /// mm: `tlb_finish_mmu()`'s handling of nested gathers (madvise, munmap).
    mmu_gather: MmuGather = MmuGather::Mainline,
        accepts = format!("{} (tlb_finish_mmu with a nested mmu_gather)", names(MmuGather::NAMES));
    /// mm: `flush_tlb_batched_pending()` in zap / change_protection.
    batched_pending: BatchedPending = BatchedPending::Mainline,
        accepts = format!("{} (flush a pending reclaim batch before changing PTEs)", names(BatchedPending::NAMES));
    /// mm: transparent huge pages for anonymous faults.
    transparent_hugepage: Thp = Thp::Never,
        accepts = format!("{} (may a fault map a 2 MiB page with one PMD leaf)", names(Thp::NAMES));
    /// mm: how a flush range is counted against the ceiling (4 KiB pages, or its page size).
    flush_stride: FlushStride = FlushStride::Mainline,
        accepts = format!("{} (flush ceiling in 4 KiB pages, or per gathered page size)", names(FlushStride::NAMES));
    /// mm: whether `flush_tlb_range()` (khugepaged's collapse, a huge-page split, mprotect)
    /// passes `freed_tables`.
    flush_tlb_range: FlushTlbRange = FlushTlbRange::Mainline,
        accepts = format!("{} (flush_tlb_range passes freed_tables)", names(FlushTlbRange::NAMES));
    /// NMIs: `copy_from_user_nmi()` and `perf_callchain_user()` read user memory only if
    /// `nmi_uaccess_okay()` (v4.19+, 4012e77a903d: `loaded_mm == current->mm`, with
    /// `switch_mm_irqs_off()` announcing `LOADED_MM_SWITCHING` before its CR3 write); false is
    /// v4.18 and earlier, which read through whatever CR3 holds.
    nmi_uaccess_okay: bool = true,
        accepts = "true | false (NMI user reads check nmi_uaccess_okay(): v4.19+)";
    /// NMIs (timed driver): perf's sampling rate per running CPU (`perf record -F`), each
    /// sample an NMI whose handler reads the interrupted task's user stack
    /// (`perf_callchain_user`). 0 = no NMIs. A halted CPU takes none (`cycles` does not count
    /// in HLT).
    perf_sample_hz: Count = Count(0),
        accepts = "samples per second per CPU (integer >= 0; 0 = no perf NMIs)";
    /// mm: where mremap's `move_ptes()` flushes the moved PTEs' old addresses.
    mremap_tlb_flush: MremapTlbFlush = MremapTlbFlush::Mainline,
        accepts = format!("{} (move_ptes flushes under the PTLs: v4.19+)", names(MremapTlbFlush::NAMES));
    /// mm: where `migrate_vma_collect_pmd()` flushes.
    migrate_vma_flush: MigrateVmaFlush = MigrateVmaFlush::Mainline,
        accepts = format!("{} (migrate_vma flushes under the PTL: 60bae7370896)", names(MigrateVmaFlush::NAMES));
    /// How kernel threads borrow an mm (`kthread_use_mm`).
    kthread_use_mm: KthreadUseMm = KthreadUseMm::Mainline,
        accepts = format!("{} (kthread_use_mm: interrupts on until switch_mm before v5.8)", names(KthreadUseMm::NAMES));
    /// v6.4+ (ce0b15d11ad8, "x86/mm: Avoid incomplete Global INVLPG flushes"): `setup_pcid()`
    /// leaves PCIDs off on a CPU whose INVLPG may miss Global entries with PCIDs on (the
    /// `invlpg_miss_global` erratum of Alder Lake and Raptor Lake cores).
    invlpg_miss_global_no_pcid: bool = true,
        accepts = "true | false (v6.4+: no PCIDs on a CPU whose INVLPG misses Global entries)";
    /// Use PCIDs (when the CPU has them): 6 dynamic ASIDs per CPU, NOFLUSH CR3 writes.
    pcid: bool = true, accepts = "true | false";
    /// `tlb_single_page_flush_ceiling`: ranges above this many pages become full flushes.
    tlb_single_page_flush_ceiling: AtLeastOne = AtLeastOne(33), accepts = "pages (integer >= 1)";
    idle: Idle = Idle::Halt, accepts = names(Idle::NAMES);
    /// The guest (or native) kernel's scheduler: `fifo` (the model's simplification, with
    /// `sched_timeslice_us`) or `eevdf` (v6.6+: wake-up preemption, deadlines; `fair.rs`).
    sched: Sched = Sched::Fifo,
        accepts = format!("{} (the kernel's task scheduler; eevdf: v6.6+, timed runs only)", names(Sched::NAMES));
    /// Scheduler time slice (µs) before a task with others waiting is preempted (`sched =
    /// "fifo"`; EEVDF's slice follows the CPU count).
    sched_timeslice_us: AtLeastOne = AtLeastOne(3000), accepts = "microseconds (integer >= 1)";
    /// Guest kernel: how `spin_lock` waits (`queued` native qspinlock, `tas` =
    /// `virt_spin_lock` without PV spinlocks, `pv` = PV qspinlock with `pv_wait`/`pv_kick`).
    spinlock: SpinlockKind = SpinlockKind::Queued,
        accepts = format!("{} (how a kernel spin_lock waits; pv halts only with a [host])", names(SpinlockKind::NAMES));
    /// mm: model the per-CPU page lists and the locks behind them (`page_lists.rs`): the
    /// page allocator's per-CPU lists refilled and drained under `zone->lock`, and the LRU
    /// pagevecs added and released under `lru_lock`. Only workloads whose page faults and frees
    /// are charged in bulk (ebizzy) go through them.
    page_lists: bool = false, accepts = "true | false (zone->lock and lru_lock behind the per-CPU page lists)";
    /// Guest (seed 001): `kvm_flush_tlb_others`/`kvm_flush_tlb_multi` skip vCPUs whose
    /// steal-time byte says preempted, setting `KVM_VCPU_FLUSH_TLB` for the host instead of an
    /// IPI. Only meaningful on a machine with a host (vCPUs).
    pv_tlb_flush: bool = false, accepts = "true | false (guest PV TLB flush; needs a [host])";
    /// Guest and host: Shoot4U (a research design, `shoot4u.rs`): a flush's remote part is one
    /// hypercall, and the host flushes each target vCPU's VPID through a host IPI to its pCPU,
    /// preempted or not. Only meaningful on a machine with a host (vCPUs).
    shoot4u: bool = false,
        accepts = "true | false (Shoot4U: the host flushes the target vCPUs, a research design; needs a [host])";
    /// Guest and host: the Hyper-V enlightened TLB flush (`hyperv.rs`): a flush's remote part is
    /// one `HvFlushVirtualAddressList/Space` hypercall, and KVM makes a flush request of each
    /// target vCPU. Only meaningful on a machine with a host (vCPUs).
    hv_tlb_flush: HvTlbFlush = HvTlbFlush::Off,
        accepts = format!("{} (Hyper-V enlightened TLB flush on KVM, by version; needs a [host])", names(HvTlbFlush::NAMES));
    /// Guest: PV send-IPI (one hypercall for a whole destination set instead of one exiting
    /// ICR write per target). Off in the 4.15 baseline.
    pv_send_ipi: bool = false, accepts = "true | false (guest PV send-IPI hypercall; needs a [host])";
    /// Guest (v5.3+): PV sched yield — after a call-function IPI, yield the pCPU to the first
    /// target the host marked preempted (`KVM_HC_SCHED_YIELD`). Off in the 4.15 baseline.
    pv_sched_yield: bool = false, accepts = "true | false (guest PV sched yield after call-function IPIs, v5.3+; needs a [host])";
    /// Host: APICv posted interrupts (an IPI to a running vCPU needs no exit to inject, EOI is
    /// virtualized). Off in the 4.15 baseline of seed 001.
    posted_interrupts: bool = false,
        accepts = "true | false (host APICv posted interrupts; needs a [host])";
    /// Host: which `vcpu_put`s set the steal-time preempted byte.
    set_preempted: SetPreempted = SetPreempted::EveryPut,
        accepts = format!("{} (host: which vcpu_puts mark the vCPU preempted)", names(SetPreempted::NAMES));
    /// Host: the error check after each VMREAD/VMWRITE on the VM-exit path.
    vmx_insn_error_check: VmxInsnErrorCheck = VmxInsnErrorCheck::Jcc,
        accepts = format!("{} (instructions after each VMREAD/VMWRITE)", names(VmxInsnErrorCheck::NAMES));
    /// Host: the KVM version around the MMU (memslot generations, MMIO checks, TLB flush
    /// requests, the form of the zap strategies). Only meaningful for a VM whose MMU is
    /// modelled.
    kvm: KvmVersion = KvmVersion::Mainline,
        accepts = format!("{} (KVM around the MMU; needs a VM with a modelled MMU)", names(KvmVersion::NAMES));
    /// Host: what a memslot deletion zaps.
    memslot_zap: MemslotZap = MemslotZap::FastInvalidate,
        accepts = format!("{} (what deleting a memslot zaps)", names(MemslotZap::NAMES));
    /// Host, shadow paging (`ept = false`): what `FNAME(sync_page)` does for an SPTE it drops.
    shadow_sync_flush: ShadowSyncFlush = ShadowSyncFlush::Remote,
        accepts = format!("{} (FNAME(sync_page)'s flush for a dropped SPTE, by kernel era)", names(ShadowSyncFlush::NAMES));
    /// Host: the TDP MMU (`kvm.tdp_mmu`, on by default since v5.15): EPT managed per root
    /// under `mmu_lock` as a rwlock, faults under the read lock. Off here so that seed 003's
    /// legacy-MMU experiments keep their v5.x MMU; seed 004 turns it on.
    tdp_mmu: bool = false, accepts = "true | false (the TDP MMU; needs a VM with a modelled MMU)";
    /// Host: which guest MTRR / CR0.CD changes zap (seed 004's Base1, Base2, mainline).
    mtrr_zap: MtrrZap = MtrrZap::Mainline,
        accepts = format!("{} (zaps for guest MTRR and CR0.CD changes)", names(MtrrZap::NAMES));
    /// Host: `KVM_X86_QUIRK_CD_NW_CLEARED` (QEMU leaves it on): CR0.CD=1 maps WB, not UC.
    quirk_cd_nw_cleared: bool = true, accepts = "true | false (KVM_X86_QUIRK_CD_NW_CLEARED)";
    /// Host: seed 004's patch 9: MTRR zap requests go on a per-VM list drained by one vCPU
    /// (`mtrr_zapping`) while the others wait.
    mtrr_zap_list: bool = false, accepts = "true | false (patch 9: serialize MTRR zaps)";
    /// Host: what a CR0.CD toggle zaps (seed 004's patch 10).
    cd_zap_range: CdZapRange = CdZapRange::All,
        accepts = format!("{} (patch 10: fine-grained CR0.CD zaps)", names(CdZapRange::NAMES));
    /// Host: seed 004's patch 11: split each MTRR zap range into its in-memslot pieces (needs
    /// `mtrr_zap_list`).
    mtrr_zap_split: bool = false, accepts = "true | false (patch 11: zap in-slot pieces only)";
    /// Host: the `mmu_lock` mode of `kvm_zap_gfn_range()`'s TDP walk (seed 004's patch 12).
    zap_gfn_range_lock: ZapLock = ZapLock::Write,
        accepts = format!("{} (patch 12: zap under the read lock)", names(ZapLock::NAMES));
    /// Host: the form of `kvm_zap_gfn_range()`'s TDP MMU walk under the write lock (whole
    /// tables before v5.18).
    tdp_zap: TdpZap = TdpZap::Mainline,
        accepts = format!("{} (the TDP MMU's GFN-range zap: whole tables before v5.18)", names(TdpZap::NAMES));
    /// Host: the iTLB multihit mitigation (`kvm.nx_huge_pages`, v5.4+; the kernel's `auto`
    /// turns it on for CPUs with the erratum): huge SPTEs are not executable, and a fetch
    /// maps its frame with 4 KiB SPTEs (`kvm/mmu/nx_huge_pages.rs`).
    nx_huge_pages: bool = false,
        accepts = "true | false (kvm.nx_huge_pages: no executable huge SPTEs)";
    /// Host: `kvm.nx_huge_pages_recovery_ratio`: each run of the recovery worker zaps
    /// 1/ratio of the tracked split pages, rounded up (0 = none).
    nx_huge_pages_recovery_ratio: Count = Count(60),
        accepts = "integer >= 0 (kvm.nx_huge_pages_recovery_ratio; 60 by default)";
    /// Host: the recovery worker's flush for the TDP MMU tables it zaps.
    nx_recovery_flush: NxRecoveryFlush = NxRecoveryFlush::Mainline,
        accepts = format!("{} (the NX recovery's TDP flush: 048f49809c52)", names(NxRecoveryFlush::NAMES));
    /// Host: how the steal-time area is mapped (`kvm/st_cache.rs`).
    steal_time_map: StealTimeMap = StealTimeMap::Mainline,
        accepts = format!("{} (the steal-time area's cache: 7e2175ebd695)", names(StealTimeMap::NAMES));
    /// Host: an allocation that fails once on the named vCPUs, where the kernel handles it.
    alloc_fail: AllocFail = AllocFail::default(),
        accepts = format!("\"none\" or \"SITE:VCPU,…\" with SITE one of {} (the first attempt of each listed vCPU fails with -ENOMEM)", names(AllocSite::NAMES));
    /// Host: `KVM_CAP_MANUAL_DIRTY_LOG_PROTECT2`, which the VMM enables (QEMU 4.0+ when the
    /// kernel has it, v5.3+): `KVM_GET_DIRTY_LOG` copies the bitmap out, and
    /// `KVM_CLEAR_DIRTY_LOG` clears and write-protects (`kvm/dirty_log.rs`).
    manual_dirty_log_protect: bool = false,
        accepts = "true | false (KVM_CLEAR_DIRTY_LOG re-protects what KVM_GET_DIRTY_LOG fetched)";
    /// Host: EPT (`kvm_intel.ept`, on by default where the CPU has it). Off: shadow paging
    /// (`kvm/mmu/shadow.rs`): KVM builds the page tables the CPU walks from the guest's own,
    /// write-protecting them or letting level-1 tables go unsync until the guest flushes
    /// (INVLPG, a CR3 load, a PV flush). Turns `ept_ad` off, as vmx's `hardware_setup()`
    /// does; needs the legacy MMU and no PML or SMM; host threads may only run MMU-notifier
    /// invalidations.
    ept: bool = true,
        accepts = "true | false (kvm_intel.ept; false: shadow paging of the guest's page tables)";
    /// Host: EPT accessed/dirty bits (`kvm_intel.enable_ept_ad_bits`, on by default where the
    /// CPU has them, Haswell+, as on every seed's host): KVM sets D in every writable SPTE it
    /// makes and the CPU sets it on a write through a leaf without it; `is_dirty_spte()` reads
    /// D instead of W. Off (older CPUs, or the parameter cleared): access tracking
    /// (`access_track.rs`), and every EPT violation tries `fast_page_fault` first. Accessed
    /// bits themselves are not modelled.
    ept_ad: bool = true,
        accepts = "true | false (EPT A/D bits; false: access tracking, W is the dirty bit)";
    /// Host: Page Modification Logging (`kvm_intel.enable_pml`, v4.2+, needs `ept_ad`): dirty
    /// logging clears D instead of W, and the CPU appends the gfn of each write that sets D
    /// to the vCPU's PML buffer, which KVM drains into the dirty bitmap at every VM exit
    /// (`vmx_flush_pml_buffer`); `KVM_GET_DIRTY_LOG` first kicks every vCPU out of the guest
    /// (`kvm_arch_sync_dirty_log`, no wait).
    pml: bool = false,
        accepts = "true | false (needs ept_ad: D-bit dirty logging with per-vCPU PML buffers)";
    /// Host: `KVM_DIRTY_LOG_INITIALLY_SET` (v5.4+, with `manual_dirty_log_protect`; QEMU asks
    /// for it): a slot's dirty bitmap starts with every bit set and turning logging on
    /// write-protects nothing; `KVM_CLEAR_DIRTY_LOG` write-protects what it clears (a huge
    /// SPTE first at 2 MiB, so that the next write splits it).
    dirty_log_initially_set: bool = false,
        accepts = "true | false (needs manual_dirty_log_protect: bitmaps start all set)";
    /// Host: bits of the memslot generation an MMIO SPTE keeps (v5.1+: 19).
    mmio_gen_bits: MmioGenBits = MmioGenBits(19),
        accepts = "bits of the generation in an MMIO SPTE (integer 2..=20; 19 in v5.1+)";
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_declared_key_parses_and_rejects_nonsense() {
        for (k, _) in option_keys() {
            let mut o = Options::default();
            assert!(o.set(k, &OptValue::Int(-7)).is_err(), "{k} took -7");
        }
        let mut o = Options::default();
        o.set("smp_call", &OptValue::Str("remote_then_local".into()))
            .unwrap();
        assert_eq!(o.smp_call, SmpCall::RemoteThenLocal);
        assert_eq!(
            o.set("lazy_tlb", &OptValue::Str("lazier".into()))
                .unwrap_err(),
            "unknown value 'lazier' (expected legacy | tlb_gen | is_lazy | v6_13 | v6_17 | mainline)"
        );
        o.set(
            "mutant",
            &OptValue::Str("batch_flush_gen_zero, switch_mm_no_barrier".into()),
        )
        .unwrap();
        assert!(o.mutants.batch_flush_gen_zero && o.mutants.switch_mm_no_barrier);
        assert!(o
            .set("nope", &OptValue::Bool(true))
            .unwrap_err()
            .starts_with("unknown option"));
    }
}

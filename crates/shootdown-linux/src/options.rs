//! Kernel configuration: each seed series is a set of named options with its *before* and
//! *after* behaviour (and mainline's where it differs); historical bugs are options too
//! ([`Mutants`]), so the checker can be shown to find them. Experiment files select these by
//! name (`smp_call = "concurrent"`), see [`Options::set`].

use serde::Serialize;

/// How `smp_call_function_many` orders the local call against the remote ones (seed 000).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum SmpCall {
    /// v5.12 and earlier: `flush_tlb_mm_range` flushes locally, then `flush_tlb_others` IPIs the
    /// remote CPUs and waits (kernel/smp.c `smp_call_function_many_cond` never runs locally).
    RemoteThenLocal,
    /// Nadav Amit's series (v5.13): `flush_tlb_multi` queues and IPIs the remote CPUs, runs the
    /// local flush while they work, then waits (`SCF_RUN_LOCAL`).
    Concurrent,
}

/// Lazy-TLB design (seed 002 and what followed; kernel-model.md §1.5–1.8).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum LazyTlb {
    /// v4.12 (V0): `cpu_tlbstate.state` OK/LAZY; lazy CPUs stay in `mm_cpumask`, the first flush
    /// IPI makes them `leave_mm()` to init_mm.
    Legacy,
    /// Andy Lutomirski's rework, seed 002 (V1, v4.14-rc1): entering lazy mode clears the CPU's
    /// bit in `mm_cpumask`; `(ctx_id, tlb_gen)` tells on switch-back whether a flush was missed.
    TlbGen,
    /// v4.20–v5.x (V3/V4, Rik van Riel): lazy CPUs stay in the mask with `is_lazy` set; flushes
    /// skip them (`tlb_is_not_lazy`) unless page tables were freed, when they switch to init_mm.
    IsLazy,
    /// Current mainline (V5): `should_flush_tlb()`, `LOADED_MM_SWITCHING`, switching away keeps
    /// the old mm's cpumask bit (trimmed lazily by flush IPIs, at most once per second).
    Mainline,
}

/// What the idle loop does (kernel command line `idle=`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum Idle {
    /// HLT/MWAIT: an IPI wakes the CPU, paying `idle_wakeup`.
    Halt,
    /// `idle=poll`: spins on TIF_NEED_RESCHED; a reschedule needs no IPI (seed 002's guest).
    Poll,
}

/// The fast path of each VMREAD/VMWRITE after the VMX instruction (seed 000's second cover
/// letter, kernel-model.md §6): how many instructions check for VMfail on success.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum VmxInsnErrorCheck {
    /// v5.4+ (`asm goto`: one hinted `JNA`/`JA` to an out-of-line error path), or ≤v5.2 with a
    /// compiler that has flag outputs (`CC_SET` becomes one Jcc): 1 instruction.
    Jcc,
    /// v5.3-rc with flag outputs: the objtool fix added an unconditional `JMP` over the inline
    /// `call kvm_spurious_fault`: 2 instructions.
    JccJmp,
    /// ≤v5.2 without flag outputs: `CC_SET` materialises the flag (`SETcc`), then `CMP`/`TEST` +
    /// `Jcc`: 3 instructions.
    SetccCmpJcc,
    /// v5.3-rc without flag outputs: `SETcc` + `CMP` + `Jcc` + `JMP`: 4 instructions.
    SetccCmpJccJmp,
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

/// Which host `vcpu_put`s mark a vCPU preempted in its steal-time area (kernel-model.md §3.3).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum SetPreempted {
    /// v4.16–v5.x: `kvm_arch_vcpu_put` calls `kvm_steal_time_set_preempted` on every put,
    /// including when the vCPU thread blocks in HLT (so PV flush skips halted vCPUs too).
    EveryPut,
    /// Later kernels: only when the vCPU thread was preempted while runnable (`vcpu->preempted`).
    Involuntary,
}

/// Historical bugs and seeded mistakes, each re-creatable as an option. All off = the fixed
/// protocol. See `docs/checker.md` and `../shared/bugs/CATALOG.md`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize)]
pub struct Mutants {
    /// N1: on page-table batch allocation failure, free the table right after a "sync" IPI that
    /// invalidates nothing, before the flush.
    pub free_tables_before_flush: bool,
    /// N3: lazy CPUs are never IPI'd, even when page tables are freed.
    pub lazy_ignores_freed_tables: bool,
    /// N5 (CVE-2025-37964): `should_flush_tlb()` tests only `loaded_mm == info->mm`, not
    /// `LOADED_MM_SWITCHING`.
    pub should_flush_ignores_switching: bool,
    /// N8: `flush_tlb_func()`'s "already up to date" shortcut treats `new_tlb_gen == 0` (batched
    /// flush: TLB_GENERATION_INVALID) as a real generation.
    pub batch_flush_gen_zero: bool,
    /// O1 (FreeBSD r362031 in Linux terms): the concurrent flush increments `tlb_gen` only in its
    /// local part, after reading `mm_cpumask` and sending the IPIs.
    pub inc_tlb_gen_after_ipis: bool,
    /// `switch_mm_irqs_off` reads `next->context.tlb_gen` before setting its bit in `mm_cpumask`.
    pub switch_mm_gen_before_cpumask: bool,
    /// `flush_tlb_func` flushes only the request's range even when more than one generation is
    /// owed (drops the `new_tlb_gen == local_tlb_gen + 1` condition).
    pub partial_flush_when_full_owed: bool,
    /// Mainline `switch_mm_irqs_off` without the explicit `smp_mb()` when the cpumask bit is
    /// already set (only visible under TSO).
    pub switch_mm_no_barrier: bool,
    /// K1 (CVE-2019-3016 part a, before 8c6de56a42e0): `kvm_steal_time_set_preempted()` writes
    /// `KVM_VCPU_PREEMPTED` over the guest's steal-time byte on every `vcpu_put`, ignoring the
    /// host shadow that says it already did: a second put before the next entry erases a
    /// `KVM_VCPU_FLUSH_TLB` the guest set in between.
    pub pv_set_preempted_clobbers_flush: bool,
    /// K2 (CVE-2019-3016 part b, before b043138246a4): `record_steal_time()` reads the whole
    /// steal-time struct into a host copy, clears `preempted` in the copy (flushing if the copy had
    /// `KVM_VCPU_FLUSH_TLB`) and writes the copy back: a flag set by the guest in between is lost.
    pub pv_record_steal_time_nonatomic: bool,
}

/// The whole kernel configuration of a run.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct Options {
    pub smp_call: SmpCall,
    pub lazy_tlb: LazyTlb,
    /// Nadav's "Privatize cpu_tlbstate": `is_lazy` in its own cache line (`cpu_tlbstate_shared`)
    /// instead of the line `switch_mm` writes on every context switch.
    pub tlbstate_shared: bool,
    /// Nadav's "Do not make is_lazy dirty for no reason": write `is_lazy = false` only if set.
    pub is_lazy_write_conditional: bool,
    /// Before v5.6, `on_each_cpu_cond_mask()` (the lazy filter of `native_flush_tlb_others`)
    /// allocated a temporary cpumask per call and, via `on_each_cpu_mask()`, also ran the
    /// function on the calling CPU after the remote ones (a no-op catch-up check for a flush
    /// that already ran locally). Nadav's series open-coded the filter.
    pub smp_cond_alloc_mask: bool,
    /// Use PCIDs (when the CPU has them): 6 dynamic ASIDs per CPU, NOFLUSH CR3 writes.
    pub pcid: bool,
    /// `tlb_single_page_flush_ceiling`: ranges above this many pages become full flushes.
    pub tlb_single_page_flush_ceiling: u64,
    pub idle: Idle,
    /// Scheduler time slice (µs) before a task with others waiting is preempted.
    pub sched_timeslice_us: u64,
    /// Guest (seed 001): `kvm_flush_tlb_others`/`kvm_flush_tlb_multi` skip vCPUs whose steal-time
    /// byte says preempted, setting `KVM_VCPU_FLUSH_TLB` for the host instead of an IPI. Only
    /// meaningful on a machine with a host (vCPUs).
    pub pv_tlb_flush: bool,
    /// Guest: PV send-IPI (one hypercall for a whole destination set instead of one exiting
    /// ICR write per target). Off in the 4.15 baseline.
    pub pv_send_ipi: bool,
    /// Host: APICv posted interrupts (an IPI to a running vCPU needs no exit to inject, EOI is
    /// virtualized). Off in the 4.15 baseline of seed 001.
    pub posted_interrupts: bool,
    /// Host: which `vcpu_put`s set the steal-time preempted byte.
    pub set_preempted: SetPreempted,
    /// Host: the error check after each VMREAD/VMWRITE on the VM-exit path.
    pub vmx_insn_error_check: VmxInsnErrorCheck,
    pub mutants: Mutants,
}

impl Default for Options {
    /// Current mainline behaviour.
    fn default() -> Self {
        Options {
            smp_call: SmpCall::Concurrent,
            lazy_tlb: LazyTlb::Mainline,
            tlbstate_shared: true,
            is_lazy_write_conditional: true,
            smp_cond_alloc_mask: false,
            pcid: true,
            tlb_single_page_flush_ceiling: 33,
            idle: Idle::Halt,
            sched_timeslice_us: 3000,
            pv_tlb_flush: false,
            pv_send_ipi: false,
            posted_interrupts: false,
            set_preempted: SetPreempted::EveryPut,
            vmx_insn_error_check: VmxInsnErrorCheck::Jcc,
            mutants: Mutants::default(),
        }
    }
}

/// Every option key with its accepted values, for documentation and error messages.
pub const OPTION_KEYS: &[(&str, &str)] = &[
    ("smp_call", "remote_then_local | concurrent"),
    ("lazy_tlb", "legacy | tlb_gen | is_lazy | mainline"),
    ("tlbstate_shared", "true | false"),
    ("is_lazy_write_conditional", "true | false"),
    (
        "smp_cond_alloc_mask",
        "true | false (on_each_cpu_cond_mask allocates a cpumask and re-runs locally: before v5.6)",
    ),
    ("pcid", "true | false"),
    ("tlb_single_page_flush_ceiling", "pages (integer >= 1)"),
    ("idle", "halt | poll"),
    ("sched_timeslice_us", "microseconds (integer >= 1)"),
    ("pv_tlb_flush", "true | false (guest PV TLB flush; needs a [host])"),
    ("pv_send_ipi", "true | false (guest PV send-IPI hypercall; needs a [host])"),
    ("posted_interrupts", "true | false (host APICv posted interrupts; needs a [host])"),
    ("set_preempted", "every_put | involuntary (host: which vcpu_puts mark the vCPU preempted)"),
    (
        "vmx_insn_error_check",
        "jcc | jcc_jmp | setcc_cmp_jcc | setcc_cmp_jcc_jmp (instructions after each VMREAD/VMWRITE)",
    ),
    (
        "mutant",
        "a mutant name (see `shootdown check --list`), or several separated by commas",
    ),
];

/// The names mutants are selected by.
pub const MUTANT_NAMES: &[(&str, &str)] = &[
    ("free_tables_before_flush", "N1"),
    ("lazy_ignores_freed_tables", "N3"),
    ("should_flush_ignores_switching", "N5"),
    ("batch_flush_gen_zero", "N8"),
    ("inc_tlb_gen_after_ipis", "O1"),
    ("switch_mm_gen_before_cpumask", ""),
    ("partial_flush_when_full_owed", ""),
    ("switch_mm_no_barrier", ""),
    ("pv_set_preempted_clobbers_flush", "K1"),
    ("pv_record_steal_time_nonatomic", "K2"),
];

/// A value given for an option key.
#[derive(Clone, Debug)]
pub enum OptValue {
    Str(String),
    Bool(bool),
    Int(i64),
}

impl Mutants {
    /// Enable a mutant by name.
    pub fn enable(&mut self, name: &str) -> Result<(), String> {
        let f = match name {
            "free_tables_before_flush" => &mut self.free_tables_before_flush,
            "lazy_ignores_freed_tables" => &mut self.lazy_ignores_freed_tables,
            "should_flush_ignores_switching" => &mut self.should_flush_ignores_switching,
            "batch_flush_gen_zero" => &mut self.batch_flush_gen_zero,
            "inc_tlb_gen_after_ipis" => &mut self.inc_tlb_gen_after_ipis,
            "switch_mm_gen_before_cpumask" => &mut self.switch_mm_gen_before_cpumask,
            "partial_flush_when_full_owed" => &mut self.partial_flush_when_full_owed,
            "switch_mm_no_barrier" => &mut self.switch_mm_no_barrier,
            "pv_set_preempted_clobbers_flush" => &mut self.pv_set_preempted_clobbers_flush,
            "pv_record_steal_time_nonatomic" => &mut self.pv_record_steal_time_nonatomic,
            _ => {
                let names: Vec<_> = MUTANT_NAMES.iter().map(|m| m.0).collect();
                return Err(format!(
                    "unknown mutant '{name}' (known: {})",
                    names.join(", ")
                ));
            }
        };
        *f = true;
        Ok(())
    }
}

impl Options {
    /// Set one option from an experiment file; the error is the reason (the caller adds file
    /// and key).
    pub fn set(&mut self, key: &str, v: &OptValue) -> Result<(), String> {
        fn s(v: &OptValue) -> Result<&str, String> {
            match v {
                OptValue::Str(s) => Ok(s),
                _ => Err("expected a string".into()),
            }
        }
        fn b(v: &OptValue) -> Result<bool, String> {
            match v {
                OptValue::Bool(b) => Ok(*b),
                _ => Err("expected true or false".into()),
            }
        }
        fn pos(v: &OptValue) -> Result<u64, String> {
            match v {
                OptValue::Int(i) if *i >= 1 => Ok(*i as u64),
                OptValue::Int(i) => Err(format!("must be at least 1 (got {i})")),
                _ => Err("expected an integer".into()),
            }
        }
        match key {
            "smp_call" => {
                self.smp_call = match s(v)? {
                    "remote_then_local" => SmpCall::RemoteThenLocal,
                    "concurrent" => SmpCall::Concurrent,
                    o => {
                        return Err(format!(
                            "unknown value '{o}' (expected remote_then_local | concurrent)"
                        ))
                    }
                }
            }
            "lazy_tlb" => {
                self.lazy_tlb = match s(v)? {
                    "legacy" => LazyTlb::Legacy,
                    "tlb_gen" => LazyTlb::TlbGen,
                    "is_lazy" => LazyTlb::IsLazy,
                    "mainline" => LazyTlb::Mainline,
                    o => {
                        return Err(format!(
                            "unknown value '{o}' (expected legacy | tlb_gen | is_lazy | mainline)"
                        ))
                    }
                }
            }
            "tlbstate_shared" => self.tlbstate_shared = b(v)?,
            "is_lazy_write_conditional" => self.is_lazy_write_conditional = b(v)?,
            "smp_cond_alloc_mask" => self.smp_cond_alloc_mask = b(v)?,
            "pcid" => self.pcid = b(v)?,
            "tlb_single_page_flush_ceiling" => self.tlb_single_page_flush_ceiling = pos(v)?,
            "idle" => {
                self.idle = match s(v)? {
                    "halt" => Idle::Halt,
                    "poll" => Idle::Poll,
                    o => return Err(format!("unknown value '{o}' (expected halt | poll)")),
                }
            }
            "sched_timeslice_us" => self.sched_timeslice_us = pos(v)?,
            "pv_tlb_flush" => self.pv_tlb_flush = b(v)?,
            "pv_send_ipi" => self.pv_send_ipi = b(v)?,
            "posted_interrupts" => self.posted_interrupts = b(v)?,
            "set_preempted" => {
                self.set_preempted = match s(v)? {
                    "every_put" => SetPreempted::EveryPut,
                    "involuntary" => SetPreempted::Involuntary,
                    o => {
                        return Err(format!(
                            "unknown value '{o}' (expected every_put | involuntary)"
                        ))
                    }
                }
            }
            "vmx_insn_error_check" => {
                self.vmx_insn_error_check = match s(v)? {
                    "jcc" => VmxInsnErrorCheck::Jcc,
                    "jcc_jmp" => VmxInsnErrorCheck::JccJmp,
                    "setcc_cmp_jcc" => VmxInsnErrorCheck::SetccCmpJcc,
                    "setcc_cmp_jcc_jmp" => VmxInsnErrorCheck::SetccCmpJccJmp,
                    o => {
                        return Err(format!(
                            "unknown value '{o}' (expected jcc | jcc_jmp | setcc_cmp_jcc | setcc_cmp_jcc_jmp)"
                        ))
                    }
                }
            }
            "mutant" => {
                for name in s(v)?.split(',').map(str::trim).filter(|n| !n.is_empty()) {
                    self.mutants.enable(name)?;
                }
            }
            _ => {
                let keys: Vec<_> = OPTION_KEYS.iter().map(|k| k.0).collect();
                return Err(format!("unknown option (known: {})", keys.join(", ")));
            }
        }
        Ok(())
    }
}

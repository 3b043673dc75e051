//! Measurements on the real Linux host the simulator runs on: what a TLB shootdown and its
//! building blocks cost here, so a cost profile can be checked against (or fitted to) the
//! machine in front of the user. Nothing needs root.
//!
//! Two entry points, both returning JSON-serialisable types for the PyO3 layer:
//!
//! * [`probe`] describes the host: CPUs, topology, kernel, mitigations, the TLB-related CPU
//!   flags, the hypervisor and its KVM paravirtual features, whether `/proc/interrupts` counts
//!   TLB shootdowns.
//! * [`run_case`] times one [`CaseSpec`]: a shootdown-causing system call (`madvise`,
//!   `mprotect`, `munmap`) with `T` sibling threads of the same process pinned to other CPUs,
//!   or one primitive (`null_syscall`, `ctx_switch`, `wake_ipi`, `migrate`). See the [`Op`]
//!   variants for the kernel path each exercises.
//!
//! Every host condition that stops a measurement is a [`HostError`] whose one-line message
//! names the cause and the fix; nothing here panics on one.
//!
//! Layering: a leaf crate; only `libc`, `serde` and `thiserror` below it.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::atomic::AtomicBool;

#[cfg(target_os = "linux")]
mod cases;
#[cfg(target_os = "linux")]
mod interrupts;
#[cfg(target_os = "linux")]
mod mem;
#[cfg(target_os = "linux")]
mod pin;
#[cfg(target_os = "linux")]
mod probe;
#[cfg(target_os = "linux")]
mod siblings;
#[cfg(target_os = "linux")]
mod sys;

mod cpuid;
mod stats;

pub use cpuid::KvmFeatures;

/// Everything that can stop a probe or a measurement. Each message is one line naming the
/// cause and, where there is one, the fix.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum HostError {
    #[error("not Linux: the host benchmarks need Linux system calls, /proc and /sys")]
    NotLinux,
    #[error(
        "only {have} online CPU{} in this process's affinity mask: {what} needs at least {need} \
         (give the process more CPUs, e.g. widen its cpuset or taskset mask)",
        plural(.have)
    )]
    TooFewCpus {
        have: usize,
        need: usize,
        what: String,
    },
    #[error("sched_setaffinity to CPU {cpu} refused: {errno} ({hint})")]
    Affinity {
        cpu: usize,
        errno: String,
        hint: String,
    },
    #[error("sched_setaffinity to CPU {want} returned but the thread runs on CPU {got} (the kernel did not migrate it; is a cpuset or isolation overriding affinity?)")]
    NotMigrated { want: usize, got: i64 },
    #[error(
        "{path} unreadable: {cause} (mount procfs/sysfs, or run outside a sandbox that hides it)"
    )]
    Unreadable { path: String, cause: String },
    #[error("{call} failed: {errno} ({hint})")]
    Syscall {
        call: String,
        errno: String,
        hint: String,
    },
    #[error("bad case spec: {0}")]
    BadSpec(String),
    #[error("benchmark thread problem: {0}")]
    Thread(String),
    #[error("cancelled")]
    Cancelled,
}

fn plural(n: &usize) -> &'static str {
    if *n == 1 {
        ""
    } else {
        "s"
    }
}

/// What [`probe`] finds out about the host. JSON field names are the Rust field names.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HostInfo {
    /// `model name` of the first processor in `/proc/cpuinfo` ("" when absent, e.g. non-x86).
    pub cpu_model: String,
    /// The CPU ids in this process's affinity mask (`sched_getaffinity`), ascending; the cases
    /// pin thread 0 to the first and sibling `i` to the `(i+1)`-th.
    pub online_cpus: Vec<usize>,
    /// `online_cpus.len()`.
    pub online_cpu_count: usize,
    pub sockets: usize,
    pub cores_per_socket: usize,
    pub threads_per_core: usize,
    /// Where the topology came from: "sysfs", "cpuinfo" or "fallback" (one socket, one thread
    /// per core, a core per online CPU).
    pub topology_source: String,
    /// `uname -r`.
    pub kernel_release: String,
    /// `/proc/cmdline`, trimmed.
    pub kernel_cmdline: String,
    /// The command line asks for `idle=poll` (idle CPUs spin instead of halting: wake-ups and
    /// IPIs to them get much cheaper).
    pub idle_poll: bool,
    /// File name → contents of `/sys/devices/system/cpu/vulnerabilities/*` (empty when the
    /// kernel has no such directory).
    pub mitigations: BTreeMap<String, String>,
    /// CPU flags from `/proc/cpuinfo`.
    pub pcid: bool,
    pub invpcid: bool,
    pub invlpgb: bool,
    /// CPUID leaf 0x40000000 signature (e.g. "KVMKVMKVM", "Microsoft Hv", "VMwareVMware"), only
    /// when CPUID.1:ECX bit 31 (hypervisor present) is set.
    pub hypervisor: Option<String>,
    /// KVM paravirtual features (CPUID 0x40000001) when the hypervisor is KVM.
    pub kvm_features: Option<KvmFeatures>,
    /// `/proc/interrupts` has a "TLB:" row (x86), so cases can count shootdown IPIs.
    pub interrupts_rows: bool,
}

/// What a case does. JSON: the snake_case names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Op {
    /// One op = `madvise(MADV_DONTNEED)` over `pages` pre-touched private anonymous pages, then
    /// a write to each page. Kernel: `madvise_dontneed_single_vma` → `zap_page_range_single` →
    /// `tlb_finish_mmu` → `flush_tlb_mm_range` (one flush for the range; a full flush past
    /// `tlb_single_page_flush_ceiling` = 33 pages) → IPI to every other CPU in `mm_cpumask`
    /// that is not lazy, then `pages` anonymous faults that map fresh zeroed pages.
    Madvise,
    /// One op = `mprotect(PROT_READ)` then `mprotect(PROT_READ|PROT_WRITE)` over `pages`
    /// pre-touched pages (8 is the usual size), then a write to each. Kernel:
    /// `change_protection` → `change_pte_range`; x86 `pte_needs_flush` counts a change of
    /// `_PAGE_RW` either way as needing a flush, so BOTH calls end in `tlb_finish_mmu` →
    /// `flush_tlb_mm_range` (about two shootdowns per op). Exclusive anonymous pages become
    /// writable again directly, so the writes rarely fault.
    Mprotect,
    /// One op = `mmap` an isolated 2 MiB-aligned 2 MiB anonymous region
    /// (`MAP_FIXED_NOREPLACE`, THP off with `MADV_NOHUGEPAGE`), write its first page (which
    /// allocates a PTE page), `munmap` it. Kernel: `do_vmi_munmap` → `unmap_region` →
    /// `unmap_vmas` + `free_pgtables` (the PTE page goes: `tlb->freed_tables`) →
    /// `tlb_finish_mmu` → `flush_tlb_mm_range(freed_tables)`. Because page-table pages are
    /// freed, mainline also IPIs CPUs that hold the mm lazily (idle after running a sibling),
    /// which `madvise` skips (while the lazy CPU has not run another process since; see
    /// [`SiblingMode::Sleeping`]). `pages` is ignored.
    Munmap,
    /// One op = `syscall(SYS_getppid)`: kernel entry/exit with the host's mitigations.
    NullSyscall,
    /// One op = one page written for the first time and later unmapped: an isolated 2 MiB
    /// anonymous region (THP off) is mapped, its first `pages` pages written, and unmapped,
    /// per `pages` ops. Per page: an anonymous fault (`do_anonymous_page`: allocate, zero,
    /// map) and its share of the `munmap` (`zap_pte_range`, the page freed); the mmap, the
    /// page table and the one flush are 1/`pages` of an op each.
    Fault,
    /// Two threads pinned to the first CPU ping-pong one byte over two pipes. One op = one
    /// context switch (half a round trip): pipe write + wake-up + `schedule()` + pipe read.
    CtxSwitch,
    /// Two threads on the first two CPUs ping-pong one byte over two pipes (pipes rather than
    /// futexes so the path matches `ctx_switch` except for the CPU hop). One op = one ROUND
    /// TRIP: two cross-CPU wake-ups (a reschedule or call-function IPI each, unless the idle
    /// CPU polls) plus two idle exits.
    WakeIpi,
    /// One thread calls `sched_setaffinity` alternately to the first and second CPU; each call
    /// migrates it (`__set_cpus_allowed_ptr` → `affine_move_task` → stopper thread on the old
    /// CPU). One op = one migration, checked with `sched_getcpu`.
    Migrate,
}

impl Op {
    /// The shootdown cases (which honour `siblings`).
    pub fn is_shootdown(self) -> bool {
        matches!(self, Op::Madvise | Op::Mprotect | Op::Munmap)
    }

    /// The JSON name.
    pub fn name(self) -> &'static str {
        match self {
            Op::Madvise => "madvise",
            Op::Mprotect => "mprotect",
            Op::Munmap => "munmap",
            Op::NullSyscall => "null_syscall",
            Op::Fault => "fault",
            Op::CtxSwitch => "ctx_switch",
            Op::WakeIpi => "wake_ipi",
            Op::Migrate => "migrate",
        }
    }

    /// What one op of the result is.
    pub fn unit(self) -> &'static str {
        match self {
            Op::Madvise | Op::Mprotect | Op::Munmap => "iteration",
            Op::NullSyscall => "syscall",
            Op::Fault => "page",
            Op::CtxSwitch => "switch",
            Op::WakeIpi => "round_trip",
            Op::Migrate => "migration",
        }
    }
}

/// How the sibling threads of a shootdown case behave while it is timed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SiblingMode {
    /// Loop reading their own page: the mm stays loaded on their CPU, so every flush IPIs them.
    Busy,
    /// Touch their page once, then block on a pipe: their CPU goes idle with the mm loaded
    /// lazily, so mainline skips them for plain flushes but not when page tables are freed.
    /// Only until another process runs on that CPU: it then loads another mm, and the next
    /// flush that reaches the CPU finds the wrong mm and drops it from `mm_cpumask`
    /// (`flush_tlb_func`, "remote wrong CPU"); from then on no flush of ours IPIs it. On a
    /// host with background processes waking every few ms that happens almost at once.
    Sleeping,
}

fn default_pages() -> u64 {
    1
}
fn default_mode() -> SiblingMode {
    SiblingMode::Busy
}
fn default_reps() -> usize {
    5
}
fn default_target_ms() -> f64 {
    30.0
}

/// One measurement. JSON fields: `op` (required), `pages` (default 1), `siblings` (default 0),
/// `sibling_mode` (default "busy"), `reps` (default 5), `target_ms` (default 30); any other
/// field is an error.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CaseSpec {
    pub op: Op,
    /// Pages operated on by `madvise` (1 or 32 usually) and `mprotect` (8 usually); ≥ 1.
    /// Ignored by `munmap` (always 2 MiB) and the primitives.
    #[serde(default = "default_pages")]
    pub pages: u64,
    /// Sibling threads of the same process for the shootdown cases, pinned to the 2nd, 3rd, …
    /// CPU of the affinity mask; at most `online_cpu_count - 1`. Ignored by the primitives.
    #[serde(default)]
    pub siblings: usize,
    #[serde(default = "default_mode")]
    pub sibling_mode: SiblingMode,
    /// Timed repetitions (after one untimed warm-up); ≥ 1, 3 or more expected.
    #[serde(default = "default_reps")]
    pub reps: usize,
    /// Wall-time budget of one repetition in ms; the op count per repetition is scaled from a
    /// short trial run to fill it.
    #[serde(default = "default_target_ms")]
    pub target_ms: f64,
}

impl CaseSpec {
    /// A spec with the defaults for everything but `op`.
    pub fn new(op: Op) -> Self {
        CaseSpec {
            op,
            pages: default_pages(),
            siblings: 0,
            sibling_mode: default_mode(),
            reps: default_reps(),
            target_ms: default_target_ms(),
        }
    }

    /// Parse a spec from JSON, rejecting unknown fields and unknown ops.
    pub fn from_json(text: &str) -> Result<Self, HostError> {
        serde_json::from_str(text).map_err(|e| HostError::BadSpec(e.to_string()))
    }

    /// Check what can be checked without the host.
    pub fn validate(&self) -> Result<(), HostError> {
        const MAX_PAGES: u64 = 1 << 18; // 1 GiB of 4 KiB pages
        if matches!(self.op, Op::Madvise | Op::Mprotect) && !(1..=MAX_PAGES).contains(&self.pages) {
            return Err(HostError::BadSpec(format!(
                "pages = {} for {:?}: must be 1..={MAX_PAGES}",
                self.pages, self.op
            )));
        }
        if !(1..=10_000).contains(&self.reps) {
            return Err(HostError::BadSpec(format!(
                "reps = {}: must be 1..=10000 (3 or more for a usable median)",
                self.reps
            )));
        }
        if !(self.target_ms.is_finite() && self.target_ms > 0.0 && self.target_ms <= 60_000.0) {
            return Err(HostError::BadSpec(format!(
                "target_ms = {}: must be a number in (0, 60000]",
                self.target_ms
            )));
        }
        Ok(())
    }
}

/// The outcome of [`run_case`]. JSON field names are the Rust field names.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CaseResult {
    /// The spec, echoed.
    pub spec: CaseSpec,
    /// What one op is: "iteration", "syscall", "switch", "round_trip" or "migration".
    pub unit: String,
    /// CPUs used: thread 0 (the timed one) first, then the siblings or the partner thread.
    pub cpus: Vec<usize>,
    /// Ops in each timed repetition.
    pub ops_per_rep: u64,
    /// Microseconds per op, one entry per timed repetition.
    pub us_per_op: Vec<f64>,
    pub median_us: f64,
    pub min_us: f64,
    pub max_us: f64,
    /// Growth of the "TLB:" row of `/proc/interrupts` (summed over all CPUs) across the timed
    /// repetitions, divided by the ops timed; `None` when the row is absent. It counts
    /// shootdown IPIs received, from every process on the host.
    pub tlb_ipis_per_op: Option<f64>,
    /// The same for "CAL:" (function-call IPIs, which carry the shootdowns and remote wake-ups).
    pub cal_ipis_per_op: Option<f64>,
    /// The same for "RES:" (rescheduling IPIs).
    pub res_ipis_per_op: Option<f64>,
    /// CPU time the sibling threads used across the timed repetitions, per sibling, as a
    /// fraction of the wall time (`None` without siblings). Busy siblings should be near 1;
    /// less means other tasks competed for their CPUs, so fewer flushes found the mm loaded
    /// there and `tlb_ipis_per_op` undercounts what a quiet host would show.
    pub sibling_cpu_share: Option<f64>,
}

/// Describe the host.
pub fn probe() -> Result<HostInfo, HostError> {
    #[cfg(target_os = "linux")]
    {
        probe::probe()
    }
    #[cfg(not(target_os = "linux"))]
    {
        Err(HostError::NotLinux)
    }
}

/// Time one case on this host. Setting `cancel` makes it return [`HostError::Cancelled`] at
/// the next check (before and between repetitions and trial runs), after stopping its threads
/// and unmapping its memory. The caller's thread is left as it was: the timed thread is a new
/// one.
pub fn run_case(spec: &CaseSpec, cancel: &AtomicBool) -> Result<CaseResult, HostError> {
    #[cfg(target_os = "linux")]
    {
        cases::run_case(spec, cancel)
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = (spec, cancel);
        Err(HostError::NotLinux)
    }
}

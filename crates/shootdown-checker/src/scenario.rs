//! Scenario files (`scenarios/*.toml`): a small machine, its address spaces and task programs,
//! optional deterministic setup steps, and the mutants (historical bugs) meaningful for it.
//!
//! See `docs/checker.md` for the format. Unknown keys are errors naming the file and the key;
//! nothing in a scenario file can make the loader panic.

use crate::error::CheckError;
use serde::Deserialize;
use shootdown_engine::Model;
use shootdown_hw::{CostProfile, Features, Topology};
use shootdown_linux::describe::NullEnv;
use shootdown_linux::host::HostOp;
use shootdown_linux::kernel_map::VMALLOC_START_VPN;
use shootdown_linux::kvm::memslot::Memslot;
use shootdown_linux::kvm::mtrr::{
    size_mask, MemType, MtrrState, VarRange, KVM_NR_VAR_MTRR, MTRR_DEF_TYPE_E, MTRR_PHYS_MASK_VALID,
};
use shootdown_linux::options::{HvTlbFlush, KvmVersion, TdpZap, ZapLock, MUTANT_NAMES};
use shootdown_linux::{
    Action, HostConfig, Machine, MemoryModel, MmId, OptValue, Options, UserOp, INIT_MM,
};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The parsed file, exactly as written.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScenarioFile {
    /// Defaults to the file stem.
    pub name: Option<String>,
    pub description: String,
    /// Number of CPUs (one socket, one thread per core).
    pub cpus: usize,
    #[serde(default)]
    pub features: FeaturesSpec,
    /// Kernel options, same keys as experiment files (`lazy_tlb`, `smp_call`, `pcid`, …).
    #[serde(default)]
    pub options: BTreeMap<String, toml::Value>,
    /// Groups of interchangeable CPUs (same role: same number of tasks with the same programs
    /// and mms). Used for symmetry reduction.
    #[serde(default)]
    pub symmetric: Vec<Vec<usize>>,
    /// Files the mms map through VMAs (`[[files]]`: `name`, `npages`, `device`; `vma.rs`).
    #[serde(default)]
    pub files: Vec<FileSpec>,
    #[serde(default)]
    pub mms: Vec<MmSpec>,
    #[serde(default)]
    pub tasks: Vec<TaskSpec>,
    /// Deterministic steps run before exploring.
    #[serde(default)]
    pub setup: Vec<SetupSpec>,
    #[serde(default)]
    pub mutants: Vec<MutantSpec>,
    /// NMIs the explorer may deliver, at any point (interrupts off included): `[[nmi]]` with
    /// `cpu`, `count` and the user stack page `vpn` perf's handler reads (`nmi.rs`).
    #[serde(default)]
    pub nmi: Vec<NmiSpec>,
    /// Kernel mappings: `[kernel] vmalloc = [{ start = 0, npages = 1 }]`, pages (by offset
    /// from `VMALLOC_START`) mapped in init_mm, Global without PTI (`kernel_map.rs`).
    pub kernel: Option<KernelSpec>,
    /// Run the CPUs as the vCPUs of one VM on a host (PV TLB flush scenarios): the host may
    /// preempt them at any instruction boundary.
    pub host: Option<HostSpec>,
    /// Model the VM's MMU (KVM): memslots, an EPT the vCPUs fault in, host threads (the VMM's,
    /// an MMU-notifier caller). Implies a `[host]` (by default one that never preempts).
    pub kvm: Option<KvmSpec>,
    /// `[finding]`: the protocol as the kernel wrote it violates an invariant in this
    /// configuration (a documented finding, not a mutant). Absent: it verifies.
    pub finding: Option<FindingSpec>,
}

/// `[[files]]`: a regular file of `npages` pages (its page cache filled on first use) or,
/// with `device`, a device whose memory its mmap maps VM_PFNMAP (`vma.rs`).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileSpec {
    pub name: String,
    pub npages: u64,
    #[serde(default)]
    pub device: bool,
}

/// `vmas = [{ start, npages, file, pgoff, populate }]` of an mm: a MAP_SHARED mapping of
/// `file` from page offset `pgoff`, pre-faulted unless `populate = false`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VmaSpec {
    pub start: u64,
    pub npages: u64,
    pub file: String,
    #[serde(default)]
    pub pgoff: u64,
    #[serde(default = "yes")]
    pub populate: bool,
}

/// How many tasks of the scenario run an op `op` says yes to.
fn tasks_running(file: &ScenarioFile, op: fn(&OpSpec) -> bool) -> usize {
    file.tasks
        .iter()
        .filter(|t| t.program.iter().any(op))
        .count()
}

fn is_text_poke(op: &OpSpec) -> bool {
    matches!(op, OpSpec::TextPoke { .. })
}

fn is_efi_call(op: &OpSpec) -> bool {
    matches!(op, OpSpec::EfiCall)
}

/// What is wrong with an `mremap` of `[start, start + npages)` to `new_start` by a task of
/// `mm`, if anything: the old range lies inside one file VMA or outside all of them, and the
/// new one is empty — no VMA, pre-mapped range or DAX file of the mm there, and no task of the
/// mm touches it (MREMAP_FIXED's unmap of the destination is not modelled).
fn mremap_ranges(
    file: &ScenarioFile,
    mm: Option<&str>,
    start: u64,
    npages: u64,
    new_start: u64,
) -> Option<String> {
    let m = file.mms.iter().find(|m| Some(m.name.as_str()) == mm)?;
    let overlaps = |a: u64, n: u64, b: u64, k: u64| a < b + k && b < a + n;
    let inside = m
        .vmas
        .iter()
        .any(|v| v.start <= start && start + npages <= v.start + v.npages);
    if !inside
        && m.vmas
            .iter()
            .any(|v| overlaps(start, npages, v.start, v.npages))
    {
        return Some("mremap's old range lies partly in a file VMA: move a range inside one VMA, or anonymous memory only".into());
    }
    let mapped = m
        .vmas
        .iter()
        .any(|v| overlaps(new_start, npages, v.start, v.npages))
        || m.map
            .iter()
            .any(|r| overlaps(new_start, npages, r.start, r.npages))
        || m.dax
            .iter()
            .any(|d| overlaps(new_start, npages, d.start, d.npages));
    let touched = file
        .tasks
        .iter()
        .filter(|t| t.mm.as_deref() == mm)
        .any(|t| {
            t.program.iter().any(|op| match *op {
                OpSpec::Touch { vpn, .. } | OpSpec::Exec { vpn } => {
                    overlaps(new_start, npages, vpn, 1)
                }
                OpSpec::TouchRange {
                    start, npages: n, ..
                } => overlaps(new_start, npages, start, n),
                OpSpec::TouchRandomBlock { start, span, .. } => {
                    overlaps(new_start, npages, start, span)
                }
                _ => false,
            })
        });
    (mapped || touched).then(|| "mremap's new range may be mapped (a VMA, a mapped range or a touch of the mm is there): MREMAP_FIXED's unmap of the destination is not modelled".into())
}

/// `[kernel]`: vmalloc'd pages, by page offset from `VMALLOC_START`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KernelSpec {
    #[serde(default)]
    pub vmalloc: Vec<RangeSpec>,
}

/// `[[nmi]]`: up to `count` NMIs on `cpu`, each reading user page `vpn` of `current->mm`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NmiSpec {
    pub cpu: usize,
    #[serde(default = "one")]
    pub count: u64,
    pub vpn: u64,
}

/// `[finding]`: what the unmutated protocol is expected to violate, and why it matters.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FindingSpec {
    /// The invariant violated (`INV-MMIO`, …).
    pub expect: String,
    pub description: String,
}

/// `[kvm]`: the VM's memslots and host threads.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KvmSpec {
    /// Memslots of address space 0 when the run starts.
    pub memslots: Vec<MemslotSpec>,
    /// Guest frames whose SPTEs exist when the run starts (as if faulted in before).
    #[serde(default)]
    pub prefault: Vec<RangeSpec>,
    /// Host threads, in order (agents after the vCPUs).
    #[serde(default)]
    pub threads: Vec<HostThreadSpec>,
    /// A device without snoop control is assigned from the start: KVM honours the guest's
    /// memory types (seed 004).
    #[serde(default)]
    pub noncoherent_dma: bool,
    /// The host's physical-address width: the TDP MMU's walks end at gfn 2^(bits - 12)
    /// (`tdp_mmu_max_gfn_exclusive`; 46 by default, scenarios narrow it to keep walks short).
    pub host_phys_bits: Option<u32>,
    /// A second address space (SMM): its memslots are `smm_memslots`, and with the TDP MMU its
    /// root exists beside the normal one from the start. vCPUs enter and leave SMM with the
    /// `smi` and `rsm` ops.
    #[serde(default)]
    pub smm: bool,
    /// Memslots of address space 1 (SMM) when the run starts (needs `smm`; default: the same
    /// as address space 0's, as QEMU's `smram` address space aliases the normal map). A slot
    /// with the base and size of one of address space 0's aliases its host memory; any other
    /// (SMRAM) has its own.
    pub smm_memslots: Option<Vec<MemslotSpec>>,
    /// Every vCPU's MTRRs when the run starts (default: disabled).
    pub mtrrs: Option<MtrrsSpec>,
    /// Every vCPU's CR0.CD when the run starts.
    #[serde(default)]
    pub cr0_cd: bool,
    /// The guest frame of vCPU 0's steal-time area (vCPU i's at the next frames), as if the
    /// guest had enabled steal time at boot: the host's accesses to the area then go through
    /// its cache (`options.steal_time_map`). Default: not modelled.
    pub steal_time_gfn: Option<u64>,
}

/// `[kvm.mtrrs]`: MTRRs enabled with a default type and variable ranges (no fixed ranges).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MtrrsSpec {
    pub default: String,
    #[serde(default)]
    pub variable: Vec<VarMtrrSpec>,
}

/// A variable MTRR: `size` bytes (a power of two) at byte address `base`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VarMtrrSpec {
    pub base: u64,
    pub size: u64,
    #[serde(rename = "type")]
    pub ty: String,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemslotSpec {
    pub id: u16,
    pub base: u64,
    pub npages: u64,
    #[serde(default)]
    pub readonly: bool,
    /// Backed by huge host pages (2 MiB SPTEs where the slot covers a whole region).
    #[serde(default)]
    pub huge: bool,
    /// `KVM_MEM_LOG_DIRTY_PAGES` from the start: a dirty bitmap, 4 KiB SPTEs only.
    #[serde(default)]
    pub dirty_log: bool,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostThreadSpec {
    pub name: String,
    pub program: Vec<HostOpSpec>,
}

/// One host-thread operation; the names are `HostOp`'s in snake_case.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum HostOpSpec {
    /// `as_id = 1`: a slot of SMM's address space, with host memory of its own.
    MemslotCreate {
        #[serde(default)]
        as_id: u8,
        id: u16,
        base: u64,
        npages: u64,
        #[serde(default)]
        readonly: bool,
        #[serde(default)]
        huge: bool,
    },
    MemslotDelete {
        #[serde(default)]
        as_id: u8,
        id: u16,
    },
    InvalidateGfns {
        gfn: u64,
        #[serde(default = "one")]
        npages: u64,
    },
    /// VFIO assigns a device without snoop control (KVM zaps: seed 004's patch 5).
    AssignNoncoherentDma,
    /// One run of the NX huge page recovery worker (`options.nx_huge_pages`).
    NxRecover,
    /// `KVM_GET_DIRTY_LOG` of memslot `id` (of address space `as_id`).
    GetDirtyLog {
        #[serde(default)]
        as_id: u8,
        id: u16,
    },
    /// `KVM_CLEAR_DIRTY_LOG` of memslot `id` (`options.manual_dirty_log_protect`).
    ClearDirtyLog {
        #[serde(default)]
        as_id: u8,
        id: u16,
    },
    /// `KVM_SET_USER_MEMORY_REGION` adding `KVM_MEM_LOG_DIRTY_PAGES` to memslot `id`.
    EnableDirtyLog {
        #[serde(default)]
        as_id: u8,
        id: u16,
    },
    /// The `clear_young` MMU notifier (aging; no flush).
    ClearYoung {
        gfn: u64,
        #[serde(default = "one")]
        npages: u64,
    },
    Compute {
        ns: u64,
    },
    Loop {
        to: u16,
        times: Option<u32>,
    },
    Exit,
}

/// The MTRR state `[kvm.mtrrs]` describes; errors are (key, reason).
fn mtrr_state(mt: &MtrrsSpec) -> Result<MtrrState, (String, String)> {
    let ty = |s: &str, key: &str| {
        MemType::parse(s).ok_or_else(|| {
            (
                key.to_string(),
                format!(
                    "unknown memory type '{s}' (expected {})",
                    MemType::NAMES.join(" | ")
                ),
            )
        })
    };
    let mut st = MtrrState {
        deftype: MTRR_DEF_TYPE_E | ty(&mt.default, "default")? as u64,
        ..Default::default()
    };
    if mt.variable.len() > KVM_NR_VAR_MTRR {
        return Err((
            "variable".into(),
            format!("at most {KVM_NR_VAR_MTRR} ranges"),
        ));
    }
    for (i, v) in mt.variable.iter().enumerate() {
        let mask = size_mask(v.size).map_err(|r| (format!("variable[{i}].size"), r))?;
        st.var[i] = VarRange {
            base: v.base | ty(&v.ty, &format!("variable[{i}].type"))? as u64,
            mask: mask | MTRR_PHYS_MASK_VALID,
        };
    }
    st.check().map_err(|r| ("variable".to_string(), r))?;
    Ok(st)
}

/// Guest frames the model's 4-level EPT can map (a 48-bit guest physical address space).
const GUEST_FRAMES: u64 = 1 << 36;

/// What is wrong with a memslot over guest frames `[base, base + npages)`, if anything: the key
/// (`base` or `npages`) and the reason. (`__kvm_set_memory_region` rejects a slot that wraps or
/// ends past the guest physical address space; the model also caps a slot at 4 GiB.)
fn bad_slot(base: u64, npages: u64) -> Option<(&'static str, String)> {
    if npages == 0 || npages > 1 << 20 {
        return Some((
            "npages",
            format!("a memslot needs 1..=1048576 pages (got {npages})"),
        ));
    }
    if base >= GUEST_FRAMES || base + npages > GUEST_FRAMES {
        return Some((
            "base",
            format!(
                "gfns {base:#x}..{:#x} end past guest memory (a 48-bit guest physical address space: frames below {GUEST_FRAMES:#x})",
                base.saturating_add(npages)
            ),
        ));
    }
    None
}

/// The host frame a memslot at guest frame `base` is backed by.
fn slot_pfn(base: u64) -> u64 {
    0x10_0000 + base
}

/// The host frame behind a memslot of SMM's address space at `base` that aliases none of
/// address space 0's (SMRAM): memory of its own.
fn smram_pfn(base: u64) -> u64 {
    0x20_0000 + base
}

/// Check one address space's memslots (`key` names the list): sizes, unique ids, no overlap.
fn check_memslots(key: &str, slots: &[MemslotSpec]) -> Result<(), (String, String)> {
    let mut ids: Vec<u16> = Vec::new();
    let mut ranges: Vec<(u64, u64)> = Vec::new();
    for (i, sl) in slots.iter().enumerate() {
        let key = format!("{key}[{i}]");
        if let Some((k, why)) = bad_slot(sl.base, sl.npages) {
            return Err((format!("{key}.{k}"), why));
        }
        if ids.contains(&sl.id) {
            return Err((
                format!("{key}.id"),
                format!("duplicate memslot id {}", sl.id),
            ));
        }
        let r = (sl.base, sl.base + sl.npages);
        if let Some(o) = ranges.iter().find(|o| o.0 < r.1 && r.0 < o.1) {
            return Err((
                key,
                format!(
                    "gfns {:#x}..{:#x} overlap another memslot's {:#x}..{:#x}",
                    r.0, r.1, o.0, o.1
                ),
            ));
        }
        ids.push(sl.id);
        ranges.push(r);
    }
    Ok(())
}

impl HostOpSpec {
    fn to_host_op(&self) -> HostOp {
        match *self {
            HostOpSpec::MemslotCreate {
                as_id,
                id,
                base,
                npages,
                readonly,
                huge,
            } => HostOp::MemslotCreate {
                as_id,
                id,
                base_gfn: base,
                npages,
                readonly,
                huge,
                pfn: if as_id == 1 {
                    smram_pfn(base)
                } else {
                    slot_pfn(base)
                },
            },
            HostOpSpec::MemslotDelete { as_id, id } => HostOp::MemslotDelete { as_id, id },
            HostOpSpec::InvalidateGfns { gfn, npages } => HostOp::InvalidateGfns { gfn, npages },
            HostOpSpec::AssignNoncoherentDma => HostOp::AssignNoncoherentDma,
            HostOpSpec::NxRecover => HostOp::NxRecover,
            HostOpSpec::GetDirtyLog { as_id, id } => HostOp::GetDirtyLog { as_id, id },
            HostOpSpec::ClearDirtyLog { as_id, id } => HostOp::ClearDirtyLog { as_id, id },
            HostOpSpec::EnableDirtyLog { as_id, id } => HostOp::EnableDirtyLog { as_id, id },
            HostOpSpec::ClearYoung { gfn, npages } => HostOp::ClearYoung { gfn, npages },
            HostOpSpec::Compute { ns } => HostOp::Compute { ns },
            HostOpSpec::Loop { to, times } => HostOp::Loop { to, times },
            HostOpSpec::Exit => HostOp::Exit,
        }
    }
}

/// `[host]`: the CPUs are vCPUs of one VM, each on its own pCPU; the host may preempt the
/// listed ones at any time (`VcpuPut`) and run them again (`VcpuLoad`).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostSpec {
    /// vCPUs the host may preempt (default: all).
    pub preemptible: Option<Vec<usize>>,
    /// A preempted vCPU may also be loaded and put again without entering the guest (a
    /// userspace ioctl): a second `kvm_arch_vcpu_put` before the next entry.
    #[serde(default)]
    pub ioctl_puts: bool,
    /// At most this many preemptions per vCPU (default 0 = unbounded).
    #[serde(default)]
    pub max_preemptions: u32,
    /// Pause-loop exiting: a vCPU spinning in guest kernel code while another vCPU of its VM
    /// is preempted may take a PLE exit and directed yield (`PleExit`), and give its pCPU away
    /// (`VcpuPut`, even if it is not preemptible). Default false: spins never exit.
    #[serde(default)]
    pub ple: bool,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FeaturesSpec {
    #[serde(default = "yes")]
    pub pcid: bool,
    #[serde(default)]
    pub pti: bool,
    #[serde(default = "yes")]
    pub invpcid: bool,
    #[serde(default = "tlb_entries")]
    pub tlb_entries: usize,
    #[serde(default = "psc_entries")]
    pub psc_entries: usize,
    /// The Alder/Raptor Lake erratum: with PCIDs on, INVLPG may leave Global entries cached.
    #[serde(default)]
    pub invlpg_miss_global: bool,
    /// AMD's INVLPGB and TLBSYNC (with `invlpgb_count_max` pages per INVLPGB, default 1).
    #[serde(default)]
    pub invlpgb: bool,
    #[serde(default = "one_u16")]
    pub invlpgb_count_max: u16,
}

fn one_u16() -> u16 {
    1
}

fn yes() -> bool {
    true
}
fn tlb_entries() -> usize {
    64
}
fn psc_entries() -> usize {
    8
}

impl Default for FeaturesSpec {
    fn default() -> Self {
        FeaturesSpec {
            pcid: true,
            pti: false,
            invpcid: true,
            tlb_entries: tlb_entries(),
            psc_entries: psc_entries(),
            invlpg_miss_global: false,
            invlpgb: false,
            invlpgb_count_max: 1,
        }
    }
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MmSpec {
    pub name: String,
    /// Pre-mapped (pre-faulted) ranges.
    #[serde(default)]
    pub map: Vec<RangeSpec>,
    /// Pages the hardware walker may fill speculatively through any CR3 that points to this mm.
    #[serde(default)]
    pub speculative: Vec<u64>,
    /// Files of a DAX filesystem mapped into this mm (pre-mapped read-only: clean), numbered
    /// in file order across mms for `fdatasync { file = N }`.
    #[serde(default)]
    pub dax: Vec<DaxSpec>,
    /// MAP_SHARED mappings of `[[files]]` (`vma.rs`).
    #[serde(default)]
    pub vmas: Vec<VmaSpec>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DaxSpec {
    pub start: u64,
    pub npages: u64,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RangeSpec {
    pub start: u64,
    #[serde(default = "one")]
    pub npages: u64,
    #[serde(default = "yes")]
    pub writable: bool,
}

fn one() -> u64 {
    1
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaskSpec {
    pub name: String,
    pub cpu: usize,
    /// The task's mm; absent for a kernel thread (khugepaged), whose program may use only
    /// `collapse`, `compute`, `loop` and `exit`.
    pub mm: Option<String>,
    pub program: Vec<OpSpec>,
}

/// One user operation; the names are [`UserOp`]'s in snake_case. Written `"exit"` or
/// `{ touch = { vpn = 0x10, write = true } }`.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum OpSpec {
    Touch {
        vpn: u64,
        #[serde(default)]
        write: bool,
    },
    /// An instruction fetch from a page.
    Exec {
        vpn: u64,
    },
    TouchRange {
        start: u64,
        npages: u64,
        #[serde(default)]
        write: bool,
    },
    TouchRandomBlock {
        start: u64,
        span: u64,
        npages: u64,
    },
    Compute {
        ns: u64,
    },
    /// Anonymous faults charged in bulk, through the per-CPU page lists with `page_lists`.
    AnonFaults {
        npages: u32,
    },
    /// Frees of pages charged in bulk (`lru_add_drain`, `release_pages`, the per-CPU list).
    FreePages {
        npages: u32,
    },
    Mmap {
        start: u64,
        npages: u64,
    },
    Munmap {
        start: u64,
        npages: u64,
    },
    MadviseDontneed {
        start: u64,
        npages: u64,
    },
    Mprotect {
        start: u64,
        npages: u64,
        writable: bool,
    },
    Fdatasync {
        #[serde(default)]
        file: u32,
    },
    ReclaimUnmap {
        start: u64,
        npages: u64,
        /// kswapd's form (kernel threads only): the mm reclaimed from.
        #[serde(default)]
        mm: Option<String>,
    },
    SetAffinity {
        cpu: usize,
    },
    SetAffinityNext,
    /// Kernel threads only: `mmget_not_zero(mm)` + `kthread_use_mm(mm)`; the `touch`es up to
    /// the next `unuse_mm` are uaccess to it.
    UseMm {
        mm: String,
    },
    /// Kernel threads only: `kthread_unuse_mm()` + `mmput()`.
    UnuseMm,
    /// Kernel code reads vmalloc page `page` (an offset from `VMALLOC_START`).
    KernelTouch {
        page: u64,
    },
    /// `text_poke()` of vmalloc page `page` (an offset): module text patched through
    /// `poking_mm`, which the scenario then has.
    TextPoke {
        page: u64,
    },
    /// `vunmap_range()` of vmalloc pages `[start, start + npages)` (offsets).
    VunmapRange {
        start: u64,
        npages: u64,
    },
    /// khugepaged (kernel threads only): collapse the 512-page group at `start` of `mm`.
    Collapse {
        mm: String,
        start: u64,
    },
    /// `mremap()` of `[start, start + npages)` to `new_start` (MREMAP_MAYMOVE | MREMAP_FIXED).
    Mremap {
        start: u64,
        npages: u64,
        new_start: u64,
    },
    /// `ftruncate()` of a regular file to `npages` pages.
    Truncate {
        file: String,
        #[serde(default)]
        npages: u64,
    },
    /// A driver revokes every mapping of a device file (`unmap_mapping_range`).
    RevokeMapping {
        file: String,
    },
    /// A driver's `migrate_vma` of the task's anonymous pages `[start, start + npages)`.
    MigrateVma {
        start: u64,
        npages: u64,
    },
    /// An EFI runtime-service call through `efi_mm`, which the scenario then has.
    EfiCall,
    Event,
    Mark,
    CopyPages {
        pages: u64,
    },
    /// Seed 004: the guest writes an MTRR MSR (by number).
    Wrmsr {
        msr: u32,
        value: u64,
    },
    /// Seed 004: the guest sets CR0.CD.
    SetCr0Cd {
        cd: bool,
    },
    /// The guest raises an SMI on its vCPU, which enters SMM (`[kvm] smm`).
    Smi,
    /// RSM: the vCPU leaves SMM.
    Rsm,
    Loop {
        to: u16,
        times: Option<u32>,
    },
    Exit,
}

impl OpSpec {
    fn to_user_op(&self, mm_ids: &BTreeMap<&str, MmId>, file_ids: &BTreeMap<&str, u32>) -> UserOp {
        match *self {
            OpSpec::Mremap {
                start,
                npages,
                new_start,
            } => UserOp::Mremap {
                start,
                npages,
                new_start,
            },
            OpSpec::Truncate { ref file, npages } => UserOp::Truncate {
                file: file_ids[file.as_str()],
                npages,
            },
            OpSpec::RevokeMapping { ref file } => UserOp::RevokeMapping {
                file: file_ids[file.as_str()],
            },
            OpSpec::MigrateVma { start, npages } => UserOp::MigrateVma { start, npages },
            OpSpec::EfiCall => UserOp::EfiCall {
                efi_mm: mm_ids["efi_mm"],
            },
            OpSpec::Collapse { ref mm, start } => UserOp::Collapse {
                mm: mm_ids[mm.as_str()],
                start,
            },
            OpSpec::UseMm { ref mm } => UserOp::UseMm {
                mm: mm_ids[mm.as_str()],
            },
            OpSpec::UnuseMm => UserOp::UnuseMm,
            OpSpec::KernelTouch { page } => UserOp::KernelTouch {
                vpn: VMALLOC_START_VPN + page,
            },
            OpSpec::TextPoke { page } => UserOp::TextPoke {
                poking_mm: mm_ids["poking_mm"],
                page: VMALLOC_START_VPN + page,
            },
            OpSpec::VunmapRange { start, npages } => UserOp::VunmapRange {
                start: VMALLOC_START_VPN + start,
                npages,
            },
            OpSpec::Touch { vpn, write } => UserOp::Touch { vpn, write },
            OpSpec::Exec { vpn } => UserOp::Exec { vpn },
            OpSpec::TouchRange {
                start,
                npages,
                write,
            } => UserOp::TouchRange {
                start,
                npages,
                write,
            },
            OpSpec::TouchRandomBlock {
                start,
                span,
                npages,
            } => UserOp::TouchRandomBlock {
                start,
                span,
                npages,
            },
            OpSpec::Compute { ns } => UserOp::Compute { ns },
            OpSpec::AnonFaults { npages } => UserOp::AnonFaults { npages },
            OpSpec::FreePages { npages } => UserOp::FreePages { npages },
            OpSpec::Mmap { start, npages } => UserOp::Mmap { start, npages },
            OpSpec::Munmap { start, npages } => UserOp::Munmap { start, npages },
            OpSpec::MadviseDontneed { start, npages } => UserOp::MadviseDontneed { start, npages },
            OpSpec::Mprotect {
                start,
                npages,
                writable,
            } => UserOp::Mprotect {
                start,
                npages,
                writable,
            },
            OpSpec::Fdatasync { file } => UserOp::Fdatasync { file },
            OpSpec::ReclaimUnmap {
                start,
                npages,
                ref mm,
            } => UserOp::ReclaimUnmap {
                start,
                npages,
                mm: mm.as_ref().map(|m| mm_ids[m.as_str()]),
            },
            OpSpec::SetAffinity { cpu } => UserOp::SetAffinity { cpu },
            OpSpec::SetAffinityNext => UserOp::SetAffinityNext,
            OpSpec::Event => UserOp::Event,
            OpSpec::Mark => UserOp::Mark,
            OpSpec::CopyPages { pages } => UserOp::CopyPages { pages },
            OpSpec::Wrmsr { msr, value } => UserOp::Wrmsr { msr, value },
            OpSpec::SetCr0Cd { cd } => UserOp::SetCr0Cd { cd },
            OpSpec::Smi => UserOp::Smi,
            OpSpec::Rsm => UserOp::Rsm,
            OpSpec::Loop { to, times } => UserOp::Loop { to, times },
            OpSpec::Exit => UserOp::Exit,
        }
    }
}

/// Run one CPU deterministically before exploring: `steps = N` of its steps, or `until` it is
/// `"idle"` (idle task, nothing on its stacks, empty runqueue) or `"user:TASK"` (TASK current and
/// in user mode, about to run its next operation), or `"user:TASK@N"` (the same, about to run
/// operation N of its program). A vCPU counts only while it runs guest code.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SetupSpec {
    pub cpu: usize,
    pub steps: Option<u64>,
    pub until: Option<String>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MutantSpec {
    /// A mutant name (`Options::set("mutant", …)`).
    pub name: String,
    /// The catalog id (`N3`), if it re-creates a catalogued bug.
    pub bug: Option<String>,
    pub description: String,
    /// The invariant the checker must report (`INV-STALE`, `INV-PTFREE`, …).
    pub expect: Option<String>,
    /// The memory model under which the bug shows (`sc` or `tso`; default `sc`).
    pub memory_model: Option<String>,
}

/// A loaded, validated scenario.
#[derive(Clone, Debug)]
pub struct Scenario {
    pub path: PathBuf,
    pub name: String,
    pub file: ScenarioFile,
    pub options: Options,
    /// What `--set` changed beyond the keys named (a grown CPU count: [`crate::scale`]).
    pub set_notes: Vec<String>,
}

/// Parse the memory-model name used on the command line and in scenario files.
pub fn parse_memory_model(s: &str) -> Option<MemoryModel> {
    match s.to_ascii_lowercase().as_str() {
        "sc" => Some(MemoryModel::Sc),
        "tso" => Some(MemoryModel::Tso),
        _ => None,
    }
}

fn toml_error_key(e: &toml::de::Error, src: &str) -> (String, String) {
    let msg = e.message().to_string();
    for prefix in ["unknown field `", "missing field `", "unknown variant `"] {
        if let Some(rest) = msg.strip_prefix(prefix) {
            if let Some(end) = rest.find('`') {
                return (rest[..end].to_string(), msg.clone());
            }
        }
    }
    if let Some(rest) = msg.strip_prefix("unexpected keys in table: ") {
        let k = rest.split(',').next().unwrap_or(rest).trim();
        return (k.to_string(), msg.clone());
    }
    let key = match e.span() {
        Some(sp) => {
            let start = sp.start.min(src.len());
            let line_no = src[..start].matches('\n').count() + 1;
            let line_start = src[..start].rfind('\n').map(|i| i + 1).unwrap_or(0);
            let line = src[line_start..].lines().next().unwrap_or("");
            // `key = value` on the offending line names the key.
            match line.split_once('=') {
                Some((k, _)) if !k.trim().is_empty() && !k.contains(['{', '[', '"']) => {
                    k.trim().to_string()
                }
                _ => format!("line {line_no}"),
            }
        }
        None => "-".to_string(),
    };
    (key, msg)
}

fn opt_value(v: &toml::Value) -> Result<OptValue, String> {
    match v {
        toml::Value::String(s) => Ok(OptValue::Str(s.clone())),
        toml::Value::Boolean(b) => Ok(OptValue::Bool(*b)),
        toml::Value::Integer(i) => Ok(OptValue::Int(*i)),
        other => Err(format!(
            "expected a string, boolean or integer, got {}",
            other.type_str()
        )),
    }
}

/// The catalog id of a mutant name (None for seeded mistakes without a catalog entry).
pub fn catalog_bug(name: &str) -> Option<&'static str> {
    MUTANT_NAMES
        .iter()
        .find(|(n, _)| *n == name)
        .and_then(|(_, b)| if b.is_empty() { None } else { Some(*b) })
}

impl Scenario {
    /// Read and validate a scenario file.
    pub fn load(path: &Path) -> Result<Scenario, CheckError> {
        Scenario::load_with(path, &[])
    }

    /// Read a scenario file, apply `--set KEY=VALUE` overrides ([`crate::scale`]), validate.
    pub fn load_with(path: &Path, sets: &[String]) -> Result<Scenario, CheckError> {
        let file_name = path.display().to_string();
        let err = |key: &str, reason: String| CheckError::new(&file_name, key, reason);
        let mut src = std::fs::read_to_string(path).map_err(|e| err("-", e.to_string()))?;
        let mut set_notes = Vec::new();
        if !sets.is_empty() {
            let mut doc: toml::Table = toml::from_str(&src).map_err(|e| {
                let (k, m) = toml_error_key(&e, &src);
                err(&k, m)
            })?;
            set_notes = crate::scale::apply(&file_name, &mut doc, sets)?;
            // Validated as if written so: errors name the key as for the file itself.
            src = toml::to_string(&doc).map_err(|e| err("-", e.to_string()))?;
        }
        let file: ScenarioFile = toml::from_str(&src).map_err(|e| {
            let (k, m) = toml_error_key(&e, &src);
            err(&k, m)
        })?;
        let name = file.name.clone().unwrap_or_else(|| {
            path.file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default()
        });
        if file.cpus == 0 || file.cpus > 64 {
            return Err(err(
                "cpus",
                format!("must be between 1 and 64 (got {})", file.cpus),
            ));
        }
        let mut options = Options::default();
        for (k, v) in &file.options {
            if k == "mutant" {
                return Err(err(
                    "options.mutant",
                    "mutants are listed in [[mutants]] and selected with --mutant".into(),
                ));
            }
            let v = opt_value(v).map_err(|r| err(&format!("options.{k}"), r))?;
            options
                .set(k, &v)
                .map_err(|r| err(&format!("options.{k}"), r))?;
        }
        let mut mm_names: Vec<&str> = Vec::new();
        for (i, mm) in file.mms.iter().enumerate() {
            if mm.name == "init_mm"
                || mm.name == "poking_mm"
                || mm.name == "efi_mm"
                || mm_names.contains(&mm.name.as_str())
            {
                return Err(err(
                    &format!("mms[{i}].name"),
                    format!("duplicate or reserved mm name '{}'", mm.name),
                ));
            }
            mm_names.push(&mm.name);
            for (j, v) in mm.vmas.iter().enumerate() {
                let key = format!("mms[{i}].vmas[{j}]");
                if !file.files.iter().any(|f| f.name == v.file) {
                    return Err(err(
                        &format!("{key}.file"),
                        format!("no file named '{}' in [[files]]", v.file),
                    ));
                }
                if v.npages == 0
                    || v.npages > 512
                    || v.start / 512 != (v.start + v.npages - 1) / 512
                {
                    return Err(err(
                        &format!("{key}.npages"),
                        "a VMA has 1 to 512 pages within one 512-page page table".into(),
                    ));
                }
                let overlaps =
                    |a: &VmaSpec| a.start < v.start + v.npages && v.start < a.start + a.npages;
                if mm.vmas[..j].iter().any(overlaps)
                    || mm
                        .map
                        .iter()
                        .any(|r| r.start < v.start + v.npages && v.start < r.start + r.npages)
                {
                    return Err(err(
                        &key,
                        "overlaps another VMA or a mapped anonymous range of the mm".into(),
                    ));
                }
            }
            for (j, r) in mm.map.iter().enumerate() {
                if r.npages == 0 || r.npages > 4096 {
                    return Err(err(
                        &format!("mms[{i}].map[{j}].npages"),
                        "must be between 1 and 4096".into(),
                    ));
                }
            }
        }
        let dax_files: usize = file.mms.iter().map(|m| m.dax.len()).sum();
        let mut file_names: Vec<&str> = Vec::new();
        for (i, f) in file.files.iter().enumerate() {
            if file_names.contains(&f.name.as_str()) {
                return Err(err(
                    &format!("files[{i}].name"),
                    format!("duplicate file name '{}'", f.name),
                ));
            }
            if f.npages == 0 || f.npages > 512 {
                return Err(err(
                    &format!("files[{i}].npages"),
                    "must be between 1 and 512".into(),
                ));
            }
            file_names.push(&f.name);
        }
        let device = |n: &str| file.files.iter().find(|f| f.name == n).map(|f| f.device);
        // A range moved or migrated lies in one page-table page (`mremap.rs`,
        // `migrate_device.rs`).
        let one_table = |start: u64, npages: u64| start / 512 == (start + npages - 1) / 512;
        let mut task_names: Vec<&str> = Vec::new();
        for (i, t) in file.tasks.iter().enumerate() {
            if t.cpu >= file.cpus {
                return Err(err(
                    &format!("tasks[{i}].cpu"),
                    format!("cpu{} does not exist (cpus = {})", t.cpu, file.cpus),
                ));
            }
            if let Some(mm) = &t.mm {
                if !mm_names.contains(&mm.as_str()) {
                    return Err(err(
                        &format!("tasks[{i}].mm"),
                        format!("no mm named '{mm}' in [[mms]]"),
                    ));
                }
            }
            if task_names.contains(&t.name.as_str()) || t.name.starts_with("swapper/") {
                return Err(err(
                    &format!("tasks[{i}].name"),
                    format!("duplicate or reserved task name '{}'", t.name),
                ));
            }
            task_names.push(&t.name);
            // A kernel thread's uaccess is bracketed by use_mm / unuse_mm (in program order).
            let mut using = false;
            for (j, op) in t.program.iter().enumerate() {
                let kthread = t.mm.is_none();
                let bad = match op {
                    OpSpec::UseMm { .. } | OpSpec::UnuseMm if !kthread => {
                        Some("use_mm and unuse_mm are kernel threads' (tasks without mm)".into())
                    }
                    OpSpec::UseMm { mm } if !mm_names.contains(&mm.as_str()) => {
                        Some(format!("no mm named '{mm}' in [[mms]]"))
                    }
                    OpSpec::UseMm { .. } if using => {
                        Some("use_mm while an mm is in use (unuse_mm it first)".into())
                    }
                    OpSpec::UnuseMm if !using => Some("unuse_mm without a use_mm before it".into()),
                    OpSpec::Exec { .. } if kthread => {
                        Some("a kernel thread does not execute user code (exec)".into())
                    }
                    OpSpec::Touch { .. } if kthread && !using => Some(
                        "a kernel thread touches user memory only between use_mm and unuse_mm"
                            .into(),
                    ),
                    OpSpec::UseMm { .. } | OpSpec::UnuseMm | OpSpec::Touch { .. } if kthread => {
                        using = matches!(op, OpSpec::UseMm { .. }) || (using && !matches!(op, OpSpec::UnuseMm));
                        None
                    }
                    OpSpec::SetAffinity { cpu } if *cpu >= file.cpus => {
                        Some(format!("cpu{cpu} does not exist"))
                    }
                    OpSpec::Loop { to, .. } if *to as usize >= t.program.len() => {
                        Some(format!("loop target {to} is past the end of the program"))
                    }
                    OpSpec::TouchRandomBlock { npages: 0, .. }
                    | OpSpec::TouchRange { npages: 0, .. }
                    | OpSpec::AnonFaults { npages: 0 }
                    | OpSpec::FreePages { npages: 0 } => Some("npages must be >= 1".into()),
                    OpSpec::Fdatasync { file } if *file as usize >= dax_files => Some(format!(
                        "fdatasync of file {file}, but the mms map {dax_files} DAX file(s) (mms.dax)"
                    )),
                    OpSpec::Collapse { .. } if t.mm.is_some() => {
                        Some("collapse is khugepaged's: only a kernel thread (a task without mm) runs it".into())
                    }
                    OpSpec::Collapse { mm, .. } if !mm_names.contains(&mm.as_str()) => {
                        Some(format!("no mm named '{mm}' in [[mms]]"))
                    }
                    OpSpec::ReclaimUnmap { mm: Some(_), .. } if t.mm.is_some() => {
                        Some("reclaim_unmap with mm is kswapd's: only a kernel thread (a task without mm) runs it; a task reclaims its own mm without one".into())
                    }
                    OpSpec::ReclaimUnmap { mm: Some(mm), .. } if !mm_names.contains(&mm.as_str()) => {
                        Some(format!("no mm named '{mm}' in [[mms]]"))
                    }
                    OpSpec::ReclaimUnmap { mm: None, .. } if t.mm.is_none() => {
                        Some("a kernel thread's reclaim_unmap names the mm it reclaims from (mm = ...)".into())
                    }
                    OpSpec::Collapse { start, .. } if start % 512 != 0 => Some(format!(
                        "collapse start {start:#x} is not the first page of a 512-page group"
                    )),
                    OpSpec::KernelTouch { .. } | OpSpec::VunmapRange { .. } | OpSpec::TextPoke { .. }
                        if file.kernel.is_none() =>
                    {
                        Some("kernel_touch, vunmap_range and text_poke need [kernel] vmalloc pages".into())
                    }
                    OpSpec::VunmapRange { npages: 0, .. } => Some("npages must be >= 1".into()),
                    OpSpec::Truncate { file: f, .. } | OpSpec::RevokeMapping { file: f }
                        if device(f).is_none() =>
                    {
                        Some(format!("no file named '{f}' in [[files]]"))
                    }
                    OpSpec::Truncate { file: f, .. } if device(f) == Some(true) => {
                        Some(format!("'{f}' is a device file: a driver revokes its mappings (revoke_mapping), nothing truncates it"))
                    }
                    OpSpec::RevokeMapping { file: f } if device(f) == Some(false) => {
                        Some(format!("'{f}' is a regular file: revoke_mapping is a device driver's (truncate it instead)"))
                    }
                    OpSpec::Mremap { npages, start, new_start } if *npages == 0 || !one_table(*start, *npages) || !one_table(*new_start, *npages) => {
                        Some("mremap moves 1 or more pages within one 512-page page table at each end".into())
                    }
                    OpSpec::Mremap { npages, start, new_start } if start.abs_diff(*new_start) < *npages => {
                        Some("the old and new ranges of an mremap overlap".into())
                    }
                    OpSpec::Mremap { start, npages, new_start } => {
                        mremap_ranges(&file, t.mm.as_deref(), *start, *npages, *new_start)
                    }
                    OpSpec::MigrateVma { npages, start } if *npages == 0 || !one_table(*start, *npages) => {
                        Some("migrate_vma takes 1 or more pages within one 512-page page table".into())
                    }
                    OpSpec::Collapse { .. }
                    | OpSpec::ReclaimUnmap { mm: Some(_), .. }
                    | OpSpec::KernelTouch { .. }
                    | OpSpec::VunmapRange { .. }
                    | OpSpec::TextPoke { .. }
                    | OpSpec::EfiCall
                    | OpSpec::Compute { .. }
                    | OpSpec::Loop { .. }
                    | OpSpec::Exit => None,
                    _ if t.mm.is_none() => Some(
                        "a kernel thread (a task without mm) runs only collapse, reclaim_unmap (with mm), use_mm, touch, unuse_mm, kernel_touch, vunmap_range, text_poke, efi_call, compute, loop and exit".into(),
                    ),
                    _ => None,
                };
                if let Some(r) = bad {
                    return Err(err(&format!("tasks[{i}].program[{j}]"), r));
                }
            }
        }
        for (i, s) in file.setup.iter().enumerate() {
            if s.cpu >= file.cpus {
                return Err(err(
                    &format!("setup[{i}].cpu"),
                    format!("cpu{} does not exist", s.cpu),
                ));
            }
            match (&s.steps, &s.until) {
                (Some(_), None) => {}
                (None, Some(u)) => {
                    let ok = u == "idle"
                        || u.strip_prefix("user:").is_some_and(|t| {
                            let (name, pc) = t.split_once('@').unwrap_or((t, "0"));
                            task_names.contains(&name) && pc.parse::<u16>().is_ok()
                        });
                    if !ok {
                        return Err(err(
                            &format!("setup[{i}].until"),
                            format!("expected \"idle\", \"user:TASK\" or \"user:TASK@N\" with a task of [[tasks]], got '{u}'"),
                        ));
                    }
                }
                _ => {
                    return Err(err(
                        &format!("setup[{i}]"),
                        "give exactly one of `steps` or `until`".into(),
                    ))
                }
            }
        }
        if let Some(h) = &file.host {
            for &c in h.preemptible.iter().flatten() {
                if c >= file.cpus {
                    return Err(err(
                        "host.preemptible",
                        format!("vcpu{c} does not exist (cpus = {})", file.cpus),
                    ));
                }
            }
        }
        if let Some(k) = &file.kvm {
            if !file.symmetric.is_empty() {
                return Err(err(
                    "symmetric",
                    "symmetry reduction does not rename KVM MMU state: not available with [kvm]"
                        .into(),
                ));
            }
            if let Some(b) = k.host_phys_bits {
                if !(22..=46).contains(&b) {
                    return Err(err(
                        "kvm.host_phys_bits",
                        format!("must be between 22 and 46 (got {b})"),
                    ));
                }
            }
            if let Some(mt) = &k.mtrrs {
                mtrr_state(mt).map_err(|(key, r)| err(&format!("kvm.mtrrs.{key}"), r))?;
            }
            check_memslots("kvm.memslots", &k.memslots).map_err(|(key, r)| err(&key, r))?;
            if let Some(slots) = &k.smm_memslots {
                if !k.smm {
                    return Err(err(
                        "kvm.smm_memslots",
                        "SMM's memslots need smm = true".into(),
                    ));
                }
                check_memslots("kvm.smm_memslots", slots).map_err(|(key, r)| err(&key, r))?;
            }
            if let Some(v) = (file.cpus..64).find(|&v| options.alloc_fail.vcpus & (1 << v) != 0) {
                return Err(err(
                    "options.alloc_fail",
                    format!("vcpu{v} does not exist (cpus = {})", file.cpus),
                ));
            }
            if options.zap_gfn_range_lock == ZapLock::Read && options.tdp_zap != TdpZap::Mainline {
                // Patch 12 was written against v6.5's leaf-only walk; the older whole-table
                // forms never ran under the read lock.
                return Err(err(
                    "options.tdp_zap",
                    "zap_gfn_range_lock = \"read\" (seed 004's patch 12) needs tdp_zap = \"mainline\"".into(),
                ));
            }
            if options.dirty_log_initially_set && !options.manual_dirty_log_protect {
                // KVM_ENABLE_CAP(KVM_CAP_MANUAL_DIRTY_LOG_PROTECT2) carries the flag.
                return Err(err(
                    "options.dirty_log_initially_set",
                    "dirty_log_initially_set = true needs options.manual_dirty_log_protect = true (it is a flag of that capability)".into(),
                ));
            }
            if !options.ept {
                // Shadow paging is modelled for guest faults, PTE changes and flushes, and MMU
                // notifiers; the memslot and dirty-log ioctls, the TDP MMU, PML and SMM are
                // not (yet) written for shadow pages.
                let reject = if options.tdp_mmu {
                    Some(("options.tdp_mmu", "the TDP MMU needs EPT (tdp_enabled)"))
                } else if options.kvm != KvmVersion::Mainline {
                    Some((
                        "options.kvm",
                        "shadow paging is modelled in its v5.15 form (kvm = \"mainline\")",
                    ))
                } else if options.hv_tlb_flush != HvTlbFlush::Off {
                    Some((
                        "options.hv_tlb_flush",
                        "Hyper-V's flush hypercalls are not modelled with shadow paging yet",
                    ))
                } else if options.shoot4u {
                    Some((
                        "options.shoot4u",
                        "Shoot4U is not modelled with shadow paging",
                    ))
                } else if file.features.invlpgb {
                    Some((
                        "features.invlpgb",
                        "INVLPGB is AMD's; shadow paging here is VMX's",
                    ))
                } else if options.pml {
                    Some(("options.pml", "PML needs EPT"))
                } else if k.threads.iter().any(|t| {
                    t.program.iter().any(|op| {
                        !matches!(op, HostOpSpec::InvalidateGfns { .. } | HostOpSpec::Exit)
                    })
                }) {
                    Some((
                        "kvm.threads",
                        "with shadow paging a host thread may only run invalidate_gfns (MMU notifiers); memslot and dirty-log ioctls are not modelled for shadow pages yet",
                    ))
                } else if !k.prefault.is_empty() {
                    Some((
                        "kvm.prefault",
                        "prefaulting fills EPT; with shadow paging the guest faults its pages in",
                    ))
                } else if k.smm {
                    Some((
                        "kvm.smm",
                        "SMM's address space is not modelled with shadow paging yet",
                    ))
                } else {
                    None
                };
                if let Some((key, why)) = reject {
                    return Err(err(key, format!("{why} (options.ept = false)")));
                }
            }
            if options.pml && !options.ept_ad {
                // vmx: enable_pml is cleared when EPT A/D bits are off (PML logs the writes
                // that set D).
                return Err(err(
                    "options.pml",
                    "pml = true needs options.ept_ad = true (PML logs the writes that set EPT D bits)".into(),
                ));
            }
            for (i, t) in k.threads.iter().enumerate() {
                for (j, op) in t.program.iter().enumerate() {
                    if matches!(op, HostOpSpec::ClearDirtyLog { .. })
                        && !options.manual_dirty_log_protect
                    {
                        return Err(err(
                            &format!("kvm.threads[{i}].program[{j}]"),
                            "clear_dirty_log needs options.manual_dirty_log_protect = true (KVM returns -EINVAL)".into(),
                        ));
                    }
                    if let HostOpSpec::GetDirtyLog { as_id, id }
                    | HostOpSpec::ClearDirtyLog { as_id, id } = op
                    {
                        let slots = match as_id {
                            0 => Some(&k.memslots),
                            _ => k.smm_memslots.as_ref().or(Some(&k.memslots)),
                        };
                        let enabled_before = t.program[..j].iter().any(|o| {
                            matches!(o, HostOpSpec::EnableDirtyLog { as_id: a, id: i } if a == as_id && i == id)
                        });
                        let logs = enabled_before
                            || slots
                                .is_some_and(|s| s.iter().any(|sl| sl.id == *id && sl.dirty_log));
                        if !logs {
                            return Err(err(
                                &format!("kvm.threads[{i}].program[{j}].id"),
                                format!("memslot {id} does not log dirty pages (give it dirty_log = true)"),
                            ));
                        }
                    }
                    if let HostOpSpec::MemslotCreate { as_id, .. }
                    | HostOpSpec::MemslotDelete { as_id, .. }
                    | HostOpSpec::GetDirtyLog { as_id, .. }
                    | HostOpSpec::ClearDirtyLog { as_id, .. }
                    | HostOpSpec::EnableDirtyLog { as_id, .. } = op
                    {
                        if *as_id > 1 || (*as_id == 1 && !k.smm) {
                            return Err(err(
                                &format!("kvm.threads[{i}].program[{j}].as_id"),
                                format!("address space {as_id} does not exist (0, or 1 with smm = true)"),
                            ));
                        }
                    }
                    if matches!(op, HostOpSpec::MemslotDelete { .. }) && options.tdp_mmu {
                        // kvm_arch_flush_shadow_memslot() zaps the TDP MMU's roots
                        // (kvm_tdp_mmu_zap_leafs / invalidating the roots); the model's slot zap
                        // walks the legacy MMU's pages only. Refused rather than checked in a form
                        // that misses the TDP roots' SPTEs (#41).
                        return Err(err(
                            &format!("kvm.threads[{i}].program[{j}]"),
                            "memslot_delete with tdp_mmu = true is not modelled: the TDP MMU's kvm_arch_flush_shadow_memslot is missing".into(),
                        ));
                    }
                    if let HostOpSpec::MemslotCreate { base, npages, .. } = op {
                        if let Some((k, why)) = bad_slot(*base, *npages) {
                            return Err(err(
                                &format!("kvm.threads[{i}].program[{j}].memslot_create.{k}"),
                                why,
                            ));
                        }
                    }
                    if let HostOpSpec::Loop { to, .. } = op {
                        if *to as usize >= t.program.len() {
                            return Err(err(
                                &format!("kvm.threads[{i}].program[{j}]"),
                                format!("loop target {to} is past the end of the program"),
                            ));
                        }
                    }
                }
            }
        }
        let smm_users = tasks_running(&file, |op| matches!(op, OpSpec::Smi | OpSpec::Rsm));
        if smm_users > 0 && !file.kvm.as_ref().is_some_and(|k| k.smm) {
            return Err(err(
                "tasks",
                "smi and rsm need SMM's address space: [kvm] smm = true".into(),
            ));
        }
        let pokers = tasks_running(&file, is_text_poke);
        let efi_callers = tasks_running(&file, is_efi_call);
        if efi_callers > 1 {
            return Err(err(
                "tasks",
                format!("{efi_callers} tasks run efi_call: runtime calls serialize on efi_runtime_lock, which is not modelled; give the calls to one task"),
            ));
        }
        if pokers > 1 {
            return Err(err(
                "tasks",
                format!("{pokers} tasks run text_poke: its callers serialize on text_mutex, which is not modelled; give the pokes to one task"),
            ));
        }
        if file.kernel.is_some() && file.features.pti {
            return Err(err(
                "kernel",
                "kernel mappings under PTI (non-Global, invalidate_other) are not modelled: set features.pti = false".into(),
            ));
        }
        let mut nmi_cpus: Vec<usize> = Vec::new();
        for (i, n) in file.nmi.iter().enumerate() {
            if n.cpu >= file.cpus || nmi_cpus.contains(&n.cpu) {
                return Err(err(
                    &format!("nmi[{i}].cpu"),
                    format!("cpu{} does not exist or has NMIs already", n.cpu),
                ));
            }
            nmi_cpus.push(n.cpu);
            if !(1..=8).contains(&n.count) {
                return Err(err(
                    &format!("nmi[{i}].count"),
                    format!("must be between 1 and 8 (got {})", n.count),
                ));
            }
        }
        let mut seen = vec![false; file.cpus];
        for (i, g) in file.symmetric.iter().enumerate() {
            if g.len() < 2 {
                return Err(err(
                    &format!("symmetric[{i}]"),
                    "a group needs at least 2 CPUs".into(),
                ));
            }
            for &c in g {
                if c >= file.cpus || seen[c] {
                    return Err(err(
                        &format!("symmetric[{i}]"),
                        format!("cpu{c} does not exist or is in two groups"),
                    ));
                }
                seen[c] = true;
            }
            // Interchangeable CPUs run the same programs in the same mms.
            let progs = |c: usize| -> Vec<String> {
                file.tasks
                    .iter()
                    .filter(|t| t.cpu == c)
                    .map(|t| format!("{:?}{:?}", t.mm, t.program))
                    .chain(
                        file.nmi
                            .iter()
                            .filter(|n| n.cpu == c)
                            .map(|n| format!("nmi {} {}", n.count, n.vpn)),
                    )
                    .collect()
            };
            let first = progs(g[0]);
            if g.iter().any(|&c| progs(c) != first) {
                return Err(err(
                    &format!("symmetric[{i}]"),
                    "CPUs of a group must run tasks with identical programs and mms, and take the same NMIs".into(),
                ));
            }
        }
        for (i, m) in file.mutants.iter().enumerate() {
            let Some(&(_, bug)) = MUTANT_NAMES.iter().find(|(n, _)| *n == m.name) else {
                let names: Vec<_> = MUTANT_NAMES.iter().map(|m| m.0).collect();
                return Err(err(
                    &format!("mutants[{i}].name"),
                    format!("unknown mutant '{}' (known: {})", m.name, names.join(", ")),
                ));
            };
            let given = m.bug.as_deref().unwrap_or("");
            if given != bug {
                return Err(err(
                    &format!("mutants[{i}].bug"),
                    format!(
                        "mutant '{}' re-creates catalog bug {}",
                        m.name,
                        if bug.is_empty() {
                            "none (omit `bug`)"
                        } else {
                            bug
                        }
                    ),
                ));
            }
            if let Some(mm) = &m.memory_model {
                if parse_memory_model(mm).is_none() {
                    return Err(err(
                        &format!("mutants[{i}].memory_model"),
                        format!("expected sc or tso, got '{mm}'"),
                    ));
                }
            }
        }
        Ok(Scenario {
            path: path.to_path_buf(),
            name,
            file,
            options,
            set_notes,
        })
    }

    fn err(&self, key: &str, reason: String) -> CheckError {
        CheckError::new(&self.path.display().to_string(), key, reason)
    }

    /// CPU symmetry groups declared by the file.
    pub fn symmetric_groups(&self) -> &[Vec<usize>] {
        &self.file.symmetric
    }

    /// Tasks (model task ids) of each CPU, in file order; idle tasks are 0..cpus.
    pub fn tasks_of_cpu(&self) -> Vec<Vec<u32>> {
        let n = self.file.cpus;
        let mut v = vec![Vec::new(); n];
        for (i, t) in self.file.tasks.iter().enumerate() {
            v[t.cpu].push((n + i) as u32);
        }
        v
    }

    /// Build the initial machine with `mutant` enabled (if any), then run the setup steps.
    pub fn build(&self, mutant: Option<&str>, mem: MemoryModel) -> Result<Machine, CheckError> {
        self.build_inner(mutant, mem, None)
    }

    /// [`Scenario::build`], also returning the setup steps it ran (actor, text), which run with
    /// the mutant on: a counterexample prints them before its own steps.
    pub fn build_traced(
        &self,
        mutant: Option<&str>,
        mem: MemoryModel,
    ) -> Result<(Machine, Vec<(String, String)>), CheckError> {
        let mut steps = Vec::new();
        let m = self.build_inner(mutant, mem, Some(&mut steps))?;
        Ok((m, steps))
    }

    fn build_inner(
        &self,
        mutant: Option<&str>,
        mem: MemoryModel,
        mut trace: Option<&mut Vec<(String, String)>>,
    ) -> Result<Machine, CheckError> {
        let f = &self.file;
        let mut opts = self.options.clone();
        if let Some(m) = mutant {
            opts.set("mutant", &OptValue::Str(m.to_string()))
                .map_err(|r| self.err("mutant", r))?;
        }
        let topo = Topology::new(1, f.cpus, 1).map_err(|(k, r)| self.err(k, r))?;
        let features = Features {
            pcid: f.features.pcid,
            invpcid: f.features.invpcid,
            pti: f.features.pti,
            tlb_entries: f.features.tlb_entries.max(1),
            psc_entries: f.features.psc_entries.max(1),
            mlp: 1,
            smt_slowdown_permille: 1000,
            invlpg_miss_global: f.features.invlpg_miss_global,
            invlpgb: f.features.invlpgb,
            invlpgb_count_max: f.features.invlpgb_count_max.max(1),
        };
        let profile = Arc::new(CostProfile::uniform("checker", 1.0, features));
        let host = match (&f.host, &f.kvm) {
            (Some(h), _) => Some(h.clone()),
            // A VM with a modelled MMU needs a host; by default it never preempts.
            (None, Some(_)) => Some(HostSpec {
                preemptible: Some(Vec::new()),
                ioctl_puts: false,
                max_preemptions: 0,
                ple: false,
            }),
            (None, None) => None,
        };
        let mut m = match &host {
            None => Machine::new(topo, profile, opts, mem),
            Some(h) => {
                let cfg = HostConfig {
                    vms: 1,
                    vcpus_per_vm: f.cpus,
                    preemptible: {
                        // A set, kept sorted: symmetry compares renamed copies of it.
                        let mut p = h
                            .preemptible
                            .clone()
                            .unwrap_or_else(|| (0..f.cpus).collect());
                        p.sort_unstable();
                        p.dedup();
                        p
                    },
                    ioctl_puts: h.ioctl_puts,
                    max_preemptions: h.max_preemptions,
                    ple_gap: if h.ple {
                        HostConfig::default().ple_gap
                    } else {
                        0
                    },
                    ..HostConfig::default()
                };
                cfg.validate(f.cpus)
                    .map_err(|(k, r)| self.err(&format!("host.{k}"), r))?;
                Machine::with_host(topo, profile, opts, mem, cfg)
            }
        };
        if let Some(k) = &f.kvm {
            let slot = |s: &MemslotSpec, pfn: u64| Memslot {
                id: s.id,
                base_gfn: s.base,
                npages: s.npages,
                readonly: s.readonly,
                invalid: false,
                huge: s.huge,
                pfn,
                dirty_log: s.dirty_log,
            };
            let slots: Vec<Memslot> = k
                .memslots
                .iter()
                .map(|s| slot(s, slot_pfn(s.base)))
                .collect();
            m.enable_kvm_mmu(0, slots.clone());
            if k.smm {
                let smm_slots = match &k.smm_memslots {
                    None => slots,
                    Some(list) => list
                        .iter()
                        .map(|s| {
                            let alias = k
                                .memslots
                                .iter()
                                .any(|n| (n.base, n.npages) == (s.base, s.npages));
                            let pfn = if alias {
                                slot_pfn(s.base)
                            } else {
                                smram_pfn(s.base)
                            };
                            slot(s, pfn)
                        })
                        .collect(),
                };
                m.enable_smm(0, smm_slots);
            }
            let mtrrs = match &k.mtrrs {
                Some(mt) => mtrr_state(mt).expect("checked at load"),
                None => MtrrState::default(),
            };
            m.set_guest_memtypes(0, k.noncoherent_dma, mtrrs, k.cr0_cd);
            if let Some(b) = k.host_phys_bits {
                m.set_tdp_max_gfn(0, 1 << (b - 12));
            }
            if let Some(g) = k.steal_time_gfn {
                m.set_steal_time_gfns(0, g);
            }
            if k.smm && m.opts.tdp_mmu {
                m.add_tdp_root(0, 1);
            }
            for r in &k.prefault {
                m.prefault_ept(0, r.start, r.npages);
            }
            for (i, t) in k.threads.iter().enumerate() {
                let prog = t.program.iter().map(HostOpSpec::to_host_op).collect();
                m.add_host_thread(&t.name, 0, i % f.cpus, prog);
            }
        }
        if let Some(k) = &f.kernel {
            for r in &k.vmalloc {
                m.map_pages(INIT_MM, VMALLOC_START_VPN + r.start, r.npages, r.writable);
            }
        }
        let mut file_ids: BTreeMap<&str, u32> = BTreeMap::new();
        for fl in &f.files {
            file_ids.insert(&fl.name, m.add_file(&fl.name, fl.npages, fl.device));
        }
        let mut mm_ids: BTreeMap<&str, MmId> = BTreeMap::new();
        for mm in &f.mms {
            let id = m.add_mm(&mm.name);
            mm_ids.insert(&mm.name, id);
            for r in &mm.map {
                m.map_pages(id, r.start, r.npages, r.writable);
            }
            for &v in &mm.speculative {
                m.spec_pages.push((id, v));
            }
            for d in &mm.dax {
                m.map_pages(id, d.start, d.npages, false);
                m.add_dax_file(id, d.start, d.npages);
            }
            for v in &mm.vmas {
                let fid = file_ids[v.file.as_str()];
                m.map_file(id, v.start, v.npages, fid, v.pgoff, v.populate);
            }
        }
        if tasks_running(f, is_text_poke) > 0 {
            mm_ids.insert("poking_mm", m.add_poking_mm());
        }
        if tasks_running(f, is_efi_call) > 0 {
            mm_ids.insert("efi_mm", m.add_efi_mm());
        }
        for t in &f.tasks {
            let prog = t
                .program
                .iter()
                .map(|op| op.to_user_op(&mm_ids, &file_ids))
                .collect();
            match &t.mm {
                Some(mm) => m.add_task(&t.name, mm_ids[mm.as_str()], t.cpu, prog),
                None => m.add_kthread(&t.name, t.cpu, prog),
            };
        }
        for n in &f.nmi {
            m.add_nmi_source(n.cpu, n.count as u8, n.vpn);
        }
        for (i, s) in f.setup.iter().enumerate() {
            self.run_setup(&mut m, i, s, trace.as_deref_mut())?;
        }
        // Start exploring with every store buffer empty.
        let mut drained = 0;
        for cpu in 0..f.cpus {
            while !m.cpus[cpu].sb.is_empty() && drained < 10_000 {
                m.apply(Action::Drain(cpu as u32), &mut NullEnv);
                drained += 1;
            }
        }
        Ok(m)
    }

    fn run_setup(
        &self,
        m: &mut Machine,
        i: usize,
        s: &SetupSpec,
        mut trace: Option<&mut Vec<(String, String)>>,
    ) -> Result<(), CheckError> {
        let key = format!("setup[{i}]");
        let cpu = s.cpu;
        let done = |m: &Machine, n: u64| -> bool {
            if let Some(k) = s.steps {
                return n >= k;
            }
            let c = &m.cpus[cpu];
            let quiet = c.irq_stack.is_empty()
                && m.tasks[c.curr as usize].stack.is_empty()
                && !m.in_host_code(cpu);
            match s.until.as_deref() {
                Some("idle") => quiet && c.curr == c.idle_task && c.runqueue.is_empty(),
                Some(u) => {
                    let want = u.strip_prefix("user:").unwrap_or(u);
                    let (name, pc) = match want.split_once('@') {
                        Some((n, pc)) => (n, pc.parse::<u16>().ok()),
                        None => (want, None),
                    };
                    let t = &m.tasks[c.curr as usize];
                    quiet && t.name == name && pc.map_or(true, |p| t.pc == p)
                }
                None => true,
            }
        };
        let mut n = 0u64;
        while !done(m, n) {
            if n >= 100_000 {
                return Err(self.err(&key, "did not finish within 100000 steps".into()));
            }
            let mut en = Vec::new();
            m.enabled(&mut en);
            let a = if en.contains(&Action::Interrupt(cpu as u32)) {
                Action::Interrupt(cpu as u32)
            } else if en.contains(&Action::Step(cpu as u32)) {
                Action::Step(cpu as u32)
            } else {
                return Err(self.err(
                    &key,
                    format!("cpu{cpu} cannot step (blocked) after {n} setup steps"),
                ));
            };
            if let Some(t) = trace.as_deref_mut() {
                t.push((
                    m.agent_name(shootdown_engine::Model::agent_of(m, a)),
                    crate::describe::step_text(m, a),
                ));
            }
            let out = m.apply(a, &mut NullEnv);
            if let Some(v) = out.violation {
                return Err(self.err(&key, format!("violation during setup: {v}")));
            }
            n += 1;
        }
        Ok(())
    }
}

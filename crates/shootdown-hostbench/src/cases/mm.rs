//! The shootdown cases: system calls on the measuring thread's own memory that make the
//! kernel flush TLBs, with sibling threads (see [`crate::siblings`]) putting the same mm on
//! other CPUs so the flush has to reach them.
//!
//! The operated memory is private anonymous and THP-off (`MADV_NOHUGEPAGE`), so every
//! re-fault maps one 4 KiB page through a PTE, as in the simulator's model.

use super::Workload;
use crate::mem::{touch_pages, Mapping, ThpDisabled, PAGE};
use crate::siblings::Siblings;
use crate::sys::{last_errno, syscall_error};
use crate::{CaseSpec, HostError};

const RW: libc::c_int = libc::PROT_READ | libc::PROT_WRITE;

/// `pages` pre-touched operated pages, plus the siblings.
struct Operated {
    map: Mapping,
    pages: usize,
    siblings: Siblings,
}

impl Operated {
    fn new(spec: &CaseSpec, sibling_cpus: &[usize]) -> Result<Self, HostError> {
        let pages = usize::try_from(spec.pages)
            .map_err(|_| HostError::BadSpec(format!("pages = {} too large", spec.pages)))?;
        let map = Mapping::anon(pages * PAGE, RW)?;
        // SAFETY: our own fresh read-write mapping of `pages` pages.
        unsafe { touch_pages(map.addr(), pages) };
        let siblings = Siblings::start(sibling_cpus, spec.sibling_mode)?;
        Ok(Operated {
            map,
            pages,
            siblings,
        })
    }

    fn ptr(&self) -> *mut libc::c_void {
        self.map.addr() as *mut libc::c_void
    }
}

/// `madvise(MADV_DONTNEED)` over the pages, then write each (see [`crate::Op::Madvise`]).
///
/// Kernel path: `madvise_dontneed_single_vma` → `zap_page_range_single` → `unmap_page_range`
/// (PTEs cleared, pages queued in the mmu_gather) → `tlb_finish_mmu` → `flush_tlb_mm_range`:
/// local INVLPG per page (full flush past 33 pages) and, if another CPU of `mm_cpumask` is
/// not lazy, `flush_tlb_multi` → IPI + wait. Then one anonymous fault per page
/// (`do_anonymous_page`, a zeroed page; no flush: the PTE was empty).
pub(crate) struct Madvise(Operated);

impl Madvise {
    pub(crate) fn new(spec: &CaseSpec, sibling_cpus: &[usize]) -> Result<Self, HostError> {
        Operated::new(spec, sibling_cpus).map(Madvise)
    }
}

impl Workload for Madvise {
    fn siblings(&self) -> Option<&Siblings> {
        Some(&self.0.siblings)
    }

    fn run(&mut self, iters: u64) -> Result<(), HostError> {
        let o = &self.0;
        for _ in 0..iters {
            // SAFETY: advice over our own mapping; its pages refault as zero pages.
            if unsafe { libc::madvise(o.ptr(), o.map.len(), libc::MADV_DONTNEED) } != 0 {
                return Err(syscall_error("madvise(MADV_DONTNEED)", "unexpected"));
            }
            // SAFETY: our own read-write mapping of `pages` pages.
            unsafe { touch_pages(o.map.addr(), o.pages) };
        }
        Ok(())
    }
}

/// `mprotect(PROT_READ)`, `mprotect(PROT_READ|PROT_WRITE)`, then write each page (see
/// [`crate::Op::Mprotect`]).
///
/// Kernel path: `do_mprotect_pkey` → `mprotect_fixup` → `change_protection` →
/// `change_pte_range`, which queues a flush (`tlb_flush_pte_range`) for every PTE whose
/// change x86's `pte_needs_flush` flags; a `_PAGE_RW` change counts in either direction, so
/// both calls end in `tlb_finish_mmu` → `flush_tlb_mm_range` → IPIs to the non-lazy CPUs of
/// the mm: about two shootdowns per iteration. Exclusive anonymous pages are made writable
/// again directly (`can_change_pte_writable`), so the writes rarely fault.
pub(crate) struct Mprotect(Operated);

impl Mprotect {
    pub(crate) fn new(spec: &CaseSpec, sibling_cpus: &[usize]) -> Result<Self, HostError> {
        Operated::new(spec, sibling_cpus).map(Mprotect)
    }
}

impl Workload for Mprotect {
    fn siblings(&self) -> Option<&Siblings> {
        Some(&self.0.siblings)
    }

    fn run(&mut self, iters: u64) -> Result<(), HostError> {
        let o = &self.0;
        let len = o.map.len();
        for _ in 0..iters {
            // SAFETY: protection changes of our own mapping; nothing else uses it meanwhile.
            unsafe {
                if libc::mprotect(o.ptr(), len, libc::PROT_READ) != 0 {
                    return Err(syscall_error("mprotect(PROT_READ)", "unexpected"));
                }
                if libc::mprotect(o.ptr(), len, RW) != 0 {
                    return Err(syscall_error(
                        "mprotect(PROT_READ|PROT_WRITE)",
                        "unexpected",
                    ));
                }
                touch_pages(o.map.addr(), o.pages);
            }
        }
        Ok(())
    }
}

/// The region `munmap` maps and unmaps: one PMD's worth.
const REGION: usize = 2 << 20;

/// How many times one iteration looks for a new hole when another thread took the last one.
const HOLE_RETRIES: usize = 8;

/// mmap an isolated 2 MiB region, write its first page (or every page), munmap it (see
/// [`crate::Op::Munmap`] and [`crate::Op::Fault`]).
///
/// The region is 2 MiB-aligned and exactly 2 MiB, mapped with `MAP_FIXED_NOREPLACE` in a
/// hole found by mapping and unmapping 4 MiB: no other mapping shares its PMD entry (any
/// would make the mmap fail with EEXIST, upon which a new hole is found), so the fault
/// allocates a PTE page for it alone and `munmap` frees that page: `unmap_region` →
/// `free_pgtables` → `free_pgd_range` → `pte_free_tlb` sets `tlb->freed_tables`, and
/// `tlb_finish_mmu` → `flush_tlb_mm_range(freed_tables = true)` IPIs even CPUs that hold the
/// mm lazily (they could otherwise walk the freed table speculatively). The PMD page is
/// shared with whatever else lives in the same 1 GiB and normally stays.
///
/// One iteration = `mmap` + `pages` faults + `munmap`. THP is off for the process while the
/// case runs ([`ThpDisabled`]), so every fault maps a 4 KiB page even under THP=always.
pub(crate) struct Munmap {
    addr: usize,
    pages: usize,
    siblings: Siblings,
    _thp: ThpDisabled,
}

impl Munmap {
    pub(crate) fn new(spec: &CaseSpec, sibling_cpus: &[usize]) -> Result<Self, HostError> {
        // Siblings first: their stacks are mapped before the hole is chosen.
        let siblings = Siblings::start(sibling_cpus, spec.sibling_mode)?;
        Ok(Munmap {
            addr: find_hole()?,
            pages: 1,
            siblings,
            _thp: ThpDisabled::new()?,
        })
    }

    /// The `fault` primitive: the first `spec.pages` pages of the region written, no siblings.
    pub(crate) fn fault(spec: &CaseSpec) -> Result<Self, HostError> {
        let pages = usize::try_from(spec.pages)
            .ok()
            .filter(|p| (1..=REGION / PAGE).contains(p))
            .ok_or_else(|| {
                HostError::BadSpec(format!(
                    "pages = {} for fault: must be 1..={} (one 2 MiB region)",
                    spec.pages,
                    REGION / PAGE
                ))
            })?;
        Ok(Munmap {
            addr: find_hole()?,
            pages,
            siblings: Siblings::none(),
            _thp: ThpDisabled::new()?,
        })
    }

    fn iteration(&mut self) -> Result<(), HostError> {
        for _ in 0..HOLE_RETRIES {
            // SAFETY: MAP_FIXED_NOREPLACE never replaces an existing mapping.
            let p = unsafe {
                libc::mmap(
                    self.addr as *mut libc::c_void,
                    REGION,
                    RW,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
                    -1,
                    0,
                )
            };
            if p == libc::MAP_FAILED {
                if last_errno() == libc::EEXIST {
                    self.addr = find_hole()?;
                    continue;
                }
                return Err(syscall_error(
                    "mmap(MAP_FIXED_NOREPLACE) of 2 MiB",
                    "out of memory or address space?",
                ));
            }
            // From here the region is ours; unmap it on every path.
            let region = Mapping::adopt(p as usize, REGION);
            if region.addr() != self.addr {
                return Err(HostError::Syscall {
                    call: "mmap(MAP_FIXED_NOREPLACE)".into(),
                    errno: "flag ignored".into(),
                    hint: "the kernel predates Linux 4.17; the munmap case needs it".into(),
                });
            }
            // SAFETY: pages of our fresh read-write region.
            unsafe { touch_pages(region.addr(), self.pages) };
            return region.unmap();
        }
        Err(HostError::Syscall {
            call: "mmap(MAP_FIXED_NOREPLACE) of 2 MiB".into(),
            errno: "EEXIST".into(),
            hint: format!(
                "other threads mapped into {HOLE_RETRIES} successive free 2 MiB holes; retry on a quieter process"
            ),
        })
    }
}

impl Workload for Munmap {
    fn ops_per_iter(&self) -> u64 {
        // The fault primitive's op is one page; munmap's is one iteration (of one page).
        self.pages as u64
    }

    fn siblings(&self) -> Option<&Siblings> {
        Some(&self.siblings)
    }

    fn run(&mut self, iters: u64) -> Result<(), HostError> {
        for _ in 0..iters {
            self.iteration()?;
        }
        Ok(())
    }
}

/// A 2 MiB-aligned address with 2 MiB free after it: map 4 MiB anywhere, round up, unmap.
fn find_hole() -> Result<usize, HostError> {
    let probe = Mapping::anon_none(2 * REGION)?;
    let aligned = (probe.addr() + REGION - 1) & !(REGION - 1);
    probe.unmap()?;
    Ok(aligned)
}

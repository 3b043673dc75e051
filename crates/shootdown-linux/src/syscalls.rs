//! mm system calls and the page-fault handler: `madvise(MADV_DONTNEED)` (zap_page_range +
//! tlb_finish_mmu), `munmap` (unmap_region: zap, free_pgtables, flush with `freed_tables`, then
//! free), `mmap`, `mprotect` (change_protection + flush_tlb_range), `fdatasync` on a DAX file
//! (dax_writeback_mapping_range: per dirty page `pfn_mkclean` = write-protect + flush of that
//! page), reclaim's batched unmap (`try_to_unmap` with TTU_BATCH_FLUSH + `arch_tlbbatch_flush`),
//! and `sched_setaffinity`.
//!
//! Each call that removes or downgrades translations records, when it returns to user space,
//! the obligation the oracle checks as `INV-SYSRET` (`Oracle::syscall_returned`).
//!
//! Simplifications: a range zap is one atomic step (it runs under the page-table lock);
//! pages are freed at the cost of `page_free` each with no allocator model; page tables are freed
//! only when the unmapped range covers a whole page-table page.

use crate::counters::Counter;
use crate::frame::{Flow, Frame};
use crate::machine::Machine;
use crate::mem::{
    misc_line, spin_key, struct_file_line, Loc, LINE_JBD2_STATE_LOCK, LINE_JBD2_TRANSACTION,
};
use crate::mmu_gather::ZapCall;
use crate::page_alloc::ZERO_PFN;
use crate::sched::RwSemDown;
use crate::state::*;
use crate::tlb::{FlushMmRange, FlushMmRangePc};
use shootdown_engine::Env;
use shootdown_hw::pagetable::{Pte, Vpn, PTRS_PER_PT};
use shootdown_hw::CpuId;

/// System calls and exceptions, each with its own steps.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Syscall {
    PageFault {
        pc: PageFaultPc,
        vpn: Vpn,
        write: bool,
    },
    Madvise {
        pc: ZapPc,
        start: Vpn,
        npages: u64,
        gather: Gather,
    },
    Munmap {
        pc: ZapPc,
        start: Vpn,
        npages: u64,
        gather: Gather,
    },
    Mmap {
        pc: MmapPc,
        /// A file mapping's VMA (`None`: anonymous memory, which has no VMA in the model).
        vma: Option<crate::vma::Vma>,
    },
    Mprotect {
        pc: ZapPc,
        start: Vpn,
        npages: u64,
        writable: bool,
        gather: Gather,
    },
    /// `todo`: the entries tagged TOWRITE when the call started (`tag_pages_for_writeback`).
    /// With `msync`, the call is `msync(MS_SYNC)` over the whole mapping of the file.
    Fdatasync {
        pc: FdatasyncPc,
        /// The `Machine::dax_files` index of the file.
        file: u32,
        msync: bool,
        todo: Vec<Vpn>,
        i: usize,
    },
    ReclaimUnmap {
        pc: ReclaimUnmapPc,
        start: Vpn,
        npages: u64,
        targets: Vec<CpuId>,
        begin: u64,
        /// kswapd's: the mm reclaimed from (a kernel thread's); `None`: the caller's own.
        mm: Option<MmId>,
    },
    SetAffinity {
        pc: SetAffinityPc,
        cpu: CpuId,
    },
    /// A kernel thread's `mmget_not_zero(mm)` + `kthread_use_mm(mm)` (`mm_refs.rs`); `old` is
    /// the `active_mm` it replaced, `irqs_off` whether it holds interrupts off (v5.8+).
    KthreadUseMm {
        pc: crate::mm_refs::UseMmPc,
        mm: MmId,
        old: Option<MmId>,
        irqs_off: bool,
    },
    /// Kernel code's `text_poke()` of kernel page `page` through `poking_mm` = `mm`
    /// (`text_poke.rs`); `prev` is the mm it switches back to.
    TextPoke {
        pc: crate::text_poke::TextPokePc,
        mm: MmId,
        page: Vpn,
        prev: MmId,
        irqs_off: bool,
    },
    /// Kernel code's `vunmap_range(start, start + npages)` (`kernel_map.rs`).
    VunmapRange {
        pc: crate::kernel_map::VunmapPc,
        start: Vpn,
        npages: u64,
        begin: u64,
    },
    /// A kernel thread's `kthread_unuse_mm(mm)` + `mmput(mm)`.
    KthreadUnuseMm {
        pc: crate::mm_refs::UnuseMmPc,
        mm: MmId,
    },
    /// An EFI runtime-service call through `efi_mm` = `mm` (`efi.rs`); `prev` is the caller's
    /// active mm.
    EfiCall {
        pc: crate::efi::EfiCallPc,
        mm: MmId,
        prev: MmId,
    },
    /// `mremap()` moving pages (`mremap.rs`).
    Mremap(Box<crate::mremap::Mremap>),
    /// `ftruncate()` or a driver's revoke: `unmap_mapping_range()` (`truncate.rs`).
    UnmapMapping(Box<crate::truncate::UnmapMapping>),
    /// A driver's `migrate_vma` of the caller's pages (`migrate_device.rs`).
    MigrateVma(Box<crate::migrate_device::MigrateVma>),
    /// khugepaged (a kernel thread): collapse group `pt` of `mm` into a PMD leaf.
    Collapse {
        pc: crate::khugepaged::CollapsePc,
        mm: MmId,
        pt: u64,
    },
}

/// The steps of the page-fault handler (`handle_mm_fault`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PageFaultPc {
    /// Exception entry; `down_read(mmap_sem)`.
    Start,
    /// Resolve the fault (a DAX write fault first joins the jbd2 handle and locks the mapping).
    Fault,
    /// DAX: retry `xa_lock_irq(&mapping->i_pages)`.
    DaxLock,
    /// DAX: holding `xa_lock`: resolve the fault, unlock.
    DaxLocked,
    /// A write to a page mapped read-only for copy-on-write, the shared zero page or a
    /// MAP_PRIVATE file's page-cache page (`do_wp_page` -> `wp_page_copy`): take the PTL,
    /// check the PTE is unchanged (`pte_same`), clear it and `flush_tlb_page()` it
    /// (`ptep_clear_flush`) with the PTL held.
    CowLock,
    /// The flush returned: map the new copy writable (`set_pte_at`; the copy is charged as
    /// zeroing a page), unlock the PTL.
    CowMap,
    /// `up_read(mmap_sem)`; return.
    Done,
}

/// The steps of `madvise(MADV_DONTNEED)`, `munmap` and `mprotect`: take `mmap_sem`, gather
/// (`tlb_gather_mmu` / `inc_tlb_flush_pending`), change the PTEs under the page-table lock
/// (after `flush_tlb_batched_pending`), flush only what the kernel flushes, release.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ZapPc {
    /// Syscall entry; take `mmap_sem`.
    Start,
    /// Take the PTL; `tlb_gather_mmu()` / `change_protection_range()`:
    /// `inc_tlb_flush_pending(mm)`; `flush_tlb_batched_pending()` (a full flush with the PTL
    /// held, if reclaim left a batch pending); else change the PTEs and unlock.
    Lock,
    /// The pending batch is flushed: mark it so, change the PTEs, unlock the PTL.
    Batched,
    /// A PMD leaf the call covers only in part was invalidated and its group flushed
    /// (`__split_huge_pmd`): link its page table; split the next, or change the PTEs and
    /// unlock.
    Split,
    /// `tlb_finish_mmu()` / `flush_tlb_range()`: flush what was gathered, if anything (or
    /// everything, when another gather of the mm is in progress).
    Finish,
    /// (munmap: free the unlinked page tables;) `dec_tlb_flush_pending()`; release
    /// `mmap_sem`; return.
    Done,
}

/// What an mmu_gather (or `change_protection`) has collected so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Gather {
    /// PTEs cleared or write-protected: the gather has a range to flush.
    pub changed: u64,
    /// munmap: page-table pages were unlinked (`tlb->freed_tables`).
    pub freed_tables: bool,
    /// PMD leaves cleared or write-protected (`tlb->cleared_pmds`).
    pub cleared_pmds: u32,
    /// The group being split (between `pmdp_invalidate`'s flush and the table's link).
    pub split: Option<u32>,
    /// `mm->tlb_flush_batched` as `flush_tlb_batched_pending()` read it.
    pub batch: u64,
}

/// Which zap-type call a [`ZapPc`] sequence is running.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ZapKind {
    Madvise,
    Munmap,
    Mprotect { writable: bool },
}

/// The steps of `mmap`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MmapPc {
    /// Syscall entry; `down_write(mmap_sem)`.
    Start,
    /// Set the VMA up; `up_write`; return.
    Done,
}

/// The steps of `fdatasync()` / `msync(MS_SYNC)` on a DAX file
/// (`dax_writeback_mapping_range`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FdatasyncPc {
    /// Syscall entry (msync: `down_read(mmap_sem)` to find the VMA).
    Start,
    /// msync: `get_file()`, `up_read(mmap_sem)`.
    MsyncVma,
    /// `tag_pages_for_writeback()` under `xa_lock`.
    Tag,
    /// Unlock after tagging.
    TagUnlock,
    /// The next tagged entry, or return.
    Next,
    /// `dax_writeback_one()`: lock the entry under `xa_lock`.
    EntryLock,
    /// Unlock `xa_lock` with the entry locked.
    EntryLocked,
    /// `dax_entry_mkclean()`: write-protect and flush the entry.
    Mkclean,
    /// `dax_flush()`: write the entry's cache lines back.
    Writeback,
    /// Clear the entry's tags and unlock it, under `xa_lock`.
    ClearLock,
    /// Unlock `xa_lock`.
    ClearUnlock,
}

/// The steps of reclaim's batched unmap.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReclaimUnmapPc {
    /// `try_to_unmap_one()` ×n: clear PTEs, add the mm's CPUs to the batch.
    Unmap,
    /// `try_to_unmap_flush()`: `arch_tlbbatch_flush()`.
    Flush,
    /// The batched flush returned.
    Done,
}

/// The steps of `sched_setaffinity`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SetAffinityPc {
    /// Move the task (schedule away if it must run elsewhere).
    Start,
    /// Running on the new CPU: return.
    Done,
}

impl Syscall {
    /// Kernel name of the call.
    pub fn name(&self) -> &'static str {
        match self {
            Syscall::PageFault { .. } => "handle_mm_fault",
            Syscall::Madvise { .. } => "madvise(MADV_DONTNEED)",
            Syscall::Munmap { .. } => "munmap",
            Syscall::Mmap { .. } => "mmap",
            Syscall::Mprotect { .. } => "mprotect",
            Syscall::Fdatasync { msync: true, .. } => "msync(MS_SYNC)",
            Syscall::Fdatasync { .. } => "fdatasync",
            Syscall::ReclaimUnmap { .. } => "try_to_unmap(TTU_BATCH_FLUSH)",
            Syscall::SetAffinity { .. } => "sched_setaffinity",
            Syscall::Collapse { .. } => "khugepaged: collapse_huge_page",
            Syscall::KthreadUseMm { .. } => "kthread_use_mm",
            Syscall::VunmapRange { .. } => "vunmap_range",
            Syscall::TextPoke { .. } => "text_poke",
            Syscall::KthreadUnuseMm { .. } => "kthread_unuse_mm",
            Syscall::EfiCall { .. } => "efi_call_virt (EFI runtime service)",
            Syscall::Mremap(_) => "mremap",
            Syscall::UnmapMapping(u) if u.truncate => "ftruncate",
            Syscall::UnmapMapping(_) => "unmap_mapping_range (driver revoke)",
            Syscall::MigrateVma(_) => "migrate_vma",
        }
    }

    /// `madvise`, `munmap` and `mprotect` of `mm`: the call, its step and its mmu_gather.
    fn zap_call(&mut self, mm: MmId) -> Option<(ZapCall, &mut ZapPc, &mut Gather)> {
        let (kind, pc, start, npages, gather) = match self {
            Syscall::Madvise {
                pc,
                start,
                npages,
                gather,
            } => (ZapKind::Madvise, pc, *start, *npages, gather),
            Syscall::Munmap {
                pc,
                start,
                npages,
                gather,
            } => (ZapKind::Munmap, pc, *start, *npages, gather),
            Syscall::Mprotect {
                pc,
                start,
                npages,
                writable,
                gather,
            } => (
                ZapKind::Mprotect {
                    writable: *writable,
                },
                pc,
                *start,
                *npages,
                gather,
            ),
            _ => return None,
        };
        let call = ZapCall {
            mm,
            kind,
            start,
            npages,
        };
        Some((call, pc, gather))
    }

    /// The step the call is at, by name (for diagnostic dumps).
    pub fn step_name(&self) -> String {
        match self {
            Syscall::PageFault { pc, .. } => format!("{pc:?}"),
            Syscall::Madvise { pc, .. }
            | Syscall::Munmap { pc, .. }
            | Syscall::Mprotect { pc, .. } => format!("{pc:?}"),
            Syscall::Mmap { pc, .. } => format!("{pc:?}"),
            Syscall::Fdatasync { pc, .. } => format!("{pc:?}"),
            Syscall::ReclaimUnmap { pc, .. } => format!("{pc:?}"),
            Syscall::SetAffinity { pc, .. } => format!("{pc:?}"),
            Syscall::Collapse { pc, .. } => format!("{pc:?}"),
            Syscall::KthreadUseMm { pc, .. } => format!("{pc:?}"),
            Syscall::VunmapRange { pc, .. } => format!("{pc:?}"),
            Syscall::TextPoke { pc, .. } => format!("{pc:?}"),
            Syscall::KthreadUnuseMm { pc, .. } => format!("{pc:?}"),
            Syscall::EfiCall { pc, .. } => format!("{pc:?}"),
            Syscall::Mremap(m) => format!("{:?}", m.pc),
            Syscall::UnmapMapping(u) => format!("{:?}", u.pc),
            Syscall::MigrateVma(m) => format!("{:?}", m.pc),
        }
    }

    /// Interrupts are disabled: holding the DAX mapping's `xa_lock` (`xa_lock_irq`).
    pub fn irqs_off(&self) -> bool {
        matches!(
            self,
            Syscall::PageFault {
                pc: PageFaultPc::DaxLocked,
                ..
            } | Syscall::Fdatasync {
                pc: FdatasyncPc::TagUnlock | FdatasyncPc::EntryLocked | FdatasyncPc::ClearUnlock,
                ..
            } | Syscall::KthreadUseMm { irqs_off: true, .. }
                | Syscall::TextPoke { irqs_off: true, .. }
        )
    }
}

impl Machine {
    fn current_mm(&self, cpu: CpuId) -> MmId {
        self.tasks[self.cpus[cpu].curr as usize]
            .mm
            .expect("user task has an mm")
    }

    /// `xa_lock_irq(&mapping->i_pages)` of DAX file `file` and the section it guards
    /// (`xa_lock_hold`); `Some` is the spin to park on while another CPU holds it.
    fn xa_lock<E: Env>(&mut self, env: &mut E, cpu: CpuId, file: u32) -> Option<Flow> {
        if self.spin_trylock(env, cpu, Loc::XaLock(file)).is_none() {
            return Some(Flow::Spin(spin_key(Loc::XaLock(file))));
        }
        self.charge(env, |c| c.xa_lock_hold);
        None
    }

    /// The faulting access invalidated this CPU's entry for the address (the SDM: a page fault
    /// drops the entries that caused it), in the user and kernel PCIDs.
    pub(crate) fn fault_dropped_entry(&mut self, cpu: CpuId, vpn: Vpn) {
        let asid = self.cpus[cpu].tlbstate.loaded_mm_asid;
        let (kp, up) = (self.kern_pcid(asid), self.user_pcid(asid));
        let tlb = &mut self.cpus[cpu].tlb;
        if tlb.lookup(up, vpn).is_some() {
            tlb.invlpg(up, vpn);
        }
        if kp != up && tlb.lookup(kp, vpn).is_some() {
            tlb.invlpg(kp, vpn);
        }
    }

    /// Clear every present PTE in the range (a downgrade: bumps versions). Returns how many;
    /// `frames` (an mmu_gather's) collects the frames they mapped (`__tlb_remove_page`).
    pub(crate) fn zap_range<E: Env>(
        &mut self,
        mm: MmId,
        start: Vpn,
        npages: u64,
        mut frames: Option<&mut Vec<crate::page_alloc::FrameRun>>,
        env: &mut E,
    ) -> u64 {
        let mut n = 0;
        let m = &mut self.mms[mm as usize];
        let keys: Vec<Vpn> = m
            .space
            .ptes
            .range(start..start + npages)
            .filter(|(_, p)| p.present)
            .map(|(v, _)| v)
            .collect();
        let mut freed = 0;
        for v in keys {
            let pte = m.space.ptes.get_mut(v).expect("listed");
            if let Some(f) = frames.as_deref_mut() {
                crate::page_alloc::push_run(f, pte.pfn, 1);
            }
            // zap_pte_range(): the zero page is no normal page, nothing to release.
            freed += u64::from(pte.pfn != ZERO_PFN);
            pte.present = false;
            pte.writable = false;
            self.oracle.pte_changed(pte);
            n += 1;
        }
        self.charge(env, |c| {
            shootdown_engine::Time(c.pte_update.0 * n + c.page_free.0 * freed)
        });
        n
    }

    pub(crate) fn syscall_step<E: Env>(
        &mut self,
        cpu: CpuId,
        s: &mut Syscall,
        env: &mut E,
    ) -> Flow {
        // Kernel threads' paths, on another process's mm.
        match s {
            Syscall::Collapse { pc, mm, pt } => return self.collapse_step(cpu, *mm, *pt, pc, env),
            Syscall::KthreadUseMm {
                pc,
                mm,
                old,
                irqs_off,
            } => return self.kthread_use_mm_step(cpu, pc, *mm, old, irqs_off, env),
            Syscall::KthreadUnuseMm { pc, mm } => {
                return self.kthread_unuse_mm_step(cpu, pc, *mm, env)
            }
            Syscall::VunmapRange {
                pc,
                start,
                npages,
                begin,
            } => return self.vunmap_range_step(cpu, pc, *start, *npages, begin, env),
            Syscall::TextPoke {
                pc,
                mm,
                page,
                prev,
                irqs_off,
            } => return self.text_poke_step(cpu, pc, *mm, *page, prev, irqs_off, env),
            Syscall::UnmapMapping(u) => return self.unmap_mapping_step(cpu, u, env),
            Syscall::EfiCall { pc, mm, prev } => {
                return self.efi_call_step(cpu, pc, *mm, prev, env)
            }
            _ => {}
        }
        let mm = match s {
            // kswapd: a kernel thread reclaiming another process's pages.
            Syscall::ReclaimUnmap { mm: Some(m), .. } => *m,
            _ => self.current_mm(cpu),
        };
        match s {
            Syscall::PageFault { pc, vpn, write } => match *pc {
                PageFaultPc::Start => {
                    self.charge_interruptible(env, cpu, |c| c.page_fault_entry_exit);
                    self.perf.counters.inc(Counter::PageFaults);
                    self.summary(|| "take mmap_sem".into());
                    *pc = PageFaultPc::Fault;
                    Flow::Call(RwSemDown::call(mm, false))
                }
                PageFaultPc::Fault | PageFaultPc::DaxLock | PageFaultPc::DaxLocked => {
                    let (vpn, write) = (*vpn, *write);
                    let dax = self.dax_file_of(mm, vpn);
                    if let (Some(f), true, true) = (dax, write, *pc != PageFaultPc::DaxLocked) {
                        if *pc == PageFaultPc::Fault {
                            // ext4_dax_huge_fault(): a write fault runs inside a jbd2 handle
                            // (ext4_journal_start_sb .. ext4_journal_stop): start_this_handle()
                            // read-locks j_state_lock and bumps the running transaction's
                            // t_updates / t_outstanding_credits, the stop undoes both. Every
                            // writer of the filesystem shares these two lines.
                            for line in [LINE_JBD2_STATE_LOCK, LINE_JBD2_TRANSACTION] {
                                for _ in 0..2 {
                                    self.atomic_on_line(env, cpu, misc_line(line));
                                }
                            }
                        }
                        // dax_iomap_fault() -> grab_mapping_entry(): the entry is found and
                        // locked under xa_lock_irq(&mapping->i_pages).
                        *pc = PageFaultPc::DaxLock;
                        if let Some(spin) = self.xa_lock(env, cpu, f) {
                            return spin;
                        }
                        self.summary(|| "dax_iomap_fault: xa_lock_irq(&mapping->i_pages)".into());
                        *pc = PageFaultPc::DaxLocked;
                        return Flow::Next;
                    }
                    if *pc == PageFaultPc::DaxLocked {
                        self.spin_unlock(env, cpu, Loc::XaLock(dax.expect("locked a DAX file")));
                    }
                    let pt = shootdown_hw::pagetable::pt_index(vpn);
                    if dax.is_none()
                        && self.mms[mm as usize].vmas.is_empty()
                        && self.huge_pmd_fault(cpu, mm, vpn, write, env)
                    {
                        self.say(|| {
                            format!("fault on mm{mm} page {vpn:#x}: 2 MiB page (PMD leaf) for pages {:#x}..{:#x}", pt * PTRS_PER_PT, (pt + 1) * PTRS_PER_PT)
                        });
                        *pc = PageFaultPc::Done;
                        return Flow::Next;
                    }
                    if self.mms[mm as usize].swap_ptes.contains_key(&vpn) {
                        // migration_entry_wait(): the page is being migrated
                        // (`migrate_device.rs`); sleep until its entry is restored under the
                        // PTL, then fault again.
                        self.perf.counters.inc(Counter::MigrationEntryWaits);
                        self.summary(|| {
                            format!("fault on mm{mm} page {vpn:#x}: migration entry: migration_entry_wait")
                        });
                        return Flow::Spin(spin_key(Loc::Ptl(mm, pt)));
                    }
                    let vma = self.vma_at(mm, vpn);
                    let file_pfn = match vma.map(|v| self.filemap_fault(v, vpn)) {
                        Some(None) => {
                            // VM_FAULT_SIGBUS: past the end of the file (or a revoked device
                            // mapping). The model's task abandons the access.
                            let t = self.cpus[cpu].curr as usize;
                            self.tasks[t].pc += 1;
                            self.tasks[t].op_progress = 0;
                            self.perf.counters.inc(Counter::Sigbus);
                            self.say(|| {
                                format!("fault on mm{mm} page {vpn:#x}: beyond the file: SIGBUS")
                            });
                            *pc = PageFaultPc::Done;
                            return Flow::Next;
                        }
                        Some(pfn) => pfn,
                        None => None,
                    };
                    if self.ensure_table(mm, vpn) {
                        // __pte_alloc() -> pte_alloc_one(): a zeroed page for the new page
                        // table, then pmd_populate() under the PMD lock.
                        self.charge(env, |c| c.page_alloc + c.page_zero);
                    }
                    let private = vma.is_some_and(|v| v.private);
                    let mut pte = self.mms[mm as usize].space.pte(vpn);
                    if !pte.present && private {
                        // A MAP_PRIVATE file page: a read maps the page-cache page read-only
                        // (do_read_fault); a write copies it into a new anonymous page
                        // (do_cow_fault: the copy is charged as zeroing a page).
                        let file_pfn = file_pfn.expect("a file VMA serves the fault");
                        self.charge(env, |c| c.page_alloc + c.page_zero + c.pte_update);
                        pte.pfn = if write { self.alloc_frame() } else { file_pfn };
                        pte.present = true;
                        pte.writable = write;
                    } else if !pte.present && !write && file_pfn.is_none() && dax.is_none() {
                        // do_anonymous_page(), a read: map the shared zero page read-only
                        // (no allocation; a later write copies it).
                        self.charge(env, |c| c.pte_update);
                        pte.pfn = ZERO_PFN;
                        pte.present = true;
                        pte.writable = false;
                    } else if !pte.present {
                        self.charge(env, |c| c.page_alloc + c.page_zero + c.pte_update);
                        pte.pfn = file_pfn.unwrap_or_else(|| self.alloc_frame());
                        pte.present = true;
                        pte.writable = write || dax.is_none();
                    } else if write && !pte.writable && (pte.pfn == ZERO_PFN || private) {
                        *pc = PageFaultPc::CowLock;
                        return Flow::Next;
                    } else if write && !pte.writable {
                        self.charge(env, |c| c.pte_update);
                        pte.writable = true;
                    }
                    if write {
                        pte.dirty = true;
                        if let Some(f) = dax {
                            self.dax_files[f as usize].dirty.insert(vpn);
                        }
                    }
                    // An upgrade (or a fill of an empty PTE) needs no flush: no version bump.
                    self.mms[mm as usize].space.ptes.insert(vpn, pte);
                    self.fault_dropped_entry(cpu, vpn);
                    self.say(|| {
                        format!(
                            "fault on mm{mm} page {vpn:#x}: map it{}",
                            if write { " writable" } else { "" }
                        )
                    });
                    *pc = PageFaultPc::Done;
                    Flow::Next
                }
                PageFaultPc::CowLock => {
                    let vpn = *vpn;
                    let ptl = Loc::Ptl(mm, shootdown_hw::pagetable::pt_index(vpn));
                    if self.spin_trylock(env, cpu, ptl).is_none() {
                        return Flow::Spin(spin_key(ptl));
                    }
                    let pte = self.mms[mm as usize].space.pte(vpn);
                    let private = self.vma_at(mm, vpn).is_some_and(|v| v.private);
                    if !(pte.present && !pte.writable && (pte.pfn == ZERO_PFN || private)) {
                        // !pte_same(): another thread changed the PTE; the access retries.
                        self.spin_unlock(env, cpu, ptl);
                        self.summary(|| {
                            format!("wp_page_copy mm{mm} page {vpn:#x}: PTE changed, retry")
                        });
                        *pc = PageFaultPc::Done;
                        return Flow::Next;
                    }
                    let m = &mut self.mms[mm as usize];
                    let p = m.space.ptes.get_mut(vpn).expect("present");
                    p.present = false;
                    p.writable = false;
                    self.oracle.pte_changed(p);
                    self.charge(env, |c| c.pte_update);
                    self.summary(|| {
                        format!("wp_page_copy mm{mm} page {vpn:#x}: ptep_clear_flush of the read-only page")
                    });
                    *pc = PageFaultPc::CowMap;
                    Flow::Call(FlushMmRange::call(mm, vpn, vpn + 1, false))
                }
                PageFaultPc::CowMap => {
                    let vpn = *vpn;
                    self.charge(env, |c| c.page_alloc + c.page_zero + c.pte_update);
                    let pfn = self.alloc_frame();
                    let pte = Pte {
                        present: true,
                        writable: true,
                        dirty: true,
                        pfn,
                        ..self.mms[mm as usize].space.pte(vpn)
                    };
                    self.mms[mm as usize].space.ptes.insert(vpn, pte);
                    self.fault_dropped_entry(cpu, vpn);
                    let ptl = Loc::Ptl(mm, shootdown_hw::pagetable::pt_index(vpn));
                    self.spin_unlock(env, cpu, ptl);
                    self.say(|| format!("wp_page_copy mm{mm} page {vpn:#x}: map the copy writable; unlock the PTL"));
                    *pc = PageFaultPc::Done;
                    Flow::Next
                }
                PageFaultPc::Done => {
                    self.rwsem_up(cpu, mm, false, env);
                    self.summary(|| "up_read(mmap_sem); return".into());
                    Flow::Return
                }
            },
            Syscall::Madvise { .. } | Syscall::Munmap { .. } | Syscall::Mprotect { .. } => {
                let (call, pc, gather) = s.zap_call(mm).expect("a zap-type call");
                self.zap_call_step(cpu, call, pc, gather, env)
            }
            Syscall::Mmap { pc, vma } => match *pc {
                MmapPc::Start => {
                    self.charge(env, |c| c.syscall_entry_exit);
                    *pc = MmapPc::Done;
                    Flow::Call(RwSemDown::call(mm, true))
                }
                MmapPc::Done => {
                    self.charge(env, |c| c.mmap_syscall);
                    if let Some(v) = *vma {
                        // mmap_region() -> vma_link(): into the mm and the file's i_mmap
                        // (whose i_mmap_rwsem the model does not take here).
                        self.vma_link(mm, v);
                    }
                    self.rwsem_up(cpu, mm, true, env);
                    Flow::Return
                }
            },
            Syscall::Fdatasync {
                pc,
                file,
                msync,
                todo,
                i,
            } => match *pc {
                FdatasyncPc::Start => {
                    self.charge_interruptible(env, cpu, |c| c.syscall_entry_exit);
                    if *msync {
                        // msync(): find the VMA under mmap_sem held for read.
                        *pc = FdatasyncPc::MsyncVma;
                        return Flow::Call(RwSemDown::call(mm, false));
                    }
                    // ext4_sync_file(): the fixed part (jbd2 checks, blkdev_issue_flush) is
                    // fsync_base; the writeback of dirty entries follows.
                    self.charge_interruptible(env, cpu, |c| c.fsync_base);
                    *pc = FdatasyncPc::Tag;
                    Flow::Next
                }
                FdatasyncPc::MsyncVma => {
                    // msync() with MS_SYNC on a shared file mapping: find_vma() (a vmacache
                    // hit, folded into the syscall cost), get_file(), drop mmap_sem, then
                    // vfs_fsync_range(datasync=1) = ext4_sync_file() as for fdatasync().
                    // MS_INVALIDATE only checks VM_LOCKED.
                    self.atomic_on_line(env, cpu, struct_file_line(*file));
                    self.rwsem_up(cpu, mm, false, env);
                    self.charge_interruptible(env, cpu, |c| c.fsync_base);
                    *pc = FdatasyncPc::Tag;
                    Flow::Next
                }
                FdatasyncPc::Tag => {
                    // dax_writeback_mapping_range(): tag_pages_for_writeback() under xa_lock
                    // first, so the writeback is bounded by what is dirty now, not what other
                    // threads dirty while it runs.
                    let f = *file;
                    if let Some(spin) = self.xa_lock(env, cpu, f) {
                        return spin;
                    }
                    *todo = std::mem::take(&mut self.dax_files[f as usize].dirty)
                        .into_iter()
                        .collect();
                    *i = 0;
                    *pc = FdatasyncPc::TagUnlock;
                    Flow::Next
                }
                FdatasyncPc::TagUnlock => {
                    self.spin_unlock(env, cpu, Loc::XaLock(*file));
                    *pc = FdatasyncPc::Next;
                    Flow::Next
                }
                FdatasyncPc::EntryLock | FdatasyncPc::ClearLock => {
                    // dax_writeback_one(): lock the entry and later clear its tags and unlock
                    // it, each under xa_lock_irq(&mapping->i_pages).
                    if let Some(spin) = self.xa_lock(env, cpu, *file) {
                        return spin;
                    }
                    *pc = if *pc == FdatasyncPc::EntryLock {
                        FdatasyncPc::EntryLocked
                    } else {
                        FdatasyncPc::ClearUnlock
                    };
                    Flow::Next
                }
                FdatasyncPc::EntryLocked => {
                    self.spin_unlock(env, cpu, Loc::XaLock(*file));
                    *pc = FdatasyncPc::Mkclean;
                    Flow::Next
                }
                FdatasyncPc::ClearUnlock => {
                    self.spin_unlock(env, cpu, Loc::XaLock(*file));
                    *pc = FdatasyncPc::Next;
                    Flow::Next
                }
                FdatasyncPc::Next => {
                    if todo.get(*i).is_none() {
                        // Every page it cleaned is write-protected for user space from here.
                        for &v in todo.iter() {
                            self.oracle.syscall_returned(mm, v, v + 1);
                        }
                        if *msync {
                            // fput(); the whole file was one range, so no second lookup.
                            self.atomic_on_line(env, cpu, struct_file_line(*file));
                        }
                        return Flow::Return;
                    }
                    *pc = FdatasyncPc::EntryLock;
                    Flow::Next
                }
                FdatasyncPc::Writeback => {
                    // dax_flush(): the cache-line writeback of the entry, after the mkclean and
                    // with interrupts on; then back to xa_lock to clear the tags.
                    self.charge_interruptible(env, cpu, |c| c.dax_writeback_page);
                    *pc = FdatasyncPc::ClearLock;
                    Flow::Next
                }
                FdatasyncPc::Mkclean => {
                    // dax_entry_mkclean() write-protects the entry and flushes it from every CPU
                    // running the mm; then the writeback.
                    let v = todo[*i];
                    *i += 1;
                    *pc = FdatasyncPc::Writeback;
                    let m = &mut self.mms[mm as usize];
                    let Some(pte) = m.space.ptes.get_mut(v) else {
                        return Flow::Next;
                    };
                    if !(pte.present && (pte.writable || pte.dirty)) {
                        return Flow::Next;
                    }
                    pte.writable = false;
                    pte.dirty = false;
                    self.oracle.pte_changed(pte);
                    self.charge(env, |c| c.pte_update);
                    self.say(|| format!("pfn_mkclean: write-protect mm{mm} page {v:#x}"));
                    Flow::Call(FlushMmRange::call(mm, v, v + 1, false))
                }
            },
            Syscall::ReclaimUnmap {
                pc,
                start,
                npages,
                targets,
                begin,
                ..
            } => match *pc {
                ReclaimUnmapPc::Unmap => {
                    // try_to_unmap_one() ×n under the PTL: clear PTEs; for each one cleared,
                    // arch_tlbbatch_add_pending() bumps tlb_gen and accumulates mm_cpumask
                    // into the batch, and set_tlb_ubc_flush_pending() marks the mm.
                    let ptl = Loc::Ptl(mm, *start / PTRS_PER_PT);
                    if self.spin_trylock(env, cpu, ptl).is_none() {
                        return Flow::Spin(spin_key(ptl));
                    }
                    let n = self.zap_range(mm, *start, *npages, None, env);
                    if n == 0 {
                        self.spin_unlock(env, cpu, ptl);
                        self.summary(|| "try_to_unmap: nothing mapped, no batch".into());
                        return Flow::Return;
                    }
                    self.rmw(env, cpu, Loc::TlbGen(mm), |g| g + 1);
                    self.mark_tlb_flush_batched(cpu, mm, env);
                    self.spin_unlock(env, cpu, ptl);
                    let (mut others, me) = self.read_cpumask_others(cpu, mm, env);
                    if me {
                        others.push(cpu);
                    }
                    others.sort_unstable();
                    *targets = others;
                    let st = *start;
                    self.say(|| {
                        format!("try_to_unmap: clear mm{mm} page {st:#x}, defer flush (batch)")
                    });
                    *pc = ReclaimUnmapPc::Flush;
                    Flow::Next
                }
                ReclaimUnmapPc::Flush => {
                    *begin = self.oracle.flush_begin();
                    *pc = ReclaimUnmapPc::Done;
                    self.summary(|| "try_to_unmap_flush: arch_tlbbatch_flush".into());
                    Flow::Call(Frame::FlushMmRange(Box::new(FlushMmRange {
                        pc: FlushMmRangePc::Start,
                        mm,
                        info: FlushTlbInfo {
                            mm: None,
                            start: 0,
                            end: TLB_FLUSH_ALL,
                            new_tlb_gen: TLB_GENERATION_INVALID,
                            stride_shift: 0,
                            freed_tables: false,
                            trim_cpumask: false,
                            initiator: cpu,
                            kernel: false,
                        },
                        begin: *begin,
                        batch_targets: Some(targets.clone()),
                        global_asid: 0,
                        munmap_in_progress: false,
                        latr_saved: false,
                    })))
                }
                ReclaimUnmapPc::Done => {
                    self.oracle
                        .flush_returned(mm, Some((*start, *start + *npages)), *begin);
                    self.summary(|| "batched flush complete: return".into());
                    Flow::Return
                }
            },
            Syscall::Mremap(m) => self.mremap_step(cpu, mm, m, env),
            Syscall::MigrateVma(m) => self.migrate_vma_step(cpu, mm, m, env),
            Syscall::Collapse { .. }
            | Syscall::KthreadUseMm { .. }
            | Syscall::KthreadUnuseMm { .. }
            | Syscall::VunmapRange { .. }
            | Syscall::UnmapMapping(_)
            | Syscall::EfiCall { .. }
            | Syscall::TextPoke { .. } => {
                unreachable!("a path on no mm of the caller's, handled above")
            }
            Syscall::SetAffinity { pc, cpu: target } => match *pc {
                SetAffinityPc::Start => {
                    self.charge(env, |c| c.syscall_entry_exit + c.sched_setaffinity);
                    self.perf.counters.inc(Counter::Migrations);
                    let me = self.cpus[cpu].curr;
                    let target = *target;
                    self.tasks[me as usize].cpu = target;
                    if target == cpu {
                        return Flow::Return;
                    }
                    // Move ourselves: queue on the target, wake it, switch away here.
                    if self.eevdf(env) {
                        self.eevdf_migrate(cpu, target, me, env.now());
                    }
                    self.tasks[me as usize].state = TaskState::Runnable;
                    self.cpus[target].runqueue.push_back(me);
                    self.kick_cpu(cpu, target, env);
                    self.say(|| format!("migrate to cpu{target}"));
                    *pc = SetAffinityPc::Done;
                    Flow::Call(self.schedule_frame())
                }
                SetAffinityPc::Done => Flow::Return,
            },
        }
    }
}

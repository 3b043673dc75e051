//! `unmap_mapping_range()` (mm/memory.c) and the two callers modelled: `ftruncate()`'s
//! `truncate_pagecache()` (mm/truncate.c) and a driver revoking its VM_PFNMAP mappings (as
//! vfio-pci's `vfio_pci_zap_bars()` does before it disables a BAR).
//!
//! `unmap_mapping_range(mapping, from, 0, 1)` read-locks `i_mmap_rwsem` and walks `i_mmap`:
//! for each VMA mapping file pages at or after `from`, `zap_page_range_single()` gathers the
//! range (`tlb_gather_mmu`), clears its PTEs under the PTL (`unmap_single_vma`), and
//! `tlb_finish_mmu()` flushes what it cleared from the VMA's mm. Truncation first lowers
//! `i_size` (faults beyond it now SIGBUS), then unmaps, then `truncate_inode_pages()` takes the
//! pages out of the page cache: a page no PTE maps and no mmu_gather still holds (another
//! zap's, its flush pending) is freed (`INV-FREEPAGE` checked) — the moment a CPU still
//! caching it through an unflushed translation can write a page that already belongs to
//! someone else. Otherwise the last reference's holder frees it (`Machine::drop_file_refs`).
//! `tlb_finish_mmu()` flushes the VMA's range even when its zap cleared nothing if another
//! gather of the mm is in progress (`mm_tlb_flush_nested()`).
//!
//! Simplified: a VMA lies in one page table, whose PTL its zap takes; `zap_pte_range()`'s
//! flush of dirty shared PTEs under the PTL (`force_flush`) is the flush after it here;
//! `flush_tlb_batched_pending()` is not run here; the second `unmap_mapping_range()` of
//! truncation (for private COW pages) has nothing to do without MAP_PRIVATE mappings.

use crate::counters::Counter;
use crate::frame::Flow;
use crate::machine::Machine;
use crate::mem::{spin_key, Loc};
use crate::sched::{RwSemDown, SemId};
use crate::state::MmId;
use crate::tlb::FlushMmRange;
use crate::vma::FileId;
use shootdown_engine::{Env, Time};
use shootdown_hw::pagetable::{Vpn, PTRS_PER_PT};
use shootdown_hw::CpuId;

/// The steps of `ftruncate()` / a driver's revoke.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum UnmapMappingPc {
    /// System-call entry; `i_size_write()` (a device: its memory disabled for faults).
    Start,
    /// `i_mmap_lock_read()` returned: read `i_mmap`.
    Walk,
    /// `zap_page_range_single()` of the next VMA: PTL, clear, unlock.
    Zap,
    /// Its `tlb_finish_mmu()` flush returned: free what it gathered, go on.
    Flushed,
    /// `i_mmap_unlock_read()`.
    Unlock,
    /// `truncate_inode_pages()`: out of the page cache, freed if unmapped.
    TruncatePages,
    /// Return to user space.
    Done,
}

/// The state of one `unmap_mapping_range()` caller.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct UnmapMapping {
    pub pc: UnmapMappingPc,
    pub file: FileId,
    /// First page offset unmapped (truncate: the new size; a revoke: 0).
    pub from: u64,
    /// `ftruncate()` (page cache truncated too), or a driver's revoke.
    pub truncate: bool,
    /// `i_mmap` as read under the lock: `(mm, vma start)`.
    pub vmas: Vec<(MmId, Vpn)>,
    pub i: u32,
    /// The range the current VMA's zap cleared, while its flush runs.
    pub zapped: Option<(MmId, Vpn, Vpn)>,
    /// The page cache was truncated already (the seeded mutant's order).
    pub pages_done: bool,
    /// `i_mmap` was walked already.
    pub walked: bool,
    /// The seeded mutant's frames, freed by the page-cache truncation while still mapped.
    pub freed_early: Vec<u32>,
}

impl UnmapMapping {
    pub fn new(file: FileId, from: u64, truncate: bool) -> Self {
        UnmapMapping {
            pc: UnmapMappingPc::Start,
            file,
            from,
            truncate,
            vmas: Vec::new(),
            i: 0,
            zapped: None,
            pages_done: false,
            walked: false,
            freed_early: Vec::new(),
        }
    }
}

impl Machine {
    /// The pages of `mm`'s VMA at `vstart`, if it still maps file `f`, that map file pages at or
    /// after page offset `from`.
    fn file_range(&self, mm: MmId, vstart: Vpn, f: FileId, from: u64) -> Option<(Vpn, Vpn)> {
        self.vma_by_start(mm, vstart)
            .filter(|v| v.file == f)
            .and_then(|v| v.range_from(from))
    }

    /// One step of `ftruncate()` or a driver's revoke of its mappings.
    pub(crate) fn unmap_mapping_step<E: Env>(
        &mut self,
        cpu: CpuId,
        s: &mut UnmapMapping,
        env: &mut E,
    ) -> Flow {
        let f = s.file;
        match s.pc {
            UnmapMappingPc::Start => {
                self.charge_interruptible(env, cpu, |c| c.syscall_entry_exit + c.unmap_base);
                // truncate_setsize() -> i_size_write(); a driver disables the device memory
                // its fault handler would map.
                self.files[f as usize].size = s.from;
                self.perf.counters.inc(Counter::UnmapMappingRange);
                if s.truncate && self.opts.mutants.truncate_frees_mapped_pages() {
                    let (name, from) = (self.files[f as usize].name.clone(), s.from);
                    self.summary(|| {
                        format!("i_size_write('{name}', {from} page(s)); the page cache first")
                    });
                    s.pc = UnmapMappingPc::TruncatePages;
                    return Flow::Next;
                }
                let (name, from, truncate) =
                    (self.files[f as usize].name.clone(), s.from, s.truncate);
                self.summary(|| {
                    let first = if truncate {
                        format!("i_size_write('{name}', {from} page(s))")
                    } else {
                        format!("'{name}': the driver disables its memory (faults now SIGBUS)")
                    };
                    format!("{first}; unmap_mapping_range: i_mmap_lock_read")
                });
                s.pc = UnmapMappingPc::Walk;
                Flow::Call(RwSemDown::i_mmap(f, false))
            }
            UnmapMappingPc::Walk => {
                s.vmas = self.files[f as usize].i_mmap.clone();
                s.i = 0;
                s.walked = true;
                let n = s.vmas.len();
                self.summary(|| format!("vma_interval_tree_foreach: {n} VMA(s) in i_mmap"));
                s.pc = UnmapMappingPc::Zap;
                Flow::Next
            }
            UnmapMappingPc::Zap => {
                let Some(&(mm, vstart)) = s.vmas.get(s.i as usize) else {
                    self.summary(|| "every VMA of i_mmap zapped".into());
                    s.pc = UnmapMappingPc::Unlock;
                    return Flow::Next;
                };
                let Some((start, end)) = self.file_range(mm, vstart, f, s.from) else {
                    self.summary(|| {
                        format!("VMA mm{mm} {vstart:#x}: gone or nothing past the new size")
                    });
                    s.i += 1;
                    return Flow::Next;
                };
                let ptl = Loc::Ptl(mm, start / PTRS_PER_PT);
                if self.spin_trylock(env, cpu, ptl).is_none() {
                    return Flow::Spin(spin_key(ptl));
                }
                // tlb_gather_mmu(): inc_tlb_flush_pending().
                self.rmw(env, cpu, Loc::TlbFlushPending(mm), |n| n + 1);
                self.zap_migration_entries(mm, start, end - start);
                let mut frames = Vec::new();
                let n = self.zap_range(mm, start, end - start, Some(&mut frames), env);
                let t = &mut self.tasks[self.cpus[cpu].curr as usize];
                t.gathered = frames;
                t.zapped_before = self.oracle.now();
                self.spin_unlock(env, cpu, ptl);
                let name = self.files[f as usize].name.clone();
                self.summary(|| {
                    format!("unmap_mapping_range('{name}'): zap_page_range_single: {n} PTE(s) of mm{mm} from {start:#x}")
                });
                s.zapped = Some((mm, start, end));
                s.pc = UnmapMappingPc::Flushed;
                let pfnmap = self.files[f as usize].device_pfn.is_some();
                if n > 0 && pfnmap && self.opts.mutants.pfnmap_zap_skips_flush() {
                    return Flow::Next;
                }
                if n == 0 {
                    // tlb_finish_mmu(): nothing gathered, but another gather of the mm may
                    // have cleared these PTEs and still owe their flush.
                    if self.load(env, cpu, Loc::TlbFlushPending(mm)) <= 1 {
                        return Flow::Next;
                    }
                    self.say(|| "tlb_finish_mmu: mm_tlb_flush_nested: flush the range".into());
                } else {
                    self.say(|| "tlb_finish_mmu: flush_tlb_range".into());
                }
                Flow::Call(FlushMmRange::call(mm, start, end, false))
            }
            UnmapMappingPc::Flushed => {
                let (mm, start, end) = s.zapped.take().expect("a VMA zapped");
                let t = &mut self.tasks[self.cpus[cpu].curr as usize];
                let (mut frames, zapped) = (
                    std::mem::take(&mut t.gathered),
                    std::mem::take(&mut t.zapped_before),
                );
                if !s.freed_early.is_empty() {
                    frames.retain(|r| !s.freed_early.contains(&r.0));
                }
                self.free_user_frames(mm, start, end - start, zapped, frames);
                self.rmw(env, cpu, Loc::TlbFlushPending(mm), |n| n - 1);
                self.summary(|| {
                    "tlb_finish_mmu: free what was gathered; dec_tlb_flush_pending".into()
                });
                s.i += 1;
                s.pc = UnmapMappingPc::Zap;
                Flow::Next
            }
            UnmapMappingPc::Unlock => {
                self.rwsem_up_sem(cpu, SemId::IMmap(f), false, env);
                self.summary(|| "i_mmap_unlock_read".into());
                s.pc = if s.truncate && !s.pages_done {
                    UnmapMappingPc::TruncatePages
                } else {
                    UnmapMappingPc::Done
                };
                Flow::Next
            }
            UnmapMappingPc::TruncatePages => {
                let gone: Vec<(u64, u32)> = self.files[f as usize]
                    .pages
                    .range(s.from..)
                    .map(|(&o, &p)| (o, p))
                    .collect();
                let mut freed = Vec::new();
                for &(o, pfn) in &gone {
                    self.files[f as usize].cache_remove(o);
                    // A zap's mmu_gather still holding the page (its flush pending) frees it
                    // when it is done.
                    let gathered = self
                        .tasks
                        .iter()
                        .any(|t| t.gathered.iter().any(|&(p, n)| p <= pfn && pfn < p + n));
                    if !s.walked && self.opts.mutants.truncate_frees_mapped_pages() {
                        s.freed_early.push(pfn);
                        crate::page_alloc::push_run(&mut freed, pfn, 1);
                    } else if !gathered && !self.file_frame_mapped(f, pfn) {
                        crate::page_alloc::push_run(&mut freed, pfn, 1);
                    }
                }
                let n = freed.iter().map(|r| r.1 as u64).sum::<u64>();
                self.perf.counters.add(Counter::TruncatedPages, n);
                self.charge(env, |c| Time(c.page_free.0 * gone.len() as u64));
                let name = self.files[f as usize].name.clone();
                self.summary(|| {
                    format!("truncate_inode_pages('{name}'): {} page(s) out of the page cache, {n} freed", gone.len())
                });
                self.free_frames_checked(freed);
                s.pages_done = true;
                if !s.walked && self.opts.mutants.truncate_frees_mapped_pages() {
                    s.pc = UnmapMappingPc::Walk;
                    return Flow::Call(RwSemDown::i_mmap(f, false));
                }
                s.pc = UnmapMappingPc::Done;
                Flow::Next
            }
            UnmapMappingPc::Done => {
                // From here no CPU may reach the revoked pages through any mapping of the file.
                for &(mm, vstart) in &s.vmas {
                    if let Some((a, b)) = self.file_range(mm, vstart, f, s.from) {
                        self.oracle.syscall_returned(mm, a, b);
                    }
                }
                self.summary(|| "return".into());
                Flow::Return
            }
        }
    }
}

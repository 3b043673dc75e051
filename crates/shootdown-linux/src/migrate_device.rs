//! `migrate_vma_setup()` / `migrate_vma_pages()` / `migrate_vma_finalize()`
//! (mm/migrate_device.c; mm/migrate.c before v6.0): a device driver (HMM: nouveau, amdgpu,
//! Intel's Xe SVM) migrating a process's anonymous pages to other memory, with the process's
//! `mmap_lock` read-held.
//!
//! * **Collect** (`migrate_vma_collect_pmd`): under the PTL, each present PTE is replaced by a
//!   migration entry (a non-present PTE naming the page: `Mm::swap_ptes`), then the range is
//!   flushed. Until 60bae7370896 (2022) the flush came after `pte_unmap_unlock()`, so a
//!   racing `madvise(MADV_DONTNEED)` could find only non-present entries, flush nothing and
//!   return while a CPU still used the page (option `migrate_vma_flush`; from v5.19 an
//!   anon-exclusive page was flushed under the PTL by `ptep_clear_flush()`, not modelled: the
//!   `v5_18` form flushes every page after the unlock).
//! * **Copy** (`migrate_vma_pages`): a destination page per source page, the contents copied.
//! * **Finalize** (`remove_migration_ptes` + putback): under the PTL, each migration entry still
//!   there becomes a PTE of the new page; an entry a racing zap removed leaves the new page
//!   unused (freed). The source pages are freed (`INV-FREEPAGE` checked): any CPU still caching
//!   one could write a page that now belongs to someone else, and its writes would be lost to
//!   the copy.
//! * A fault on a migration entry waits for the migration (`migration_entry_wait`,
//!   `syscalls.rs`).
//!
//! Simplified: the destination is memory the CPU maps directly (system or device-coherent
//! memory); device-private destinations (non-present device entries, migrated back on a CPU
//! fault) are not modelled; `migrate_vma_unmap()`'s `try_to_migrate()` has nothing left to do
//! for the pages the collect step unmapped itself; file pages are skipped (anonymous VMAs only);
//! `flush_tlb_batched_pending()` is not run in the collect step.

use crate::counters::Counter;
use crate::frame::Flow;
use crate::machine::Machine;
use crate::mem::{spin_key, Loc};
use crate::options::MigrateVmaFlush;
use crate::sched::RwSemDown;
use crate::state::MmId;
use crate::tlb::FlushMmRange;
use shootdown_engine::{Env, Time};
use shootdown_hw::pagetable::{Vpn, PTRS_PER_PT};
use shootdown_hw::CpuId;

/// The steps of one driver migration.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MigrateVmaPc {
    /// The driver's ioctl entry; `mmap_read_lock()`.
    Start,
    /// `migrate_vma_collect_pmd()`: PTL, migration entries in, flush as the version does.
    Collect,
    /// The flush under the PTL returned: `pte_unmap_unlock()`.
    CollectUnlock,
    /// `migrate_vma_pages()`: allocate destinations and copy.
    Copy,
    /// `migrate_vma_finalize()`: PTL, restore the entries to the new pages, free the old.
    Finalize,
    /// `mmap_read_unlock()`; return.
    Done,
}

/// The state of one migration.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct MigrateVma {
    pub pc: MigrateVmaPc,
    pub start: Vpn,
    pub npages: u64,
    /// The pages collected: `(page, source frame, destination frame)` (0 until copied).
    pub pages: Vec<(Vpn, u32, u32)>,
    /// Oracle epoch after the collect step changed the PTEs.
    pub zapped_before: u64,
}

impl MigrateVma {
    pub fn new(start: Vpn, npages: u64) -> Self {
        MigrateVma {
            pc: MigrateVmaPc::Start,
            start,
            npages,
            pages: Vec::new(),
            zapped_before: 0,
        }
    }

    fn ptl(&self, mm: MmId) -> Loc {
        Loc::Ptl(mm, self.start / PTRS_PER_PT)
    }
}

impl Machine {
    /// `zap_pte_range()` clears non-present entries too: a migration entry goes without a
    /// flush (no CPU cached a translation from it).
    pub(crate) fn zap_migration_entries(&mut self, mm: MmId, start: Vpn, npages: u64) {
        let m = &mut self.mms[mm as usize];
        if !m.swap_ptes.is_empty() {
            m.swap_ptes.retain(|&v, _| v < start || v >= start + npages);
        }
    }

    /// One step of a driver's `migrate_vma` of `[start, start + npages)` of `mm`.
    pub(crate) fn migrate_vma_step<E: Env>(
        &mut self,
        cpu: CpuId,
        mm: MmId,
        s: &mut MigrateVma,
        env: &mut E,
    ) -> Flow {
        match s.pc {
            MigrateVmaPc::Start => {
                self.charge_interruptible(env, cpu, |c| c.syscall_entry_exit + c.unmap_base);
                self.summary(|| "migrate_vma_setup: mmap_read_lock".into());
                s.pc = MigrateVmaPc::Collect;
                Flow::Call(RwSemDown::call(mm, false))
            }
            MigrateVmaPc::Collect => {
                let ptl = s.ptl(mm);
                if self.spin_trylock(env, cpu, ptl).is_none() {
                    return Flow::Spin(spin_key(ptl));
                }
                for v in s.start..s.start + s.npages {
                    if self.vma_at(mm, v).is_some() {
                        continue;
                    }
                    let m = &mut self.mms[mm as usize];
                    let Some(pte) = m.space.ptes.get_mut(v).filter(|p| p.present) else {
                        continue;
                    };
                    let pfn = pte.pfn;
                    pte.present = false;
                    pte.writable = false;
                    self.oracle.pte_changed(pte);
                    m.swap_ptes.insert(v, pfn);
                    s.pages.push((v, pfn, 0));
                }
                s.zapped_before = self.oracle.now();
                let n = s.pages.len() as u64;
                self.charge(env, |c| Time(c.pte_update.0 * n));
                let st = s.start;
                self.summary(|| {
                    format!("migrate_vma_collect_pmd: {n} PTE(s) of mm{mm} from {st:#x} -> migration entries")
                });
                let flush = FlushMmRange::call(mm, s.start, s.start + s.npages, false);
                if n == 0 || self.opts.mutants.migrate_vma_skips_collect_flush() {
                    self.spin_unlock(env, cpu, ptl);
                    s.pc = MigrateVmaPc::Copy;
                    return Flow::Next;
                }
                match self.opts.migrate_vma_flush {
                    MigrateVmaFlush::Mainline => {
                        s.pc = MigrateVmaPc::CollectUnlock;
                        self.say(|| "flush_tlb_range with the PTL held".into());
                    }
                    MigrateVmaFlush::V5_18 => {
                        self.spin_unlock(env, cpu, ptl);
                        s.pc = MigrateVmaPc::Copy;
                        self.say(|| "pte_unmap_unlock; then flush_tlb_range".into());
                    }
                }
                Flow::Call(flush)
            }
            MigrateVmaPc::CollectUnlock => {
                self.spin_unlock(env, cpu, s.ptl(mm));
                self.summary(|| "pte_unmap_unlock".into());
                s.pc = MigrateVmaPc::Copy;
                Flow::Next
            }
            MigrateVmaPc::Copy => {
                for p in s.pages.iter_mut() {
                    p.2 = self.alloc_frame();
                }
                let n = s.pages.len() as u64;
                self.charge(env, |c| Time((c.page_alloc.0 + c.user_touch_page.0) * n));
                self.summary(|| format!("migrate_vma_pages: {n} page(s) copied to new frames"));
                s.pc = MigrateVmaPc::Finalize;
                Flow::Next
            }
            MigrateVmaPc::Finalize => {
                let ptl = s.ptl(mm);
                if self.spin_trylock(env, cpu, ptl).is_none() {
                    return Flow::Spin(spin_key(ptl));
                }
                let (mut restored, mut old, mut unused) = (0u64, Vec::new(), Vec::new());
                for &(v, src, dst) in &s.pages {
                    let m = &mut self.mms[mm as usize];
                    crate::page_alloc::push_run(&mut old, src, 1);
                    if m.swap_ptes.get(&v) != Some(&src) {
                        // A zap removed the entry meanwhile: the new page is not used.
                        crate::page_alloc::push_run(&mut unused, dst, 1);
                        continue;
                    }
                    m.swap_ptes.remove(&v);
                    let mut pte = m.space.pte(v);
                    // A non-present entry becomes present: an upgrade, no version bump.
                    pte.present = true;
                    pte.writable = true;
                    pte.pfn = dst;
                    m.space.ptes.insert(v, pte);
                    restored += 1;
                }
                self.spin_unlock(env, cpu, ptl);
                self.perf.counters.add(Counter::MigratedPages, restored);
                self.charge(env, |c| Time((c.pte_update.0 + c.page_free.0) * restored));
                self.summary(|| {
                    format!("migrate_vma_finalize: {restored} PTE(s) of mm{mm} restored to the new frames; free the old")
                });
                for (pfn, n) in unused {
                    self.free_frames.insert(pfn, n);
                }
                self.free_user_frames(mm, s.start, s.npages, s.zapped_before, old);
                s.pc = MigrateVmaPc::Done;
                Flow::Next
            }
            MigrateVmaPc::Done => {
                self.rwsem_up(cpu, mm, false, env);
                self.oracle
                    .syscall_returned(mm, s.start, s.start + s.npages);
                self.summary(|| "mmap_read_unlock; return".into());
                Flow::Return
            }
        }
    }
}

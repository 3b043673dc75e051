//! mm system calls and the page-fault handler: `madvise(MADV_DONTNEED)` (zap_page_range +
//! tlb_finish_mmu), `munmap` (unmap_region: zap, free_pgtables, flush with `freed_tables`, then
//! free), `mmap`, `mprotect` (change_protection + flush_tlb_range), `fdatasync` on a DAX file
//! (dax_writeback_mapping_range: per dirty page `pfn_mkclean` = write-protect + flush of that
//! page), reclaim's batched unmap (`try_to_unmap` with TTU_BATCH_FLUSH + `arch_tlbbatch_flush`),
//! and `sched_setaffinity`.
//!
//! Simplifications: a range zap is one atomic step (it runs under the page-table lock);
//! pages are freed at the cost of `page_free` each with no allocator model; page tables are freed
//! only when the unmapped range covers a whole page-table page.

use crate::counters::Counter;
use crate::frame::{Flow, FlushMmRange, Frame, Syscall};
use crate::machine::Machine;
use crate::mem::{
    misc_line, spin_key, struct_file_line, Loc, LINE_JBD2_STATE_LOCK, LINE_JBD2_TRANSACTION,
};
use crate::state::*;
use shootdown_engine::Env;
use shootdown_hw::pagetable::{Vpn, PTRS_PER_PT};
use shootdown_hw::CpuId;

impl Machine {
    fn current_mm(&self, cpu: CpuId) -> MmId {
        self.tasks[self.cpus[cpu].curr as usize]
            .mm
            .expect("user task has an mm")
    }

    fn flush_frame(mm: MmId, start: Vpn, end: Vpn, freed_tables: bool) -> Frame {
        Frame::FlushMmRange(Box::new(FlushMmRange {
            pc: 0,
            mm,
            info: FlushTlbInfo {
                mm: Some(mm),
                start,
                end,
                new_tlb_gen: 0,
                freed_tables,
                trim_cpumask: false,
                initiator: 0,
            },
            begin: 0,
            batch_targets: None,
        }))
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

    /// Clear every present PTE in the range (a downgrade: bumps versions). Returns how many.
    fn zap_range<E: Env>(&mut self, mm: MmId, start: Vpn, npages: u64, env: &mut E) -> u64 {
        let mut n = 0;
        let m = &mut self.mms[mm as usize];
        let keys: Vec<Vpn> = m
            .space
            .ptes
            .range(start..start + npages)
            .filter(|(_, p)| p.present)
            .map(|(v, _)| *v)
            .collect();
        for v in keys {
            let pte = m.space.ptes.get_mut(&v).expect("listed");
            pte.present = false;
            pte.writable = false;
            self.oracle.pte_changed(pte);
            n += 1;
        }
        self.charge(env, |c| {
            shootdown_engine::Time((c.pte_update.0 + c.page_free.0) * n)
        });
        n
    }

    pub(crate) fn syscall_step<E: Env>(
        &mut self,
        cpu: CpuId,
        s: &mut Syscall,
        env: &mut E,
    ) -> Flow {
        let mm = self.current_mm(cpu);
        match s {
            Syscall::PageFault { pc, vpn, write } => match *pc {
                0 => {
                    self.charge_interruptible(env, cpu, |c| c.page_fault_entry_exit);
                    self.perf.counters.inc(Counter::PageFaults);
                    *pc = 1;
                    Flow::Call(Frame::RwSemDown {
                        pc: 0,
                        mm,
                        write: false,
                    })
                }
                1 | 5 | 6 => {
                    let (vpn, write) = (*vpn, *write);
                    let dax = self.dax_file_of(mm, vpn);
                    if let (Some(f), true, true) = (dax, write, *pc != 6) {
                        if *pc == 1 {
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
                        *pc = 5;
                        if let Some(spin) = self.xa_lock(env, cpu, f) {
                            return spin;
                        }
                        *pc = 6;
                        return Flow::Next;
                    }
                    if *pc == 6 {
                        self.spin_unlock(env, cpu, Loc::XaLock(dax.expect("locked a DAX file")));
                    }
                    self.ensure_table(mm, vpn);
                    let mut pte = self.mms[mm as usize].space.pte(vpn);
                    if !pte.present {
                        self.charge(env, |c| c.page_alloc + c.page_zero + c.pte_update);
                        self.next_pfn += 1;
                        pte.pfn = self.next_pfn;
                        pte.present = true;
                        pte.writable = write || dax.is_none();
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
                    // The faulting access invalidated this CPU's entry for the address.
                    let asid = self.cpus[cpu].tlbstate.loaded_mm_asid;
                    let (kp, up) = (self.kern_pcid(asid), self.user_pcid(asid));
                    let tlb = &mut self.cpus[cpu].tlb;
                    if tlb.lookup(up, vpn).is_some() {
                        tlb.invlpg(up, vpn);
                    }
                    if kp != up && tlb.lookup(kp, vpn).is_some() {
                        tlb.invlpg(kp, vpn);
                    }
                    self.say(|| {
                        format!(
                            "fault on mm{mm} page {vpn:#x}: map it{}",
                            if write { " writable" } else { "" }
                        )
                    });
                    *pc = 2;
                    Flow::Next
                }
                _ => {
                    self.rwsem_up(cpu, mm, false, env);
                    Flow::Return
                }
            },
            Syscall::Madvise { pc, start, npages } => match *pc {
                0 => {
                    self.charge(env, |c| c.syscall_entry_exit + c.unmap_base);
                    *pc = 1;
                    Flow::Call(Frame::RwSemDown {
                        pc: 0,
                        mm,
                        write: false,
                    })
                }
                1 => {
                    let n = self.zap_range(mm, *start, *npages, env);
                    let st = *start;
                    self.say(|| format!("zap {n} PTEs of mm{mm} from {st:#x}"));
                    *pc = 2;
                    Flow::Call(Self::flush_frame(mm, *start, *start + *npages, false))
                }
                _ => {
                    self.rwsem_up(cpu, mm, false, env);
                    Flow::Return
                }
            },
            Syscall::Munmap { pc, start, npages } => match *pc {
                0 => {
                    self.charge(env, |c| c.syscall_entry_exit + c.unmap_base);
                    *pc = 1;
                    Flow::Call(Frame::RwSemDown {
                        pc: 0,
                        mm,
                        write: true,
                    })
                }
                1 => {
                    let (start, npages) = (*start, *npages);
                    self.zap_range(mm, start, npages, env);
                    // free_pgtables(): unlink page-table pages the range covers entirely.
                    let first = start.div_ceil(PTRS_PER_PT);
                    let last = (start + npages) / PTRS_PER_PT;
                    let m = &mut self.mms[mm as usize];
                    for idx in first..last {
                        if let Some(t) = m.space.pmd.remove(&idx) {
                            m.tables_to_free.push(t);
                        }
                    }
                    let freed = !m.tables_to_free.is_empty();
                    if freed && self.opts.mutants.free_tables_before_flush {
                        // N1: tlb_remove_table_one() after a failed batch allocation: a "sync"
                        // IPI that invalidates nothing, then the table is freed at once.
                        for t in std::mem::take(&mut self.mms[mm as usize].tables_to_free) {
                            self.pt_pages.free(t);
                        }
                    }
                    self.say(|| {
                        format!(
                            "zap mm{mm} pages {start:#x}..{:#x}; unlink page tables: {freed}",
                            start + npages
                        )
                    });
                    *pc = 2;
                    Flow::Call(Self::flush_frame(mm, start, start + npages, freed))
                }
                _ => {
                    let tables = std::mem::take(&mut self.mms[mm as usize].tables_to_free);
                    for t in &tables {
                        self.pt_pages.free(*t);
                        self.charge(env, |c| c.pgtable_free);
                    }
                    if !tables.is_empty() {
                        self.say(|| format!("free {} page-table page(s) of mm{mm}", tables.len()));
                    }
                    self.rwsem_up(cpu, mm, true, env);
                    Flow::Return
                }
            },
            Syscall::Mmap { pc } => match *pc {
                0 => {
                    self.charge(env, |c| c.syscall_entry_exit);
                    *pc = 1;
                    Flow::Call(Frame::RwSemDown {
                        pc: 0,
                        mm,
                        write: true,
                    })
                }
                _ => {
                    self.charge(env, |c| c.mmap_syscall);
                    self.rwsem_up(cpu, mm, true, env);
                    Flow::Return
                }
            },
            Syscall::Mprotect {
                pc,
                start,
                npages,
                writable,
            } => match *pc {
                0 => {
                    self.charge(env, |c| c.syscall_entry_exit + c.unmap_base);
                    *pc = 1;
                    Flow::Call(Frame::RwSemDown {
                        pc: 0,
                        mm,
                        write: true,
                    })
                }
                1 => {
                    let m = &mut self.mms[mm as usize];
                    let mut changed = 0u64;
                    for (_, pte) in m.space.ptes.range_mut(*start..*start + *npages) {
                        if !pte.present {
                            continue;
                        }
                        if *writable {
                            pte.writable = true;
                        } else if pte.writable {
                            pte.writable = false;
                            self.oracle.pte_changed(pte);
                            changed += 1;
                        }
                    }
                    self.charge(env, |c| shootdown_engine::Time(c.pte_update.0 * changed));
                    *pc = 2;
                    Flow::Call(Self::flush_frame(mm, *start, *start + *npages, false))
                }
                _ => {
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
                0 => {
                    self.charge_interruptible(env, cpu, |c| c.syscall_entry_exit);
                    if *msync {
                        // msync(): find the VMA under mmap_sem held for read (pc 9).
                        *pc = 9;
                        return Flow::Call(Frame::RwSemDown {
                            pc: 0,
                            mm,
                            write: false,
                        });
                    }
                    // ext4_sync_file(): the fixed part (jbd2 checks, blkdev_issue_flush) is
                    // fsync_base; the writeback of dirty entries follows.
                    self.charge_interruptible(env, cpu, |c| c.fsync_base);
                    *pc = 3;
                    Flow::Next
                }
                9 => {
                    // msync() with MS_SYNC on a shared file mapping: find_vma() (a vmacache
                    // hit, folded into the syscall cost), get_file(), drop mmap_sem, then
                    // vfs_fsync_range(datasync=1) = ext4_sync_file() as for fdatasync().
                    // MS_INVALIDATE only checks VM_LOCKED.
                    self.atomic_on_line(env, cpu, struct_file_line(*file));
                    self.rwsem_up(cpu, mm, false, env);
                    self.charge_interruptible(env, cpu, |c| c.fsync_base);
                    *pc = 3;
                    Flow::Next
                }
                3 => {
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
                    *pc = 4;
                    Flow::Next
                }
                4 => {
                    self.spin_unlock(env, cpu, Loc::XaLock(*file));
                    *pc = 1;
                    Flow::Next
                }
                5 | 7 => {
                    // dax_writeback_one(): lock the entry (5) and later clear its tags and
                    // unlock it (7), each under xa_lock_irq(&mapping->i_pages).
                    if let Some(spin) = self.xa_lock(env, cpu, *file) {
                        return spin;
                    }
                    *pc += 1;
                    Flow::Next
                }
                6 => {
                    self.spin_unlock(env, cpu, Loc::XaLock(*file));
                    *pc = 2;
                    Flow::Next
                }
                8 => {
                    self.spin_unlock(env, cpu, Loc::XaLock(*file));
                    *pc = 1;
                    Flow::Next
                }
                1 => {
                    if todo.get(*i).is_none() {
                        if *msync {
                            // fput(); the whole file was one range, so no second lookup.
                            self.atomic_on_line(env, cpu, struct_file_line(*file));
                        }
                        return Flow::Return;
                    }
                    *pc = 5;
                    Flow::Next
                }
                10 => {
                    // dax_flush(): the cache-line writeback of the entry, after the mkclean and
                    // with interrupts on; then back to xa_lock to clear the tags (pc 7).
                    self.charge_interruptible(env, cpu, |c| c.dax_writeback_page);
                    *pc = 7;
                    Flow::Next
                }
                _ => {
                    // dax_entry_mkclean() write-protects the entry and flushes it from every CPU
                    // running the mm; then the writeback (pc 10).
                    let v = todo[*i];
                    *i += 1;
                    *pc = 10;
                    let m = &mut self.mms[mm as usize];
                    let Some(pte) = m.space.ptes.get_mut(&v) else {
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
                    Flow::Call(Self::flush_frame(mm, v, v + 1, false))
                }
            },
            Syscall::ReclaimUnmap {
                pc,
                start,
                npages,
                targets,
                begin,
            } => match *pc {
                0 => {
                    // try_to_unmap_one() ×n: clear PTEs, arch_tlbbatch_add_pending(): bump
                    // tlb_gen and accumulate mm_cpumask into the batch.
                    self.zap_range(mm, *start, *npages, env);
                    self.rmw(env, cpu, Loc::TlbGen(mm), |g| g + 1);
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
                    *pc = 1;
                    Flow::Next
                }
                1 => {
                    *begin = self.oracle.flush_begin();
                    *pc = 2;
                    Flow::Call(Frame::FlushMmRange(Box::new(FlushMmRange {
                        pc: 0,
                        mm,
                        info: FlushTlbInfo {
                            mm: None,
                            start: 0,
                            end: TLB_FLUSH_ALL,
                            new_tlb_gen: TLB_GENERATION_INVALID,
                            freed_tables: false,
                            trim_cpumask: false,
                            initiator: cpu,
                        },
                        begin: *begin,
                        batch_targets: Some(targets.clone()),
                    })))
                }
                _ => {
                    self.oracle
                        .flush_returned(mm, Some((*start, *start + *npages)), *begin);
                    Flow::Return
                }
            },
            Syscall::SetAffinity { pc, cpu: target } => match *pc {
                0 => {
                    self.charge(env, |c| c.syscall_entry_exit + c.sched_setaffinity);
                    self.perf.counters.inc(Counter::Migrations);
                    let me = self.cpus[cpu].curr;
                    let target = *target;
                    self.tasks[me as usize].cpu = target;
                    if target == cpu {
                        return Flow::Return;
                    }
                    // Move ourselves: queue on the target, wake it, switch away here.
                    self.tasks[me as usize].state = TaskState::Runnable;
                    self.cpus[target].runqueue.push_back(me);
                    self.kick_cpu(cpu, target, env);
                    self.say(|| format!("migrate to cpu{target}"));
                    *pc = 1;
                    Flow::Call(self.schedule_frame())
                }
                _ => Flow::Return,
            },
        }
    }
}

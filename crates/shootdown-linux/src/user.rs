//! User mode and the hardware's side of a memory access: the task's next operation, the TLB
//! lookup / page walk / fill on every access (each checked by the oracle), speculative fills by
//! the page walker, and PTI's deferred user-PCID flush on return to user.

use crate::counters::Counter;
use crate::frame::Frame;
use crate::kvm::Exit;
use crate::machine::Machine;
use crate::mem::{tlbstate_line, TLBSTATE_USER_PCID_FLUSH_MASK_OFFSET};
use crate::state::*;
use crate::syscalls::{
    FdatasyncPc, Gather, MmapPc, PageFaultPc, ReclaimUnmapPc, SetAffinityPc, Syscall, ZapPc,
};
use shootdown_engine::trace::TraceEvent;
use shootdown_engine::{Env, Park, Time, Violation};
use shootdown_hw::ept::EptWalk;
use shootdown_hw::pagetable::{pt_index, Vpn, Walk, PTRS_PER_PT};
use shootdown_hw::tlb::{EptUse, TlbEntry};
use shootdown_hw::CpuId;

/// A fresh `fdatasync()` (or, with `msync`, `msync(MS_SYNC)` of its whole mapping) frame for DAX
/// file `file`.
fn fdatasync(file: u32, msync: bool) -> Syscall {
    Syscall::Fdatasync {
        pc: FdatasyncPc::Start,
        file,
        msync,
        todo: Vec::new(),
        i: 0,
    }
}

/// Why an access did not complete.
pub(crate) enum Fault {
    /// The guest's page-fault handler must run.
    PageFault,
    /// The second stage stops it: a VM exit to KVM.
    Exit(Exit),
}

impl Machine {
    /// Walk `vpn` for `cpu` under `pcid` in `mm`: paging-structure cache first, then the PMD.
    /// A walk through a freed page-table page is an `INV-PTFREE` violation. The leaf found,
    /// and whether it is a PMD leaf (a 2 MiB translation).
    fn walk<E: Env>(
        &mut self,
        cpu: CpuId,
        mm: MmId,
        pcid: u16,
        vpn: Vpn,
        env: &mut E,
    ) -> Option<(shootdown_hw::pagetable::Pte, bool)> {
        let space = &self.mms[mm as usize].space;
        let walk = match self.cpus[cpu].tlb.psc_lookup(pcid, pt_index(vpn)) {
            Some(table) => self.pt_pages.walk_table(space, table, vpn),
            None => self.pt_pages.walk(space, vpn),
        };
        match walk {
            Walk::NoTable => None,
            Walk::FreedTable(t) => {
                self.violate(Violation {
                    invariant: "INV-PTFREE",
                    detail: format!(
                        "cpu{cpu} walked mm{mm} page {vpn:#x} through freed page-table page #{t}"
                    ),
                });
                None
            }
            Walk::Leaf { table, pte } => {
                self.cpus[cpu].tlb.psc_insert(pcid, pt_index(vpn), table);
                let _ = env;
                Some((pte, false))
            }
            Walk::Huge { pte } => Some((pte, true)),
        }
    }

    /// The PCID an access of the current task uses: user mode's, or the kernel's for a kernel
    /// thread's uaccess (`kthread_use_mm`).
    fn access_pcid(&self, cpu: CpuId) -> u16 {
        let asid = self.cpus[cpu].tlbstate.loaded_mm_asid;
        if self.tasks[self.cpus[cpu].curr as usize].kthread {
            self.kern_pcid(asid)
        } else {
            self.user_pcid(asid)
        }
    }

    /// One user access by the current task: TLB hit (checked by the oracle) or miss + walk +
    /// fill; `Err(PageFault)` when the page-fault handler must run. On a vCPU whose VM has a
    /// KVM MMU the walk goes on through the EPT (its paging-structure cache first) and the
    /// entry cached is a combined one; a missing or MMIO SPTE is a VM exit (`Err(Exit)`).
    pub(crate) fn user_access<E: Env>(
        &mut self,
        cpu: CpuId,
        vpn: Vpn,
        access: Access,
        env: &mut E,
    ) -> Result<(), Fault> {
        let task = self.cpus[cpu].curr;
        let mm = self.tasks[task as usize].mm.expect("user task");
        if self.cpus[cpu].cr3_mm != mm {
            self.violate(Violation {
                invariant: "INV-CTX",
                detail: format!(
                    "cpu{cpu} ran a task of mm{mm} with CR3 = mm{}",
                    self.cpus[cpu].cr3_mm
                ),
            });
            return Ok(());
        }
        self.perf.cpu[cpu].last_user_vpn = Some(vpn);
        let pcid = self.access_pcid(cpu);
        self.access_through_cr3(cpu, mm, pcid, vpn, access, env)
    }

    /// The hardware's side of an access to `vpn` of `mm` (CR3's) under `pcid`: TLB hit
    /// (checked by the oracle) or miss + walk + fill. User mode's accesses and the kernel's
    /// uaccess (an NMI's `__get_user`) share it.
    pub(crate) fn access_through_cr3<E: Env>(
        &mut self,
        cpu: CpuId,
        mm: MmId,
        pcid: u16,
        vpn: Vpn,
        access: Access,
        env: &mut E,
    ) -> Result<(), Fault> {
        let write = access.is_write();
        let hit = self.cpus[cpu].tlb.lookup(pcid, vpn);
        // A combined entry that lacks the permission is not used: the access walks (and a
        // fetch through a non-executable EPT leaf exits). No iTLB/dTLB split is modelled.
        let lacks_permission = |e: &TlbEntry| {
            e.ept
                .is_some_and(|u| !access.allowed_by(e.writable, u.exec))
        };
        // A write through an entry that cached the EPT leaf's D bit clear walks again, for the
        // A/D assist to set it (and, with PML, log the write).
        let needs_dirty_assist = |e: &TlbEntry| {
            write && e.writable && e.ept.is_some_and(|u| self.opts.ept_ad && !u.dirty)
        };
        if let Some(e) = hit.filter(|e| !lacks_permission(e) && !needs_dirty_assist(e)) {
            if write && !e.writable {
                self.cpus[cpu].tlb.invlpg(pcid, vpn);
                return Err(Fault::PageFault);
            }
            let pte = self.mms[e.mm as usize].space.leaf(vpn, e.huge);
            self.perf.uses_checked += 1;
            if let Err(v) = self.oracle.check_use(mm, e.mm, vpn, e.version, &pte) {
                self.violate(v);
            }
            if let Some(u) = &e.ept {
                let vm = self.vm_of(cpu);
                if let Err(v) = self.oracle.check_ept_use(vm, vpn, u, &self.ept) {
                    self.violate(v);
                }
                self.check_address_space(cpu, u, None);
                if write {
                    let gfn = u.gfn;
                    self.note_guest_write(cpu, gfn);
                }
            }
            self.say(|| {
                format!(
                    "user access mm{mm} page {vpn:#x}: TLB hit (PTE version {}{})",
                    e.version,
                    e.ept
                        .map(|u| format!(", SPTE version {}", u.version))
                        .unwrap_or_default()
                )
            });
            return Ok(());
        }
        self.charge(env, |c| c.tlb_miss_walk);
        self.perf.counters.inc(Counter::TlbMisses);
        if self.shadow_paging(cpu) {
            return self.shadow_translate(cpu, mm, pcid, vpn, access, env);
        }
        let Some((pte, huge)) = self.walk(cpu, mm, pcid, vpn, env) else {
            return Err(Fault::PageFault);
        };
        if !pte.present || (write && !pte.writable) {
            return Err(Fault::PageFault);
        }
        let (ept, writable) = if self.has_kvm_mmu(cpu) {
            let (u, w) = self.ept_translate(cpu, pte.pfn as u64, access)?;
            (Some(u), pte.writable && w)
        } else {
            (None, pte.writable)
        };
        let victim = env.random(u64::MAX);
        self.cpus[cpu].tlb.insert(
            pcid,
            vpn,
            TlbEntry {
                pfn: pte.pfn,
                writable,
                global: false,
                mm,
                version: pte.version,
                ept,
                // Simplification: a combined mapping takes the guest leaf's size, whatever
                // the EPT leaf's (its EPT use is the accessed page's).
                huge,
            },
            victim,
        );
        self.perf.uses_checked += 1;
        if let Some(u) = ept.filter(|_| write) {
            self.note_guest_write(cpu, u.gfn);
        }
        self.say(|| {
            format!(
                "user access mm{mm} page {vpn:#x}: walk, fill TLB (PTE version {}{})",
                pte.version,
                ept.map(|u| format!(", gfn {:#x}, SPTE version {}", u.gfn, u.version))
                    .unwrap_or_default()
            )
        });
        Ok(())
    }

    /// The second stage of a vCPU's walk: guest frame `gfn` through the EPT of its root (from
    /// a table its EPT paging-structure cache holds, if any). A walk through a freed EPT page is
    /// `INV-PTFREE`; a missing SPTE (or a read-only one, written) is an EPT violation, an MMIO
    /// SPTE an EPT misconfiguration.
    fn ept_translate(
        &mut self,
        v: CpuId,
        gfn: u64,
        access: Access,
    ) -> Result<(EptUse, bool), Fault> {
        let root = self.host_ref().vcpus[v]
            .root
            .expect("a vCPU in the guest has a root");
        let start = self.cpus[v]
            .tlb
            .ept_psc_lookup(gfn)
            .map_or(root, |(_, sp)| sp);
        match self.ept.walk_from(start, gfn) {
            EptWalk::FreedTable(sp) => {
                self.violate(Violation {
                    invariant: "INV-PTFREE",
                    detail: format!("vcpu{v} walked gfn {gfn:#x} through freed EPT page #{sp}"),
                });
                Err(Fault::Exit(Exit::EptViolation {
                    gfn,
                    access,
                    present: false,
                }))
            }
            EptWalk::NotPresent { .. } => Err(Fault::Exit(Exit::EptViolation {
                gfn,
                access,
                present: false,
            })),
            EptWalk::Mmio { .. } => Err(Fault::Exit(Exit::EptMisconfig { gfn })),
            EptWalk::Leaf {
                sp,
                idx,
                level,
                spte,
            } => {
                let shootdown_hw::ept::SpteKind::Leaf {
                    pfn,
                    writable,
                    exec,
                    dirty,
                    access_tracked,
                    ..
                } = spte.kind
                else {
                    unreachable!("a leaf walk ends at a leaf")
                };
                if access_tracked {
                    // R/W/X clear: to the CPU the entry is not present.
                    return Err(Fault::Exit(Exit::EptViolation {
                        gfn,
                        access,
                        present: false,
                    }));
                }
                if !access.allowed_by(writable, exec) {
                    // The exit's "present" bits matter to KVM for a write only (the fast
                    // path); other accesses keep them clear, so as not to split states.
                    return Err(Fault::Exit(Exit::EptViolation {
                        gfn,
                        access,
                        present: access.is_write(),
                    }));
                }
                self.cpus[v].tlb.ept_psc_insert(level, gfn, sp);
                if access.is_write() {
                    self.ept_write_assist(v, sp, idx, gfn);
                }
                let filled = self.oracle.now();
                let u = EptUse {
                    gfn,
                    sp,
                    idx,
                    version: spte.version,
                    filled,
                    exec,
                    dirty: self.opts.ept_ad && (dirty || access.is_write()),
                };
                let host_pfn = pfn + gfn % shootdown_hw::ept::gfns_per_entry(level);
                self.check_address_space(v, &u, Some(host_pfn));
                Ok((u, writable))
            }
        }
    }

    /// The hardware's walk with shadow paging (EPT off): not the guest's page tables but
    /// KVM's shadow of them, from the vCPU's root (the guest CR3's shadow page). A leaf that
    /// allows the access fills the TLB with what KVM built it from (the guest PTE's version,
    /// checked by the oracle like any fill); otherwise the #PF exits to KVM, which reads the
    /// guest's own tables (`FNAME(walk_addr)`): a guest PTE that allows the access is a shadow
    /// fault for KVM to fix (`Exit::ShadowPageFault`), else KVM injects the #PF and the
    /// guest's handler runs (`Err(PageFault)`, the exit paid).
    fn shadow_translate<E: Env>(
        &mut self,
        cpu: CpuId,
        mm: MmId,
        pcid: u16,
        vpn: Vpn,
        access: Access,
        env: &mut E,
    ) -> Result<(), Fault> {
        let root = self.host_ref().vcpus[cpu]
            .root
            .expect("a vCPU in the guest has a root");
        let vm = self.vm_of(cpu);
        if let EptWalk::Leaf { sp, idx, spte, .. } = self.ept.walk_from(root, vpn) {
            let shootdown_hw::ept::SpteKind::Leaf { writable, .. } = spte.kind else {
                unreachable!("a leaf walk ends at a leaf")
            };
            if access.allowed_by(writable, true) {
                let l = &self.kvm(vm).shadow.leaves[&sp];
                let sh = l.gptes[&idx];
                let huge = l.table.is_none();
                if !sh.accessed {
                    // The walk sets the SPTE's accessed bit (a locked write of the entry; its
                    // translation stays, so a TLB entry from it is as current as before).
                    self.leaf_sp_mut(vm, sp)
                        .gptes
                        .get_mut(&idx)
                        .expect("a record of the SPTE")
                        .accessed = true;
                }
                let pfn = if huge {
                    sh.gfn - vpn % PTRS_PER_PT
                } else {
                    sh.gfn
                };
                let u = EptUse {
                    gfn: sh.gfn,
                    sp,
                    idx,
                    version: spte.version,
                    filled: self.oracle.now(),
                    exec: true,
                    dirty: false,
                };
                let victim = env.random(u64::MAX);
                self.cpus[cpu].tlb.insert(
                    pcid,
                    vpn,
                    TlbEntry {
                        pfn: pfn as u32,
                        writable,
                        global: false,
                        mm,
                        version: sh.version,
                        ept: Some(u),
                        huge,
                    },
                    victim,
                );
                self.perf.uses_checked += 1;
                let pte = self.mms[mm as usize].space.leaf(vpn, huge);
                if let Err(v) = self.oracle.check_use(mm, mm, vpn, sh.version, &pte) {
                    self.violate(v);
                }
                if access.is_write() {
                    self.note_guest_write(cpu, sh.gfn);
                }
                self.say(|| {
                    format!(
                        "user access mm{mm} page {vpn:#x}: walk the shadow page tables, fill TLB (shadow page #{sp} entry {idx}, built from guest PTE version {})",
                        sh.version
                    )
                });
                return Ok(());
            }
        }
        match self.fname_walk_addr(mm, vpn, access) {
            crate::kvm::mmu::paging_tmpl::GuestWalk::Mapped { .. } => {
                Err(Fault::Exit(Exit::ShadowPageFault { vpn, access }))
            }
            crate::kvm::mmu::paging_tmpl::GuestWalk::Fault => {
                // The #PF exits (the exception bitmap intercepts it without EPT); KVM's walk
                // finds the guest's tables do not allow the access and injects it
                // (kvm_inject_emulated_page_fault: for a protection fault, first
                // kvm_mmu_invalidate_gva, against a stale SPTE looping the fault).
                self.vm_exit(env);
                self.charge(env, |c| c.ept_violation);
                let protection = self.mms[mm as usize].space.pte(vpn).present;
                let what = if protection {
                    format!(
                        "; kvm_mmu_invalidate_gva: {}",
                        self.kvm_mmu_invalidate_gva(cpu, vpn, env)
                    )
                } else {
                    String::new()
                };
                self.say(|| {
                    format!("user access mm{mm} page {vpn:#x}: no shadow translation; #PF VM exit, FNAME(walk_addr): the guest PTE does not allow it: inject the #PF{what}")
                });
                Err(Fault::PageFault)
            }
        }
    }

    /// The current task's access was completed by KVM (emulated MMIO): its op moves on as if
    /// the access had been made.
    pub(crate) fn complete_user_access<E: Env>(&mut self, cpu: CpuId, env: &mut E) {
        let t = self.cpus[cpu].curr as usize;
        let op = self.tasks[t]
            .program
            .get(self.tasks[t].pc as usize)
            .copied();
        let _ = env;
        match op {
            Some(UserOp::Touch { .. } | UserOp::Exec { .. }) => self.tasks[t].pc += 1,
            Some(
                UserOp::TouchRange { npages, .. }
                | UserOp::TouchRandomBlock { npages, .. }
                | UserOp::FileioExec { npages, .. },
            ) => self.advance_multi(t, npages),
            Some(UserOp::TouchRegions { regions, .. }) => {
                self.tasks[t].op_started = None;
                self.advance_multi(t, regions);
            }
            _ => {}
        }
    }

    /// One page of a multi-page access op done: the next, or the op after it.
    fn advance_multi(&mut self, t: usize, npages: u64) {
        let task = &mut self.tasks[t];
        task.op_progress += 1;
        if task.op_progress >= npages {
            task.op_progress = 0;
            task.op_base = None;
            task.pc += 1;
        }
    }

    /// Would a speculative fill of `vpn` through `cpu`'s CR3 change anything?
    pub(crate) fn fill_would_change(&self, cpu: CpuId, vpn: Vpn) -> bool {
        if self.shadow_paging(cpu) {
            // The page walker reads KVM's shadow tables, not the guest's: not modelled.
            return false;
        }
        let c = &self.cpus[cpu];
        let pcid = self.fill_pcid(cpu);
        if c.tlb.lookup(pcid, vpn).is_some() {
            return false;
        }
        let space = &self.mms[c.cr3_mm as usize].space;
        let walk = match c.tlb.psc_lookup(pcid, pt_index(vpn)) {
            Some(t) => self.pt_pages.walk_table(space, t, vpn),
            None => self.pt_pages.walk(space, vpn),
        };
        match walk {
            Walk::NoTable => false,
            Walk::FreedTable(_) => true,
            Walk::Leaf { pte, .. } | Walk::Huge { pte } => pte.present,
        }
    }

    fn fill_pcid(&self, cpu: CpuId) -> u16 {
        let c = &self.cpus[cpu];
        let user_mode = !self.is_idle(cpu)
            && c.irq_stack.is_empty()
            && self.tasks[c.curr as usize].stack.is_empty();
        if user_mode {
            self.access_pcid(cpu)
        } else {
            c.cr3_pcid
        }
    }

    /// The page walker caches a translation nobody asked for, through whatever CR3 is loaded —
    /// including a lazy CPU's (docs/design/kernel-model.md §1.1: fills are asynchronous and speculative).
    pub(crate) fn speculative_fill<E: Env>(&mut self, cpu: CpuId, vpn: Vpn, env: &mut E) {
        let mm = self.cpus[cpu].cr3_mm;
        let pcid = self.fill_pcid(cpu);
        self.say(|| format!("page walker: speculative fill of mm{mm} page {vpn:#x} (PCID {pcid})"));
        if let Some((pte, huge)) = self.walk(cpu, mm, pcid, vpn, env) {
            if pte.present {
                self.cpus[cpu].tlb.insert(
                    pcid,
                    vpn,
                    TlbEntry {
                        pfn: pte.pfn,
                        writable: pte.writable,
                        global: false,
                        mm,
                        version: pte.version,
                        ept: None,
                        huge,
                    },
                    0,
                );
            }
        }
    }

    /// Count one workload event (the metric; `shootdown profile`'s unit), and, from the start
    /// of the measurement, when it happened.
    pub(crate) fn count_event<E: Env>(&mut self, env: &E) {
        self.perf.counters.inc(Counter::Events);
        if env.now() >= self.perf.measure_from {
            self.perf.events_measured += 1;
            self.perf.first_event_at.get_or_insert(env.now());
            self.perf.last_event_at = env.now();
        }
    }

    /// `SWITCH_TO_USER_CR3` (arch/x86/entry/calling.h): if the user PCID's bit is set in
    /// `user_pcid_flush_mask`, clear it and load the user CR3 without NOFLUSH, flushing the
    /// whole user PCID. With in-context flushes (`pti_user_flush = "deferred"`, the RFC's
    /// `SWITCH_TO_USER_CR3 has_stack=1`) a recorded range is flushed instead: the user CR3
    /// with NOFLUSH, then an INVLPG per page in the user PCID, then `lfence`. Simplified: the
    /// return paths without a stack (`SWITCH_TO_USER_CR3_NOSTACK`, which always flush the
    /// whole PCID) are not told apart; the range is reset once flushed (the kernel leaves it
    /// for the next first deferral to overwrite: no state differs in what it flushes).
    fn switch_to_user_cr3<E: Env>(&mut self, cpu: CpuId, env: &mut E) {
        let asid = self.cpus[cpu].tlbstate.loaded_mm_asid;
        let ts = &mut self.cpus[cpu].tlbstate;
        if ts.user_pcid_flush_mask & (1 << asid) == 0 {
            // The user CR3 with NOFLUSH: with shadow paging, an exit all the same.
            if self.pti {
                self.kvm_shadow_cr3_load(cpu, false, env);
            }
            return;
        }
        ts.user_pcid_flush_mask &= !(1 << asid);
        let (start, end, stride) = (
            ts.user_flush_start,
            ts.user_flush_end,
            ts.user_flush_stride_shift,
        );
        (
            ts.user_flush_start,
            ts.user_flush_end,
            ts.user_flush_stride_shift,
        ) = (0, TLB_FLUSH_ALL, 0);
        self.touch_line(
            env,
            cpu,
            tlbstate_line(cpu, TLBSTATE_USER_PCID_FLUSH_MASK_OFFSET),
            true,
        );
        let up = self.user_pcid(asid);
        if end == TLB_FLUSH_ALL {
            self.cpus[cpu].tlb.flush_pcid(up);
            self.charge(env, |c| c.cr3_write_flush);
            self.kvm_shadow_cr3_load(cpu, true, env);
            return;
        }
        for v in (start..end).step_by(1 << stride) {
            self.invlpg(cpu, up, v);
            self.charge(env, |c| c.invlpg);
            self.perf.counters.inc(Counter::InvlpgCount);
            if self.shadow_paging(cpu) {
                self.kvm_mmu_invlpg(cpu, v, env);
            }
        }
        if env.tracing() {
            env.trace(TraceEvent::Instant {
                agent: cpu,
                name: "deferred user flush",
                detail: Some(crate::tlb::range_text(start, end)),
            });
        }
        self.say(|| {
            format!(
                "return to user: INVLPG the deferred user range ({}) in the user PCID",
                crate::tlb::range_text(start, end)
            )
        });
    }

    /// One step of user mode for the current task.
    pub(crate) fn user_step<E: Env>(&mut self, cpu: CpuId, env: &mut E) -> Park {
        let t = self.cpus[cpu].curr as usize;
        if self.tasks[t].state == TaskState::Dead {
            return Park::Halt;
        }
        // Return to user: PTI's deferred user-PCID flush (SWITCH_TO_USER_CR3). A kernel
        // thread never returns to user.
        if self.pti && !self.tasks[t].kthread {
            self.switch_to_user_cr3(cpu, env);
        }
        // Preemption at return to user: FIFO's time slice, or EEVDF's expired deadline or a
        // wake-up's resched_curr.
        let preempt = if self.eevdf(env) {
            let expired = self.eevdf_update_curr(cpu, env.now());
            expired || (self.cpus[cpu].need_resched && !self.cpus[cpu].runqueue.is_empty())
        } else {
            env.timed()
                && !self.cpus[cpu].runqueue.is_empty()
                && env.now().saturating_sub(self.perf.cpu[cpu].slice_start)
                    >= Time::from_us(self.opts.sched_timeslice_us.0)
        };
        if preempt {
            let f = self.schedule_frame();
            self.call(cpu, env, f);
            return Park::Run;
        }
        let task = &self.tasks[t];
        let op = task
            .program
            .get(task.pc as usize)
            .copied()
            .unwrap_or(UserOp::Exit);
        if let Some(text) = self
            .perf
            .labels_on
            .then(|| user_op_text(&op, &self.files))
            .flatten()
        {
            self.summary(|| text);
        }
        match op {
            UserOp::Touch { .. } if self.tasks[t].mm.is_none() => {
                // A kernel thread whose mmget_not_zero failed: copy_{to,from}_user fails.
                self.say(|| "uaccess without an mm: -EFAULT".into());
                self.tasks[t].pc += 1;
            }
            UserOp::Touch { vpn, write } => {
                let vpn = vpn + self.tasks[t].page_index;
                self.user_touch(cpu, vpn, Access::from_write(write), true, env);
            }
            UserOp::Exec { vpn } => {
                let vpn = vpn + self.tasks[t].page_index;
                self.user_touch(cpu, vpn, Access::Fetch, true, env);
            }
            UserOp::TouchRange {
                start,
                npages,
                write,
            } => {
                let v = start + self.tasks[t].op_progress;
                self.user_touch_multi(cpu, v, write, npages, env);
            }
            UserOp::TouchRegions {
                start,
                regions,
                pages,
                write,
            } => {
                let vpn = start + self.tasks[t].op_progress * pages;
                self.user_touch_region(cpu, t, vpn, write, pages, regions, env);
            }
            UserOp::TouchRandomBlock {
                start,
                span,
                npages,
            } => {
                let base = match self.tasks[t].op_base {
                    Some(b) => b,
                    None => {
                        let blocks = (span / npages.max(1)).max(1);
                        let b = start + env.random(blocks) * npages;
                        self.tasks[t].op_base = Some(b);
                        b
                    }
                };
                let v = base + self.tasks[t].op_progress;
                self.user_touch_multi(cpu, v, true, npages, env);
            }
            UserOp::Compute { ns } => {
                self.charge_interruptible(env, cpu, |_| Time::from_ns(ns));
                self.tasks[t].pc += 1;
            }
            UserOp::AnonFaults { npages } => {
                self.tasks[t].pc += 1;
                self.call(cpu, env, crate::page_lists::BulkPages::faults(npages));
            }
            UserOp::FreePages { npages } => {
                self.tasks[t].pc += 1;
                self.call(cpu, env, crate::page_lists::BulkPages::frees(npages));
            }
            UserOp::Mmap { .. } => self.enter_syscall(
                cpu,
                t,
                Syscall::Mmap {
                    pc: MmapPc::Start,
                    vma: None,
                },
                env,
            ),
            UserOp::MmapFile {
                start,
                npages,
                file,
                private,
            } => self.enter_syscall(
                cpu,
                t,
                Syscall::Mmap {
                    pc: MmapPc::Start,
                    vma: Some(crate::vma::Vma {
                        start,
                        npages,
                        file,
                        pgoff: 0,
                        private,
                    }),
                },
                env,
            ),
            UserOp::Munmap { start, npages } => self.enter_syscall(
                cpu,
                t,
                Syscall::Munmap {
                    pc: ZapPc::Start,
                    start,
                    npages,
                    gather: Gather::default(),
                },
                env,
            ),
            UserOp::MadviseDontneed { start, npages } => self.enter_syscall(
                cpu,
                t,
                Syscall::Madvise {
                    pc: ZapPc::Start,
                    start: start + self.tasks[t].page_index,
                    npages,
                    gather: Gather::default(),
                },
                env,
            ),
            UserOp::Mprotect {
                start,
                npages,
                writable,
            } => self.enter_syscall(
                cpu,
                t,
                Syscall::Mprotect {
                    pc: ZapPc::Start,
                    start,
                    npages,
                    writable,
                    gather: Gather::default(),
                },
                env,
            ),
            UserOp::Fdatasync { file } => self.enter_syscall(cpu, t, fdatasync(file, false), env),
            UserOp::FileioNext => {
                self.fileio_next(cpu, t, env);
                self.tasks[t].pc += 1;
            }
            UserOp::FileioExec { npages, copy_pages } => {
                if let Some(file) = self.tasks[t].fsync_file.take() {
                    // sb_fileio.c file_do_fsync(): in mmap mode on a 64-bit build the fsync
                    // request is msync(MS_SYNC | MS_INVALIDATE) of the file's mapping, whatever
                    // --file-fsync-mode says.
                    self.enter_syscall(cpu, t, fdatasync(file, true), env);
                } else {
                    let base = self.tasks[t].op_base.expect("FileioNext chose a block");
                    let v = base + self.tasks[t].op_progress;
                    let pc = self.tasks[t].pc;
                    self.user_touch_multi(cpu, v, true, npages, env);
                    if self.tasks[t].pc != pc {
                        // The rest of the block's memcpy, under translations now in the TLB.
                        self.charge_interruptible(env, cpu, |c| {
                            Time(c.user_touch_page.0 * copy_pages)
                        });
                    }
                }
            }
            UserOp::ReclaimUnmap { start, npages, mm } => self.enter_syscall(
                cpu,
                t,
                Syscall::ReclaimUnmap {
                    pc: ReclaimUnmapPc::Unmap,
                    start,
                    npages,
                    targets: Vec::new(),
                    begin: 0,
                    mm,
                },
                env,
            ),
            UserOp::SetAffinity { cpu: target } => self.enter_syscall(
                cpu,
                t,
                Syscall::SetAffinity {
                    pc: SetAffinityPc::Start,
                    cpu: target,
                },
                env,
            ),
            UserOp::KernelTouch { vpn } => {
                self.kernel_access(cpu, vpn, env);
                self.tasks[t].pc += 1;
            }
            UserOp::TextPoke { poking_mm, page } => self.enter_syscall(
                cpu,
                t,
                Syscall::TextPoke {
                    pc: crate::text_poke::TextPokePc::SetPte,
                    mm: poking_mm,
                    page,
                    prev: INIT_MM,
                    irqs_off: false,
                },
                env,
            ),
            UserOp::Mremap {
                start,
                npages,
                new_start,
            } => self.enter_syscall(
                cpu,
                t,
                Syscall::Mremap(Box::new(crate::mremap::Mremap::new(
                    start, npages, new_start,
                ))),
                env,
            ),
            UserOp::Truncate { file, npages } => self.enter_syscall(
                cpu,
                t,
                Syscall::UnmapMapping(Box::new(crate::truncate::UnmapMapping::new(
                    file, npages, true,
                ))),
                env,
            ),
            UserOp::RevokeMapping { file } => self.enter_syscall(
                cpu,
                t,
                Syscall::UnmapMapping(Box::new(crate::truncate::UnmapMapping::new(file, 0, false))),
                env,
            ),
            UserOp::EfiCall { efi_mm } => self.enter_syscall(
                cpu,
                t,
                Syscall::EfiCall {
                    pc: crate::efi::EfiCallPc::Enter,
                    mm: efi_mm,
                    prev: INIT_MM,
                },
                env,
            ),
            UserOp::MigrateVma { start, npages } => self.enter_syscall(
                cpu,
                t,
                Syscall::MigrateVma(Box::new(crate::migrate_device::MigrateVma::new(
                    start, npages,
                ))),
                env,
            ),
            UserOp::VunmapRange { start, npages } => self.enter_syscall(
                cpu,
                t,
                Syscall::VunmapRange {
                    pc: crate::kernel_map::VunmapPc::Unmap,
                    start,
                    npages,
                    begin: 0,
                },
                env,
            ),
            UserOp::UseMm { mm } => self.enter_syscall(
                cpu,
                t,
                Syscall::KthreadUseMm {
                    pc: crate::mm_refs::UseMmPc::Mmget,
                    mm,
                    old: None,
                    irqs_off: false,
                },
                env,
            ),
            UserOp::UnuseMm => match self.tasks[t].mm {
                Some(mm) => self.enter_syscall(
                    cpu,
                    t,
                    Syscall::KthreadUnuseMm {
                        pc: crate::mm_refs::UnuseMmPc::Lazy,
                        mm,
                    },
                    env,
                ),
                None => {
                    // Its mmget_not_zero failed: nothing to give back.
                    self.say(|| "no mm in use: nothing to unuse".into());
                    self.tasks[t].pc += 1;
                }
            },
            UserOp::Collapse { mm, start } => self.enter_syscall(
                cpu,
                t,
                Syscall::Collapse {
                    pc: crate::khugepaged::CollapsePc::Start,
                    mm,
                    pt: start / shootdown_hw::pagetable::PTRS_PER_PT,
                },
                env,
            ),
            UserOp::SetAffinityNext => {
                let ring = &self.tasks[t].cpus;
                let pos = ring
                    .iter()
                    .position(|&c| c == cpu)
                    .map(|p| (p + 1) % ring.len())
                    .unwrap_or(0);
                let target = ring[pos];
                self.enter_syscall(
                    cpu,
                    t,
                    Syscall::SetAffinity {
                        pc: SetAffinityPc::Start,
                        cpu: target,
                    },
                    env,
                )
            }
            UserOp::Event => {
                self.count_event(env);
                self.tasks[t].pc += 1;
            }
            UserOp::Mark => {
                let now = env.now();
                let marks = &mut self.perf.marks;
                if marks.len() <= t {
                    marks.resize(t + 1, Vec::new());
                }
                marks[t].push(now);
                self.tasks[t].pc += 1;
            }
            UserOp::CopyPages { pages } => {
                self.charge_interruptible(env, cpu, |c| Time(c.user_touch_page.0 * pages));
                self.tasks[t].pc += 1;
            }
            UserOp::Cpuid => {
                if self.host.is_some() {
                    self.vm_exit(env);
                    self.charge(env, |c| c.cpuid_emulation);
                } else {
                    self.charge(env, |c| c.cpuid_emulation);
                }
                self.tasks[t].pc += 1;
            }
            UserOp::Wrmsr { .. }
            | UserOp::SetMsr { .. }
            | UserOp::SetCr0Cd { .. }
            | UserOp::Smi
            | UserOp::Rsm
            | UserOp::GuestSpinLock { .. }
            | UserOp::GuestSpinUnlock { .. }
            | UserOp::Rendezvous { .. } => return self.boot_op_step(cpu, t, op, env),
            UserOp::NextPage { to, pages } => {
                let task: &mut Task = &mut self.tasks[t];
                if task.page_index + 1 < pages {
                    task.page_index += 1;
                    task.pc = to;
                } else {
                    task.page_index = 0;
                    task.pc += 1;
                }
            }
            UserOp::Loop { to, times } => {
                let task: &mut Task = &mut self.tasks[t];
                take_loop(&mut task.pc, &mut task.loop_left, to, times);
            }
            UserOp::CrossCall { to, func } => {
                self.tasks[t].pc += 1;
                let f = self.cross_call_frame(cpu, to, func);
                self.call(cpu, env, f);
            }
            UserOp::PipeWrite { pipe } => self.pipe_write(cpu, t, pipe, env),
            UserOp::PipeRead { pipe } => self.pipe_read(cpu, t, pipe, env),
            UserOp::Pause => {
                // sys_pause(): the task sleeps in TASK_INTERRUPTIBLE until a signal, and none
                // comes. Only the entry is paid: the sleep never returns.
                self.charge(env, |c| c.syscall_entry_exit);
                self.tasks[t].state = TaskState::Blocked;
                self.tasks[t].pc += 1;
                self.say(|| "pause(): sleep".into());
                let f = self.schedule_frame();
                self.call(cpu, env, f);
            }
            UserOp::Exit => {
                self.tasks[t].state = TaskState::Dead;
                self.perf.user_tasks_alive -= 1;
                self.say(|| "exit".into());
                self.exit_mm(t as TaskId);
                let f = self.schedule_frame();
                self.call(cpu, env, f);
            }
        }
        Park::Run
    }

    /// sysbench's `file_get_rnd_request()` (sb_fileio.c) for the current task: every `fsync_freq`
    /// writes (counted process-wide), the next `--file-num` requests fsync each file in turn;
    /// otherwise a write of a uniformly random block. The counters are unsynchronized globals
    /// every thread writes, and the request ends with `pthread_mutex_unlock(&exec_mutex)`.
    fn fileio_next<E: Env>(&mut self, cpu: CpuId, t: usize, env: &mut E) {
        use crate::mem::{misc_line, LINE_SB_EXEC_MUTEX, LINE_SB_FILEIO_STATE};
        let Some(g) = self.fileio.as_mut() else {
            panic!("FileioNext without a fileio generator (Machine::fileio)");
        };
        if g.fsync_freq != 0 && g.is_dirty && g.req_performed % g.fsync_freq == 0 {
            self.tasks[t].fsync_file = Some(g.files[g.fsynced_file as usize]);
            g.fsynced_file += 1;
            if g.fsynced_file as usize == g.files.len() {
                g.fsynced_file = 0;
                g.is_dirty = false;
            }
        } else {
            let blocks_per_file = (g.units_per_file / g.units_per_block).max(1);
            let block = env.random(blocks_per_file * g.files.len() as u64);
            let file = g.files[(block / blocks_per_file) as usize];
            let start = self.dax_files[file as usize].start;
            self.tasks[t].op_base = Some(start + (block % blocks_per_file) * g.units_per_block);
            self.tasks[t].op_progress = 0;
            g.req_performed += 1;
            g.is_dirty = true;
        }
        self.touch_line(env, cpu, misc_line(LINE_SB_FILEIO_STATE), true);
        self.atomic_on_line(env, cpu, misc_line(LINE_SB_EXEC_MUTEX));
    }

    fn enter_syscall<E: Env>(&mut self, cpu: CpuId, t: usize, s: Syscall, env: &mut E) {
        self.tasks[t].pc += 1;
        self.call(cpu, env, Frame::Syscall(s));
    }

    /// Touch one page; on a fault, enter the fault handler (the op is retried afterwards).
    fn user_touch<E: Env>(
        &mut self,
        cpu: CpuId,
        vpn: Vpn,
        access: Access,
        advance: bool,
        env: &mut E,
    ) -> bool {
        let write = access.is_write();
        match self.user_access(cpu, vpn, access, env) {
            Ok(()) => {
                self.charge_interruptible(env, cpu, |c| c.user_touch_page);
                if advance {
                    self.tasks[self.cpus[cpu].curr as usize].pc += 1;
                }
                true
            }
            Err(Fault::Exit(exit)) => {
                self.vm_exit_to_kvm(cpu, exit, env);
                false
            }
            Err(Fault::PageFault) => {
                self.say(|| {
                    format!(
                        "{} page {vpn:#x}: page fault",
                        match access {
                            Access::Write => "write to",
                            Access::Read => "read of",
                            Access::Fetch => "fetch from",
                        }
                    )
                });
                self.call(
                    cpu,
                    env,
                    Frame::Syscall(Syscall::PageFault {
                        pc: PageFaultPc::Start,
                        vpn,
                        write,
                    }),
                );
                false
            }
        }
    }

    /// One region of a [`UserOp::TouchRegions`]: its representative page `vpn`, then the
    /// charge for the region's other pages (see the op).
    #[allow(clippy::too_many_arguments)]
    fn user_touch_region<E: Env>(
        &mut self,
        cpu: CpuId,
        t: usize,
        vpn: Vpn,
        write: bool,
        pages: u64,
        regions: u64,
        env: &mut E,
    ) {
        let first = self.tasks[t].op_started.is_none();
        let started = *self.tasks[t].op_started.get_or_insert(env.now());
        if !self.user_touch(cpu, vpn, Access::from_write(write), false, env) {
            return;
        }
        self.tasks[t].op_started = None;
        let pcid = self.access_pcid(cpu);
        let entry = self.cpus[cpu].tlb.lookup(pcid, vpn);
        let huge_ept = entry
            .and_then(|e| e.ept)
            .is_some_and(|u| self.ept.page(u.sp).level >= 2);
        self.cpus[cpu].tlb.invlpg(pcid, vpn);
        if env.timed() && pages > 1 {
            let c = &self.perf.profile.costs;
            let plain = c.tlb_miss_walk.as_ns_f64() + c.user_touch_page.as_ns_f64();
            let each = if first || huge_ept {
                plain
            } else {
                env.now().saturating_sub(started).as_ns_f64() + plain
            };
            let rest = Time::from_ns_f64(each * (pages - 1) as f64);
            self.charge_interruptible(env, cpu, |_| rest);
        }
        self.advance_multi(t, regions);
    }

    fn user_touch_multi<E: Env>(
        &mut self,
        cpu: CpuId,
        vpn: Vpn,
        write: bool,
        npages: u64,
        env: &mut E,
    ) {
        if self.user_touch(cpu, vpn, Access::from_write(write), false, env) {
            self.advance_multi(self.cpus[cpu].curr as usize, npages);
        }
    }
}

/// How a counterexample names a user operation (None where its own step says what it did: an
/// access, `exit`, `pause`, an instruction that exits to KVM, which names itself).
fn user_op_text(op: &UserOp, files: &[crate::vma::File]) -> Option<String> {
    let file = |f: u32| &files[f as usize].name;
    Some(match *op {
        UserOp::Touch { .. }
        | UserOp::Exec { .. }
        | UserOp::TouchRange { .. }
        | UserOp::TouchRegions { .. }
        | UserOp::TouchRandomBlock { .. }
        | UserOp::Wrmsr { .. }
        | UserOp::SetMsr { .. }
        | UserOp::SetCr0Cd { .. }
        | UserOp::Smi
        | UserOp::Rsm
        | UserOp::Exit
        | UserOp::PipeWrite { .. }
        | UserOp::PipeRead { .. }
        | UserOp::Pause => return None,
        UserOp::Compute { ns } => format!("compute {ns} ns"),
        UserOp::Event => "count an event".into(),
        UserOp::CrossCall { to, func } => format!("cross call of {func:?} to {to:?}, wait = 1"),
        UserOp::Mark => "mark the time".into(),
        UserOp::Loop { to, .. } => format!("loop to operation {to}"),
        UserOp::NextPage { to, pages } => format!("next of {pages} pages: loop to operation {to}"),
        UserOp::MmapFile {
            start,
            npages,
            file,
            private,
        } => format!(
            "mmap({start:#x}, {npages} page(s), {}, '{}')",
            if private { "MAP_PRIVATE" } else { "MAP_SHARED" },
            files.get(file as usize).map_or("?", |f| f.name.as_str())
        ),
        UserOp::AnonFaults { npages } => {
            format!("{npages} anonymous page fault(s), charged in bulk")
        }
        UserOp::FreePages { npages } => format!("free {npages} page(s) charged in bulk"),
        UserOp::MadviseDontneed { start, npages } => {
            format!("madvise({start:#x}, {npages} page(s), MADV_DONTNEED)")
        }
        UserOp::Munmap { start, npages } => format!("munmap({start:#x}, {npages} page(s))"),
        UserOp::Mprotect {
            start,
            npages,
            writable,
        } => {
            format!(
                "mprotect({start:#x}, {npages} page(s), {})",
                if writable { "RW" } else { "RO" }
            )
        }
        UserOp::ReclaimUnmap {
            start,
            npages,
            mm: None,
        } => {
            format!("reclaim {npages} page(s) at {start:#x}")
        }
        UserOp::ReclaimUnmap {
            start,
            npages,
            mm: Some(mm),
        } => format!("kswapd: reclaim {npages} page(s) at {start:#x} of mm{mm}"),
        UserOp::SetAffinity { cpu } => format!("sched_setaffinity(cpu{cpu})"),
        UserOp::UseMm { mm } => format!("mmget_not_zero(mm{mm}); kthread_use_mm(mm{mm})"),
        UserOp::UnuseMm => "kthread_unuse_mm; mmput".into(),
        UserOp::KernelTouch { vpn } => format!("kernel code reads vmalloc page {vpn:#x}"),
        UserOp::TextPoke { page, .. } => format!("text_poke(kernel page {page:#x})"),
        UserOp::Mremap {
            start,
            npages,
            new_start,
        } => format!("mremap({start:#x}, {npages} page(s)) to {new_start:#x}"),
        UserOp::Truncate { file: f, npages } => {
            format!("ftruncate('{}', {npages} page(s))", file(f))
        }
        UserOp::RevokeMapping { file: f } => {
            format!("driver: unmap_mapping_range('{}') (revoke)", file(f))
        }
        UserOp::EfiCall { .. } => "EFI runtime service call (efivarfs)".into(),
        UserOp::MigrateVma { start, npages } => {
            format!("driver: migrate_vma({start:#x}, {npages} page(s))")
        }
        UserOp::VunmapRange { start, npages } => {
            format!("vunmap_range({start:#x}, {npages} page(s))")
        }
        UserOp::Collapse { mm, start } => {
            format!(
                "khugepaged: collapse mm{mm} pages {start:#x}..{:#x}",
                start + 512
            )
        }
        UserOp::Mmap { start, npages } => format!("mmap({start:#x}, {npages} page(s))"),
        UserOp::Fdatasync { file } => format!("fdatasync(DAX file {file})"),
        UserOp::FileioNext => "sysbench: file_get_rnd_request()".into(),
        UserOp::FileioExec { npages, .. } => {
            format!("sysbench: the request ({npages} page(s) written, or an fsync)")
        }
        UserOp::SetAffinityNext => "sched_setaffinity(the next CPU of its list)".into(),
        UserOp::CopyPages { pages } => format!("copy {pages} page(s)"),
        UserOp::Cpuid => "CPUID".into(),
        UserOp::GuestSpinLock { lock } => format!("spin_lock(guest lock {lock})"),
        UserOp::GuestSpinUnlock { lock } => format!("spin_unlock(guest lock {lock})"),
        UserOp::Rendezvous { word, parties } => {
            format!("meet {parties} parties at guest word {word}")
        }
    })
}

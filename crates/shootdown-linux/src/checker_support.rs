//! Helpers the explorer (`shootdown-checker`) needs and only the model can answer: which steps
//! are *local* (for partial-order reduction) and how to rename CPUs (for symmetry reduction).
//! Nothing here changes how a step executes.

use crate::frame::Frame;
use crate::machine::Machine;
use crate::mem::Loc;
use crate::sched::SchedulePc;
use crate::smp::CallFunctionIrqPc;
use crate::state::*;
use crate::switch_mm::SwitchMmPc;
use crate::syscalls::Syscall;
use crate::tlb::FlushFuncPc;
use shootdown_hw::CpuId;

impl Machine {
    /// Is `Step(cpu)` in this state a *local* step that, on its own, is a persistent set?
    ///
    /// True only when all of these hold:
    /// * interrupts are disabled on `cpu` — so `Interrupt(cpu)`, the one action of another kind
    ///   that would change what `Step(cpu)` does, cannot become enabled before `Step(cpu)` runs
    ///   (only `cpu` itself re-enables them);
    /// * the step reads only locations no other CPU writes (`cpu`'s own `loaded_mm`, `is_lazy`,
    ///   `ctxs[]`, its own store buffer, its stacks) and writes nothing another CPU reads;
    /// * it does not touch the TLB, CR3, the page tables or the oracle (so it commutes with
    ///   `Fill(cpu, …)` and `Drain(cpu)` too, and can never report a violation);
    /// * it never spins (it stays enabled whatever the other CPUs do).
    ///
    /// The recognised steps: `__schedule` calling `switch_mm_irqs_off` (`ContextSwitch`, next
    /// task has an mm) and returning (`Return`, without PTI so the walker's PCID does not change
    /// with the mode); `switch_mm_irqs_off`'s `Start` when it stores nothing (mainline/is_lazy,
    /// not lazy, conditional `is_lazy` write); `flush_tlb_func`'s `Guards` unless they trim the
    /// cpumask; the CALL_FUNCTION handler returning after its last entry.
    pub fn step_is_local(&self, cpu: CpuId) -> bool {
        if cpu < self.cpus.len() && self.shadow_paging(cpu) && !self.host_ref().threads.is_empty() {
            // A host thread may take `mmu_lock`, which makes a vCPU step that would enter a
            // shadow-paging section wait (`Machine::enabled`): no step of it is persistent.
            return false;
        }
        if cpu >= self.cpus.len() || self.in_host_code(cpu) {
            return self.host_step_is_local(cpu);
        }
        if self.irqs_enabled(cpu) || self.step_blocked(cpu) {
            return false;
        }
        // On a host, `VcpuPut(cpu)` would disable `Step(cpu)`: not a persistent set then.
        if self.host.is_some() && (!self.vcpu_in_guest(cpu) || self.host_may_preempt(cpu)) {
            return false;
        }
        let Some(top) = self.top_frame(cpu) else {
            return false;
        };
        let own = |loc: Loc| self.value_seen_by(cpu, loc);
        match top {
            Frame::Schedule(s) => match s.pc {
                SchedulePc::ContextSwitch => self.tasks[s.next as usize].mm.is_some(),
                SchedulePc::Return => !self.pti,
                _ => false,
            },
            // With global ASIDs, both read the mm's `global_asid`, which others write.
            Frame::SwitchMm(s) => {
                s.pc == SwitchMmPc::Start
                    && !self.broadcast_tlb_enabled()
                    && self.opts.lazy_tlb.has_is_lazy()
                    && self.opts.is_lazy_write_conditional
                    && own(Loc::IsLazy(cpu as u32)) == 0
            }
            Frame::FlushFunc(s) => {
                if s.pc != FlushFuncPc::Guards || self.broadcast_tlb_enabled() {
                    return false;
                }
                let loaded = own(Loc::LoadedMm(cpu as u32));
                let trims = s.info.mm.is_some_and(|m| m as u64 != loaded)
                    && self.opts.lazy_tlb.trims_lazily()
                    && !s.local;
                // TlbGen reads our own cpumask bit, which only we write: still local; Legacy
                // with a lazy CPU calls leave_mm (a push): local too.
                !trims
            }
            Frame::CallFunctionIrq(s) => s.pc == CallFunctionIrqPc::Run && s.i >= s.entries.len(),
            _ => false,
        }
    }

    /// Is the next host step of `agent` (a host thread, or a vCPU thread in host code) *local*?
    /// The recognised steps only push or pop a frame after reading the agent's own frames and
    /// memslot copies being built (nothing published): `vcpu_run` calling `kvm_mmu_load`;
    /// `__kvm_set_memory_region` building a memslot copy and calling `install_new_memslots`, or
    /// calling the zap; `install_new_memslots` calling `synchronize_srcu_expedited` and
    /// returning; the zaps calling the commit. No other agent's action changes what they do, and
    /// the host actions of the same vCPU (a kick being taken) commute with them; they cannot
    /// report a violation.
    fn host_step_is_local(&self, agent: usize) -> bool {
        use crate::kvm::kvm_main::{InstallMemslotsPc, SetMemoryRegionPc};
        use crate::kvm::mmu::zap::ZapPc;
        use crate::kvm::VcpuRunPc;
        if agent < self.cpus.len() {
            let v = &self.host_ref().vcpus[agent];
            if v.thread != crate::kvm::ThreadState::Running {
                return false;
            }
        }
        let Some(top) = self.host_stack(agent).last() else {
            return false;
        };
        match top {
            Frame::VcpuRun(s) => s.pc == VcpuRunPc::Reload,
            Frame::SetMemoryRegion(s) => matches!(
                s.pc,
                SetMemoryRegionPc::InstallInvalid
                    | SetMemoryRegionPc::FlushShadow
                    | SetMemoryRegionPc::InstallFinal
            ),
            Frame::InstallMemslots(s) => {
                matches!(s.pc, InstallMemslotsPc::Sync | InstallMemslotsPc::Done)
            }
            Frame::ZapMemslot(s) => s.pc == ZapPc::Commit,
            _ => false,
        }
    }

    /// A copy of this machine with CPUs renamed: CPU `c` becomes `perm[c]` and task `t` becomes
    /// `task_perm[t]` (the caller maps idle tasks and the tasks of interchangeable CPUs
    /// consistently). Task and mm *names* stay where they were (they never affect behaviour), so
    /// two states that differ only by the renaming compare equal.
    pub fn permute_cpus(&self, perm: &[usize], task_perm: &[u32]) -> Machine {
        let pc = |c: CpuId| perm[c];
        let pt = |t: TaskId| task_perm[t as usize];
        let key = |k: CsdKey| CsdKey {
            src: pc(k.src),
            dst: pc(k.dst),
        };
        let info = |i: &FlushTlbInfo| FlushTlbInfo {
            initiator: pc(i.initiator),
            ..*i
        };
        let loc = |l: Loc| l.rename_cpus(&|c| pc(c as usize) as u32);
        // A spinlock's value: 0 free, else the holder + 1.
        let holder = |l: Loc, v: u64| {
            if l.value_is_holder() && v != 0 {
                pc(v as usize - 1) as u64 + 1
            } else {
                v
            }
        };
        let frame = |f: &Frame| -> Frame {
            let mut f = f.clone();
            match &mut f {
                Frame::FlushMmRange(s) => {
                    // The initiator is set by the first step (a placeholder before it).
                    if s.pc != crate::tlb::FlushMmRangePc::Start {
                        s.info = info(&s.info);
                    }
                    if let Some(t) = &mut s.batch_targets {
                        t.iter_mut().for_each(|c| *c = pc(*c));
                    }
                }
                Frame::FlushFunc(s) => s.info = info(&s.info),
                Frame::SmpCallMany(s) => {
                    s.info = info(&s.info);
                    for v in [&mut s.candidates, &mut s.queued, &mut s.ipi] {
                        v.iter_mut().for_each(|c| *c = pc(*c));
                    }
                }
                Frame::CallFunctionIrq(s) => {
                    s.entries.iter_mut().for_each(|k| *k = key(*k));
                }
                // Before `Pick`, prev and next are unset placeholders, not tasks.
                Frame::Schedule(s) if s.pc != crate::sched::SchedulePc::Pick => {
                    s.prev = pt(s.prev);
                    s.next = pt(s.next);
                }
                Frame::Schedule(_) => {}
                Frame::Syscall(Syscall::ReclaimUnmap { targets, .. }) => {
                    targets.iter_mut().for_each(|c| *c = pc(*c));
                }
                Frame::Syscall(Syscall::SetAffinity { cpu, .. }) => *cpu = pc(*cpu),
                Frame::PvFlushTlbMulti(s) => {
                    s.call.info = info(&s.call.info);
                    for v in [
                        &mut s.call.candidates,
                        &mut s.call.queued,
                        &mut s.call.ipi,
                        &mut s.keep,
                    ] {
                        v.iter_mut().for_each(|c| *c = pc(*c));
                    }
                }
                Frame::SwitchMm(_) | Frame::RwSemDown(_) | Frame::Syscall(_) => {}
                // Host frames: symmetry is not available with a host (scenario.rs).
                Frame::VcpuRun(_)
                | Frame::Shoot4u(_)
                | Frame::HvFlushTlbMulti(_)
                | Frame::MakeAllCpusRequest(_)
                | Frame::FlushRemoteTlbs(_)
                | Frame::SynchronizeSrcu(_)
                | Frame::InstallMemslots(_)
                | Frame::SetMemoryRegion(_)
                | Frame::MmuNotifierInvalidate(_)
                | Frame::TdpPageFault(_)
                | Frame::MmioPageFault(_)
                | Frame::ShadowPageFault(_)
                | Frame::MmuLoad(_)
                | Frame::MmuUnload(_)
                | Frame::CommitZap(_)
                | Frame::ZapMemslot(_)
                | Frame::ZapGfnRange(_)
                | Frame::TdpMmuPageFault(_)
                | Frame::NxRecover(_)
                | Frame::FastPageFault(_)
                | Frame::GetDirtyLog(_)
                | Frame::ClearYoung(_)
                | Frame::MtrrZapRequest(_)
                | Frame::NoncoherentDmaStart(_) => {}
                Frame::BulkPages(_) | Frame::PageListLocked(_) => {}
                // Its state index is the same after renaming (the states keep their order).
                Frame::LatrTick(_) => {}
            }
            f
        };
        let mut m = self.clone();
        for (c, old) in self.cpus.iter().enumerate() {
            let mut n = old.clone();
            n.irq_stack = old.irq_stack.iter().map(frame).collect();
            n.call_queue = old.call_queue.iter().map(|k| key(*k)).collect();
            n.curr = pt(old.curr);
            n.idle_task = pt(old.idle_task);
            n.runqueue = old.runqueue.iter().map(|&t| pt(t)).collect();
            let mut sb = shootdown_hw::store_buffer::StoreBuffer::default();
            let mut tmp = old.sb.clone();
            while let Some((l, v)) = tmp.pop_oldest() {
                sb.push(loc(l), holder(l, v));
            }
            n.sb = sb;
            m.cpus[pc(c)] = n;
        }
        for (t, old) in self.tasks.iter().enumerate() {
            let mut n = old.clone();
            n.name = self.tasks[pt(t as TaskId) as usize].name.clone();
            n.cpu = pc(old.cpu);
            n.stack = old.stack.iter().map(frame).collect();
            for op in n.program.iter_mut() {
                if let UserOp::SetAffinity { cpu } = op {
                    *cpu = pc(*cpu);
                }
            }
            n.cpus.iter_mut().for_each(|c| *c = pc(*c));
            m.tasks[pt(t as TaskId) as usize] = n;
        }
        for (i, mm) in self.mms.iter().enumerate() {
            let nm = &mut m.mms[i];
            for c in 0..self.cpus.len() {
                nm.cpumask_assign(pc(c), mm.cpumask_test(c));
            }
            for (&pt, v) in nm.ptl_held.iter_mut() {
                *v = holder(Loc::Ptl(i as MmId, pt), *v);
            }
            nm.mmap_sem.waiters = mm
                .mmap_sem
                .waiters
                .iter()
                .map(|&(t, w)| (pt(t), w))
                .collect();
        }
        m.rename_i_mmap_waiters(&pt);
        for (c, pl) in self.page_lists.iter().enumerate() {
            m.page_lists[pc(c)] = *pl;
        }
        for (i, l) in m.kernel_locks.iter_mut().enumerate() {
            // Kernel locks are held and queued for by CPUs (host agents never take them).
            l.val = holder(Loc::KernelLock(i as u32), l.val);
            l.queue.iter_mut().for_each(|c| *c = pc(*c as usize) as u32);
        }
        for (i, f) in m.dax_files.iter_mut().enumerate() {
            f.xa_lock = holder(Loc::XaLock(i as u32), f.xa_lock);
        }
        m.csd_locked = self.csd_locked.renamed(key);
        for (c, fi) in self.flush_info.iter().enumerate() {
            m.flush_info[pc(c)] = fi.as_ref().map(info);
        }
        m.rename_latr(&pc);
        if let (Some(h), Some(mh)) = (&self.host, m.host.as_mut()) {
            // A host under one VM with one pCPU per vCPU (vCPU v runs on pCPU v, as the
            // checker's [host] scenarios build it): vCPUs and pCPUs rename together. Host
            // threads and KVM MMU state are not renamed (scenario.rs refuses symmetry there).
            let agent = |a: u32| {
                if (a as usize) < perm.len() {
                    pc(a as usize) as u32
                } else {
                    a
                }
            };
            for (v, old) in h.vcpus.iter().enumerate() {
                let mut nv = old.clone();
                nv.pcpu = pc(old.pcpu as usize) as u32;
                nv.stack = old.stack.iter().map(frame).collect();
                nv.kicks = old.kicks.iter().map(|&a| agent(a)).collect();
                mh.vcpus[pc(v)] = nv;
                mh.steal_preempted[pc(v)] = h.steal_preempted[v];
            }
            for (p, old) in h.pcpus.iter().enumerate() {
                let q = &mut mh.pcpus[pc(p)];
                q.curr = old.curr.map(|v| pc(v as usize) as u32);
                q.rq = old.rq.iter().map(|&v| pc(v as usize) as u32).collect();
            }
            mh.kick_csd = h
                .kick_csd
                .iter()
                .map(|&(s, d)| (agent(s), agent(d)))
                .collect();
            let mut pre: Vec<usize> = h.cfg.preemptible.iter().map(|&c| pc(c)).collect();
            pre.sort_unstable();
            mh.cfg.preemptible = pre;
        }
        m
    }
}

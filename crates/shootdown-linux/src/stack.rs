//! What a CPU runs: the frames on its interrupt stack or on its current task's kernel stack,
//! else the task's next user operation, else the idle loop. One `Step` runs the top frame's next
//! step ([`Machine::step_frame`] dispatches on the frame) and applies its [`Flow`]: continue,
//! call, return or spin. Also the timeline slices that follow the stacks.

use crate::frame::{Flow, Frame};
use crate::machine::Machine;
use crate::perf::FrameHint;
use crate::state::*;
use shootdown_engine::trace::TraceEvent;
use shootdown_engine::{Env, Outcome, Park, StepKind};
use shootdown_hw::CpuId;

/// Where a frame came from, so it goes back to the same stack even if the step switched tasks.
#[derive(Clone, Copy)]
enum StackRef {
    Irq,
    Task(TaskId),
}

impl Machine {
    /// Interrupts enabled on `cpu` (no handler running, no IRQs-off frame on top).
    pub fn irqs_enabled(&self, cpu: CpuId) -> bool {
        let c = &self.cpus[cpu];
        if !c.irq_stack.is_empty() || c.irq_off > 0 {
            return false;
        }
        match self.tasks[c.curr as usize].stack.last() {
            Some(f) => !f.irqs_off(),
            None => true,
        }
    }

    /// Is `cpu` in kernel mode (an interrupt handler, a task in the kernel, a kernel thread —
    /// with or without a borrowed mm — or the idle task)? For a vCPU this is
    /// `kvm_arch_vcpu_in_kernel` (PLE exits only at CPL 0); for an interrupt it decides whether
    /// entry and return switch CR3 under PTI and the return clears buffers
    /// (`swapgs_restore_regs_and_return_to_usermode` vs `retint_kernel`).
    pub(crate) fn in_kernel_mode(&self, cpu: CpuId) -> bool {
        let c = &self.cpus[cpu];
        let t = &self.tasks[c.curr as usize];
        !c.irq_stack.is_empty() || !t.stack.is_empty() || t.mm.is_none() || t.kthread
    }

    /// Is `cpu` running its idle task?
    pub fn is_idle_cpu(&self, cpu: CpuId) -> bool {
        self.is_idle(cpu)
    }

    pub(crate) fn is_idle(&self, cpu: CpuId) -> bool {
        self.cpus[cpu].curr == self.cpus[cpu].idle_task
    }

    /// The kernel function `Step(cpu)` runs next (`None`: the task's user or idle code).
    pub fn top_frame_name(&self, cpu: CpuId) -> Option<&'static str> {
        self.top_frame(cpu).map(Frame::name)
    }

    /// The frame `Step(cpu)` runs next: the top of its interrupt stack, else of its current
    /// task's kernel stack (`None`: the task's user or idle code).
    pub(crate) fn top_frame(&self, cpu: CpuId) -> Option<&Frame> {
        let c = &self.cpus[cpu];
        match c.irq_stack.last() {
            Some(f) => Some(f),
            None => self.tasks[c.curr as usize].stack.last(),
        }
    }

    /// Would `Step(cpu)` only spin (or halt)? Mirrors the wait conditions in the step code.
    pub fn step_blocked(&self, cpu: CpuId) -> bool {
        let c = &self.cpus[cpu];
        match self.top_frame(cpu) {
            Some(f) => self.frame_spins(cpu, f),
            None => {
                let t = &self.tasks[c.curr as usize];
                if c.curr == c.idle_task {
                    // An idle vCPU with a KVM MMU still has its HLT exit to take.
                    c.runqueue.is_empty() && !self.has_kvm_mmu(cpu)
                } else {
                    t.state == TaskState::Dead
                }
            }
        }
    }

    #[inline]
    fn pop_frame(&mut self, cpu: CpuId) -> (StackRef, Option<Frame>) {
        let c = &mut self.cpus[cpu];
        if let Some(f) = c.irq_stack.pop() {
            return (StackRef::Irq, Some(f));
        }
        let t = c.curr;
        (StackRef::Task(t), self.tasks[t as usize].stack.pop())
    }

    #[inline]
    fn push_frame(&mut self, cpu: CpuId, at: StackRef, f: Frame) {
        match at {
            StackRef::Irq => self.cpus[cpu].irq_stack.push(f),
            StackRef::Task(t) => self.tasks[t as usize].stack.push(f),
        }
    }

    /// Push a new call on the current stack of `cpu` (used by user-mode code entering the kernel).
    pub(crate) fn call<E: Env>(&mut self, cpu: CpuId, env: &mut E, f: Frame) {
        if env.tracing() {
            env.trace(TraceEvent::Begin {
                agent: cpu,
                name: f.name(),
                detail: None,
            });
        }
        let (at, top) = self.pop_frame(cpu);
        if let Some(t) = top {
            self.push_frame(cpu, at, t);
        }
        self.push_frame(cpu, at, f);
    }

    /// Open `task`'s slices on `cpu`'s timeline: a bottom slice (`user` or `idle`, with the
    /// task's name) and one per kernel frame on its stack, outermost first. With
    /// [`Machine::trace_task_out`] at every context switch, each CPU's track shows exactly what
    /// runs on that CPU, and a task's half-done kernel call reappears when it runs again.
    pub(crate) fn trace_task_in<E: Env>(&self, cpu: CpuId, task: TaskId, env: &mut E) {
        let t = &self.tasks[task as usize];
        env.trace(TraceEvent::Begin {
            agent: cpu,
            name: if t.mm.is_some() { "user" } else { "idle" },
            detail: Some(t.name.clone()),
        });
        for f in &t.stack {
            env.trace(TraceEvent::Begin {
                agent: cpu,
                name: f.name(),
                detail: None,
            });
        }
    }

    /// Close `task`'s slices on `cpu`'s timeline (see [`Machine::trace_task_in`]); `popped`
    /// counts its frames being stepped (off its stack) that have open slices.
    pub(crate) fn trace_task_out<E: Env>(
        &self,
        cpu: CpuId,
        task: TaskId,
        popped: usize,
        env: &mut E,
    ) {
        for _ in 0..self.tasks[task as usize].stack.len() + popped + 1 {
            env.trace(TraceEvent::End { agent: cpu });
        }
    }

    /// One step of `cpu`: its top frame's, else its user or idle task's.
    pub(crate) fn step_cpu<E: Env>(&mut self, cpu: CpuId, env: &mut E) -> Park {
        // Which kind of step this is, for the engine's per-class cycle counts (built with
        // `phase-timing` only; otherwise the closure is never run).
        shootdown_engine::phases::classify(|| {
            self.top_frame(cpu).map_or("user or idle task", Frame::name)
        });
        let park = self.step_cpu_stack(cpu, env);
        self.note_top_frame(cpu);
        park
    }

    /// Where `cpu`'s top frame now is, for the timed driver's prefetch of its next step
    /// ([`FrameHint`]; only on machines large enough for it to prefetch at all).
    #[inline]
    fn note_top_frame(&mut self, cpu: CpuId) {
        if cpu >= self.perf.frames.len() {
            return;
        }
        self.perf.frames[cpu] = self
            .top_frame(cpu)
            .map_or(FrameHint::default(), Frame::hint);
    }

    #[inline]
    fn step_cpu_stack<E: Env>(&mut self, cpu: CpuId, env: &mut E) -> Park {
        if env.tracing() && !self.perf.cpu[cpu].trace_started {
            self.perf.cpu[cpu].trace_started = true;
            self.trace_task_in(cpu, self.cpus[cpu].curr, env);
        }
        let (at, frame) = self.pop_frame(cpu);
        let Some(mut f) = frame else {
            return if self.is_idle(cpu) {
                self.idle_step(cpu, env)
            } else {
                self.user_step(cpu, env)
            };
        };
        let flow = self.step_frame(cpu, &mut f, env);
        match flow {
            Flow::Next => {
                self.push_frame(cpu, at, f);
                Park::Run
            }
            Flow::Call(callee) => {
                if env.tracing() {
                    env.trace(TraceEvent::Begin {
                        agent: cpu,
                        name: callee.name(),
                        detail: None,
                    });
                }
                self.push_frame(cpu, at, f);
                self.push_frame(cpu, at, callee);
                Park::Run
            }
            Flow::Return => {
                if env.tracing() {
                    env.trace(TraceEvent::End { agent: cpu });
                }
                Park::Run
            }
            Flow::Spin(key) => {
                self.push_frame(cpu, at, f);
                self.charge(env, |c| c.spin_poll);
                Park::SpinOn(key)
            }
            Flow::Halt => {
                self.push_frame(cpu, at, f);
                Park::Halt
            }
        }
    }

    pub(crate) fn step_frame<E: Env>(&mut self, cpu: CpuId, f: &mut Frame, env: &mut E) -> Flow {
        match f {
            Frame::FlushMmRange(s) => self.flush_tlb_mm_range_step(cpu, s, env),
            Frame::FlushFunc(s) => self.flush_tlb_func_step(cpu, s, env),
            Frame::SmpCallMany(s) => self.smp_call_function_many_step(cpu, s, env),
            Frame::CallFunctionIrq(s) => self.call_function_interrupt_step(cpu, s, env),
            Frame::SwitchMm(s) => self.switch_mm_irqs_off_step(cpu, s, env),
            Frame::Schedule(s) => self.schedule_step(cpu, s, env),
            Frame::RwSemDown(s) => self.rwsem_down_step(cpu, s, env),
            Frame::Syscall(s) => self.syscall_step(cpu, s, env),
            Frame::PvFlushTlbMulti(s) => self.pv_flush_tlb_multi_step(cpu, s, env),
            Frame::Shoot4u(s) => self.shoot4u_step(cpu, s, env),
            Frame::HvFlushTlbMulti(s) => self.hv_flush_tlb_multi_step(cpu, s, env),
            Frame::VcpuRun(s) => self.vcpu_run_step(cpu, s, env),
            Frame::MakeAllCpusRequest(s) => self.make_all_cpus_request_step(cpu, s, env),
            Frame::FlushRemoteTlbs(s) => self.flush_remote_tlbs_step(cpu, s, env),
            Frame::SynchronizeSrcu(s) => self.synchronize_srcu_step(cpu, s, env),
            Frame::InstallMemslots(s) => self.install_memslots_step(cpu, s, env),
            Frame::SetMemoryRegion(s) => self.set_memory_region_step(cpu, s, env),
            Frame::MmuNotifierInvalidate(s) => self.mmu_notifier_step(cpu, s, env),
            Frame::TdpPageFault(s) => self.tdp_page_fault_step(cpu, s, env),
            Frame::MmioPageFault(s) => self.mmio_page_fault_step(cpu, s, env),
            Frame::ShadowPageFault(s) => self.shadow_page_fault_step(cpu, s, env),
            Frame::MmuLoad(s) => self.mmu_load_step(cpu, s, env),
            Frame::MmuUnload(s) => self.mmu_unload_step(cpu, s, env),
            Frame::CommitZap(s) => self.commit_zap_step(cpu, s, env),
            Frame::ZapMemslot(s) => self.zap_memslot_step(cpu, s, env),
            Frame::ZapGfnRange(s) => self.zap_gfn_range_step(cpu, s, env),
            Frame::NxRecover(s) => self.nx_recover_step(cpu, s, env),
            Frame::FastPageFault(s) => self.fast_page_fault_step(cpu, s, env),
            Frame::GetDirtyLog(s) => self.get_dirty_log_step(cpu, s, env),
            Frame::ClearYoung(s) => self.clear_young_step(cpu, s, env),
            Frame::TdpMmuPageFault(s) => self.tdp_mmu_page_fault_step(cpu, s, env),
            Frame::MtrrZapRequest(s) => self.mtrr_zap_request_step(cpu, s, env),
            Frame::NoncoherentDmaStart(s) => self.noncoherent_dma_step(cpu, s, env),
            Frame::BulkPages(s) => self.bulk_pages_step(cpu, s, env),
            Frame::PageListLocked(s) => self.page_list_locked_step(cpu, s, env),
            Frame::LatrTick(s) => self.latr_tick_step(cpu, s, env),
        }
    }

    /// Would the frame's next step only wait (spin) for something another agent changes?
    /// Mirrors the wait conditions in the step code.
    pub(crate) fn frame_spins(&self, cpu: CpuId, f: &Frame) -> bool {
        use crate::kvm::kvm_main::{InstallMemslotsPc, MmuNotifierPc, SetMemoryRegionPc};
        use crate::kvm::mmu::fault::TdpPageFaultPc;
        use crate::kvm::mmu::page::{MmuLoadPc, MmuUnloadPc};
        match f {
            Frame::SmpCallMany(s) => self.smp_call_spins(cpu, s),
            Frame::CallFunctionIrq(s) => self.call_function_spins(cpu, s),
            Frame::FlushMmRange(s) => self.finish_asid_transition_waits(cpu, s),
            Frame::Schedule(s) => self.schedule_spins(cpu, s),
            Frame::MakeAllCpusRequest(s) => self.make_all_cpus_request_spins(cpu, s),
            Frame::Shoot4u(s) => self.shoot4u_spins(cpu, s),
            Frame::SynchronizeSrcu(s) => self.srcu_waits(cpu, s),
            Frame::InstallMemslots(s) => {
                s.pc == InstallMemslotsPc::WaitNotifiers && self.memslots_wait_notifiers(cpu)
            }
            Frame::SetMemoryRegion(s) => match s.pc {
                SetMemoryRegionPc::Lock => self.slots_lock_busy(cpu),
                SetMemoryRegionPc::ApplyFlagsLock => self.kvm_mmu_lock_waits(cpu, s.lock, true),
                _ => false,
            },
            Frame::TdpPageFault(s) => s.pc == TdpPageFaultPc::Lock && self.mmu_lock_waits(cpu),
            Frame::MmuLoad(s) if self.opts.tdp_mmu => {
                s.pc == MmuLoadPc::Lock && self.mmu_rwlock_waits(cpu, s.lock, true)
            }
            Frame::MmuLoad(s) => s.pc == MmuLoadPc::Lock && self.mmu_lock_waits(cpu),
            Frame::MmuUnload(s) if self.opts.tdp_mmu => {
                s.pc == MmuUnloadPc::Lock && self.mmu_rwlock_waits(cpu, s.lock, true)
            }
            Frame::MmuUnload(s) => s.pc == MmuUnloadPc::Lock && self.mmu_lock_waits(cpu),
            Frame::MmuNotifierInvalidate(s) if self.opts.tdp_mmu => {
                s.pc == MmuNotifierPc::EndLock && self.mmu_rwlock_waits(cpu, s.lock, true)
            }
            Frame::MmuNotifierInvalidate(s) => {
                matches!(s.pc, MmuNotifierPc::StartLock | MmuNotifierPc::EndLock)
                    && self.mmu_lock_waits(cpu)
            }
            Frame::ZapMemslot(s) => self.zap_waits(cpu, s),
            Frame::ZapGfnRange(s) => self.zap_gfn_range_waits(cpu, s),
            Frame::NxRecover(s) => self.nx_recover_waits(cpu, s),
            Frame::GetDirtyLog(s) => self.get_dirty_log_waits(cpu, s),
            Frame::ClearYoung(s) => self.clear_young_waits(cpu, s),
            Frame::TdpMmuPageFault(s) => {
                s.pc == crate::kvm::mmu::tdp_mmu::TdpMmuPageFaultPc::Lock
                    && self.mmu_rwlock_waits(cpu, s.lock, false)
            }
            Frame::MtrrZapRequest(s) => self.mtrr_zap_request_waits(cpu, s),
            Frame::PageListLocked(s) => self.page_list_locked_spins(cpu, s),
            _ => false,
        }
    }

    /// A vCPU thread in host code: the next step of the top frame of its host stack, if the
    /// thread is current on its pCPU — else (timed driver only: the explorer gives every vCPU
    /// its own pCPU) a no-op that parks the agent until the host scheduler switches to it.
    pub(crate) fn step_host<E: Env>(&mut self, v: CpuId, env: &mut E) -> Outcome {
        let h = self.host_ref();
        let vc = &h.vcpus[v];
        if vc.thread == crate::kvm::ThreadState::Blocked && !env.timed() {
            self.kvm_vcpu_wake(v);
            return Outcome {
                park: Park::Run,
                kind: StepKind::Shared,
                violation: None,
            };
        }
        let current = vc.thread != crate::kvm::ThreadState::Blocked
            && h.pcpus[vc.pcpu as usize].curr == Some(v as u32);
        if !current {
            let p = vc.pcpu as usize;
            if self.halt_polling(v) && env.now() >= self.perf.host.poll_until[v] {
                // The halt-poll ran out: the thread sleeps (`halt_poll.rs`).
                self.halt_poll_give_up(v, p, env.now(), env);
            }
            self.wake_for_kick(v, env);
            return Outcome {
                park: Park::Halt,
                kind: StepKind::Local,
                violation: None,
            };
        }
        if env.tracing() && self.traces_host(v) && !self.perf.cpu[v].trace_started {
            // The vCPU's first traced step is on its host side: open its guest task's slices,
            // then those of the host frames it starts with (set up outside any step).
            self.perf.cpu[v].trace_started = true;
            self.trace_task_in(v, self.cpus[v].curr, env);
            for f in self.host_stack(v) {
                env.trace(TraceEvent::Begin {
                    agent: v,
                    name: f.name(),
                    detail: None,
                });
            }
        }
        let park = self.step_host_stack(v, env);
        if matches!(park, Park::Spin | Park::SpinOn(_) | Park::Halt) {
            self.wake_for_kick(v, env);
        }
        Outcome {
            park,
            kind: StepKind::Shared,
            violation: self.perf.violation.take(),
        }
    }

    /// The host stack of an agent: a vCPU thread's, or a host thread's.
    pub(crate) fn host_stack(&self, agent: usize) -> &Vec<Frame> {
        let h = self.host_ref();
        match h.vcpus.get(agent) {
            Some(v) => &v.stack,
            None => &h.threads[agent - self.cpus.len()].stack,
        }
    }
    pub(crate) fn host_stack_mut(&mut self, agent: usize) -> &mut Vec<Frame> {
        let n = self.cpus.len();
        let h = self.host_mut();
        if agent < n {
            &mut h.vcpus[agent].stack
        } else {
            &mut h.threads[agent - n].stack
        }
    }

    /// Whether host frames of `agent` show on the timeline: a host thread's, and a vCPU's in a
    /// VM with a KVM MMU (the PV-flush experiments keep their host side out of the trace).
    pub(crate) fn traces_host(&self, agent: usize) -> bool {
        agent >= self.cpus.len() || self.has_kvm_mmu(agent)
    }

    /// Push a host frame from outside a step of the stack (an exit, a host thread's program).
    pub(crate) fn push_host_frame<E: Env>(&mut self, agent: usize, f: Frame, env: &mut E) {
        if env.tracing() && self.traces_host(agent) {
            env.trace(TraceEvent::Begin {
                agent,
                name: f.name(),
                detail: None,
            });
        }
        self.host_stack_mut(agent).push(f);
    }

    /// Run the next step of the top frame of `agent`'s host stack.
    pub(crate) fn step_host_stack<E: Env>(&mut self, agent: usize, env: &mut E) -> Park {
        let tracing = env.tracing() && self.traces_host(agent);
        let mut f = self.host_stack_mut(agent).pop().expect("a host frame");
        match self.step_frame(agent, &mut f, env) {
            Flow::Next => {
                self.host_stack_mut(agent).push(f);
                Park::Run
            }
            Flow::Call(callee) => {
                if tracing {
                    env.trace(TraceEvent::Begin {
                        agent,
                        name: callee.name(),
                        detail: None,
                    });
                }
                let stack = self.host_stack_mut(agent);
                stack.push(f);
                stack.push(callee);
                Park::Run
            }
            Flow::Return => {
                if tracing {
                    env.trace(TraceEvent::End { agent });
                }
                Park::Run
            }
            Flow::Spin(key) => {
                self.host_stack_mut(agent).push(f);
                self.charge(env, |c| c.spin_poll);
                Park::SpinOn(key)
            }
            Flow::Halt => unreachable!("host code does not halt in pv_wait"),
        }
    }

    /// Would `agent`'s next host step only wait?
    pub(crate) fn host_stack_blocked(&self, agent: usize) -> bool {
        self.host_stack(agent)
            .last()
            .is_some_and(|f| self.frame_spins(agent, f))
    }
}

//! kernel/smp.c: `smp_call_function_many_cond()` and the CALL_FUNCTION handler
//! `__flush_smp_call_function_queue()` (docs/design/kernel-model.md §2). What it calls is
//! `flush_tlb_func`, or a kernel module's function ([`CallFunc`]: the `ipi_benchmark` module's,
//! through [`crate::UserOp::CrossCall`]).
//!
//! Simplifications: the v5.x single-target fast path (`smp_call_function_single` with an
//! on-stack csd) is folded into the general path (same steps, same costs); `cond_func` reads the
//! remote CPU's state in one step.
//!
//! **Early acknowledgement** (option `early_ack`, a research design: Nadav Amit's RFC v2 "x86:
//! Flush remote TLBs concurrently and async", May 2019, patches 10–11 — "smp: Enable data
//! inlining for inter-processor function call" and "x86/mm/tlb: Use async and inline messages
//! for flushing" — and the EuroSys'20 paper "Don't shoot down TLB shootdowns!"). The flush
//! request is copied into the csd (`CSD_FLAG_INLINED`), so the responder can let the initiator
//! go before it flushes: `flush_smp_call_function_queue()` copies `csd->inlined_info`, sets
//! `async_func_in_progress = func`, unlocks the csd, runs `func`, then clears
//! `async_func_in_progress`. The argument is that a CPU inside the interrupt handler uses no
//! user translation before it returns, by which time it has flushed; only NMIs read user memory
//! from there, and `nmi_uaccess_okay()` refuses while `async_func_in_progress` names the flush
//! (`nmi.rs`). Flushes that free page tables stay synchronous ("speculative page walks might
//! cause machine-checks"), and so does `flush_tlb_kernel_range` (`kernel_map.rs`). In the RFC as
//! posted the call is made with `wait = 0`: the initiator does not even wait for the
//! acknowledgement (`rfc_v2`); `acked` waits for each early unlock, as the thread describes the
//! design. Simplified: the model's flush request is still read from the initiator's per-CPU
//! `flush_tlb_info` in the same step as the unlock (the inlined copy and the unlock touch no
//! location another CPU writes meanwhile), and the lazy filter is the configured kernel's
//! (`flush_cond`), where the RFC used `tlb_is_not_lazy`.

use crate::counters::Counter;
use crate::frame::{CallCond, Flow, Frame};
use crate::machine::Machine;
use crate::mem::{call_queue_line, flush_info_line, spin_key, Loc};
use crate::options::EarlyAck;
use crate::state::*;
use crate::tlb::{loaded_mm_text, FlushFunc};
use shootdown_engine::trace::TraceEvent;
use shootdown_engine::Env;
use shootdown_hw::CpuId;

/// What a cross call runs on its targets (`smp_call_func_t func`, kept in each csd).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub enum CallFunc {
    /// `flush_tlb_func` with the initiator's `flush_tlb_info`.
    FlushTlb,
    /// The `ipi_benchmark` module's `handle_ipi`: it records when it ran (`ktime_get()`, whose
    /// cost is not modelled), so here it does nothing.
    Nop,
    /// `ipi_benchmark`'s `handle_ipi_spinlock`: `spin_lock()` then `spin_unlock()` of one lock
    /// every target shares (a [`Machine::add_kernel_lock`] id).
    SpinLock { lock: u32 },
}

/// Where a module's cross call goes ([`crate::UserOp::CrossCall`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub enum CrossCallTo {
    /// `smp_call_function_single(this_cpu, func, info, 1)`: `func` runs here, with interrupts
    /// off, and no IPI is sent.
    This,
    /// `smp_call_function_single(cpumask_any_but(cpu_online_mask, this_cpu), …, 1)`: the first
    /// other CPU.
    AnyBut,
    /// `smp_call_function_many(cpu_online_mask, …, 1)`: every other CPU.
    AllOthers,
}

/// `smp_call_function_many_cond()` running `func` (`flush_tlb_func` unless a module's call).
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct SmpCallMany {
    pub pc: SmpCallManyPc,
    /// What the targets run.
    pub func: CallFunc,
    pub info: FlushTlbInfo,
    pub cond: CallCond,
    /// Remote candidates (the mask minus this CPU), in order.
    pub candidates: Vec<CpuId>,
    pub i: usize,
    /// Targets whose csd was queued (waited on).
    pub queued: Vec<CpuId>,
    /// Targets that need an IPI (their queue was empty).
    pub ipi: Vec<CpuId>,
    /// `SCF_RUN_LOCAL`: also run on this CPU, between sending and waiting.
    pub run_local: bool,
    /// O1 mutant: bump `tlb_gen` in the local part.
    pub inc_gen_locally: bool,
    /// Pre-v5.6 `on_each_cpu_cond_mask()`: run `func` on this CPU too, after waiting for the
    /// remote ones (`on_each_cpu_mask()`).
    pub local_after: bool,
}

shootdown_engine::clone_by_fields!(SmpCallMany {
    pc,
    func,
    info,
    cond,
    candidates,
    i,
    queued,
    ipi,
    run_local,
    inc_gen_locally,
    local_after,
});

/// The steps of `smp_call_function_many_cond()`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SmpCallManyPc {
    /// `cond_func` for the next candidate.
    Cond,
    /// `csd_lock` + fill + `llist_add` to the candidate's `call_single_queue`.
    Queue,
    /// Send the IPIs to the targets whose queue was empty.
    SendIpis,
    /// `SCF_RUN_LOCAL`: run `func` here while the remote CPUs work.
    RunLocal,
    /// `csd_lock_wait` for each queued target.
    Wait,
}

impl SmpCallMany {
    /// The target its next step considers, queues or waits for, in its lists (for the
    /// prefetch hint, [`crate::perf::FrameHint`]).
    pub(crate) fn next_target(&self) -> Option<&CpuId> {
        match self.pc {
            SmpCallManyPc::Cond | SmpCallManyPc::Queue => self.candidates.get(self.i),
            SmpCallManyPc::Wait => self.queued.get(self.i),
            SmpCallManyPc::SendIpis | SmpCallManyPc::RunLocal => None,
        }
    }

    /// A call over `candidates` (remote CPUs, in `for_each_cpu` order) filtered by `cond`.
    pub fn new(cond: CallCond, candidates: Vec<CpuId>, info: FlushTlbInfo) -> SmpCallMany {
        SmpCallMany {
            pc: SmpCallManyPc::Cond,
            func: CallFunc::FlushTlb,
            info,
            cond,
            candidates,
            i: 0,
            queued: Vec::new(),
            ipi: Vec::new(),
            run_local: false,
            inc_gen_locally: false,
            local_after: false,
        }
    }
}

/// The CALL_FUNCTION vector handler: `__flush_smp_call_function_queue()`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CallFunctionIrq {
    pub pc: CallFunctionIrqPc,
    pub entries: Vec<CsdKey>,
    pub i: usize,
    /// The interrupt arrived in user mode, so it returns there (timed runs only: it prices
    /// the return).
    pub from_user: bool,
    /// Early acknowledgement: `async_func_in_progress` is `flush_tlb_func` (its csd is
    /// unlocked, its flush not yet done).
    pub async_running: bool,
}

/// The steps of the CALL_FUNCTION handler.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CallFunctionIrqPc {
    /// `llist_del_all` of this CPU's `call_single_queue`.
    DelAll,
    /// Run `func` for the next entry (or return from the interrupt).
    Run,
    /// `csd_unlock` of the entry just run.
    Unlock,
    /// Early acknowledgement: `flush_tlb_func` returned; `async_func_in_progress = NULL`.
    AsyncDone,
    /// `handle_ipi_spinlock`: take the shared lock (spinning), then release it.
    LockFunc,
}

impl CallFunctionIrq {
    /// The csd its next step runs or unlocks, in its list (for the prefetch hint,
    /// [`crate::perf::FrameHint`]).
    pub(crate) fn next_entry(&self) -> Option<&CsdKey> {
        self.entries.get(self.i)
    }

    pub fn new(from_user: bool) -> CallFunctionIrq {
        CallFunctionIrq {
            pc: CallFunctionIrqPc::DelAll,
            entries: Vec::new(),
            i: 0,
            from_user,
            async_running: false,
        }
    }
}

impl Machine {
    /// Early acknowledgement: may this request's csd be unlocked before its flush? Not for a
    /// kernel-range flush, nor (but for the mutant) one that frees page tables.
    pub(crate) fn early_ack_allowed(&self, info: &FlushTlbInfo) -> bool {
        self.opts.early_ack != EarlyAck::Off
            && !info.kernel
            && (!info.freed_tables || self.opts.mutants.early_ack_freed_tables())
    }

    /// Early acknowledgement as the RFC posted it: an async flush is sent with `wait = 0`.
    fn no_wait(&self, s: &SmpCallMany) -> bool {
        self.opts.early_ack == EarlyAck::RfcV2 && self.call_early_acked(s)
    }

    /// Is this call's flush acknowledged early (never a module's call)?
    fn call_early_acked(&self, s: &SmpCallMany) -> bool {
        s.func == CallFunc::FlushTlb && self.early_ack_allowed(&s.info)
    }

    /// A module's cross call from `cpu` to `to` running `func`, waiting for it
    /// (`smp_call_function_single` / `smp_call_function_many` with `wait = 1`).
    pub(crate) fn cross_call_frame(&self, cpu: CpuId, to: CrossCallTo, func: CallFunc) -> Frame {
        let others = (0..self.cpus.len()).filter(|&c| c != cpu);
        let candidates: Vec<CpuId> = match to {
            CrossCallTo::This => Vec::new(),
            CrossCallTo::AnyBut => others.take(1).collect(),
            CrossCallTo::AllOthers => others.collect(),
        };
        let info = FlushTlbInfo {
            mm: None,
            start: 0,
            end: 0,
            new_tlb_gen: 0,
            stride_shift: 0,
            freed_tables: false,
            trim_cpumask: false,
            initiator: cpu,
            kernel: false,
        };
        Frame::SmpCallMany(Box::new(SmpCallMany {
            func,
            run_local: to == CrossCallTo::This,
            ..SmpCallMany::new(CallCond::All, candidates, info)
        }))
    }

    /// Would the CALL_FUNCTION handler's next step only spin (on `handle_ipi_spinlock`'s lock)?
    pub(crate) fn call_function_spins(&self, cpu: CpuId, s: &CallFunctionIrq) -> bool {
        s.pc == CallFunctionIrqPc::LockFunc
            && match self.cfd_func[s.entries[s.i].src] {
                CallFunc::SpinLock { lock } => self.kernel_lock_waits(cpu, lock),
                _ => false,
            }
    }

    /// `this_cpu_read(async_func_in_progress) == flush_tlb_func`: `cpu` is between an early
    /// unlock and the end of that flush (`nmi_uaccess_okay()`'s added test).
    pub(crate) fn async_flush_in_progress(&self, cpu: CpuId) -> bool {
        self.cpus[cpu]
            .irq_stack
            .iter()
            .any(|f| matches!(f, Frame::CallFunctionIrq(s) if s.async_running))
    }

    /// Mainline `should_flush_tlb(cpu, info)`.
    fn should_flush_tlb<E: Env>(
        &mut self,
        me: CpuId,
        cpu: CpuId,
        info: &FlushTlbInfo,
        env: &mut E,
    ) -> bool {
        let loaded = self.load_overlapped(env, me, Loc::LoadedMm(cpu as u32));
        // smp_rmb(): is_lazy is at least as new as loaded_mm.
        if self.load_overlapped(env, me, Loc::IsLazy(cpu as u32)) != 0 {
            return false; // lazy: flushed at the next switch
        }
        let Some(mm) = info.mm else { return true };
        if loaded == LOADED_MM_SWITCHING && !self.opts.mutants.should_flush_ignores_switching() {
            return true;
        }
        loaded == mm as u64 || info.trim_cpumask
    }

    fn call_cond<E: Env>(&mut self, me: CpuId, cpu: CpuId, s: &SmpCallMany, env: &mut E) -> bool {
        match s.cond {
            CallCond::All => true,
            // tlb_is_not_lazy(): one remote read of is_lazy.
            CallCond::NotLazy => self.load_overlapped(env, me, Loc::IsLazy(cpu as u32)) == 0,
            CallCond::ShouldFlush => self.should_flush_tlb(me, cpu, &s.info, env),
        }
    }

    pub(crate) fn smp_call_spins(&self, cpu: CpuId, s: &SmpCallMany) -> bool {
        let locked =
            |dst: CpuId| self.value_seen_by(cpu, Loc::CsdLock(CsdKey { src: cpu, dst })) != 0;
        match s.pc {
            SmpCallManyPc::Queue => locked(s.candidates[s.i]),
            SmpCallManyPc::Wait => s.i < s.queued.len() && locked(s.queued[s.i]),
            _ => false,
        }
    }

    /// One step of `smp_call_function_many_cond(mask, flush_tlb_func, info, wait=1, cond)`.
    pub(crate) fn smp_call_function_many_step<E: Env>(
        &mut self,
        cpu: CpuId,
        s: &mut SmpCallMany,
        env: &mut E,
    ) -> Flow {
        use SmpCallManyPc::*;
        match s.pc {
            Cond => {
                if s.i >= s.candidates.len() {
                    self.summary(|| "every target considered".into());
                    s.pc = SendIpis;
                    return Flow::Next;
                }
                let t = s.candidates[s.i];
                // What cond_func looks at, as it is in memory now (counterexample text only).
                let ts = &self.cpus[t].tlbstate;
                let (is_lazy, loaded) = (ts.is_lazy, ts.loaded_mm);
                let yes = self.call_cond(cpu, t, s, env);
                let cond = s.cond;
                self.summary(|| {
                    let what = match cond {
                        CallCond::All => format!("cpu{t} in mask"),
                        CallCond::NotLazy => {
                            format!("tlb_is_not_lazy(cpu{t}) = {yes} (is_lazy = {is_lazy})")
                        }
                        CallCond::ShouldFlush => format!(
                            "should_flush_tlb(cpu{t}) = {yes} (loaded_mm = {}, is_lazy = {is_lazy})",
                            loaded_mm_text(loaded)
                        ),
                    };
                    format!("{what}{}", if yes { "" } else { ": skip" })
                });
                if yes {
                    s.pc = Queue;
                } else {
                    s.i += 1;
                }
                Flow::Next
            }
            Queue => {
                let t = s.candidates[s.i];
                let k = CsdKey { src: cpu, dst: t };
                if self.smp_call_spins(cpu, s) {
                    // csd_lock_wait(): a previous call still owns it
                    return Flow::Spin(spin_key(Loc::CsdLock(k)));
                }
                self.store(env, cpu, Loc::CsdLock(k), 1);
                // The csd's func (one per sender's cfd here: a sender runs one call at a time).
                self.cfd_func[cpu] = s.func;
                // llist_add(): cmpxchg on the target's queue head (full barrier).
                self.fence(cpu);
                self.touch_line(env, cpu, call_queue_line(t), true);
                self.charge(env, |c| c.atomic_rmw);
                let q = &mut self.cpus[t].call_queue;
                let was_empty = q.is_empty();
                q.push(k);
                if was_empty {
                    s.ipi.push(t);
                }
                self.summary(|| {
                    format!(
                        "csd_lock + llist_add(csd, call_single_queue(cpu{t})){}",
                        if was_empty {
                            ": queue was empty, IPI needed"
                        } else {
                            ": queue not empty, no IPI"
                        }
                    )
                });
                s.queued.push(t);
                s.i += 1;
                s.pc = Cond;
                Flow::Next
            }
            SendIpis => {
                let targets = std::mem::take(&mut s.ipi);
                let n = if s.info.end == TLB_FLUSH_ALL {
                    1
                } else {
                    (s.info.end - s.info.start).div_ceil(1 << s.info.stride_shift)
                };
                if s.func == CallFunc::FlushTlb {
                    self.perf
                        .counters
                        .add(Counter::FlushRemoteSendIpi, n * s.queued.len() as u64);
                }
                if targets.is_empty() {
                    self.summary(|| "no IPI to send".into());
                } else {
                    self.summary(|| format!("send CALL_FUNCTION IPI to cpus {targets:?}"));
                }
                self.send_call_function_ipi(cpu, &targets, env);
                s.pc = RunLocal;
                Flow::Next
            }
            RunLocal => {
                s.pc = Wait;
                // The RFC's flush_tlb_multi() with wait = 0: no csd_lock_wait at all.
                s.i = if self.no_wait(s) { s.queued.len() } else { 0 };
                if s.run_local && s.func != CallFunc::FlushTlb {
                    // smp_call_function_single() to this CPU: func runs here, interrupts off.
                    if let CallFunc::SpinLock { .. } = s.func {
                        unreachable!("a module's local call runs handle_ipi only");
                    }
                    self.summary(|| "run the function here, interrupts off (no IPI)".into());
                    return Flow::Next;
                }
                if s.run_local {
                    if s.inc_gen_locally {
                        if let Some(mm) = s.info.mm {
                            self.rmw(env, cpu, Loc::TlbGen(mm), |g| g + 1);
                        }
                    }
                    if self.call_cond(cpu, cpu, s, env) {
                        self.summary(|| {
                            "run flush_tlb_func locally (SCF_RUN_LOCAL), while the remote CPUs work"
                                .into()
                        });
                        return Flow::Call(FlushFunc::call(s.info, true));
                    }
                }
                if self.no_wait(s) {
                    self.summary(|| "wait = 0 (async flush, RFC v2 as posted)".into());
                } else {
                    self.summary(|| "wait for the targets".into());
                }
                Flow::Next
            }
            Wait => {
                if s.i >= s.queued.len() {
                    if self.no_wait(s) {
                        self.summary(|| "return without waiting for the targets (wait = 0)".into());
                    } else if self.call_early_acked(s) {
                        self.summary(|| "return: every target has acknowledged (early ack)".into());
                    } else if s.func != CallFunc::FlushTlb {
                        self.summary(|| "return: every target has run the function".into());
                    } else {
                        self.summary(|| "return: every target has run flush_tlb_func".into());
                    }
                    if s.local_after && self.call_cond(cpu, cpu, s, env) {
                        // on_each_cpu_mask(): the calling CPU runs func after the remote ones
                        // (flush_tlb_func_remote, which finds itself up to date).
                        s.local_after = false;
                        return Flow::Call(FlushFunc::call(s.info, false));
                    }
                    return Flow::Return;
                }
                let t = s.queued[s.i];
                let k = CsdKey { src: cpu, dst: t };
                if self.smp_call_spins(cpu, s) {
                    return Flow::Spin(spin_key(Loc::CsdLock(k)));
                }
                self.load(env, cpu, Loc::CsdLock(k));
                if self.call_early_acked(s) {
                    self.summary(|| {
                        format!("csd_lock_wait(cpu{t}): csd unlocked, request acknowledged")
                    });
                } else {
                    self.summary(|| format!("csd_lock_wait(cpu{t}): csd unlocked, request done"));
                }
                s.i += 1;
                Flow::Next
            }
        }
    }

    /// One step of the CALL_FUNCTION handler: `DelAll` takes the queue (then FIFO order), `Run`
    /// runs `func` for the next entry, `Unlock` unlocks its csd (SYNC: after `func`, so the
    /// waiter learns completion).
    pub(crate) fn call_function_interrupt_step<E: Env>(
        &mut self,
        cpu: CpuId,
        s: &mut CallFunctionIrq,
        env: &mut E,
    ) -> Flow {
        use CallFunctionIrqPc::*;
        match s.pc {
            DelAll => {
                self.fence(cpu);
                self.touch_line(env, cpu, call_queue_line(cpu), true);
                // The queue holds the entries in insertion order already (FIFO after reversal).
                s.entries = std::mem::take(&mut self.cpus[cpu].call_queue);
                s.i = 0;
                s.pc = Run;
                let n = s.entries.len();
                self.summary(|| format!("llist_del_all(call_single_queue): {n} request(s)"));
                Flow::Next
            }
            Run => {
                if s.i >= s.entries.len() {
                    // `exiting_irq()` and the return path, after every csd is unlocked.
                    if env.timed() {
                        let t = self.irq_exit_time(s.from_user);
                        env.charge(t);
                    }
                    self.summary(|| "return from interrupt".into());
                    return Flow::Return;
                }
                let k = s.entries[s.i];
                s.pc = Unlock;
                match self.cfd_func[k.src] {
                    CallFunc::FlushTlb => {}
                    CallFunc::Nop => {
                        self.summary(|| format!("run cpu{}'s handle_ipi", k.src));
                        return Flow::Next;
                    }
                    CallFunc::SpinLock { .. } => {
                        s.pc = LockFunc;
                        self.summary(|| format!("run cpu{}'s handle_ipi_spinlock", k.src));
                        return Flow::Next;
                    }
                }
                let Some(info) = self.flush_info[k.src] else {
                    self.summary(|| format!("run flush_tlb_func for cpu{}'s request", k.src));
                    return Flow::Next;
                };
                self.touch_line(env, cpu, flush_info_line(k.src), false);
                if !self.early_ack_allowed(&info) {
                    self.summary(|| format!("run flush_tlb_func for cpu{}'s request", k.src));
                } else {
                    // Copy the inlined request, async_func_in_progress = flush_tlb_func,
                    // csd_unlock(): the initiator may go on before this CPU flushes.
                    self.store(env, cpu, Loc::CsdLock(k), 0);
                    self.perf.counters.inc(Counter::EarlyAcks);
                    if env.tracing() {
                        env.trace(TraceEvent::Instant {
                            agent: cpu,
                            name: "early ack",
                            detail: Some(format!(
                                "cpu{}'s flush acknowledged before it runs",
                                k.src
                            )),
                        });
                    }
                    s.async_running = true;
                    s.pc = AsyncDone;
                    self.summary(|| {
                        format!(
                            "copy cpu{}'s inlined flush_tlb_info; async_func_in_progress = flush_tlb_func; csd_unlock (early ack): cpu{} may go on; now run flush_tlb_func",
                            k.src, k.src
                        )
                    });
                }
                Flow::Call(FlushFunc::call(info, false))
            }
            AsyncDone => {
                s.async_running = false;
                self.summary(|| {
                    "async_func_in_progress = NULL: the early-acked flush is done".into()
                });
                s.i += 1;
                s.pc = Run;
                Flow::Next
            }
            LockFunc => {
                let k = s.entries[s.i];
                let CallFunc::SpinLock { lock } = self.cfd_func[k.src] else {
                    unreachable!("LockFunc runs handle_ipi_spinlock only");
                };
                if let Some(wait) = self.kernel_spin_lock(cpu, lock, env) {
                    return wait;
                }
                self.kernel_spin_unlock(cpu, lock, env);
                self.summary(|| "spin_lock + spin_unlock of the benchmark's lock".into());
                s.pc = Unlock;
                Flow::Next
            }
            Unlock => {
                let k = s.entries[s.i];
                // smp_store_release(&csd->node.u_flags, 0)
                self.store(env, cpu, Loc::CsdLock(k), 0);
                self.summary(|| format!("csd_unlock: cpu{}'s request done", k.src));
                s.i += 1;
                s.pc = Run;
                Flow::Next
            }
        }
    }
}

//! kernel/smp.c: `smp_call_function_many_cond()` and the CALL_FUNCTION handler
//! `__flush_smp_call_function_queue()` (kernel-model.md §2). Only `flush_tlb_func` is ever
//! called through it in this model.
//!
//! Simplifications: the v5.x single-target fast path (`smp_call_function_single` with an
//! on-stack csd) is folded into the general path (same steps, same costs); `cond_func` reads the
//! remote CPU's state in one step.

use crate::counters::Counter;
use crate::frame::{CallCond, CallFunctionIrq, Flow, FlushFunc, SmpCallMany};
use crate::machine::Machine;
use crate::mem::{call_queue_line, flush_info_line, spin_key, Loc};
use crate::state::*;
use shootdown_engine::Env;
use shootdown_hw::CpuId;

impl Machine {
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
        if loaded == LOADED_MM_SWITCHING && !self.opts.mutants.should_flush_ignores_switching {
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
        let locked = |dst: CpuId| {
            let k = Loc::CsdLock(CsdKey { src: cpu, dst });
            self.cpus[cpu]
                .sb
                .forward(k)
                .map(|v| v != 0)
                .unwrap_or_else(|| self.csd_locked.contains(&CsdKey { src: cpu, dst }))
        };
        match s.pc {
            1 => locked(s.candidates[s.i]),
            5 => s.i < s.queued.len() && locked(s.queued[s.i]),
            _ => false,
        }
    }

    /// One step of `smp_call_function_many_cond(mask, flush_tlb_func, info, wait=1, cond)`.
    ///
    /// pc 0: `cond_func` for the next candidate; pc 1: `csd_lock` + fill + `llist_add` to its
    /// `call_single_queue` (an IPI is needed only if the queue was empty); pc 3: send the IPIs;
    /// pc 4: with `SCF_RUN_LOCAL`, run `func` here while the remotes work (Nadav); pc 5:
    /// `csd_lock_wait` for each queued target.
    pub(crate) fn smp_call_function_many_step<E: Env>(
        &mut self,
        cpu: CpuId,
        s: &mut SmpCallMany,
        env: &mut E,
    ) -> Flow {
        match s.pc {
            0 => {
                if s.i >= s.candidates.len() {
                    s.pc = 3;
                    return Flow::Next;
                }
                let t = s.candidates[s.i];
                if self.call_cond(cpu, t, s, env) {
                    s.pc = 1;
                } else {
                    s.i += 1;
                }
                Flow::Next
            }
            1 => {
                let t = s.candidates[s.i];
                let k = CsdKey { src: cpu, dst: t };
                if self.smp_call_spins(cpu, s) {
                    // csd_lock_wait(): a previous call still owns it
                    return Flow::Spin(spin_key(Loc::CsdLock(k)));
                }
                self.store(env, cpu, Loc::CsdLock(k), 1);
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
                s.queued.push(t);
                s.i += 1;
                s.pc = 0;
                Flow::Next
            }
            3 => {
                let targets = std::mem::take(&mut s.ipi);
                let n = if s.info.end == TLB_FLUSH_ALL {
                    1
                } else {
                    s.info.end - s.info.start
                };
                self.perf
                    .counters
                    .add(Counter::FlushRemoteSendIpi, n * s.queued.len() as u64);
                self.send_call_function_ipi(cpu, &targets, env);
                s.pc = 4;
                Flow::Next
            }
            4 => {
                s.pc = 5;
                s.i = 0;
                if s.run_local {
                    if s.inc_gen_locally {
                        if let Some(mm) = s.info.mm {
                            self.rmw(env, cpu, Loc::TlbGen(mm), |g| g + 1);
                        }
                    }
                    if self.call_cond(cpu, cpu, s, env) {
                        return Flow::Call(FlushFunc::call(s.info, true));
                    }
                }
                Flow::Next
            }
            _ => {
                if s.i >= s.queued.len() {
                    if s.local_after && self.call_cond(cpu, cpu, s, env) {
                        // on_each_cpu_mask(): the calling CPU runs func after the remote ones
                        // (flush_tlb_func_remote, which finds itself up to date).
                        s.local_after = false;
                        return Flow::Call(FlushFunc::call(s.info, false));
                    }
                    return Flow::Return;
                }
                let k = CsdKey {
                    src: cpu,
                    dst: s.queued[s.i],
                };
                if self.smp_call_spins(cpu, s) {
                    return Flow::Spin(spin_key(Loc::CsdLock(k)));
                }
                self.load(env, cpu, Loc::CsdLock(k));
                s.i += 1;
                Flow::Next
            }
        }
    }

    /// One step of the CALL_FUNCTION handler: pc 0 `llist_del_all` (then FIFO order), pc 1 run
    /// `func` for the next entry, pc 2 `csd_unlock` (SYNC: after `func`, so the waiter learns
    /// completion).
    pub(crate) fn call_function_interrupt_step<E: Env>(
        &mut self,
        cpu: CpuId,
        s: &mut CallFunctionIrq,
        env: &mut E,
    ) -> Flow {
        match s.pc {
            0 => {
                self.fence(cpu);
                self.touch_line(env, cpu, call_queue_line(cpu), true);
                let mut e = std::mem::take(&mut self.cpus[cpu].call_queue);
                e.sort_by_key(|_| 0); // stable: queue order is insertion order already (FIFO after reversal)
                s.entries = e;
                s.i = 0;
                s.pc = 1;
                Flow::Next
            }
            1 => {
                if s.i >= s.entries.len() {
                    return Flow::Return;
                }
                let k = s.entries[s.i];
                let Some(info) = self.flush_info[k.src] else {
                    s.pc = 2;
                    return Flow::Next;
                };
                self.touch_line(env, cpu, flush_info_line(k.src), false);
                s.pc = 2;
                Flow::Call(FlushFunc::call(info, false))
            }
            _ => {
                let k = s.entries[s.i];
                // smp_store_release(&csd->node.u_flags, 0)
                self.store(env, cpu, Loc::CsdLock(k), 0);
                s.i += 1;
                s.pc = 1;
                Flow::Next
            }
        }
    }
}

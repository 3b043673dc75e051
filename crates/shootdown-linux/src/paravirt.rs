//! arch/x86/kernel/kvm.c (guest side of seed 001): the paravirtual TLB flush.
//!
//! `kvm_flush_tlb_others()` (v4.16) / `kvm_flush_tlb_multi()` (now) replaces the native
//! cross call of a flush: for each remote vCPU of the mask it reads that vCPU's steal-time
//! `preempted` byte (G1); if the host marked it `KVM_VCPU_PREEMPTED`, it tries
//! `cmpxchg(byte, seen, seen | KVM_VCPU_FLUSH_TLB)` (G2) and on success drops the vCPU from the
//! flush mask — the host will flush its TLB before it next enters the guest (kvm_host.rs) — then
//! makes the native call (§2) for the vCPUs that remain. The initiator itself is running, so it
//! is never preempted and is not looked at (the kernel reads its byte too and finds 0).
//!
//! Simplification: the scratch `__pv_tlb_mask` copy of the cpumask is the list of candidates the
//! native path computed (`mm_cpumask` minus this CPU); lazy filtering still happens afterwards,
//! inside the native call, as in the kernel.

use crate::counters::Counter;
use crate::frame::{Flow, Frame, PvFlushTlbMulti, SmpCallMany};
use crate::kvm_host::{KVM_VCPU_FLUSH_TLB, KVM_VCPU_PREEMPTED};
use crate::machine::Machine;
use crate::mem::Loc;
use shootdown_engine::Env;
use shootdown_hw::CpuId;

impl Machine {
    /// The cross call of a flush: the native `smp_call_function_many_cond`, or — in a guest with
    /// `pv_tlb_flush` — the PV filter in front of it.
    pub(crate) fn flush_others_frame(&self, call: SmpCallMany) -> Frame {
        if self.opts.pv_tlb_flush && self.host.is_some() && !call.candidates.is_empty() {
            Frame::PvFlushTlbMulti(Box::new(PvFlushTlbMulti {
                pc: 0,
                call,
                i: 0,
                seen: 0,
                keep: Vec::new(),
            }))
        } else {
            Frame::SmpCallMany(Box::new(call))
        }
    }

    /// One step of `kvm_flush_tlb_multi(cpumask, info)`: pc 0 reads the next candidate's byte
    /// (G1), pc 1 the cmpxchg (G2); when every candidate was looked at, the native call with the
    /// vCPUs that were not skipped.
    pub(crate) fn pv_flush_tlb_multi_step<E: Env>(
        &mut self,
        cpu: CpuId,
        s: &mut PvFlushTlbMulti,
        env: &mut E,
    ) -> Flow {
        match s.pc {
            0 => {
                if s.i >= s.call.candidates.len() {
                    s.pc = 2;
                    let mut call = s.call.clone();
                    call.candidates = std::mem::take(&mut s.keep);
                    if call.candidates.is_empty() && !call.run_local {
                        self.say(|| "every target vCPU was preempted: no IPI".into());
                        return Flow::Return;
                    }
                    let n = call.candidates.clone();
                    self.say(|| format!("native flush with the remaining vCPUs {n:?}"));
                    return Flow::Call(Frame::SmpCallMany(Box::new(call)));
                }
                let t = s.call.candidates[s.i];
                let st = self.load(env, cpu, Loc::Preempted(t as u32));
                self.say(|| format!("READ_ONCE(st[{t}].preempted) = {st:#x}"));
                if st & KVM_VCPU_PREEMPTED != 0 {
                    s.seen = st as u8;
                    s.pc = 1;
                } else {
                    s.keep.push(t);
                    s.i += 1;
                }
                Flow::Next
            }
            1 => {
                let t = s.call.candidates[s.i];
                let seen = s.seen as u64;
                let old = self.rmw(env, cpu, Loc::Preempted(t as u32), |x| {
                    if x == seen {
                        x | KVM_VCPU_FLUSH_TLB
                    } else {
                        x
                    }
                });
                if old == seen {
                    self.perf.counters.inc(Counter::PvTlbFlushSkipped);
                    self.say(|| {
                        format!("cmpxchg(st[{t}].preempted, {seen:#x}, {:#x}) succeeds: vcpu{t} skipped (flushed by the host at entry)", seen | KVM_VCPU_FLUSH_TLB)
                    });
                } else {
                    s.keep.push(t);
                    self.say(|| {
                        format!("cmpxchg(st[{t}].preempted, {seen:#x}, ..) fails (now {old:#x}): vcpu{t} stays in the mask")
                    });
                }
                s.i += 1;
                s.pc = 0;
                Flow::Next
            }
            _ => {
                self.say(|| "return".into());
                Flow::Return
            }
        }
    }
}

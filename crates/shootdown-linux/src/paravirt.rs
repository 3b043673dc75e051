//! arch/x86/kernel/kvm.c (guest side of seed 001): the paravirtual TLB flush, and the PV sched
//! yield after a call-function IPI (v5.3+, [`Machine::pv_sched_yield`]).
//!
//! `kvm_flush_tlb_others()` (v4.16) / `kvm_flush_tlb_multi()` (now) replaces the native
//! cross call of a flush: for each remote vCPU of the mask it reads that vCPU's steal-time
//! `preempted` byte (G1); if the host marked it `KVM_VCPU_PREEMPTED`, it tries
//! `cmpxchg(byte, seen, seen | KVM_VCPU_FLUSH_TLB)` (G2) and on success drops the vCPU from the
//! flush mask — the host will flush its TLB before it next enters the guest (kvm/x86.rs) — then
//! makes the native call (§2) for the vCPUs that remain. The initiator itself is running, so it
//! is never preempted and is not looked at (the kernel reads its byte too and finds 0).
//!
//! Simplification: the scratch `__pv_tlb_mask` copy of the cpumask is the list of candidates the
//! native path computed (`mm_cpumask` minus this CPU); lazy filtering still happens afterwards,
//! inside the native call, as in the kernel.

use crate::counters::Counter;
use crate::frame::{Flow, Frame};
use crate::kvm::{KVM_VCPU_FLUSH_TLB, KVM_VCPU_PREEMPTED};
use crate::machine::Machine;
use crate::mem::Loc;
use crate::smp::SmpCallMany;
use shootdown_engine::Env;
use shootdown_hw::CpuId;

/// The guest's paravirtual `kvm_flush_tlb_others()` / `kvm_flush_tlb_multi()`
/// (arch/x86/kernel/kvm.c): filter out preempted vCPUs, then the native cross call with the rest.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct PvFlushTlbMulti {
    pub pc: PvFlushTlbMultiPc,
    /// The native call to make afterwards; its `candidates` are the remote CPUs of the mask.
    pub call: SmpCallMany,
    /// Next candidate to look at.
    pub i: usize,
    /// The byte read by step G1 for the current candidate.
    pub seen: u8,
    /// Candidates that still need the IPI (`flushmask`).
    pub keep: Vec<CpuId>,
}

shootdown_engine::clone_by_fields!(PvFlushTlbMulti {
    pc,
    call,
    i,
    seen,
    keep,
});

/// The steps of `kvm_flush_tlb_multi()`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PvFlushTlbMultiPc {
    /// G1: read the next candidate's steal-time `preempted` byte (or, when every candidate was
    /// looked at, call the native cross call with those left).
    ReadPreempted,
    /// G2: `cmpxchg` `KVM_VCPU_FLUSH_TLB` into a preempted candidate's byte.
    SetFlushTlb,
    /// Back from the native call: return.
    Done,
}

impl Machine {
    /// The cross call of a flush: the native `smp_call_function_many_cond`, or — in a guest with
    /// `pv_tlb_flush` — the PV filter in front of it.
    pub(crate) fn flush_others_frame(&self, call: SmpCallMany) -> Frame {
        if self.opts.shoot4u && self.host.is_some() && !call.candidates.is_empty() {
            return crate::shoot4u::Shoot4u::call(call);
        }
        if self.opts.hv_tlb_flush != crate::options::HvTlbFlush::Off
            && self.host.is_some()
            && !call.candidates.is_empty()
        {
            return crate::hyperv::HvFlushTlbMulti::call(call);
        }
        if self.opts.pv_tlb_flush && self.host.is_some() && !call.candidates.is_empty() {
            Frame::PvFlushTlbMulti(Box::new(PvFlushTlbMulti {
                pc: PvFlushTlbMultiPc::ReadPreempted,
                call,
                i: 0,
                seen: 0,
                keep: Vec::new(),
            }))
        } else {
            Frame::SmpCallMany(Box::new(call))
        }
    }

    /// A flush hypercall that replaced the remote part of `call` (Shoot4U's, Hyper-V's) has
    /// returned (VM entry): this vCPU's own flush if it has the mm loaded (`flush_tlb_multi`'s
    /// local part), else return. The caller's next step is its last.
    pub(crate) fn flush_hypercall_returned(&mut self, call: &SmpCallMany) -> Flow {
        if call.run_local {
            self.summary(|| {
                "the hypercall returns (VM entry); mm loaded here: flush_tlb_func (local)".into()
            });
            return Flow::Call(crate::tlb::FlushFunc::call(call.info, true));
        }
        self.summary(|| "the hypercall returns (VM entry): return".into());
        Flow::Return
    }

    /// One step of `kvm_flush_tlb_multi(cpumask, info)`: `ReadPreempted` reads the next
    /// candidate's byte (G1), `SetFlushTlb` the cmpxchg (G2); when every candidate was looked
    /// at, the native call with the vCPUs that were not skipped.
    pub(crate) fn pv_flush_tlb_multi_step<E: Env>(
        &mut self,
        cpu: CpuId,
        s: &mut PvFlushTlbMulti,
        env: &mut E,
    ) -> Flow {
        use PvFlushTlbMultiPc::*;
        match s.pc {
            ReadPreempted => {
                if s.i >= s.call.candidates.len() {
                    s.pc = Done;
                    let mut call = s.call.clone();
                    call.candidates = std::mem::take(&mut s.keep);
                    if call.candidates.is_empty() && !call.run_local {
                        self.say(|| "every target vCPU was preempted: no IPI".into());
                        return Flow::Return;
                    }
                    let n = &call.candidates;
                    self.say(|| format!("native flush with the remaining vCPUs {n:?}"));
                    return Flow::Call(Frame::SmpCallMany(Box::new(call)));
                }
                let t = s.call.candidates[s.i];
                let st = self.load(env, cpu, Loc::Preempted(t as u32));
                self.say(|| format!("READ_ONCE(st[{t}].preempted) = {st:#x}"));
                if st & KVM_VCPU_PREEMPTED != 0 {
                    s.seen = st as u8;
                    s.pc = SetFlushTlb;
                } else {
                    s.keep.push(t);
                    s.i += 1;
                }
                Flow::Next
            }
            SetFlushTlb => {
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
                s.pc = ReadPreempted;
                Flow::Next
            }
            Done => {
                self.say(|| "return".into());
                Flow::Return
            }
        }
    }
}

impl Machine {
    /// `kvm_smp_send_call_func_ipi` (v5.3+, `KVM_FEATURE_PV_SCHED_YIELD`, option
    /// `pv_sched_yield`): after sending a call-function IPI, the sender looks for the first
    /// target the host marked preempted (`vcpu_is_preempted`: its steal-time byte) and, if one
    /// is, yields its pCPU to it with the `KVM_HC_SCHED_YIELD` hypercall, so that the IPI it
    /// will wait for gets handled sooner. The host side is `kvm_sched_yield`
    /// (`host/ple.rs`), timed driver only; under the explorer the hypercall is just an exit.
    pub(crate) fn pv_sched_yield<E: Env>(&mut self, src: CpuId, targets: &[CpuId], env: &mut E) {
        let mut target = None;
        for &t in targets {
            if self.load(env, src, Loc::Preempted(t as u32)) & KVM_VCPU_PREEMPTED != 0 {
                target = Some(t);
                break;
            }
        }
        let Some(t) = target else { return };
        self.perf.counters.inc(Counter::PvSchedYield);
        self.say(|| format!("kvm_smp_send_call_func_ipi: vcpu{t} preempted, KVM_HC_SCHED_YIELD"));
        self.vm_exit(env);
        if env.timed() {
            self.kvm_sched_yield(src, t, env);
        }
    }
}

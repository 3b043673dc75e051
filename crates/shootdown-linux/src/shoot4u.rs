//! Shoot4U (Ouyang, Lange and Zheng, "Shoot4U: Using VMM Assists to Optimize TLB Operations on
//! Preempted vCPUs", VEE'16; a research design, never merged), read from the authors' patches
//! of Linux 4.0 (`drouyang/shoot4u`: `shoot4u/0002-guest-support.patch`,
//! `0001-host-support.patch`). Option `shoot4u`; only meaningful on a machine with a host.
//!
//! * **Guest** (`shoot4u_flush_tlb_others`, installed as `pv_mmu_ops.flush_tlb_others`): the
//!   remote part of a flush is one hypercall, `kvm_hypercall3(KVM_HC_SHOOT4U, vcpu_bitmap,
//!   start, end)`, with every vCPU of the mask (no lazy filter, no look at the steal-time
//!   `preempted` byte). No guest IPI is sent and no target runs the guest's `flush_tlb_func`.
//! * **Host** (`kvm_pv_shoot4u_op`): for each target vCPU of the bitmap in vCPU order,
//!   `smp_call_function_single(v->cpu, flush_tlb_func_shoot4u, &info, 1)`: a host IPI to the
//!   pCPU the vCPU runs or last ran on, waited for before the next. There
//!   `flush_tlb_func_shoot4u` flushes the vCPU's VPID (the artifact's default mode:
//!   `kvm_x86_ops->tlb_flush`, every guest translation of every PCID); a vCPU running in the
//!   guest takes the IPI as an external-interrupt exit. Preempted vCPUs cost the initiator one
//!   IPI round trip instead of a wait for their next time slice.
//!
//! Rebuilt on this model's flush code: the hook replaces the remote part of `flush_tlb_multi`
//! (the candidates are `mm_cpumask` minus this vCPU), and the local flush runs after the
//! hypercall returns. The target guest's `cpu_tlbstate` generations are not updated (its
//! `flush_tlb_func` never runs), so it later catches up with flushes of its own: over-flushing,
//! which the kernel's generation checks tolerate. Simplified: the host IPI uses the kick
//! machinery (`send_kick`, `ack_kicks`), and the artifact's fine-grained INVVPID modes (one
//! address for a single-page flush) are not modelled; the hypercall is charged as one VM exit
//! and entry of the initiator, plus each target's IPI round trip as it waits.

use crate::counters::Counter;
use crate::frame::{Flow, Frame};
use crate::machine::Machine;
use crate::mem::{spin_key, Loc};
use crate::smp::SmpCallMany;
use crate::tlb::range_text;
use shootdown_engine::trace::TraceEvent;
use shootdown_engine::Env;
use shootdown_hw::CpuId;

/// The guest's `shoot4u_flush_tlb_others()` and, inside its hypercall, the host's
/// `kvm_pv_shoot4u_op()`.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct Shoot4u {
    pub pc: Shoot4uPc,
    /// The native call it replaces: its `candidates` are the bitmap, its `info` the range, its
    /// `run_local` whether this vCPU flushes itself afterwards.
    pub call: SmpCallMany,
    /// The next target of the bitmap.
    pub i: usize,
}

shootdown_engine::clone_by_fields!(Shoot4u { pc, call, i });

/// The steps of `shoot4u_flush_tlb_others()`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Shoot4uPc {
    /// `kvm_hypercall3(KVM_HC_SHOOT4U, …)`: the VM exit into `kvm_pv_shoot4u_op`.
    Hypercall,
    /// `smp_call_function_single(v->cpu, flush_tlb_func_shoot4u, &info, 1)` for the next
    /// target: lock the csd, send the host IPI.
    Ipi,
    /// Its `csd_lock_wait`.
    Wait,
    /// Back from this vCPU's own flush: return.
    Done,
}

impl Shoot4u {
    pub fn call(call: SmpCallMany) -> Frame {
        Frame::Shoot4u(Box::new(Shoot4u {
            pc: Shoot4uPc::Hypercall,
            call,
            i: 0,
        }))
    }
}

impl Machine {
    /// Would the hypercall's next step only wait (`csd_lock` or `csd_lock_wait` of a host IPI
    /// still pending)?
    pub(crate) fn shoot4u_spins(&self, me: CpuId, s: &Shoot4u) -> bool {
        matches!(s.pc, Shoot4uPc::Ipi | Shoot4uPc::Wait)
            && s.call
                .candidates
                .get(s.i)
                .is_some_and(|&t| self.value_seen_by(me, Loc::KickCsd(me as u32, t as u32)) != 0)
    }

    /// One step of `shoot4u_flush_tlb_others()`.
    pub(crate) fn shoot4u_step<E: Env>(&mut self, me: CpuId, s: &mut Shoot4u, env: &mut E) -> Flow {
        use Shoot4uPc::*;
        match s.pc {
            Hypercall => {
                self.vm_exit(env);
                self.perf.counters.inc(Counter::Shoot4uHypercalls);
                if env.tracing() {
                    let n = s.call.candidates.len();
                    env.trace(TraceEvent::Instant {
                        agent: me,
                        name: "KVM_HC_SHOOT4U",
                        detail: Some(format!("{n} target vCPU(s)")),
                    });
                }
                let call = &s.call;
                self.summary(|| {
                    format!(
                        "kvm_hypercall3(KVM_HC_SHOOT4U, vcpus {:?}, {}): VM exit; kvm_pv_shoot4u_op",
                        call.candidates,
                        range_text(call.info.start, call.info.end)
                    )
                });
                s.pc = Ipi;
                Flow::Next
            }
            Ipi => {
                let Some(&t) = s.call.candidates.get(s.i) else {
                    s.pc = Done;
                    return self.flush_hypercall_returned(&s.call);
                };
                if self.shoot4u_spins(me, s) {
                    // csd_lock(): this vCPU's previous host IPI to t is still pending.
                    return Flow::Spin(spin_key(Loc::KickCsd(me as u32, t as u32)));
                }
                let pcpu = self.host_ref().vcpus[t].pcpu;
                if !self.vcpu_in_guest(t) {
                    // The pCPU runs another thread (or t's thread in host code): the IPI's
                    // handler flushes t's VPID there as it arrives, and the initiator waits
                    // the round trip. (Not a kick: this is a guest frame, and a guest step's
                    // wake-up of a preempted vCPU waits until that vCPU runs, `host/env.rs`.)
                    if env.timed() {
                        let lat = self.ipi_latency(me, t);
                        let c = &self.perf.profile.costs;
                        let t_ipi = c.ipi_send + lat + lat + c.irq_entry + c.irq_exit;
                        env.charge(t_ipi);
                    }
                    self.perf.counters.inc(Counter::KvmKickIpis);
                    self.summary(|| {
                        format!("smp_call_function_single(pcpu{pcpu}, flush_tlb_func_shoot4u for vcpu{t}, wait = 1): vcpu{t} is not in the guest; pcpu{pcpu}'s IPI handler flushes its VPID")
                    });
                    self.flush_tlb_func_shoot4u(t, env);
                    s.i += 1;
                    return Flow::Next;
                }
                self.rmw(env, me, Loc::KickCsd(me as u32, t as u32), |_| 1);
                self.host_mut().vcpus[t].shoot4u_flushes += 1;
                self.send_kick(me, t, env);
                let no_wait = self.opts.mutants.shoot4u_no_wait();
                self.summary(|| {
                    format!(
                        "smp_call_function_single(pcpu{pcpu}, flush_tlb_func_shoot4u for vcpu{t}, wait = {}): host IPI",
                        u8::from(!no_wait)
                    )
                });
                if no_wait {
                    s.i += 1;
                } else {
                    s.pc = Wait;
                }
                Flow::Next
            }
            Wait => {
                let t = s.call.candidates[s.i];
                if self.shoot4u_spins(me, s) {
                    return Flow::Spin(spin_key(Loc::KickCsd(me as u32, t as u32)));
                }
                self.load(env, me, Loc::KickCsd(me as u32, t as u32));
                self.summary(|| format!("csd_lock_wait: vcpu{t}'s VPID flushed on its pCPU"));
                s.i += 1;
                s.pc = Ipi;
                Flow::Next
            }
            Done => {
                self.summary(|| "return".into());
                Flow::Return
            }
        }
    }

    /// `flush_tlb_func_shoot4u()` on vCPU `v`'s pCPU, in the host IPI's handler: the artifact's
    /// default mode, `kvm_x86_ops->tlb_flush(vcpu)`.
    pub(crate) fn flush_tlb_func_shoot4u<E: Env>(&mut self, v: CpuId, env: &mut E) {
        self.say(|| format!("flush_tlb_func_shoot4u: flush vcpu{v}'s VPID"));
        self.kvm_vcpu_flush_tlb(v, env);
    }
}

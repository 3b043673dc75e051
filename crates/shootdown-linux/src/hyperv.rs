//! arch/x86/hyperv/mmu.c: a guest's Hyper-V enlightened TLB flush (option `hv_tlb_flush`; KVM's
//! side is `kvm/hyperv.rs`). With `HV_X64_REMOTE_TLB_FLUSH_RECOMMENDED`,
//! `hyperv_setup_mmu_ops()` installs `hyperv_flush_tlb_multi` (before v5.13
//! `hyperv_flush_tlb_others`) as the remote part of every flush: no IPI, one hypercall with the
//! processor set and the range (the `_Ex` forms for VP numbers of 64 and more). A range is sent as `HvFlushVirtualAddressList` (one GVA entry
//! per `HV_TLB_FLUSH_UNIT` = 4096 pages, up to 509 of them), a full flush as
//! `HvFlushVirtualAddressSpace` with `HV_FLUSH_NON_GLOBAL_MAPPINGS_ONLY`.
//!
//! v6.3+ (`mainline`, "x86/hyperv: Exclude lazy TLB mode CPUs from enlightened TLB flushes")
//! leaves out the CPUs whose `is_lazy` is set, unless the flush frees page tables; earlier
//! forms send every CPU of the mask.
//!
//! Rebuilt on this model's flush code, as `shoot4u.rs` is: the hook replaces the remote part of
//! `flush_tlb_multi` (its candidates are `mm_cpumask` minus this vCPU), and this vCPU's own
//! flush is the caller's local `flush_tlb_func` after the hypercall returns (since v5.13 the
//! calling VP is in the set and KVM flushes it before its next guest instruction: the same
//! point). The targets' `cpu_tlbstate` generations are not updated (their `flush_tlb_func`
//! never runs), so they later catch up with flushes of their own: over-flushing, which the
//! generation checks tolerate. Simplified: the processor set is built in one step, reading
//! each candidate's `is_lazy` (as `cond_func` does in `smp.rs`); a set with a VP number of 64 or
//! more is sent as the `_Ex` form, whose sparse-set encoding is not modelled (KVM makes the same
//! mask of it); the fallback to IPIs when the hypercall fails is not modelled.

use crate::counters::Counter;
use crate::frame::{Flow, Frame};
use crate::machine::Machine;
use crate::mem::Loc;
use crate::options::HvTlbFlush;
use crate::smp::SmpCallMany;
use crate::state::TLB_FLUSH_ALL;
use crate::tlb::range_text;
use shootdown_engine::trace::TraceEvent;
use shootdown_engine::Env;
use shootdown_hw::CpuId;

/// The guest's `hyperv_flush_tlb_multi()`.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct HvFlushTlbMulti {
    pub pc: HvFlushTlbMultiPc,
    /// The native call it replaces: its `candidates` are the mask, its `info` the range, its
    /// `run_local` whether this vCPU flushes itself afterwards.
    pub call: SmpCallMany,
}

shootdown_engine::clone_by_fields!(HvFlushTlbMulti { pc, call });

/// The steps of `hyperv_flush_tlb_multi()`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HvFlushTlbMultiPc {
    /// Build the processor set and make the hypercall: the VM exit into `kvm_hv_flush_tlb`.
    Hypercall,
    /// The hypercall returned (VM entry): this vCPU's own flush, or return.
    Returned,
    /// Back from this vCPU's own flush: return.
    Done,
}

impl HvFlushTlbMulti {
    pub fn call(call: SmpCallMany) -> Frame {
        Frame::HvFlushTlbMulti(Box::new(HvFlushTlbMulti {
            pc: HvFlushTlbMultiPc::Hypercall,
            call,
        }))
    }
}

impl Machine {
    /// One step of `hyperv_flush_tlb_multi()`.
    pub(crate) fn hv_flush_tlb_multi_step<E: Env>(
        &mut self,
        me: CpuId,
        s: &mut HvFlushTlbMulti,
        env: &mut E,
    ) -> Flow {
        use HvFlushTlbMultiPc::*;
        match s.pc {
            Hypercall => {
                let skip_lazy = self.opts.hv_tlb_flush == HvTlbFlush::Mainline
                    && (!s.call.info.freed_tables
                        || self.opts.mutants.hv_flush_skips_lazy_freed_tables());
                let mut targets = Vec::new();
                for &t in &s.call.candidates {
                    if skip_lazy && self.load_overlapped(env, me, Loc::IsLazy(t as u32)) != 0 {
                        continue;
                    }
                    targets.push(t);
                }
                s.pc = Returned;
                let (start, end) = (s.call.info.start, s.call.info.end);
                // A VP number of 64 or more needs the `_Ex` form (a sparse VP set); KVM turns
                // either into the same vCPU mask.
                let ex = targets.iter().any(|&t| t >= 64);
                let call = match (end == TLB_FLUSH_ALL, ex) {
                    (true, false) => "HvFlushVirtualAddressSpace",
                    (true, true) => "HvFlushVirtualAddressSpaceEx",
                    (false, false) => "HvFlushVirtualAddressList",
                    (false, true) => "HvFlushVirtualAddressListEx",
                };
                if targets.is_empty() {
                    // The processor mask ended up empty: no hypercall, only the local flush.
                    s.pc = Done;
                    if s.call.run_local {
                        self.summary(|| {
                            "every target vCPU is lazy: no hypercall; mm loaded here: flush_tlb_func (local)".into()
                        });
                        return Flow::Call(crate::tlb::FlushFunc::call(s.call.info, true));
                    }
                    self.summary(|| "every target vCPU is lazy: no hypercall: return".into());
                    return Flow::Return;
                }
                self.vm_exit(env);
                self.perf.counters.inc(Counter::HvFlushHypercalls);
                if env.tracing() {
                    env.trace(TraceEvent::Instant {
                        agent: me,
                        name: call,
                        detail: Some(format!("{} target vCPU(s)", targets.len())),
                    });
                }
                self.summary(|| {
                    format!(
                        "{call}(vcpus {targets:?}, {}): VM exit; kvm_hv_flush_tlb",
                        range_text(start, end)
                    )
                });
                Flow::Call(self.kvm_hv_flush_tlb(&targets, start, end))
            }
            Returned => {
                s.pc = Done;
                self.flush_hypercall_returned(&s.call)
            }
            Done => {
                self.summary(|| "return".into());
                Flow::Return
            }
        }
    }
}

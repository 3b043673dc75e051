//! arch/x86/kvm/hyperv.c: the host side of the Hyper-V enlightened TLB flush (option
//! `hv_tlb_flush`; the guest side is `crate::hyperv`). `kvm_hv_hypercall` hands
//! `HvFlushVirtualAddressSpace/List` (and their `_Ex` forms) to `kvm_hv_flush_tlb`, which turns
//! the processor set into a vCPU mask (`sparse_set_to_vcpu_mask`) and makes a flush request of
//! each vCPU in it with `kvm_make_vcpus_request_mask` (`kvm_main.rs`): the request bit is set,
//! vCPUs in guest mode are kicked, and with `KVM_REQUEST_WAIT` the hypercall returns only once
//! every kicked vCPU has left the guest. That suffices because a vCPU handles its requests
//! before it enters the guest again. The address space the guest names is ignored: every vCPU
//! of the mask flushes whatever it holds.
//!
//! By version ([`HvTlbFlush`]):
//! * `v4_18`: `KVM_REQ_TLB_FLUSH` with `KVM_REQUEST_WAIT`.
//! * `v5_10`: `KVM_REQ_TLB_FLUSH_GUEST`, which 0baedd792713 gave no `KVM_REQUEST_WAIT`: the
//!   kicks are sent and not waited for, so the caller resumes while a target may still run on
//!   its old translations. 1ebfaa11ebb5 ("KVM: x86: Wait for IPIs to be delivered when handling
//!   Hyper-V TLB flush hypercall", v5.16) put the wait back.
//! * `mainline` (v6.3+, "Fine-grained TLB flush"): `KVM_REQ_HV_TLB_FLUSH` with the wait, and
//!   the addresses go in each target's FIFO (`tlb_flush_fifo`, 16 slots, one kept for a
//!   flush-all entry): a Space call, more than 15 entries, or a FIFO without room for them puts
//!   one flush-all entry instead; at entry `kvm_hv_vcpu_flush_tlb` flushes each address
//!   (INVVPID individual-address) or, on a flush-all entry, the whole VPID.
//!
//! Simplified: the vCPU mask is the guest's list of target vCPUs (VP index = vCPU index, as
//! QEMU sets it); the hypercall is one VM exit and entry of the caller, charged at the start.

use crate::frame::Frame;
use crate::kvm::kvm_main::MakeAllCpusRequest;
use crate::kvm::Request;
use crate::machine::Machine;
use crate::mem::Loc;
use crate::options::HvTlbFlush;
use crate::state::TLB_FLUSH_ALL;
use shootdown_engine::Env;
use shootdown_hw::pagetable::Vpn;
use shootdown_hw::tlb::Invlpgb;
use shootdown_hw::CpuId;

/// `KVM_HV_TLB_FLUSH_FIFO_SIZE`.
pub const KVM_HV_TLB_FLUSH_FIFO_SIZE: usize = 16;
/// `HV_TLB_FLUSH_UNIT`: the pages one list entry covers (the low 12 bits of a GVA entry count
/// the pages after the first).
pub const HV_TLB_FLUSH_UNIT: u64 = 4096;

/// An entry of a vCPU's `tlb_flush_fifo`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HvFlushEntry {
    /// Pages `[start, end)` (one GVA list entry).
    Range(Vpn, Vpn),
    /// `KVM_HV_TLB_FLUSHALL_ENTRY`.
    All,
}

impl Machine {
    /// The request `kvm_hv_flush_tlb` makes, and whether it carries `KVM_REQUEST_WAIT`.
    fn hv_flush_request(&self) -> (Request, bool) {
        match self.opts.hv_tlb_flush {
            HvTlbFlush::V4_18 | HvTlbFlush::Off => (Request::TlbFlush, true),
            HvTlbFlush::V5_10 => (Request::TlbFlushGuest, false),
            HvTlbFlush::Mainline => (Request::HvTlbFlush, true),
        }
    }

    /// `kvm_hv_flush_tlb(vcpu, hc)` for pages `[start, end)` (`end == TLB_FLUSH_ALL`: a Space
    /// call) of vCPUs `targets`: fill their FIFOs (v6.3+), then the frame of
    /// `kvm_make_vcpus_request_mask`.
    pub(crate) fn kvm_hv_flush_tlb(&mut self, targets: &[CpuId], start: Vpn, end: Vpn) -> Frame {
        let (req, wait) = self.hv_flush_request();
        if self.opts.hv_tlb_flush == HvTlbFlush::Mainline {
            let entries: Vec<HvFlushEntry> = if end == TLB_FLUSH_ALL {
                vec![HvFlushEntry::All]
            } else {
                (start..end)
                    .step_by(HV_TLB_FLUSH_UNIT as usize)
                    .map(|s| HvFlushEntry::Range(s, (s + HV_TLB_FLUSH_UNIT).min(end)))
                    .collect()
            };
            for &t in targets {
                let fifo = &mut self.host_mut().vcpus[t].hv_tlb_flush_fifo;
                // hv_tlb_flush_enqueue(): one slot is kept for the flush-all entry.
                let avail = (KVM_HV_TLB_FLUSH_FIFO_SIZE - 1).saturating_sub(fifo.len());
                if entries.len() > avail {
                    if fifo.last() != Some(&HvFlushEntry::All) {
                        fifo.push(HvFlushEntry::All);
                    }
                } else {
                    fifo.extend_from_slice(&entries);
                }
            }
        }
        let mask = targets.iter().map(|&t| t as u32).collect();
        MakeAllCpusRequest::call_mask(req, Some(mask), wait)
    }

    /// Before vCPU `v` enters the guest of a VM without a modelled MMU (whose entry is one
    /// step): the flush requests `kvm_hv_flush_tlb` makes, as `vcpu_enter_guest` handles them
    /// (`KVM_REQ_TLB_FLUSH`, `KVM_REQ_TLB_FLUSH_GUEST`, `KVM_REQ_HV_TLB_FLUSH`).
    pub(crate) fn kvm_service_flush_requests<E: Env>(&mut self, v: CpuId, env: &mut E) {
        if self.opts.hv_tlb_flush == HvTlbFlush::Off {
            return;
        }
        let reqs = Loc::VcpuRequests(v as u32);
        let r = self.load(env, v, reqs);
        for req in [
            Request::TlbFlush,
            Request::TlbFlushGuest,
            Request::HvTlbFlush,
        ] {
            if r & req.bit() == 0 {
                continue;
            }
            self.rmw(env, v, reqs, |x| x & !req.bit());
            if req == Request::HvTlbFlush {
                self.kvm_hv_vcpu_flush_tlb(v, env);
            } else {
                self.say(|| format!("kvm_check_request({}): flush the VPID", req.name()));
                self.kvm_vcpu_flush_tlb(v, env);
            }
        }
    }

    /// `kvm_hv_vcpu_flush_tlb(vcpu)` (v6.3+), for `KVM_REQ_HV_TLB_FLUSH`: each address of the
    /// FIFO flushed in every PCID of the VPID (INVVPID individual-address), or the whole VPID at
    /// a flush-all entry (`kvm_vcpu_flush_tlb_guest`, which also empties the FIFO).
    pub(crate) fn kvm_hv_vcpu_flush_tlb<E: Env>(&mut self, v: CpuId, env: &mut E) {
        let fifo = std::mem::take(&mut self.host_mut().vcpus[v].hv_tlb_flush_fifo);
        if fifo.is_empty() {
            // Another hypercall's request had these entries flushed already: nothing to do.
            self.say(|| "kvm_check_request(KVM_REQ_HV_TLB_FLUSH): the FIFO is empty".into());
            return;
        }
        if fifo.contains(&HvFlushEntry::All) {
            self.say(|| {
                "kvm_check_request(KVM_REQ_HV_TLB_FLUSH): flush-all entry: flush the VPID".into()
            });
            self.kvm_vcpu_flush_tlb(v, env);
            return;
        }
        for e in &fifo {
            let HvFlushEntry::Range(start, end) = *e else {
                unreachable!("no flush-all entry")
            };
            self.cpus[v].tlb.invlpgb(&Invlpgb {
                pcid: None,
                range: Some((start, end)),
                final_only: false,
                include_global: true,
            });
            // Priced as an INVLPG a page: the profiles have no INVVPID individual-address cost.
            self.charge(env, |c| shootdown_engine::Time(c.invlpg.0 * (end - start)));
        }
        self.perf
            .counters
            .inc(crate::counters::Counter::KvmTlbFlush);
        self.say(|| {
            format!(
                "kvm_check_request(KVM_REQ_HV_TLB_FLUSH): INVVPID the FIFO's addresses {fifo:?}"
            )
        });
    }
}

//! arch/x86/kvm/vmx: what a VM exit and entry cost (with the VMX-instruction error checks of
//! seed 000's second cover letter, docs/design/kernel-model.md §6), and the guest TLB flush KVM does for a
//! vCPU (INVVPID).

use crate::counters::Counter;
use crate::kvm::mtrr::MemType;
use crate::machine::Machine;
use crate::options::MtrrZap;
use shootdown_engine::{Env, Time};
use shootdown_hw::ept::{Gfn, MT_WB_IPAT};
use shootdown_hw::CpuId;

/// EPT leaf memory-type bits: the type (2:0) and IPAT (bit 3).
pub fn mt_bits(ty: MemType, ipat: bool) -> u8 {
    ty as u8 | if ipat { 8 } else { 0 }
}

/// A leaf's memory type as text (`WB+IPAT`).
pub fn memtype_text(bits: u8) -> String {
    let ty = MemType::from_bits(bits as u64 & 7).map_or("?", |t| t.name());
    format!("{ty}{}", if bits & 8 != 0 { "+IPAT" } else { "" })
}

impl Machine {
    /// `kvm_mmu_honors_guest_mtrrs(kvm)` (6.7's name for the 6.5 test `tdp_enabled &&
    /// kvm_arch_has_noncoherent_dma(kvm)`): KVM bakes the guest's memory types into SPTEs
    /// (never from v6.11).
    pub(crate) fn honors_guest_mtrrs(&self, vm: usize) -> bool {
        self.honors_guest_mtrrs_with(self.kvm(vm).noncoherent_dma)
    }

    /// The same test with the non-coherent DMA count as a caller read it.
    pub(crate) fn honors_guest_mtrrs_with(&self, noncoherent_dma: bool) -> bool {
        self.opts.mtrr_zap != MtrrZap::Mainline && noncoherent_dma
    }

    /// `vmx_get_mt_mask(vcpu, gfn, is_mmio)` for RAM: WB+IPAT without non-coherent DMA; with
    /// it, while the vCPU has CR0.CD=1, WB+IPAT with `KVM_X86_QUIRK_CD_NW_CLEARED` (patch 7:
    /// WB without IPAT) or UC+IPAT; else the type the vCPU's MTRRs give `gfn`. Mainline (6.11+)
    /// with non-coherent DMA: WB without IPAT (guest PAT decides).
    pub(crate) fn vmx_get_mt_mask(&self, v: CpuId, gfn: Gfn) -> u8 {
        let vm = self.vm_of(v);
        if !self.kvm(vm).noncoherent_dma {
            return MT_WB_IPAT;
        }
        if self.opts.mtrr_zap == MtrrZap::Mainline {
            return mt_bits(MemType::Wb, false);
        }
        let vc = &self.host_ref().vcpus[v];
        if vc.cr0_cd {
            return match (self.opts.quirk_cd_nw_cleared, self.opts.mtrr_zap) {
                (true, MtrrZap::Base2) => mt_bits(MemType::Wb, false),
                (true, _) => MT_WB_IPAT,
                (false, _) => mt_bits(MemType::Uc, true),
            };
        }
        mt_bits(vc.mtrr.memtype(gfn), false)
    }

    /// Why a leaf of memory type `bits` mapping gfns `[g, g + n)` is not what vCPU `v`'s state
    /// now gives them (`None` if it is): a different type, or (a huge leaf) frames the vCPU's
    /// MTRRs give different types.
    pub(crate) fn leaf_memtype_wrong(&self, v: CpuId, g: Gfn, n: u64, bits: u8) -> Option<String> {
        let want = self.vmx_get_mt_mask(v, g);
        if want != bits {
            return Some(format!("vcpu{v}'s state now gives {}", memtype_text(want)));
        }
        let vc = &self.host_ref().vcpus[v];
        let by_mtrrs = self.honors_guest_mtrrs(self.vm_of(v)) && !vc.cr0_cd;
        if n > 1 && by_mtrrs && !vc.mtrr.uniform(g, n) {
            return Some(format!(
                "vcpu{v}'s MTRRs give its frames more than one type"
            ));
        }
        None
    }

    /// Cost of one VM exit + entry on this host, with the VMX-instruction error checks of
    /// `vmcs_accesses_per_exit` VMREAD/VMWRITEs.
    pub fn vm_exit_cost(&self) -> Time {
        let c = &self.perf.profile.costs;
        let n = self
            .host
            .as_ref()
            .map_or(20, |h| h.cfg.vmcs_accesses_per_exit);
        let instrs = self.opts.vmx_insn_error_check.instructions();
        c.vm_exit_entry + Time(c.vmx_insn_error_check.0 * instrs * n)
    }

    /// Charge one VM exit + entry and count it.
    pub(crate) fn vm_exit<E: Env>(&mut self, env: &mut E) {
        self.perf.counters.inc(Counter::KvmExits);
        if env.timed() {
            env.charge(self.vm_exit_cost());
        }
    }

    /// `kvm_vcpu_flush_tlb(vcpu)` (H5): INVVPID single-context — every guest-linear translation
    /// of the vCPU, all guest PCIDs (and paging-structure caches).
    pub(crate) fn kvm_vcpu_flush_tlb<E: Env>(&mut self, v: CpuId, env: &mut E) {
        if self.shadow_paging(v) {
            let how = self.kvm_vcpu_flush_tlb_guest_shadow(v, env);
            self.say(|| format!("kvm_vcpu_flush_tlb_guest (shadow paging): {how}"));
        }
        self.cpus[v].tlb.flush_all();
        self.perf.counters.inc(Counter::KvmTlbFlush);
        self.charge(env, |c| c.invvpid_single);
    }
}

//! arch/x86/kvm/vmx: what a VM exit and entry cost (with the VMX-instruction error checks of
//! seed 000's second cover letter, kernel-model.md §6), and the guest TLB flush KVM does for a
//! vCPU (INVVPID).

use crate::counters::Counter;
use crate::machine::Machine;
use shootdown_engine::{Env, Time};
use shootdown_hw::CpuId;

impl Machine {
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
        self.cpus[v].tlb.flush_all();
        self.perf.counters.inc(Counter::KvmTlbFlush);
        self.charge(env, |c| c.invvpid_single);
    }
}

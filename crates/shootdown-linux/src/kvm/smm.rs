//! arch/x86/kvm/smm.c: System Management Mode as KVM emulates it, as far as translations go.
//!
//! A vCPU in SMM sees the memory of address space 1 (`kvm_arch_vcpu_memslots_id`; QEMU's
//! `smram` address space: SMRAM over an alias of the normal map). Its faults look up that
//! address space's memslots and generation (`kvm_vcpu_gfn_to_memslot`, `check_mmio_spte`), and
//! its MMU role has `smm` set: its root and every page below it are SMM's own
//! (`kvm_mmu_get_page` matches the whole role; the TDP MMU keeps a root per address space).
//! Entering or leaving SMM (`kvm_smm_changed`) resets the MMU context (`kvm_mmu_reset_context`
//! → `kvm_mmu_unload`, which also forgets the MMIO cache); the next entry loads the root of
//! the new role. The MMIO cache itself is validated against address space 0's generation
//! (`vcpu_cache_mmio_info` / `vcpu_match_mmio_gen` read `kvm_memslots(vcpu->kvm)`, v6.6), as the
//! kernel does.
//!
//! The guest raises an SMI itself (the `smi` op: a write to the APM control port, which QEMU
//! turns into `KVM_SMI`; KVM's `process_smi` and `enter_smm` run before the next entry) and
//! leaves SMM by `rsm` (a #UD intercept, emulated: `em_rsm` → `emulator_leave_smm`).
//! Simplified: the SMI is taken in the exit that raised it; SMRAM's state-save area, SMBASE
//! and the real-mode-like register state are not modelled, and the guest's page tables stay
//! the task's (the scenarios map guest pages to the frames the handler's identity map would).

use crate::counters::Counter;
use crate::frame::Frame;
use crate::kvm::mmu::page::MmuUnload;
use crate::machine::Machine;
use shootdown_hw::CpuId;

impl Machine {
    /// `kvm_arch_vcpu_memslots_id(vcpu)`: the address space of vCPU `v`'s memslots (1 in SMM).
    pub(crate) fn vcpu_as_id(&self, v: CpuId) -> usize {
        self.host_ref().vcpus[v].smm as usize
    }

    /// `kvm_smm_changed(vcpu, entering_smm)` for vCPU `v`, from `enter_smm` or
    /// `emulator_leave_smm`: set or clear `HF_SMM_MASK`, then `kvm_mmu_reset_context()` — the
    /// returned `kvm_mmu_unload` frame; the MMIO cache is cleared with it. The
    /// `smm_change_keeps_root` mutant skips the reset: the vCPU goes on with the root (and the
    /// translations) of the role it left.
    pub(crate) fn kvm_smm_changed(&mut self, v: CpuId, entering: bool) -> Option<Frame> {
        self.perf.counters.inc(Counter::KvmSmmTransitions);
        self.host_mut().vcpus[v].smm = entering;
        let (what, hflags) = if entering {
            ("enter_smm", "hflags |= HF_SMM_MASK")
        } else {
            ("emulator_leave_smm", "hflags &= ~HF_SMM_MASK")
        };
        if self.opts.mutants.smm_change_keeps_root() {
            self.say(|| format!("{what}: kvm_smm_changed: {hflags} (no MMU reset)"));
            return None;
        }
        self.host_mut().vcpus[v].mmio = None;
        self.say(|| {
            format!("{what}: kvm_smm_changed: {hflags}; kvm_mmu_reset_context: clear the MMIO cache, kvm_mmu_unload")
        });
        Some(MmuUnload::call())
    }
}

//! Page Modification Logging (arch/x86/kvm/vmx/vmx.c, x86.c and mmu/, v5.15; SDM 29.3.6),
//! option `pml` (with `ept_ad`). With EPT A/D bits on, the CPU sets an SPTE's D bit on the
//! first write through it (`EptMemory::set_dirty`), and with PML it also appends the write's
//! GPA to the vCPU's 512-entry log. KVM drains the log into the dirty bitmap at every VM exit
//! (`vmx_handle_exit` → `vmx_flush_pml_buffer` → `kvm_vcpu_mark_page_dirty`), and dirty
//! logging clears D bits instead of W (`kvm_arch_mmu_enable_log_dirty_pt_masked` →
//! `kvm_mmu_clear_dirty_pt_masked`, `dirty_log.rs`): the next write sets D again, and so logs
//! again, without a fault. Before reading a bitmap, `KVM_GET_DIRTY_LOG` kicks every vCPU out of
//! the guest (`kvm_arch_sync_dirty_log`) so that their logs drain — without waiting: a log
//! not yet drained reaches the bitmap, and so the VMM, with the next harvest.
//!
//! Simplified: the log never fills (no PML-full exit; scenarios write far fewer than 512
//! pages); PML is on whenever the VM has a logged slot (`vmx_update_cpu_dirty_logging`, v5.12+,
//! turns it on with the first one); a write through a TLB entry that cached D clear re-walks
//! to set it, as the CPU does (the model refills the entry).

use crate::counters::Counter;
use crate::machine::Machine;
use shootdown_engine::Env;
use shootdown_hw::ept::{Gfn, SpId};
use shootdown_hw::CpuId;

impl Machine {
    /// The CPU's write through leaf `idx` of `sp` (guest frame `gfn`) from vCPU `v`: with EPT
    /// A/D bits, the A/D assist sets D if it is clear, and with PML logs `gfn`.
    pub(crate) fn ept_write_assist(&mut self, v: CpuId, sp: SpId, idx: u16, gfn: Gfn) {
        if !self.opts.ept_ad || !self.ept.set_dirty(sp, idx) {
            return;
        }
        self.perf.counters.inc(Counter::KvmEptDirtyAssists);
        let vm = self.vm_of(v);
        let log = self.opts.pml && !self.kvm(vm).dirty_log.bitmaps.is_empty();
        if log {
            self.host_mut().vcpus[v].pml.push(gfn);
            self.perf.counters.inc(Counter::KvmPmlLogged);
        }
        self.say(|| {
            format!(
                "the CPU's A/D assist sets D in EPT page #{sp} entry {idx} (gfn {gfn:#x}){}",
                if log { ", and PML logs the gfn" } else { "" }
            )
        });
    }

    /// `vmx_flush_pml_buffer()` at a VM exit of vCPU `v`: each logged gfn is marked dirty in
    /// its slot (`kvm_vcpu_mark_page_dirty`), and the log is reset. What it drained, for the
    /// step's text.
    pub(crate) fn vmx_flush_pml_buffer<E: Env>(&mut self, v: CpuId, env: &mut E) -> Vec<Gfn> {
        let gfns = std::mem::take(&mut self.host_mut().vcpus[v].pml);
        let as_id = self.vcpu_as_id(v);
        for &gfn in &gfns {
            self.kvm_vcpu_mark_page_dirty(v, as_id, gfn, env);
            self.perf.counters.inc(Counter::KvmPmlFlushed);
        }
        gfns
    }

    /// The `pml_make_spte_skips_mark` mutant: `make_spte()` leaves a logged slot's dirty mark
    /// to PML.
    pub(crate) fn make_spte_leaves_mark_to_pml(&self) -> bool {
        self.opts.pml && self.opts.mutants.pml_make_spte_skips_mark()
    }

    /// Is `gfn` in a vCPU's PML log, not yet drained into the bitmap?
    pub(crate) fn pml_pending(&self, vm: usize, gfn: Gfn) -> bool {
        self.kvm(vm)
            .vcpus
            .clone()
            .any(|c| self.host_ref().vcpus[c].pml.contains(&gfn))
    }
}

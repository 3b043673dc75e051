//! EFI runtime services on `efi_mm` (arch/x86/platform/efi/efi_64.c `efi_enter_mm` /
//! `efi_leave_mm`, `arch_efi_call_virt_setup` / `_teardown`; v4.17+, 03781e40890c, as in
//! v6.6): another user of CR3 than the scheduler.
//!
//! The firmware's runtime regions are mapped in `efi_mm`, an mm no task owns. A runtime call
//! (an efivarfs read in the caller's context until v4.19, the `efi_rts_wq` worker since) does
//! `kernel_fpu_begin()`, then `efi_enter_mm()`: remember `current->active_mm`, make `efi_mm` the
//! active mm, and `switch_mm()` to it (an ordinary switch: `efi_mm` gets an ASID and its own
//! `tlb_gen` freshness like any mm); the firmware runs with interrupts *on*; `efi_leave_mm()`
//! switches back the same way, and that `switch_mm()` is what catches up on flushes of the
//! caller's mm that skipped this CPU while `loaded_mm` was `efi_mm`. While `efi_mm` is loaded
//! `current->mm` is the caller's: a perf NMI's user read there is what `nmi_uaccess_okay()`
//! refuses (v4.19+, `nmi.rs`).
//!
//! Simplified: one runtime page at [`EFI_RUNTIME_VPN`] (non-Global; the kernel maps the
//! regions at `EFI_VA_START` and 1:1); `efi_sync_low_kernel_mappings()`, the FPU state and
//! `firmware_restrict_branch_speculation_*` cost nothing here. Before v4.17 the call wrote CR3
//! directly (`write_cr3(efi_scratch.efi_pgt)`, then `__flush_tlb_all()` each way): not modelled.

use crate::frame::Flow;
use crate::machine::Machine;
use crate::mem::Loc;
use crate::state::{Access, MmId, TaskId};
use crate::switch_mm::SwitchMm;
use shootdown_engine::Env;
use shootdown_hw::pagetable::Vpn;
use shootdown_hw::CpuId;

/// The page of `efi_mm` where the model keeps the firmware's runtime region.
pub const EFI_RUNTIME_VPN: Vpn = 0x7e00_0000;

/// The steps of one runtime-service call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EfiCallPc {
    /// `kernel_fpu_begin()`; `efi_enter_mm()`: `efi_prev_mm = current->active_mm`,
    /// `current->active_mm = &efi_mm`, `switch_mm()`.
    Enter,
    /// The firmware runs: it reads and writes its runtime data through `efi_mm`.
    Firmware,
    /// `efi_leave_mm()`: `current->active_mm = efi_prev_mm`, `switch_mm()` back.
    Leave,
    /// `kernel_fpu_end()`; return.
    Done,
}

impl Machine {
    /// `efi_alloc_page_tables()` + the runtime mappings: `efi_mm`, with its runtime page
    /// mapped (a frame of its own).
    pub fn add_efi_mm(&mut self) -> MmId {
        let mm = self.add_mm("efi_mm");
        self.map_pages(mm, EFI_RUNTIME_VPN, 1, true);
        mm
    }

    /// One step of a runtime-service call on `cpu` through `efi_mm` = `mm`; `prev` keeps the
    /// caller's active mm (and, for the seeded mutant, its ASID).
    pub(crate) fn efi_call_step<E: Env>(
        &mut self,
        cpu: CpuId,
        pc: &mut EfiCallPc,
        mm: MmId,
        prev: &mut MmId,
        env: &mut E,
    ) -> Flow {
        let me: TaskId = self.cpus[cpu].curr;
        match *pc {
            EfiCallPc::Enter => {
                self.charge(env, |c| c.syscall_entry_exit);
                self.perf.counters.inc(crate::counters::Counter::EfiCalls);
                *prev = self.tasks[me as usize]
                    .active_mm
                    .unwrap_or(crate::state::INIT_MM);
                self.tasks[me as usize].active_mm = Some(mm);
                let p = *prev;
                self.summary(|| {
                    format!("kernel_fpu_begin; efi_enter_mm: efi_prev_mm = mm{p}; active_mm = efi_mm; switch_mm")
                });
                *pc = EfiCallPc::Firmware;
                Flow::Call(SwitchMm::call(mm))
            }
            EfiCallPc::Firmware => {
                let pcid = self.kern_pcid(self.cpus[cpu].tlbstate.loaded_mm_asid);
                self.summary(|| "the firmware's runtime service runs (interrupts on)".into());
                if self
                    .access_through_cr3(cpu, mm, pcid, EFI_RUNTIME_VPN, Access::Write, env)
                    .is_err()
                {
                    panic!("EFI: the runtime page is not mapped in efi_mm");
                }
                *pc = EfiCallPc::Leave;
                Flow::Next
            }
            EfiCallPc::Leave => {
                let p = *prev;
                self.tasks[me as usize].active_mm = Some(p);
                *pc = EfiCallPc::Done;
                if self.opts.mutants.efi_leave_mm_restores_cr3() {
                    self.efi_restore_cr3(cpu, p, env);
                    return Flow::Next;
                }
                self.summary(|| format!("efi_leave_mm: active_mm = mm{p}; switch_mm back"));
                Flow::Call(SwitchMm::call(p))
            }
            EfiCallPc::Done => {
                self.summary(|| "kernel_fpu_end; return".into());
                Flow::Return
            }
        }
    }

    /// The seeded mutant's `efi_leave_mm()`: back to `prev` the way the pre-`efi_mm` code
    /// restored `efi_scratch.prev_cr3`, but without its `__flush_tlb_all()` — `loaded_mm`
    /// and CR3 set to `prev`'s ASID slot (NOFLUSH), no `tlb_gen` comparison.
    fn efi_restore_cr3<E: Env>(&mut self, cpu: CpuId, prev: MmId, env: &mut E) {
        let ctx_id = self.mms[prev as usize].ctx_id;
        let ts = &self.cpus[cpu].tlbstate;
        let asid = (0..crate::state::TLB_NR_DYN_ASIDS as u16)
            .find(|&a| ts.ctxs[a as usize].ctx_id == ctx_id)
            .unwrap_or(ts.loaded_mm_asid);
        self.cpus[cpu].tlbstate.loaded_mm_asid = asid;
        if prev != crate::state::INIT_MM {
            self.rmw(env, cpu, Loc::CpumaskBit(prev, cpu as u32), |_| 1);
        }
        self.load_new_mm_cr3(cpu, prev, asid, false, env);
        self.store(env, cpu, Loc::LoadedMm(cpu as u32), prev as u64);
        self.summary(|| {
            format!("efi_leave_mm: CR3 <- mm{prev} asid {asid} (NOFLUSH), no tlb_gen check")
        });
    }
}

//! `text_poke()` on a temporary mm (arch/x86/kernel/alternative.c `__text_poke`,
//! `use_temporary_mm`, `unuse_temporary_mm`; v5.3+ as in v6.6): another user of CR3 than the
//! scheduler.
//!
//! To write kernel text through a writable alias without exposing it to other CPUs, the
//! kernel maps the text page at `poking_addr` in `poking_mm` — a user-half address of an mm no
//! task runs, with a non-Global PTE — loads `poking_mm` with interrupts off, writes, clears the
//! PTE, switches back to the mm that was loaded (`switch_mm_irqs_off` both ways, leaving lazy
//! mode first), and only then calls `flush_tlb_mm_range(poking_mm, …)`: no CPU has
//! `poking_mm` loaded by then, so the flush sends no IPI and only bumps `tlb_gen`; the next
//! poke's switch to `poking_mm` sees the newer generation and flushes the ASID slot. While
//! `poking_mm` is loaded, `current->mm` is the interrupted task's: an NMI's user read there is
//! what `nmi_uaccess_okay()` refuses (`nmi.rs`).
//!
//! Simplifications: one page per poke (no page-crossing write); callers serialize on
//! `text_mutex`, so a scenario gives its pokes to one task; `get_locked_pte`'s PTL and the
//! hardware-breakpoint handling are left out. When `text_poke` returns, a later use of the old
//! `poking_addr` translation is `INV-SYSRET` (the oracle's contract for a call that removed a
//! translation).

use crate::frame::Flow;
use crate::machine::Machine;
use crate::mem::Loc;
use crate::state::{Access, MmId, INIT_MM};
use crate::switch_mm::SwitchMm;
use crate::tlb::FlushMmRange;
use shootdown_engine::Env;
use shootdown_hw::pagetable::Vpn;
use shootdown_hw::CpuId;

/// `poking_addr` (randomized in the user half at boot; fixed here) as a page number.
pub const POKING_VPN: Vpn = 0x7f00_0000;

/// The steps of `__text_poke()`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TextPokePc {
    /// `local_irq_save`; `set_pte_at(poking_mm, poking_addr)` to the text page's frame.
    SetPte,
    /// `use_temporary_mm(poking_mm)`: leave lazy mode, remember `loaded_mm`, switch.
    Use,
    /// The write through `poking_addr`.
    Write,
    /// `pte_clear(poking_mm, poking_addr)`.
    Clear,
    /// `unuse_temporary_mm()`: switch back to the remembered mm.
    Unuse,
    /// `flush_tlb_mm_range(poking_mm, poking_addr, +1 page)`.
    Flush,
    /// `local_irq_restore`; return.
    Done,
}

impl Machine {
    /// `poking_init()`: the mm `text_poke` maps its alias in, with the page table for
    /// `poking_addr` allocated up front.
    pub fn add_poking_mm(&mut self) -> MmId {
        let mm = self.add_mm("poking_mm");
        self.ensure_table(mm, POKING_VPN);
        mm
    }

    /// One step of `__text_poke(page)` on `cpu` with `poking_mm` = `mm`; `prev` keeps the
    /// mm that was loaded.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn text_poke_step<E: Env>(
        &mut self,
        cpu: CpuId,
        pc: &mut TextPokePc,
        mm: MmId,
        page: Vpn,
        prev: &mut MmId,
        irqs_off: &mut bool,
        env: &mut E,
    ) -> Flow {
        match *pc {
            TextPokePc::SetPte => {
                *irqs_off = true;
                let pfn = self.mms[INIT_MM as usize].space.pte(page).pfn;
                let space = &mut self.mms[mm as usize].space;
                let mut pte = space.pte(POKING_VPN);
                pte.pfn = pfn;
                pte.present = true;
                pte.writable = true;
                space.ptes.insert(POKING_VPN, pte);
                self.say(|| {
                    format!("local_irq_save; set_pte_at(poking_mm, {POKING_VPN:#x}) -> text page {page:#x}")
                });
                *pc = TextPokePc::Use;
                Flow::Next
            }
            TextPokePc::Use => {
                if self.load(env, cpu, Loc::IsLazy(cpu as u32)) != 0 {
                    self.summary(|| "use_temporary_mm: lazy: leave_mm first".into());
                    return Flow::Call(SwitchMm::call(INIT_MM));
                }
                *prev = self.load(env, cpu, Loc::LoadedMm(cpu as u32)) as MmId;
                let p = *prev;
                self.summary(|| format!("use_temporary_mm(poking_mm): loaded_mm was mm{p}"));
                *pc = TextPokePc::Write;
                Flow::Call(SwitchMm::call(mm))
            }
            TextPokePc::Write => {
                let pcid = self.kern_pcid(self.cpus[cpu].tlbstate.loaded_mm_asid);
                self.summary(|| format!("memcpy to poking_addr {POKING_VPN:#x}"));
                if self
                    .access_through_cr3(cpu, mm, pcid, POKING_VPN, Access::Write, env)
                    .is_err()
                {
                    panic!("text_poke: the poking PTE is not present");
                }
                *pc = TextPokePc::Clear;
                Flow::Next
            }
            TextPokePc::Clear => {
                self.zap_range(mm, POKING_VPN, 1, None, env);
                self.summary(|| "pte_clear(poking_mm, poking_addr)".into());
                *pc = TextPokePc::Unuse;
                Flow::Next
            }
            TextPokePc::Unuse => {
                let p = *prev;
                self.summary(|| format!("unuse_temporary_mm: back to mm{p}"));
                *pc = TextPokePc::Flush;
                Flow::Call(SwitchMm::call(p))
            }
            TextPokePc::Flush => {
                *pc = TextPokePc::Done;
                if self.opts.mutants.text_poke_skips_flush() {
                    self.summary(|| "no flush of poking_mm".into());
                    return Flow::Next;
                }
                self.summary(|| "flush_tlb_mm_range(poking_mm, poking_addr, 1 page)".into());
                Flow::Call(FlushMmRange::call(mm, POKING_VPN, POKING_VPN + 1, false))
            }
            TextPokePc::Done => {
                *irqs_off = false;
                self.oracle.syscall_returned(mm, POKING_VPN, POKING_VPN + 1);
                self.summary(|| "local_irq_restore; return".into());
                Flow::Return
            }
        }
    }
}

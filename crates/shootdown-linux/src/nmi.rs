//! NMIs: perf's sampling interrupt and the user memory its handler reads.
//!
//! An NMI is taken whatever the CPU is doing, interrupts off included: in the middle of
//! `switch_mm_irqs_off()`, between `__schedule()`'s switch of the mm and its switch of `current`
//! (`switch_to`), inside `kthread_use_mm()`. The handler modelled is perf's
//! (arch/x86/events/core.c `perf_event_nmi_handler` → `perf_event_overflow` →
//! kernel/events/callchain.c `get_perf_callchain` → `perf_callchain_user`): for a task with an
//! mm it walks the user stack with `__get_user` under `pagefault_disable()`, through whatever
//! CR3 holds. What may go wrong is *whose* memory that is: `current` is still the previous task
//! after the CR3 write of a context switch, and a kernel thread sets `current->mm` before its
//! CR3 write in `kthread_use_mm()`. The oracle's `INV-CTX` is that a read on behalf of `current`
//! goes through `current->mm`'s page tables.
//!
//! With early acknowledgement (`early_ack`, a research design), `nmi_uaccess_okay()` is also
//! false while `async_func_in_progress` names `flush_tlb_func` (the RFC's addition).
//!
//! Versions (`nmi_uaccess_okay`): v4.18 and earlier read unconditionally; v4.19+
//! (4012e77a903d, "x86/nmi: Fix NMI uaccess race against CR3 switching") read only if
//! `nmi_uaccess_okay()`: `cpu_tlbstate.loaded_mm == current->mm`, which holds mid-switch only
//! because `switch_mm_irqs_off()` stores `LOADED_MM_SWITCHING` before its CR3 write and the
//! next mm after it (`switch_mm.rs`).
//!
//! Simplifications: the handler is one step (an NMI does not nest and takes no IRQ); the
//! callchain is one read of one page (the explorer's `[[nmi]]` page, or the page the task
//! touched last in the timed driver), not up to `perf_event_max_stack` frames; a read that
//! misses a present PTE ends the callchain as `pagefault_disable()` makes it; in a VM whose MMU
//! is modelled, a read the EPT would stop is abandoned (the hardware would exit and retry).
//! The timed driver samples at a fixed period per CPU (`perf_sample_hz`; perf's frequency
//! mode adjusts the period, which averages to the same rate), never in HLT (the `cycles`
//! event does not count there).

use crate::counters::Counter;
use crate::machine::Machine;
use crate::mem::Loc;
use crate::state::{Access, MmId};
use shootdown_engine::trace::TraceEvent;
use shootdown_engine::{Env, Park, Time, Violation};
use shootdown_hw::pagetable::Vpn;
use shootdown_hw::CpuId;

impl Machine {
    /// The explorer may deliver up to `count` NMIs to `cpu`; each reads user page `vpn` of
    /// whatever mm is `current`'s (a scenario's `[[nmi]]`).
    pub fn add_nmi_source(&mut self, cpu: CpuId, count: u8, vpn: Vpn) {
        self.nmis_possible = true;
        let c = &mut self.cpus[cpu];
        c.nmis_left = count;
        c.nmi_vpn = Some(vpn);
    }

    /// `current->mm` as the NMI handler reads it: a kernel thread has none (unless it borrowed
    /// one), and neither has a task past `exit_mm()` (`mm_refs.rs`).
    fn nmi_current_mm(&self, cpu: CpuId) -> Option<MmId> {
        self.tasks[self.cpus[cpu].curr as usize].mm
    }

    /// Take an NMI on `cpu`: perf's handler samples the interrupted task's user stack.
    pub(crate) fn take_nmi<E: Env>(&mut self, cpu: CpuId, env: &mut E) -> Park {
        self.perf.counters.inc(Counter::Nmis);
        self.cpus[cpu].nmis_left = self.cpus[cpu].nmis_left.saturating_sub(1);
        if env.timed() {
            let mut t = self.core_time(self.perf.profile.costs.nmi_entry_exit);
            if self.host.is_some() {
                // The PMI exits to KVM, which injects the NMI (`kvm_perf_overflow`).
                t += self.vm_exit_cost();
                self.perf.counters.inc(Counter::KvmExits);
            }
            env.charge(t);
            self.schedule_next_nmi(cpu, env.now());
            if env.tracing() {
                env.trace(TraceEvent::Instant {
                    agent: cpu,
                    name: "NMI",
                    detail: None,
                });
            }
        }
        self.perf_callchain_user(cpu, env);
        Park::Run
    }

    /// `perf_callchain_user()` (arch/x86/events/core.c), reached through `get_perf_callchain()`
    /// only if `current->mm`: the read of the user stack, checked by `nmi_uaccess_okay()` in
    /// v4.19+.
    fn perf_callchain_user<E: Env>(&mut self, cpu: CpuId, env: &mut E) {
        let Some(mm) = self.nmi_current_mm(cpu) else {
            self.perf.counters.inc(Counter::NmiUaccessSkipped);
            self.say(|| "perf_callchain_user: current has no mm: no user callchain".into());
            return;
        };
        if self.opts.nmi_uaccess_okay {
            let loaded = self.load(env, cpu, Loc::LoadedMm(cpu as u32));
            if loaded != mm as u64 {
                self.perf.counters.inc(Counter::NmiUaccessSkipped);
                self.say(|| {
                    format!(
                        "perf_callchain_user: nmi_uaccess_okay() is false (loaded_mm = {}, current->mm = mm{mm}): no user callchain",
                        loaded_name(loaded)
                    )
                });
                return;
            }
            // Early acknowledgement (a research design, `smp.rs`): between its early unlock
            // and its flush the CPU may still cache translations the initiator considers gone.
            if self.async_flush_in_progress(cpu) && !self.opts.mutants.early_ack_nmi_unchecked() {
                self.perf.counters.inc(Counter::NmiUaccessSkipped);
                self.say(|| {
                    "perf_callchain_user: nmi_uaccess_okay() is false (async_func_in_progress = flush_tlb_func): no user callchain".into()
                });
                return;
            }
        }
        let Some(vpn) = self.cpus[cpu].nmi_vpn.or(self.perf.cpu[cpu].last_user_vpn) else {
            return;
        };
        self.perf.counters.inc(Counter::NmiUaccessReads);
        let checked = if self.opts.nmi_uaccess_okay {
            "nmi_uaccess_okay(); "
        } else {
            ""
        };
        self.say(|| {
            format!("perf_callchain_user: {checked}__get_user of mm{mm}'s user stack page {vpn:#x}")
        });
        let cr3 = self.cpus[cpu].cr3_mm;
        if cr3 != mm {
            let name = self.tasks[self.cpus[cpu].curr as usize].name.clone();
            self.violate(Violation {
                invariant: "INV-CTX",
                detail: format!(
                    "cpu{cpu}'s NMI read the user stack of {name} (mm{mm}) through CR3 = mm{cr3}"
                ),
            });
            return;
        }
        // Kernel mode: the kernel PCID, whatever mode the NMI interrupted (the entry code
        // switches to the kernel CR3 under PTI).
        let pcid = self.kern_pcid(self.cpus[cpu].tlbstate.loaded_mm_asid);
        if self
            .access_through_cr3(cpu, mm, pcid, vpn, Access::Read, env)
            .is_err()
        {
            self.say(|| {
                "not present: __get_user fails (pagefault_disable), the callchain ends".into()
            });
        }
    }

    /// Timed driver: perf's next sample on `cpu` is due (and the CPU is running: a vCPU in its
    /// guest, a CPU not halted).
    #[inline]
    pub(crate) fn nmi_due(&self, cpu: CpuId, now: Time) -> bool {
        self.opts.perf_sample_hz.0 > 0
            && cpu < self.cpus.len()
            && now >= self.perf.cpu[cpu].next_nmi
            && !self.cpus[cpu].halted
            && (self.host.is_none() || self.vcpu_in_guest(cpu))
    }

    /// The sampling period.
    fn nmi_period(&self) -> Time {
        Time::from_ns(1_000_000_000 / self.opts.perf_sample_hz.0.max(1))
    }

    /// The first sample of each CPU, staggered across one period (perf's per-CPU events start
    /// counting at different instants).
    pub(crate) fn init_nmi_schedule(&mut self) {
        if self.opts.perf_sample_hz.0 == 0 {
            return;
        }
        let (p, n) = (self.nmi_period().0, self.cpus.len() as u64);
        for c in 0..self.cpus.len() {
            self.perf.cpu[c].next_nmi = Time(p * (2 * c as u64 + 1) / (2 * n));
        }
    }

    /// After a sample: the next one a period later, or a period from now after a halt (no
    /// catch-up burst for the samples a halted CPU did not count).
    fn schedule_next_nmi(&mut self, cpu: CpuId, now: Time) {
        let p = self.nmi_period();
        let mut next = self.perf.cpu[cpu].next_nmi + p;
        if next <= now {
            next = now + p;
        }
        self.perf.cpu[cpu].next_nmi = next;
    }

    /// Timed driver: a CPU that spins or does interruptible work is interrupted by perf's next
    /// sample.
    pub(crate) fn wake_for_nmi<E: Env>(&self, cpu: CpuId, env: &mut E) {
        if self.opts.perf_sample_hz.0 > 0 && cpu < self.cpus.len() {
            env.wake_by(cpu, self.perf.cpu[cpu].next_nmi);
        }
    }
}

/// `cpu_tlbstate.loaded_mm` as a counterexample prints it.
fn loaded_name(v: u64) -> String {
    if v == crate::state::LOADED_MM_SWITCHING {
        "LOADED_MM_SWITCHING".into()
    } else {
        format!("mm{v}")
    }
}

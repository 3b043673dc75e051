//! The two counts of an `mm_struct` and the paths that take and drop them
//! (include/linux/sched/mm.h, kernel/fork.c, kernel/sched/core.c `context_switch`,
//! kernel/exit.c `exit_mm`), and kernel threads borrowing an mm (kernel/kthread.c
//! `kthread_use_mm`/`kthread_unuse_mm`, mm/mmu_context.c `use_mm`/`unuse_mm` before v5.8).
//!
//! * `mm_users` counts the users of the address space: its threads, and a kernel thread that
//!   got one with `mmget_not_zero()` (which fails once the count is 0). `mmput()` of the last
//!   user drops the users' `mm_count` reference.
//! * `mm_count` counts references to the `mm_struct`, its pgd and page tables: one for all the
//!   users together, one per task whose `active_mm` it is lazily (a kernel thread or idle task
//!   that runs on it without owning it; x86 has no `MMU_LAZY_TLB_SHOOTDOWN`, so
//!   `mmgrab_lazy_tlb` is `mmgrab`), one per `mmgrab()`. At 0, `__mmdrop()` frees the page
//!   tables: correct counting guarantees no CPU's CR3 still points to them, which the oracle
//!   checks there (`INV-PTFREE`).
//!
//! Simplifications: `init_mm` is never counted (it is static); `exit_mmap()` (the last user's
//! teardown of the address space) is not modelled, so an mm whose users are gone keeps its
//! mappings until `__mmdrop`; `exit_mm()` calls `enter_lazy_tlb()` at the exiting task's last
//! context switch rather than in `exit_mm()` itself.

use crate::frame::Flow;
use crate::machine::Machine;
use crate::options::KthreadUseMm;
use crate::state::{MmId, TaskId, INIT_MM};
use crate::switch_mm::SwitchMm;
use shootdown_engine::{Env, Violation};
use shootdown_hw::CpuId;

/// The steps of `kthread_use_mm(mm)`, after its caller's `mmget_not_zero(mm)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum UseMmPc {
    /// The caller's `mmget_not_zero(mm)`.
    Mmget,
    /// `tsk->active_mm = mm; tsk->mm = mm` (v5.8+: `mmgrab`, `local_irq_disable` first).
    SetMm,
    /// `switch_mm_irqs_off(active_mm, mm)`.
    Switch,
    /// `local_irq_enable`; drop the reference to the previous `active_mm`.
    Finish,
}

/// The steps of `kthread_unuse_mm(mm)` and its caller's `mmput(mm)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum UnuseMmPc {
    /// `tsk->mm = NULL` (v5.8+: interrupts off, `mmgrab_lazy_tlb`), `enter_lazy_tlb`.
    Lazy,
    /// v5.8+: `mmdrop(mm)`; the caller's `mmput(mm)`.
    Put,
}

impl Machine {
    /// `mmgrab(mm)`.
    pub(crate) fn mmgrab(&mut self, mm: MmId) {
        if mm != INIT_MM {
            self.mms[mm as usize].mm_count += 1;
        }
    }

    /// `mmdrop(mm)`: at 0, `__mmdrop` frees the pgd and page tables, which no CPU's CR3 may
    /// still point to.
    pub(crate) fn mmdrop(&mut self, mm: MmId) {
        if mm == INIT_MM {
            return;
        }
        let count = self.mms[mm as usize].mm_count;
        if count == 0 {
            self.violate(Violation {
                invariant: "INV-PTFREE",
                detail: format!("mmdrop(mm{mm}) after its mm_count reached 0 (__mmdrop ran)"),
            });
            return;
        }
        self.mms[mm as usize].mm_count = count - 1;
        if count > 1 {
            return;
        }
        self.say(|| format!("mmdrop(mm{mm}): mm_count = 0: __mmdrop frees its pgd"));
        // destroy_context(): mm_free_global_asid() (v6.15+).
        self.mm_free_global_asid(mm);
        if let Some(c) = (0..self.cpus.len()).find(|&c| self.cpus[c].cr3_mm == mm) {
            self.violate(Violation {
                invariant: "INV-PTFREE",
                detail: format!(
                    "__mmdrop(mm{mm}) freed its page tables while cpu{c}'s CR3 points to them"
                ),
            });
        }
    }

    /// `mmget_not_zero(mm)`.
    fn mmget_not_zero(&mut self, mm: MmId) -> bool {
        let m = &mut self.mms[mm as usize];
        if m.mm_users == 0 {
            return false;
        }
        m.mm_users += 1;
        true
    }

    /// `mmput(mm)`: the last user drops the users' `mm_count` reference (`__mmput`; its
    /// `exit_mmap` is not modelled).
    pub(crate) fn mmput(&mut self, mm: MmId) {
        let m = &mut self.mms[mm as usize];
        m.mm_users -= 1;
        if m.mm_users == 0 {
            self.say(|| format!("mmput(mm{mm}): last user gone"));
            self.mmdrop(mm);
        }
    }

    /// `exit_mm()` of the current task: keep its mm as `active_mm` (`mmgrab`), clear
    /// `current->mm`, `mmput`.
    pub(crate) fn exit_mm(&mut self, t: TaskId) {
        let Some(mm) = self.tasks[t as usize].mm.take() else {
            return;
        };
        self.mmgrab(mm);
        self.mmput(mm);
    }

    /// `context_switch()`'s lazy-TLB hand-off of `active_mm` (v5.x+ form) before the switch:
    /// a next task without an mm takes prev's `active_mm`, with a reference of its own if
    /// prev owns it (else prev's reference passes to it).
    pub(crate) fn context_switch_lazy_mm(&mut self, prev: TaskId, next: TaskId) {
        if self.tasks[next as usize].mm.is_some() {
            return;
        }
        let old = self.tasks[prev as usize].active_mm;
        self.tasks[next as usize].active_mm = old;
        if self.tasks[prev as usize].mm.is_some() {
            if let Some(old) = old {
                self.mmgrab(old);
            }
        } else {
            self.tasks[prev as usize].active_mm = None;
        }
    }

    /// `finish_task_switch()`: a task without an mm that switched to one with an mm drops the
    /// reference it held to its `active_mm` (`rq->prev_mm`).
    pub(crate) fn finish_task_switch_mm(&mut self, prev: TaskId, next: TaskId) {
        if self.tasks[prev as usize].mm.is_none() && self.tasks[next as usize].mm.is_some() {
            if let Some(old) = self.tasks[prev as usize].active_mm.take() {
                self.mmdrop(old);
            }
        }
    }

    /// One step of `mmget_not_zero(mm)` + `kthread_use_mm(mm)` (`use_mm` before v5.8).
    pub(crate) fn kthread_use_mm_step<E: Env>(
        &mut self,
        cpu: CpuId,
        pc: &mut UseMmPc,
        mm: MmId,
        old: &mut Option<MmId>,
        irqs_off: &mut bool,
        env: &mut E,
    ) -> Flow {
        let t = self.cpus[cpu].curr;
        let mainline = self.opts.kthread_use_mm == KthreadUseMm::Mainline;
        match *pc {
            UseMmPc::Mmget => {
                if !self.mmget_not_zero(mm) {
                    self.say(|| format!("mmget_not_zero(mm{mm}) fails: its users are gone"));
                    return Flow::Return;
                }
                let users = self.mms[mm as usize].mm_users;
                self.say(|| format!("mmget_not_zero(mm{mm}): mm_users = {users}"));
                *pc = UseMmPc::SetMm;
                Flow::Next
            }
            UseMmPc::SetMm => {
                let task = &mut self.tasks[t as usize];
                *old = task.active_mm;
                task.active_mm = Some(mm);
                task.mm = Some(mm);
                if mainline {
                    self.mmgrab(mm);
                    *irqs_off = true;
                    self.say(|| {
                        format!(
                            "kthread_use_mm: local_irq_disable; current->mm = active_mm = mm{mm}"
                        )
                    });
                } else {
                    if *old != Some(mm) {
                        self.mmgrab(mm);
                    }
                    self.say(|| format!("use_mm: current->mm = active_mm = mm{mm}"));
                }
                *pc = UseMmPc::Switch;
                Flow::Next
            }
            UseMmPc::Switch => {
                self.summary(|| "switch_mm_irqs_off".into());
                *pc = UseMmPc::Finish;
                Flow::Call(SwitchMm::call(mm))
            }
            UseMmPc::Finish => {
                *irqs_off = false;
                let old = old.take();
                self.summary(|| "local_irq_enable; drop the previous active_mm".into());
                if let Some(o) = old.filter(|&o| mainline || o != mm) {
                    self.mmdrop(o);
                }
                let _ = env;
                Flow::Return
            }
        }
    }

    /// One step of `kthread_unuse_mm(mm)` (`unuse_mm` before v5.8) and the caller's `mmput`.
    pub(crate) fn kthread_unuse_mm_step<E: Env>(
        &mut self,
        cpu: CpuId,
        pc: &mut UnuseMmPc,
        mm: MmId,
        env: &mut E,
    ) -> Flow {
        let t = self.cpus[cpu].curr;
        let mainline = self.opts.kthread_use_mm == KthreadUseMm::Mainline;
        match *pc {
            UnuseMmPc::Lazy => {
                self.tasks[t as usize].mm = None;
                if mainline && !self.opts.mutants.kthread_unuse_mm_drops_lazy_ref() {
                    self.mmgrab(mm);
                    self.say(|| {
                        format!("kthread_unuse_mm: current->mm = NULL; mmgrab_lazy_tlb(mm{mm})")
                    });
                } else {
                    self.say(|| "current->mm = NULL (active_mm keeps the mm)".into());
                }
                self.enter_lazy_tlb(cpu, env);
                *pc = UnuseMmPc::Put;
                Flow::Next
            }
            UnuseMmPc::Put => {
                if mainline {
                    self.mmdrop(mm);
                }
                self.mmput(mm);
                let (users, count) = (
                    self.mms[mm as usize].mm_users,
                    self.mms[mm as usize].mm_count,
                );
                self.say(|| format!("mmput(mm{mm}): mm_users = {users}, mm_count = {count}"));
                Flow::Return
            }
        }
    }
}

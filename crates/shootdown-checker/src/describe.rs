//! Counterexample step texts in kernel terms. The model labels the steps it knows how to
//! describe (`Machine::describe`); for the others the explorer looks at the frame the step runs
//! and at what the step changed (it replays it on a copy), and says what happened:
//! `smp_call_function_many_cond: should_flush_tlb(cpu1) = false: skip`.

use shootdown_engine::Model;
use shootdown_linux::describe::NullEnv;
use shootdown_linux::frame::{CallCond, Frame, Syscall};
use shootdown_linux::state::{TaskState, LOADED_MM_SWITCHING, TLB_FLUSH_ALL};
use shootdown_linux::{Action, Machine, UserOp};

fn mm_val(v: u64) -> String {
    if v == LOADED_MM_SWITCHING {
        "LOADED_MM_SWITCHING".into()
    } else {
        format!("mm{v}")
    }
}

fn top(m: &Machine, cpu: usize) -> Option<&Frame> {
    let c = &m.cpus[cpu];
    c.irq_stack
        .last()
        .or_else(|| m.tasks[c.curr as usize].stack.last())
}

/// Depth of the stack the step runs on (to tell a return from a call).
fn depth(m: &Machine, cpu: usize) -> usize {
    let c = &m.cpus[cpu];
    if !c.irq_stack.is_empty() {
        1000 + c.irq_stack.len()
    } else {
        m.tasks[c.curr as usize].stack.len()
    }
}

fn range(start: u64, end: u64) -> String {
    if end == TLB_FLUSH_ALL {
        "full".into()
    } else if end == start + 1 {
        format!("page {start:#x}")
    } else {
        format!("pages {start:#x}..{end:#x}")
    }
}

/// What `Step(cpu)` does, from the frame before and the machine after.
fn explain(before: &Machine, after: &Machine, cpu: usize) -> Option<String> {
    let f = top(before, cpu)?;
    let returned = depth(after, cpu) < depth(before, cpu);
    let called = depth(after, cpu) > depth(before, cpu);
    let ftop = top(after, cpu);
    Some(match f {
        Frame::FlushMmRange(s) => match s.pc {
            0 if s.batch_targets.is_some() => format!(
                "flush_tlb_info = {{mm = NULL, full, new_tlb_gen = 0}} for cpus {:?}",
                s.batch_targets.as_ref().expect("batch")
            ),
            0 => {
                let g = after.mms[s.mm as usize].tlb_gen;
                let g0 = before.mms[s.mm as usize].tlb_gen;
                if g != g0 {
                    format!(
                        "inc_mm_tlb_gen(mm{}) = {g} (locked: full barrier); {}",
                        s.mm,
                        range(s.info.start, s.info.end)
                    )
                } else {
                    format!(
                        "new_tlb_gen = {} (mm{}.tlb_gen not bumped yet); {}",
                        g0 + 1,
                        s.mm,
                        range(s.info.start, s.info.end)
                    )
                }
            }
            1 | 2 => match ftop {
                Some(Frame::SmpCallMany(c)) if called => format!(
                    "read mm_cpumask(mm{}): remote cpus {:?} -> flush_tlb_multi/others",
                    s.mm, c.candidates
                ),
                Some(Frame::PvFlushTlbMulti(c)) if called => format!(
                    "read mm_cpumask(mm{}): remote vcpus {:?} -> kvm_flush_tlb_multi (PV)",
                    s.mm, c.call.candidates
                ),
                Some(Frame::FlushFunc(_)) if called => {
                    "mm loaded here: flush_tlb_func (local)".into()
                }
                _ => "no (other) CPU to flush here".into(),
            },
            _ => format!("return: flush of mm{} complete", s.mm),
        },
        Frame::SmpCallMany(s) => match s.pc {
            0 if s.i >= s.candidates.len() => "every target considered".into(),
            0 => {
                let t = s.candidates[s.i];
                let yes = matches!(ftop, Some(Frame::SmpCallMany(n)) if n.pc == 1);
                let what = match s.cond {
                    CallCond::All => format!("cpu{t} in mask"),
                    CallCond::NotLazy => format!(
                        "tlb_is_not_lazy(cpu{t}) = {yes} (is_lazy = {})",
                        before.cpus[t].tlbstate.is_lazy
                    ),
                    CallCond::ShouldFlush => format!(
                        "should_flush_tlb(cpu{t}) = {yes} (loaded_mm = {}, is_lazy = {})",
                        mm_val(before.cpus[t].tlbstate.loaded_mm),
                        before.cpus[t].tlbstate.is_lazy
                    ),
                };
                format!("{what}{}", if yes { "" } else { ": skip" })
            }
            1 => {
                let t = s.candidates[s.i];
                let ipi = matches!(ftop, Some(Frame::SmpCallMany(n)) if n.ipi.len() > s.ipi.len());
                format!(
                    "csd_lock + llist_add(csd, call_single_queue(cpu{t})){}",
                    if ipi {
                        ": queue was empty, IPI needed"
                    } else {
                        ": queue not empty, no IPI"
                    }
                )
            }
            3 if s.ipi.is_empty() => "no IPI to send".into(),
            3 => format!("send CALL_FUNCTION IPI to cpus {:?}", s.ipi),
            4 if called => {
                "run flush_tlb_func locally (SCF_RUN_LOCAL), while the remote CPUs work".into()
            }
            4 => "wait for the targets".into(),
            _ if s.i < s.queued.len() => format!(
                "csd_lock_wait(cpu{}): csd unlocked, request done",
                s.queued[s.i]
            ),
            _ => "return: every target has run flush_tlb_func".into(),
        },
        Frame::FlushFunc(s) => match s.pc {
            0 => {
                let loaded = before.cpus[cpu].tlbstate.loaded_mm;
                let asid = before.cpus[cpu].tlbstate.loaded_mm_asid;
                let local = before.cpus[cpu].tlbstate.ctxs[asid as usize].tlb_gen;
                let req = format!(
                    "request {{mm = {}, {}, new_tlb_gen = {}}}{}, loaded_mm = {}, local tlb_gen = {local}",
                    s.info.mm.map(|x| format!("mm{x}")).unwrap_or_else(|| "NULL".into()),
                    range(s.info.start, s.info.end),
                    s.info.new_tlb_gen,
                    if s.info.freed_tables { " (freed tables)" } else { "" },
                    mm_val(loaded),
                );
                let out = if returned {
                    "nothing to do: return"
                } else if called {
                    "lazy: switch to init_mm"
                } else {
                    "go on"
                };
                format!("{req}: {out}")
            }
            1 => {
                let mm_gen = match ftop {
                    Some(Frame::FlushFunc(n)) => n.mm_gen,
                    _ => before.mms[s.mm as usize].tlb_gen,
                };
                format!(
                    "read mm{}.tlb_gen = {mm_gen} (local {}){}",
                    s.mm,
                    s.local_gen,
                    if returned { ": up to date, return" } else { "" }
                )
            }
            2 => {
                let i = &s.info;
                let ok = i.new_tlb_gen == s.local_gen + 1
                    || before.opts.mutants.partial_flush_when_full_owed;
                let partial = i.end != TLB_FLUSH_ALL && ok && i.new_tlb_gen == s.mm_gen;
                format!(
                    "{} flush; ctxs[{}].tlb_gen = {}",
                    if partial {
                        format!("partial ({}, INVLPG)", range(i.start, i.end))
                    } else {
                        "full".into()
                    },
                    s.asid,
                    s.mm_gen
                )
            }
            _ => "flush the requested range (v4.12)".into(),
        },
        Frame::CallFunctionIrq(s) => match s.pc {
            0 => {
                let n = match ftop {
                    Some(Frame::CallFunctionIrq(x)) => x.entries.len(),
                    _ => 0,
                };
                format!("llist_del_all(call_single_queue): {n} request(s)")
            }
            1 if s.i < s.entries.len() => {
                format!("run flush_tlb_func for cpu{}'s request", s.entries[s.i].src)
            }
            1 => "return from interrupt".into(),
            _ => format!("csd_unlock: cpu{}'s request done", s.entries[s.i].src),
        },
        Frame::Schedule(s) => match s.pc {
            1 if called => "context_switch: switch_mm_irqs_off".into(),
            1 => "context_switch: enter_lazy_tlb".into(),
            _ => "return to the task".into(),
        },
        Frame::SwitchMm(_) | Frame::PvFlushTlbMulti(_) => return None,
        Frame::RwSemDown { write, mm, .. } => {
            if returned {
                format!(
                    "{} mmap_sem of mm{mm}",
                    if *write {
                        "write-locked"
                    } else {
                        "read-locked"
                    }
                )
            } else {
                return None;
            }
        }
        Frame::Syscall(sc) => match sc {
            Syscall::Madvise { pc: 2.., .. } | Syscall::PageFault { pc: 2.., .. } => {
                "up_read(mmap_sem); return".into()
            }
            Syscall::Munmap { pc: 2.., .. } => {
                "free page tables; up_write(mmap_sem); return".into()
            }
            Syscall::Madvise { pc: 0, .. }
            | Syscall::Munmap { pc: 0, .. }
            | Syscall::PageFault { pc: 0, .. } => "take mmap_sem".into(),
            Syscall::ReclaimUnmap { pc: 1, .. } => "try_to_unmap_flush: arch_tlbbatch_flush".into(),
            Syscall::ReclaimUnmap { pc: 2.., .. } => "batched flush complete: return".into(),
            _ => return None,
        },
    })
}

fn user_op_text(op: &UserOp) -> String {
    match *op {
        UserOp::MadviseDontneed { start, npages } => {
            format!("madvise({start:#x}, {npages} page(s), MADV_DONTNEED)")
        }
        UserOp::Munmap { start, npages } => format!("munmap({start:#x}, {npages} page(s))"),
        UserOp::Mprotect {
            start,
            npages,
            writable,
        } => {
            format!(
                "mprotect({start:#x}, {npages} page(s), {})",
                if writable { "RW" } else { "RO" }
            )
        }
        UserOp::ReclaimUnmap { start, npages } => format!("reclaim {npages} page(s) at {start:#x}"),
        UserOp::SetAffinity { cpu } => format!("sched_setaffinity(cpu{cpu})"),
        other => format!("{other:?}"),
    }
}

/// Describe `a` as it would execute from `m`, in kernel terms.
pub fn describe(m: &Machine, a: Action) -> String {
    let base = m.describe(a);
    let Action::Step(c) = a else { return base };
    let cpu = c as usize;
    if base.contains(": ") {
        return base;
    }
    let mut after = m.clone();
    after.apply(a, &mut NullEnv);
    if top(m, cpu).is_none() {
        let t = &m.tasks[m.cpus[cpu].curr as usize];
        if m.is_idle_cpu(cpu) {
            return "idle: work queued, schedule()".into();
        }
        if t.state == TaskState::Dead {
            return base;
        }
        if let Some(op) = t.program.get(t.pc as usize) {
            return format!("{base}: {}", user_op_text(op));
        }
        return base;
    }
    match explain(m, &after, cpu) {
        Some(x) => format!("{base}: {x}"),
        None => base,
    }
}

//! kernel/sched: `__schedule()`/`context_switch()`, the idle loop, `try_to_wake_up()`, and
//! `mmap_sem` as a blocking reader/writer semaphore.
//!
//! Simplifications: one runqueue per CPU, FIFO (`sched = "fifo"`) or ordered by EEVDF
//! (`sched = "eevdf"`, `fair.rs`); no load balancing (tasks stay where they were put or moved by
//! `sched_setaffinity`); preemption only at return to user, after the time slice (FIFO: a woken
//! task does not preempt a busy CPU, it runs at that CPU's next scheduling point) or, with
//! EEVDF, after an expired deadline or a wake-up that `pick_eevdf` gives the CPU.

use crate::counters::Counter;
use crate::frame::{Flow, Frame};
use crate::machine::Machine;
use crate::options::Sched;
use crate::state::*;
use crate::switch_mm::SwitchMm;
use shootdown_engine::trace::TraceEvent;
use shootdown_engine::{Env, Park};
use shootdown_hw::CpuId;

/// `__schedule()` + `context_switch()`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Schedule {
    pub pc: SchedulePc,
    pub prev: TaskId,
    pub next: TaskId,
}

/// The steps of `__schedule()`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SchedulePc {
    /// Pick the next task.
    Pick,
    /// `context_switch()`: `switch_mm_irqs_off` or `enter_lazy_tlb`.
    ContextSwitch,
    /// `finish_task_switch()`: the next task runs.
    Finish,
    /// Left on the previous task's stack: it returns when that task runs again.
    Return,
}

/// `down_read()` / `down_write()` on `mmap_sem`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RwSemDown {
    pub pc: RwSemDownPc,
    pub sem: SemId,
    pub write: bool,
}

/// Which `rw_semaphore`: an mm's `mmap_sem` or a file's `i_mmap_rwsem` (`vma.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SemId {
    MmapSem(MmId),
    IMmap(crate::vma::FileId),
}

/// The steps of `down_read()` / `down_write()`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RwSemDownPc {
    /// Take the semaphore, or queue and sleep.
    Try,
    /// Woken with the semaphore handed over: return.
    Woken,
}

impl RwSemDown {
    /// A call of `down_read(&mm->mmap_sem)` (or `down_write` with `write`).
    pub fn call(mm: MmId, write: bool) -> Frame {
        Self::call_sem(SemId::MmapSem(mm), write)
    }

    /// A call of `i_mmap_lock_read(mapping)` / `i_mmap_lock_write` of file `file`.
    pub fn i_mmap(file: crate::vma::FileId, write: bool) -> Frame {
        Self::call_sem(SemId::IMmap(file), write)
    }

    fn call_sem(sem: SemId, write: bool) -> Frame {
        Frame::RwSemDown(RwSemDown {
            pc: RwSemDownPc::Try,
            sem,
            write,
        })
    }
}

impl Machine {
    pub(crate) fn schedule_spins(&self, cpu: CpuId, s: &Schedule) -> bool {
        // A task still switching out on another CPU can't be picked yet (p->on_cpu). The task
        // running this very schedule() may be picked again: it was woken before it switched out
        // (a lock handed over between its decision to sleep and its call to schedule()).
        s.pc == SchedulePc::Pick
            && self
                .queued_pick(cpu)
                .map(|i| self.cpus[cpu].runqueue[i])
                .map(|n| n != self.cpus[cpu].curr && self.tasks[n as usize].on_cpu)
                .unwrap_or(false)
    }

    /// Whether `cpu`'s current task is still runnable (it is picked again if nothing else is).
    fn prev_runnable(&self, cpu: CpuId) -> bool {
        let prev = self.cpus[cpu].curr;
        prev != self.cpus[cpu].idle_task && self.tasks[prev as usize].state == TaskState::Running
    }

    /// Which queued task `schedule()` switches to (its index in the runqueue), if any: the
    /// head of the FIFO, or EEVDF's pick (`fair.rs`), which can keep the previous task. With
    /// no timed run behind it EEVDF's entities are all alike, and its pick is the head too.
    fn queued_pick(&self, cpu: CpuId) -> Option<usize> {
        match self.opts.sched {
            Sched::Fifo => (!self.cpus[cpu].runqueue.is_empty()).then_some(0),
            Sched::Eevdf => self.eevdf_pick_next(cpu, self.prev_runnable(cpu)),
        }
    }

    pub(crate) fn schedule_frame(&self) -> Frame {
        Frame::Schedule(Schedule {
            pc: SchedulePc::Pick,
            prev: 0,
            next: 0,
        })
    }

    /// One step of `__schedule()` (see [`SchedulePc`]).
    pub(crate) fn schedule_step<E: Env>(
        &mut self,
        cpu: CpuId,
        s: &mut Schedule,
        env: &mut E,
    ) -> Flow {
        use SchedulePc::*;
        match s.pc {
            Pick => {
                let prev = self.cpus[cpu].curr;
                let idle = self.cpus[cpu].idle_task;
                let prev_runnable = self.prev_runnable(cpu);
                let eevdf = self.eevdf(env);
                if eevdf {
                    self.eevdf_update_curr(cpu, env.now());
                    if self.tasks[prev as usize].state == TaskState::Blocked {
                        self.eevdf_dequeue(cpu, prev);
                    }
                }
                let pick = self.queued_pick(cpu);
                if self.schedule_spins(cpu, s) {
                    let waited = self.cpus[cpu].runqueue[pick.unwrap_or(0)];
                    return Flow::Spin(crate::mem::on_cpu_key(waited));
                }
                let next = match pick.and_then(|i| self.cpus[cpu].runqueue.remove(i)) {
                    Some(n) => n,
                    None if prev_runnable => prev,
                    None => idle,
                };
                self.cpus[cpu].need_resched = false;
                if eevdf && next != prev && next != idle {
                    self.eevdf_set_next(next);
                }
                if next == prev {
                    self.tasks[prev as usize].state = TaskState::Running;
                    self.perf.cpu[cpu].slice_start = env.now();
                    self.say(|| "schedule: keep running".into());
                    return Flow::Return;
                }
                if prev_runnable {
                    self.tasks[prev as usize].state = TaskState::Runnable;
                    self.cpus[cpu].runqueue.push_back(prev);
                }
                self.charge(env, |c| c.context_switch);
                self.perf.counters.inc(Counter::ContextSwitches);
                s.prev = prev;
                s.next = next;
                let (pn, nn) = (
                    self.tasks[prev as usize].name.clone(),
                    self.tasks[next as usize].name.clone(),
                );
                self.say(|| format!("schedule: {pn} -> {nn}"));
                s.pc = ContextSwitch;
                Flow::Next
            }
            ContextSwitch => {
                s.pc = Finish;
                self.context_switch_lazy_mm(s.prev, s.next);
                match self.tasks[s.next as usize].mm {
                    Some(mm) => {
                        self.summary(|| "context_switch: switch_mm_irqs_off".into());
                        Flow::Call(SwitchMm::call(mm))
                    }
                    None => {
                        self.summary(|| "context_switch: enter_lazy_tlb".into());
                        self.enter_lazy_tlb(cpu, env);
                        Flow::Next
                    }
                }
            }
            Finish => {
                let (prev, next) = (s.prev, s.next);
                self.finish_task_switch_mm(prev, next);
                let t = &mut self.tasks[next as usize];
                t.state = TaskState::Running;
                t.cpu = cpu;
                t.on_cpu = true;
                self.cpus[cpu].curr = next;
                self.tasks[prev as usize].on_cpu = false;
                self.perf.cpu[cpu].slice_start = env.now();
                env.notify_key(crate::mem::on_cpu_key(prev));
                if env.tracing() {
                    // This __schedule frame is off prev's stack while it is stepped.
                    self.trace_task_out(cpu, prev, 1, env);
                    let name = self.tasks[next as usize].name.clone();
                    env.trace(TraceEvent::Instant {
                        agent: cpu,
                        name: "sched_switch",
                        detail: Some(name),
                    });
                    self.trace_task_in(cpu, next, env);
                }
                let nn = self.tasks[next as usize].name.clone();
                self.say(|| format!("finish_task_switch: now running {nn}"));
                s.pc = Return;
                Flow::Next
            }
            Return => {
                self.summary(|| "return to the task".into());
                Flow::Return
            }
        }
    }

    /// The idle task with nothing on the stack: schedule if work arrived, else halt (or poll).
    pub(crate) fn idle_step<E: Env>(&mut self, cpu: CpuId, env: &mut E) -> Park {
        if !self.cpus[cpu].runqueue.is_empty() {
            self.summary(|| "work queued, schedule()".into());
            self.cpus[cpu].halted = false;
            let f = self.schedule_frame();
            self.call(cpu, env, f);
            return Park::Run;
        }
        self.cpus[cpu].halted = true;
        // The explorer has no host scheduler to block a halted vCPU (the timed driver's does):
        // in a VM with a KVM MMU the HLT exit is this step.
        if !env.timed() && self.has_kvm_mmu(cpu) {
            self.kvm_vcpu_block(cpu, env);
        }
        Park::Halt
    }

    /// `try_to_wake_up()`: make `task` runnable on its CPU and poke that CPU if it is idle.
    pub(crate) fn wake_up_process<E: Env>(&mut self, waker: CpuId, task: TaskId, env: &mut E) {
        let t = &mut self.tasks[task as usize];
        if t.state != TaskState::Blocked {
            return;
        }
        t.state = TaskState::Runnable;
        let target = t.cpu;
        let eevdf = self.eevdf(env);
        if eevdf {
            // enqueue_entity(): update_curr() first, then place_entity().
            let now = env.now() + env.elapsed();
            if self.eevdf_update_curr(target, now) {
                self.cpus[target].need_resched = true;
            }
            self.eevdf_place(target, task);
        }
        self.cpus[target].runqueue.push_back(task);
        self.charge(env, |c| c.wakeup);
        if self.is_idle(target) {
            self.kick_cpu(waker, target, env);
        } else if eevdf && self.eevdf_wakeup_preempts(target, task) {
            self.resched_curr(waker, target, env);
        }
    }

    /// One step of `down_read()` / `down_write()`: take it, or queue and sleep; the releaser hands
    /// the semaphore over before waking us.
    pub(crate) fn rwsem_down_step<E: Env>(
        &mut self,
        cpu: CpuId,
        s: &mut RwSemDown,
        env: &mut E,
    ) -> Flow {
        let (sem_id, write) = (s.sem, s.write);
        let name = self.sem_text(sem_id);
        let taken = || {
            format!(
                "{} {name}",
                if write { "write-locked" } else { "read-locked" }
            )
        };
        if s.pc == RwSemDownPc::Woken {
            self.summary(taken);
            return Flow::Return;
        }
        self.touch_line(env, cpu, sem_line(sem_id), true);
        self.charge(env, |c| c.atomic_rmw);
        let me = self.cpus[cpu].curr;
        let sem = self.sem_mut(sem_id);
        let free = !sem.writer && sem.waiters.is_empty() && (!write || sem.readers == 0);
        if free {
            if write {
                sem.writer = true;
            } else {
                sem.readers += 1;
            }
            self.summary(taken);
            return Flow::Return;
        }
        sem.waiters.push_back((me, write));
        self.tasks[me as usize].state = TaskState::Blocked;
        if let SemId::MmapSem(_) = sem_id {
            self.perf.counters.inc(Counter::MmapSemContended);
        }
        self.say(|| format!("{name} contended: sleep"));
        s.pc = RwSemDownPc::Woken;
        Flow::Call(self.schedule_frame())
    }

    /// How a counterexample names a semaphore.
    fn sem_text(&self, sem: SemId) -> String {
        match sem {
            SemId::MmapSem(mm) => format!("mmap_sem of mm{mm}"),
            SemId::IMmap(f) => format!("i_mmap_rwsem of file '{}'", self.files[f as usize].name),
        }
    }

    fn sem_mut(&mut self, sem: SemId) -> &mut RwSem {
        match sem {
            SemId::MmapSem(mm) => &mut self.mms[mm as usize].mmap_sem,
            SemId::IMmap(f) => &mut self.files[f as usize].i_mmap_rwsem,
        }
    }

    /// `up_read()` / `up_write()` of `mm`'s `mmap_sem`.
    pub(crate) fn rwsem_up<E: Env>(&mut self, cpu: CpuId, mm: MmId, write: bool, env: &mut E) {
        self.rwsem_up_sem(cpu, SemId::MmapSem(mm), write, env)
    }

    /// `up_read()` / `up_write()`: release and hand over to waiters in FIFO order (a writer, or a
    /// run of readers).
    pub(crate) fn rwsem_up_sem<E: Env>(
        &mut self,
        cpu: CpuId,
        sem_id: SemId,
        write: bool,
        env: &mut E,
    ) {
        self.touch_line(env, cpu, sem_line(sem_id), true);
        self.charge(env, |c| c.atomic_rmw);
        let sem = self.sem_mut(sem_id);
        if write {
            sem.writer = false;
        } else {
            sem.readers -= 1;
        }
        let mut woken = Vec::new();
        while let Some(&(t, w)) = sem.waiters.front() {
            if w {
                if sem.readers == 0 && !sem.writer {
                    sem.writer = true;
                    sem.waiters.pop_front();
                    woken.push(t);
                }
                break;
            }
            if sem.writer {
                break;
            }
            sem.readers += 1;
            sem.waiters.pop_front();
            woken.push(t);
        }
        for t in woken {
            self.wake_up_process(cpu, t, env);
        }
    }
}

/// The cache line of a semaphore's count.
fn sem_line(sem: SemId) -> u64 {
    match sem {
        SemId::MmapSem(mm) => mmap_sem_line(mm),
        SemId::IMmap(f) => (8u64 << 56) | f as u64,
    }
}

fn mmap_sem_line(mm: MmId) -> u64 {
    (7u64 << 56) | mm as u64
}

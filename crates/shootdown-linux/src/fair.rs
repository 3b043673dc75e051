//! kernel/sched/fair.c's EEVDF (v6.6+, as in v6.12) for the guest or native kernel's tasks,
//! option `sched = "eevdf"`: who runs next, and whether a woken task preempts the running one.
//! The model's other form, `fifo`, is one FIFO runqueue per CPU with preemption only after a
//! time slice (`sched.rs`).
//!
//! What is modelled, for nice-0 tasks (every weight `NICE_0_LOAD`, so `calc_delta_fair` is the
//! identity and a task's vruntime advances 1:1 with the time it runs):
//! * **`update_curr`**: the running task's vruntime grows by what it ran; `update_deadline`
//!   gives it a new deadline (`vruntime + slice`) once its vruntime reaches the old one, and
//!   with others queued that is a reschedule (`resched_curr`).
//! * **The slice**: `sysctl_sched_base_slice` = 0.75 ms × (1 + ilog2(min(CPUs, 8)))
//!   (`SCHED_TUNABLESCALING_LOG`): 3 ms from 8 CPUs. `sched_timeslice_us` does not apply.
//! * **Sleep** (`dequeue_entity` → `update_entity_lag`): `vlag = V − vruntime`, clamped to
//!   ±max(2 × slice, `TICK_NSEC`), where `V` is `avg_vruntime()`, the mean vruntime of the
//!   queued tasks and the running one.
//! * **Wake-up** (`enqueue_entity` → `place_entity` with `PLACE_LAG`): `vruntime = V − lag`, the
//!   lag inflated by `(n + 1) / n` for the `n` entities already there (so that it survives the
//!   shift its own arrival makes to `V`), `deadline = vruntime + slice`. Then
//!   `check_preempt_wakeup_fair`: the woken task preempts only if `pick_eevdf` would pick it —
//!   among the eligible entities (`vruntime <= V`, exactly: `Σ v_i >= v × n`) the earliest
//!   deadline, where the running task, if still eligible, keeps the CPU while it is protected
//!   (`RUN_TO_PARITY`: picked by `set_next_entity` and not given a new deadline since; a
//!   re-pick of the same task does not re-arm it) or while its deadline is strictly earlier.
//!   Then `resched_curr` on the target: a reschedule IPI unless it is this CPU.
//! * **A new task** (`wake_up_new_task`): placed at `V` with half a slice to its deadline
//!   (`PLACE_DEADLINE_INITIAL`).
//! * **`pick_next_task_fair`** at `schedule()`: `pick_eevdf` over the queue and the previous
//!   task if it is still runnable.
//!
//! Simplified: `DELAY_DEQUEUE` is left out (a task that sleeps with negative lag is dequeued at
//! once and placed with that lag when woken, where the kernel keeps it queued, ineligible,
//! until it is picked or woken, and DELAY_ZERO drops a positive lag; both leave it ineligible
//! when it is woken soon after); `PREEMPT_SHORT` (equal slices never trigger it) is left out; `NEXT_BUDDY` is off, as by
//! default; the tick is not a scheduling point of its own: an expired deadline is noticed at
//! the next return to user (as `fifo`'s time slice). `TICK_NSEC` is 4 ms (HZ=250), which
//! matters only under 4 CPUs. Load balancing and wake-affine placement are not modelled: a task
//! wakes on the CPU it last ran on. Timed driver only: the explorer picks FIFO, and every
//! interleaving of the steps is explored anyway.

use crate::machine::Machine;
use crate::options::Sched;
use crate::state::{TaskId, TaskState};
use shootdown_engine::{Env, Time};
use shootdown_hw::CpuId;

/// A task's `sched_entity`, as far as EEVDF orders it (picoseconds of vruntime).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SchedEntity {
    pub vruntime: i64,
    pub deadline: i64,
    /// `se->vlag`: the lag saved when it slept.
    pub vlag: i64,
    /// `RUN_TO_PARITY`'s stamp (`curr->vlag == curr->deadline`): picked and not given a new
    /// deadline since.
    pub protected: bool,
}

/// What a CPU's `cfs_rq` keeps beside its entities (picoseconds).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FairRq {
    /// `curr->exec_start`: when `update_curr` last accounted the running task.
    pub exec_start: Time,
    /// `V` when the queue last emptied, for a task that wakes onto an empty queue.
    pub min_vruntime: i64,
}

/// `TICK_NSEC` at HZ=250, in picoseconds.
const TICK_PS: i64 = 4_000_000_000;

impl Machine {
    /// Is the guest (or native) kernel's scheduler EEVDF here (timed runs only)?
    pub(crate) fn eevdf<E: Env>(&self, env: &E) -> bool {
        self.opts.sched == Sched::Eevdf && env.timed()
    }

    /// `sysctl_sched_base_slice` scaled by CPU count, in picoseconds.
    fn base_slice(&self) -> i64 {
        let n = self.cpus.len().clamp(1, 8) as u32;
        750_000_000 * (1 + n.ilog2() as i64)
    }

    fn se(&mut self, t: TaskId) -> &mut SchedEntity {
        let n = self.tasks.len();
        if self.perf.se.len() < n {
            self.perf.se.resize(n, SchedEntity::default());
        }
        &mut self.perf.se[t as usize]
    }

    fn fair_rq(&self, cpu: CpuId) -> FairRq {
        self.perf.fair_rq.get(cpu).copied().unwrap_or_default()
    }

    fn fair_rq_mut(&mut self, cpu: CpuId) -> &mut FairRq {
        if self.perf.fair_rq.len() < self.cpus.len() {
            self.perf.fair_rq.resize(self.cpus.len(), FairRq::default());
        }
        &mut self.perf.fair_rq[cpu]
    }

    fn se_of(&self, t: TaskId) -> SchedEntity {
        self.perf.se.get(t as usize).copied().unwrap_or_default()
    }

    /// The task `cpu` runs that is a CFS entity (`cfs_rq->curr`): not the idle task, and not
    /// one that has blocked or exited on its way out.
    fn eevdf_curr(&self, cpu: CpuId) -> Option<TaskId> {
        let c = &self.cpus[cpu];
        (c.curr != c.idle_task && self.tasks[c.curr as usize].state == TaskState::Running)
            .then_some(c.curr)
    }

    /// The queued entities of `cpu` and its running one: (sum of vruntimes, count).
    fn eevdf_load(&self, cpu: CpuId) -> (i128, i64) {
        let mut sum = 0i128;
        let mut n = 0i64;
        let queued = self.cpus[cpu].runqueue.iter().copied();
        for t in queued.chain(self.eevdf_curr(cpu)) {
            sum += self.se_of(t).vruntime as i128;
            n += 1;
        }
        (sum, n)
    }

    /// `avg_vruntime(cfs_rq)` of `cpu`, whose entities' `load` is `eevdf_load`'s.
    fn avg_vruntime(&self, cpu: CpuId, (sum, n): (i128, i64)) -> i64 {
        if n == 0 {
            self.fair_rq(cpu).min_vruntime
        } else {
            (sum / n as i128) as i64
        }
    }

    /// `update_curr()` of `cpu`'s running task at `now`; true if `update_deadline` gave it a
    /// new deadline while others are queued (`resched_curr`).
    pub(crate) fn eevdf_update_curr(&mut self, cpu: CpuId, now: Time) -> bool {
        let rq = self.fair_rq_mut(cpu);
        // A waker's clock can be behind this CPU's last account of itself.
        let start = rq.exec_start;
        if now < start {
            return false;
        }
        rq.exec_start = now;
        let Some(t) = self.eevdf_curr(cpu) else {
            return false;
        };
        let delta = (now.0 - start.0) as i64;
        let slice = self.base_slice();
        let queued = !self.cpus[cpu].runqueue.is_empty();
        let se = self.se(t);
        se.vruntime += delta;
        if se.vruntime < se.deadline {
            return false;
        }
        se.deadline = se.vruntime + slice;
        se.protected = false;
        queued
    }

    /// `dequeue_entity()` of `cpu`'s previous task `t` going to sleep (or moving away):
    /// `update_entity_lag()`.
    pub(crate) fn eevdf_dequeue(&mut self, cpu: CpuId, t: TaskId) {
        // `avg_vruntime()` still counts it: it is `cfs_rq->curr` until it is dequeued.
        let (mut sum, mut n) = self.eevdf_load(cpu);
        if self.eevdf_curr(cpu) != Some(t) {
            sum += self.se_of(t).vruntime as i128;
            n += 1;
        }
        let v = self.avg_vruntime(cpu, (sum, n));
        let limit = (2 * self.base_slice()).max(TICK_PS);
        self.fair_rq_mut(cpu).min_vruntime = v;
        let se = self.se(t);
        se.vlag = (v - se.vruntime).clamp(-limit, limit);
        se.protected = false;
    }

    /// `place_entity()` of task `t` joining `cpu`'s queue (before it is pushed there).
    pub(crate) fn eevdf_place(&mut self, cpu: CpuId, t: TaskId) {
        let load = self.eevdf_load(cpu);
        let (n, v) = (load.1, self.avg_vruntime(cpu, load));
        let slice = self.base_slice();
        let se = self.se(t);
        let lag = if n == 0 {
            0
        } else {
            ((se.vlag as i128 * (n + 1) as i128) / n as i128) as i64
        };
        se.vruntime = v - lag;
        se.deadline = se.vruntime + slice;
        se.protected = false;
    }

    /// `place_entity()` of a new task on `cpu` (`wake_up_new_task`, `ENQUEUE_INITIAL`): at `V`,
    /// with half a slice to its deadline (`PLACE_DEADLINE_INITIAL`), before it is queued.
    pub(crate) fn eevdf_place_new(&mut self, cpu: CpuId, t: TaskId) {
        let v = self.avg_vruntime(cpu, self.eevdf_load(cpu));
        let half = self.base_slice() / 2;
        *self.se(t) = SchedEntity {
            vruntime: v,
            deadline: v + half,
            vlag: 0,
            protected: false,
        };
    }

    /// `pick_eevdf()` over `cpu`'s queue and, if `with_curr`, its running task: the index in
    /// the runqueue of the task to run, or None for the running task.
    fn pick_eevdf(&self, cpu: CpuId, with_curr: bool) -> Option<usize> {
        let rq = &self.cpus[cpu].runqueue;
        // entity_eligible(): `vruntime <= V`, without the division.
        let (sum, n) = self.eevdf_load(cpu);
        let eligible = |se: &SchedEntity| n == 0 || sum >= se.vruntime as i128 * n as i128;
        let curr = with_curr
            .then(|| self.eevdf_curr(cpu))
            .flatten()
            .map(|c| self.se_of(c))
            .filter(eligible);
        if curr.is_some_and(|se| se.protected) {
            return None;
        }
        let best = rq
            .iter()
            .enumerate()
            .map(|(i, &t)| (i, self.se_of(t)))
            .filter(|(_, se)| eligible(se))
            .min_by_key(|(i, se)| (se.deadline, *i));
        match (curr, best) {
            (Some(c), Some((_, b))) if c.deadline < b.deadline => None,
            (_, Some((i, _))) => Some(i),
            (Some(_), None) => None,
            // Nothing eligible, which only rounding allows (the entity of least vruntime is):
            // that entity.
            (None, None) => rq
                .iter()
                .enumerate()
                .min_by_key(|(i, &t)| (self.se_of(t).vruntime, *i))
                .map(|(i, _)| i),
        }
    }

    /// `schedule()`'s `pick_next_task_fair()`: which queued task `cpu` switches to (its index
    /// in the runqueue), or None to keep running the previous task (if still runnable) or go
    /// idle. `prev_runnable`: the previous task stays a candidate.
    pub(crate) fn eevdf_pick_next(&self, cpu: CpuId, prev_runnable: bool) -> Option<usize> {
        if self.cpus[cpu].runqueue.is_empty() {
            return None;
        }
        self.pick_eevdf(cpu, prev_runnable)
    }

    /// A move of task `t` from `from`'s queue to `to`'s (`sched_setaffinity`): dequeued with
    /// its lag, placed on the other queue with it.
    pub(crate) fn eevdf_migrate(&mut self, from: CpuId, to: CpuId, t: TaskId, now: Time) {
        self.eevdf_update_curr(from, now);
        self.eevdf_dequeue(from, t);
        self.eevdf_update_curr(to, now);
        self.eevdf_place(to, t);
    }

    /// `set_next_entity()` of the task `cpu` switches to: arms `RUN_TO_PARITY`.
    pub(crate) fn eevdf_set_next(&mut self, t: TaskId) {
        self.se(t).protected = true;
    }

    /// `check_preempt_wakeup_fair()` after task `t` was queued on `cpu`: would `pick_eevdf`
    /// now choose it over the running task?
    pub(crate) fn eevdf_wakeup_preempts(&self, cpu: CpuId, t: TaskId) -> bool {
        if self.eevdf_curr(cpu).is_none() || self.cpus[cpu].need_resched {
            return false;
        }
        self.pick_eevdf(cpu, true)
            .is_some_and(|i| self.cpus[cpu].runqueue[i] == t)
    }

    /// `resched_curr()` from a wake-up on `waker`: `cpu` reschedules at its next return to
    /// user, after a reschedule IPI unless it is the waker itself.
    pub(crate) fn resched_curr<E: Env>(&mut self, waker: CpuId, cpu: CpuId, env: &mut E) {
        self.perf
            .counters
            .inc(crate::counters::Counter::WakeupPreemptions);
        if env.tracing() {
            let name = self.tasks[self.cpus[cpu].curr as usize].name.clone();
            env.trace(shootdown_engine::trace::TraceEvent::Instant {
                agent: cpu,
                name: "wakeup preemption",
                detail: Some(format!("{name} is preempted (cpu{waker} woke a task)")),
            });
        }
        self.kick_cpu(waker, cpu, env);
    }
}

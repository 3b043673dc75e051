//! CFS's fairness among vCPU threads (kernel/sched/fair.c, v4.15), as far as wake-ups and
//! yields need it (timed driver only): each thread's `vruntime`, its placement when it wakes,
//! `check_preempt_wakeup`, and `pick_next_entity`'s buddy tests, which decide whether a
//! `yield_to` takes effect.
//!
//! * **`update_curr`**: a running thread's vruntime grows by its runtime (every vCPU thread has
//!   nice 0, so `calc_delta_fair` is the identity); housekeeping and context-switch time are
//!   charged to no vCPU thread.
//! * **`place_entity`** (a wake-up, not an initial placement): a thread that slept gets at most
//!   half a `sched_latency` of credit below its run queue's `min_vruntime`, which only grows.
//! * **`pick_next_entity`**: the leftmost thread runs, unless a buddy is "not unfair":
//!   `wakeup_preempt_entity(buddy, left) < 1`, i.e. the buddy's vruntime is at most `wakeup_gran`
//!   (the `wakeup_granularity_us` setting) past the leftmost's. `yield_to` makes its target the
//!   next buddy of the target's run queue and the yielder the skip buddy of its own: the target
//!   runs only if that test passes (else the leftmost does), and the yielder gives its pCPU
//!   away only if it is not the leftmost or the second-leftmost passes the test against it.
//! * **`check_preempt_wakeup`**: a woken thread preempts the running one at once if the
//!   running one's vruntime is more than `wakeup_gran` past its own.
//! * **`check_preempt_tick`** (with `tick_us` > 0): at each tick, the running thread is
//!   preempted once it ran more than its `sched_slice`, or, past `sched_min_granularity`, once
//!   its vruntime leads the leftmost waiting thread's by more than that slice.
//!
//! Simplified: the next thread after a preemption is the queue's head (round-robin, a woken
//! thread first), not the leftmost; all ticks are aligned; the last buddy and the buddies'
//! survival to a later `schedule()` are left out (a refused next buddy is dropped).

use crate::machine::Machine;
use shootdown_engine::Time;
use shootdown_hw::CpuId;

impl Machine {
    /// vCPU `v`'s thread starts running at `t` (`set_next_entity`).
    pub(crate) fn fair_sched_in(&mut self, v: CpuId, t: Time) {
        self.perf.host.run_start[v] = t;
    }

    /// vCPU `v`'s thread stops running at `t` (`update_curr` at `put_prev_entity`).
    pub(crate) fn fair_sched_out(&mut self, v: CpuId, t: Time) {
        let hp = &mut self.perf.host;
        hp.vruntime[v] += t.saturating_sub(hp.run_start[v]);
        hp.run_start[v] = hp.run_start[v].max(t);
        let p = self.host_ref().vcpus[v].pcpu as usize;
        self.fair_update_min_vruntime(p, t);
    }

    /// vCPU `v`'s vruntime at `t`, with the runtime so far if its thread is current.
    fn vruntime_at(&self, v: CpuId, t: Time) -> Time {
        let hp = &self.perf.host;
        let p = self.host_ref().vcpus[v].pcpu as usize;
        if self.host_ref().pcpus[p].curr == Some(v as u32) {
            hp.vruntime[v] + t.saturating_sub(hp.run_start[v])
        } else {
            hp.vruntime[v]
        }
    }

    /// The leftmost thread of pCPU `p` at `t` among the current one and those queued, with
    /// its vruntime (`None` on an idle pCPU with an empty queue).
    fn fair_leftmost(&self, p: usize, t: Time) -> Option<(CpuId, Time)> {
        let q = &self.host_ref().pcpus[p];
        q.curr
            .iter()
            .chain(q.rq.iter())
            .map(|&w| (w as usize, self.vruntime_at(w as usize, t)))
            .min_by_key(|&(w, vr)| (vr, w))
    }

    /// The leftmost thread waiting in pCPU `p`'s queue, with its vruntime.
    fn fair_queued_leftmost(&self, p: usize) -> Option<(CpuId, Time)> {
        self.host_ref().pcpus[p]
            .rq
            .iter()
            .map(|&w| (w as usize, self.perf.host.vruntime[w as usize]))
            .min_by_key(|&(w, vr)| (vr, w))
    }

    /// `update_min_vruntime`: the run queue's floor follows its leftmost thread, never back.
    fn fair_update_min_vruntime(&mut self, p: usize, t: Time) {
        if let Some((_, vr)) = self.fair_leftmost(p, t) {
            let m = &mut self.perf.host.min_vruntime[p];
            *m = (*m).max(vr);
        }
    }

    /// `place_entity(cfs_rq, se, 0)` for vCPU `w` woken at `t`: at least `min_vruntime` less
    /// half a `sched_latency`.
    pub(crate) fn fair_place(&mut self, w: CpuId, t: Time) {
        let p = self.host_ref().vcpus[w].pcpu as usize;
        self.fair_update_min_vruntime(p, t);
        let thresh = Time::from_us(self.host_ref().cfg.sched_latency_us / 2);
        let floor = self.perf.host.min_vruntime[p].saturating_sub(thresh);
        let vr = &mut self.perf.host.vruntime[w];
        *vr = (*vr).max(floor);
    }

    /// `wakeup_preempt_entity(buddy, left) < 1`: is running `buddy` "not unfair" to `left`?
    fn fair_not_unfair(&self, buddy: Time, left: Time) -> bool {
        buddy.saturating_sub(left) <= Time::from_us(self.host_ref().cfg.wakeup_granularity_us)
    }

    /// The first tick at which `check_preempt_tick` preempts pCPU `p`'s running thread, as the
    /// run queue stands (`Time::MAX`: nothing runs or nothing waits). It preempts once the
    /// thread has run more than its `sched_slice` (the period — `sched_latency`, or
    /// `sched_min_granularity` per thread beyond 8 — shared among the runnable threads), or, after
    /// `sched_min_granularity`, once its vruntime is more than that slice past the leftmost
    /// waiting thread's.
    pub(crate) fn fair_tick_preempt_at(&self, p: usize) -> Time {
        let h = self.host_ref();
        let q = &h.pcpus[p];
        let (Some(u), false) = (q.curr, q.rq.is_empty()) else {
            return Time::MAX;
        };
        let hp = &self.perf.host;
        let nr = 1 + q.rq.len() as u64;
        let (lat, min_gran) = (h.cfg.sched_latency_us, h.cfg.sched_min_granularity_us);
        let period = if nr > 8 { nr * min_gran } else { lat };
        let ideal = Time(Time::from_us(period).0 / nr);
        let left = self.fair_queued_leftmost(p).map_or(Time::MAX, |(_, vr)| vr);
        let (start, vr0) = (hp.run_start[u as usize], hp.vruntime[u as usize]);
        // vruntime(start + d) - left > ideal  <=>  d > ideal + left - vr0.
        let by_vruntime = (ideal + left)
            .saturating_sub(vr0)
            .max(Time::from_us(min_gran));
        let after = ideal.min(by_vruntime);
        let tick = Time::from_us(h.cfg.tick_us);
        Time(((start + after).0 / tick.0 + 1) * tick.0)
    }

    /// `check_preempt_wakeup`: does thread `w`, woken at `t`, preempt the running `curr`?
    /// `wakeup_preempt_entity(curr, w) == 1`: `curr`'s vruntime is more than `wakeup_gran`
    /// past `w`'s (already placed).
    pub(crate) fn fair_wakeup_preempts(&self, curr: CpuId, w: CpuId, t: Time) -> bool {
        !self.fair_not_unfair(self.vruntime_at(curr, t), self.perf.host.vruntime[w])
    }

    /// `yield_to`'s target side: the thread `pick_next_entity` runs on `w`'s pCPU at `t` with
    /// `w` the next buddy — `w` if that is not unfair to the leftmost, else the leftmost.
    pub(crate) fn fair_pick_with_next_buddy(&self, w: CpuId, t: Time) -> CpuId {
        let p = self.host_ref().vcpus[w].pcpu as usize;
        match self.fair_leftmost(p, t) {
            Some((l, left)) if !self.fair_not_unfair(self.vruntime_at(w, t), left) => l,
            _ => w,
        }
    }

    /// `yield_task_fair` + `schedule()` on the yielder `v`'s pCPU at `t`, with `v` the skip
    /// buddy: the queued thread that runs instead, if any — the leftmost of the queue, if it
    /// is left of the yielder or not unfair to it — which is moved to the queue's head.
    pub(crate) fn fair_yield_switch(&mut self, v: CpuId, t: Time) -> Option<CpuId> {
        let p = self.host_ref().vcpus[v].pcpu as usize;
        // Alone on the pCPU (`nr_running == 1`): nothing to yield to.
        let (second, vr2) = self.fair_queued_leftmost(p)?;
        if !self.fair_not_unfair(vr2, self.vruntime_at(v, t)) {
            return None;
        }
        self.host_queue_first(p, second);
        Some(second)
    }
}

#[cfg(test)]
mod tests {
    use crate::host::HostConfig;
    use crate::machine::Machine;
    use crate::options::Options;
    use crate::MemoryModel;
    use shootdown_engine::Time;
    use shootdown_hw::{CostProfile, Features, Topology};
    use std::sync::Arc;

    /// Two VMs of one vCPU on one pCPU: vCPU 0 runs (since 0), vCPU 1 waits in the queue.
    fn pair() -> Machine {
        let topo = Topology::new(1, 1, 1).unwrap();
        let prof = Arc::new(CostProfile::uniform("t", 10.0, Features::modern()));
        let cfg = HostConfig {
            vms: 2,
            vcpus_per_vm: 1,
            ..HostConfig::default()
        };
        Machine::with_host(topo, prof, Options::default(), MemoryModel::Sc, cfg)
    }
    const MS: fn(u64) -> Time = Time::from_ms;

    #[test]
    fn a_yield_target_runs_only_within_wakeup_gran_of_the_leftmost() {
        let mut m = pair();
        // vCPU 0 has run 1 ms: it is the leftmost.
        m.perf.host.vruntime[1] = MS(10);
        assert_eq!(m.fair_pick_with_next_buddy(1, MS(1)), 0);
        m.perf.host.vruntime[1] = MS(5);
        assert_eq!(m.fair_pick_with_next_buddy(1, MS(1)), 1);
    }

    #[test]
    fn a_yielder_keeps_its_pcpu_when_the_queue_is_far_ahead() {
        let mut m = pair();
        m.perf.host.vruntime[1] = MS(10);
        assert_eq!(m.fair_yield_switch(0, MS(1)), None);
        // Once it has run past the other by more than the granularity, it goes.
        assert_eq!(m.fair_yield_switch(0, MS(7)), Some(1));
        m.perf.host.vruntime[1] = MS(2);
        assert_eq!(m.fair_yield_switch(0, MS(1)), Some(1));
    }

    #[test]
    fn a_woken_thread_gets_half_a_latency_of_credit_and_no_more() {
        let mut m = pair();
        m.perf.host.vruntime[0] = MS(50);
        m.fair_sched_out(0, Time::ZERO);
        assert_eq!(
            m.perf.host.min_vruntime[0],
            MS(0),
            "vCPU 1 (vruntime 0) is leftmost"
        );
        m.perf.host.min_vruntime[0] = MS(50);
        m.fair_place(1, MS(60));
        assert_eq!(m.perf.host.vruntime[1], MS(38));
        m.perf.host.vruntime[1] = MS(45);
        m.fair_place(1, MS(60));
        assert_eq!(m.perf.host.vruntime[1], MS(45));
    }

    #[test]
    fn a_wakeup_preempts_a_thread_more_than_wakeup_gran_ahead() {
        let mut m = pair();
        m.perf.host.vruntime[1] = MS(15);
        // vCPU 0, running since 0, is at 20 ms of vruntime at 20 ms.
        assert!(m.fair_wakeup_preempts(0, 1, MS(20)));
        m.perf.host.vruntime[1] = MS(17);
        assert!(!m.fair_wakeup_preempts(0, 1, MS(20)));
    }

    #[test]
    fn the_tick_preempts_after_the_slice_or_a_vruntime_lead_of_a_slice() {
        let mut m = pair();
        m.host_mut().cfg.tick_us = 4000;
        // Two threads: sched_slice is 24 ms / 2 = 12 ms, seen at the tick after it.
        assert_eq!(m.fair_tick_preempt_at(0), MS(16));
        // The waiting thread is 20 ms behind at vCPU 0's start: a 12 ms lead over it is reached
        // before min_granularity (3 ms), so the first tick after 3 ms preempts.
        m.perf.host.vruntime[0] = MS(20);
        assert_eq!(m.fair_tick_preempt_at(0), MS(4));
        // Nothing waits: no preemption.
        m.host_mut().pcpus[0].rq.clear();
        assert_eq!(m.fair_tick_preempt_at(0), Time::MAX);
    }
}

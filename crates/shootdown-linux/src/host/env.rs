//! The timed driver's [`Env`] seen by a guest step on a host.

use shootdown_engine::{Env, Time};

/// The timed driver's [`Env`] seen by a guest step on a host: wake-ups of vCPUs are collected so
/// the host can turn them into what they mean for a vCPU thread (deliver to a running vCPU, kick
/// a blocked one, nothing for a preempted one: it sees its pending interrupt when it runs).
pub(crate) struct HostEnv<'a, E: Env> {
    pub inner: &'a mut E,
    pub charged: Time,
    pub wakes: Vec<(usize, Time)>,
}

impl<E: Env> Env for HostEnv<'_, E> {
    fn timed(&self) -> bool {
        self.inner.timed()
    }
    fn now(&self) -> Time {
        self.inner.now()
    }
    fn charge(&mut self, t: Time) {
        self.charged += t;
        self.inner.charge(t);
    }
    fn elapsed(&self) -> Time {
        self.inner.elapsed()
    }
    fn random(&mut self, n: u64) -> u64 {
        self.inner.random(n)
    }
    fn wake(&mut self, agent: usize, at: Time) {
        self.wakes.push((agent, at));
    }
    fn wake_by(&mut self, agent: usize, at: Time) {
        self.inner.wake_by(agent, at)
    }
    fn notify(&mut self) {
        self.inner.notify()
    }
    fn notify_key(&mut self, key: u64) {
        self.inner.notify_key(key)
    }
    fn tracing(&self) -> bool {
        self.inner.tracing()
    }
    fn trace(&mut self, ev: shootdown_engine::trace::TraceEvent) {
        self.inner.trace(ev)
    }
    fn cpu_order(&mut self, cpus: &[usize]) {
        self.inner.cpu_order(cpus)
    }
}

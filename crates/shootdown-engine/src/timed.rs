//! The timed driver: a deterministic discrete-event simulation over a [`Model`].
//!
//! Every agent has its own clock. The driver repeatedly takes the agent with the earliest clock
//! (ties broken by agent index, so runs are reproducible), asks the model what that agent does
//! now ([`Model::timed_action`]), applies it, and advances the agent's clock by the cost the step
//! charged. Agents that halt wait for an [`Env::wake`]; agents that spin wait for an
//! [`Env::notify`] — the step that frees them — and resume at the time it finished.
//!
//! The run is a pure function of the model's initial state and the seed: no wall-clock, thread
//! count or hash-map order enters it.

use crate::model::{prefetch, AgentId, Env, Lead, Model, Park, Violation};
use crate::phases::{Phase, Stopwatch};
use crate::profile::{Profile, Profiler};
use crate::queue::EventQueue;
use crate::rng::DetRng;
use crate::time::Time;
use crate::trace::{Stamped, TraceEvent, WindowSink, WindowStart};
use rustc_hash::FxHasher;
use std::collections::HashMap;
use std::hash::BuildHasherDefault;

/// Why a timed run stopped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Stop {
    /// [`Model::finished`] became true.
    Finished,
    /// The simulated-time limit was reached.
    TimeLimit,
    /// The step limit was reached.
    StepLimit,
    /// No agent can ever run again, yet the workload is not finished.
    Deadlock,
    /// A step reported a broken invariant.
    Violation(Violation),
}

/// Summary of a timed run.
#[derive(Clone, Debug)]
pub struct RunStats {
    pub stop: Stop,
    pub steps: u64,
    /// Simulated time at which the run stopped (the latest agent clock).
    pub end: Time,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum AgentState {
    /// Runs at its slot's `at`.
    Scheduled,
    Halted,
    /// Waits for a notification (of its `key`, if `keyed`), or its deadline (`at`, if
    /// `deadline`).
    Spinning,
    Done,
}

/// One agent's scheduling state in one 32-byte slot. A step reads and writes its agent's
/// clock, state and deadline together: with thousands of agents, one array of slots costs one
/// cache miss where an array per field cost one each (profiled at 4096 CPUs).
#[derive(Clone, Copy, Debug)]
struct Agent {
    clock: Time,
    /// `Scheduled`: when it runs. `Spinning` with a `deadline`: the deadline.
    at: Time,
    /// The key a `keyed` spinner waits on.
    key: u64,
    state: AgentState,
    /// A spinner's deadline ([`Env::wake_by`]) is `at`: its queue entry at that time runs it
    /// unless a notification ran it first.
    deadline: bool,
    keyed: bool,
}

impl Agent {
    fn is_scheduled_at(&self, t: Time) -> bool {
        self.state == AgentState::Scheduled && self.at == t
    }
    /// A spinner's deadline, if it has one.
    fn spin_deadline(&self) -> Option<Time> {
        (self.state == AgentState::Spinning && self.deadline).then_some(self.at)
    }
    /// The key a keyed spinner waits on, forgotten.
    fn take_key(&mut self) -> Option<u64> {
        std::mem::take(&mut self.keyed).then_some(self.key)
    }
}

/// Limits for a run.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub max_time: Time,
    pub max_steps: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_time: Time::MAX,
            max_steps: u64::MAX,
        }
    }
}

/// Below this many agents the timed driver gives the model no prefetch hints
/// ([`Model::prefetch`]): their state stays in the host's cache anyway. (A host-speed setting;
/// hints never change a result.)
pub const PREFETCH_MIN_AGENTS: usize = 256;

/// The discrete-event driver. Holds only scheduling state and what a step may ask of the
/// driver (randomness, the trace); the model holds everything else.
pub struct TimedDriver {
    sched: Schedule,
    rng: DetRng,
    trace: Option<TraceSink>,
}

/// Who runs when: the agents' slots and the queue of their next runs.
struct Schedule {
    agents: Vec<Agent>,
    queue: EventQueue,
    spinners: Vec<AgentId>,
    /// Agents spinning on a specific key, no key with none. Hashed: nearly every step
    /// notifies a key (every store does) and almost never one that anybody spins on (at 4096
    /// CPUs, 11 k of 19 M), so the lookup is on the common path. Its order is never observed:
    /// whom a notification wakes is sorted first.
    keyed: HashMap<u64, Vec<AgentId>, BuildHasherDefault<FxHasher>>,
    steps: u64,
}

/// Where trace events go: kept for a timeline, or folded into a profile as they come.
#[derive(Debug)]
enum TraceSink {
    Record(Vec<Stamped>),
    Window(Box<WindowSink>),
    Profile(Profiler),
}

impl TraceSink {
    fn take(&mut self, at: Time, ev: TraceEvent) {
        match self {
            TraceSink::Record(v) => v.push(Stamped { at, ev }),
            TraceSink::Window(w) => w.take(at, ev),
            TraceSink::Profile(p) => p.record(at, &ev),
        }
    }
}

/// What a step sees of the driver. One lives for a whole run, reset before each step (it
/// used to be built per step: a dozen stores a step the driver does not need).
struct StepEnv<'a> {
    now: Time,
    charged: Time,
    rng: &'a mut DetRng,
    wakes: Vec<(AgentId, Time)>,
    deadlines: Vec<(AgentId, Time)>,
    notified: bool,
    keys: Vec<u64>,
    trace: Option<&'a mut TraceSink>,
}

impl StepEnv<'_> {
    /// Ready for the next step, which starts at `now`.
    fn reset(&mut self, now: Time) {
        self.now = now;
        self.charged = Time::ZERO;
        self.notified = false;
        self.wakes.clear();
        self.deadlines.clear();
        self.keys.clear();
    }

    /// The step woke, gave a deadline to, and notified no one (it may have notified keys no
    /// agent of `sched` spins on).
    #[inline]
    fn is_quiet(&self, sched: &Schedule) -> bool {
        self.wakes.is_empty()
            && self.deadlines.is_empty()
            && !self.notified
            && self.keys.iter().all(|k| !sched.keyed.contains_key(k))
    }
}

impl Env for StepEnv<'_> {
    fn timed(&self) -> bool {
        true
    }
    fn now(&self) -> Time {
        self.now
    }
    fn charge(&mut self, t: Time) {
        self.charged += t;
    }
    fn elapsed(&self) -> Time {
        self.charged
    }
    fn random(&mut self, n: u64) -> u64 {
        self.rng.below(n)
    }
    fn wake(&mut self, agent: AgentId, at: Time) {
        self.wakes.push((agent, at));
    }
    fn wake_by(&mut self, agent: AgentId, at: Time) {
        self.deadlines.push((agent, at));
    }
    fn notify(&mut self) {
        self.notified = true;
    }
    fn notify_key(&mut self, key: u64) {
        self.keys.push(key);
    }
    fn tracing(&self) -> bool {
        self.trace.is_some()
    }
    fn trace(&mut self, ev: TraceEvent) {
        let at = self.now + self.charged;
        if let Some(t) = self.trace.as_mut() {
            t.take(at, ev);
        }
    }
}

impl Schedule {
    fn schedule(&mut self, agent: AgentId, at: Time) {
        let a = &mut self.agents[agent];
        a.deadline = false;
        match a.state {
            AgentState::Scheduled if a.at <= at => {}
            AgentState::Done => {}
            _ => {
                if a.state == AgentState::Spinning {
                    match a.take_key() {
                        Some(k) => {
                            if let Some(v) = self.keyed.get_mut(&k) {
                                v.retain(|&s| s != agent);
                                if v.is_empty() {
                                    self.keyed.remove(&k);
                                }
                            }
                        }
                        None => self.spinners.retain(|&s| s != agent),
                    }
                }
                let at = self.make_runnable(agent, at);
                self.queue.push(at, agent);
            }
        }
    }

    /// Mark `agent` runnable at `at` (not before its own clock), with no spin deadline: the
    /// time of the queue entry it needs.
    fn make_runnable(&mut self, agent: AgentId, at: Time) -> Time {
        let a = &mut self.agents[agent];
        a.deadline = false;
        a.at = at.max(a.clock);
        a.state = AgentState::Scheduled;
        a.at
    }

    /// While the earliest agent steps, prefetch for the two agents most likely to run after
    /// it: the second- and third-earliest queue entries ([`EventQueue::next_two`]). With
    /// thousands of agents nearly every step is another agent's, whose state is cold; hinted
    /// one and two steps ahead, it arrives while other steps run
    /// (at 1024 CPUs the guesses are right for 97 % and 92 % of steps; hints three steps ahead,
    /// right for 74 %, were slower). A stale entry, or an agent the step wakes earlier, only
    /// wastes a prefetch. With few agents everything is in the host's cache already, and the
    /// hints only cost time.
    #[inline]
    fn prefetch_next<M: Model>(&self, model: &M) {
        if self.agents.len() < PREFETCH_MIN_AGENTS {
            return;
        }
        let Some((next, after)) = self.queue.next_two() else {
            return;
        };
        prefetch(&self.agents[after]);
        model.prefetch(after, Lead::Two);
        model.prefetch(next, Lead::One);
    }

    /// `agent`, whose step ended at `end`, runs on: what `schedule(agent, end)` would push,
    /// put in the step's own entry (one sift-down instead of a pop and a push).
    #[inline]
    fn run_on(&mut self, agent: AgentId, end: Time) {
        let at = self.make_runnable(agent, end);
        self.queue.replace_top(at, agent);
    }

    /// After `agent`'s step from `now` to `end`: park or requeue it as the step said, then
    /// wake whom the step woke and notified (`env`).
    fn after_step(&mut self, agent: AgentId, park: Park, now: Time, end: Time, env: &StepEnv) {
        self.agents[agent].state = AgentState::Halted; // placeholder until decided below
        match park {
            Park::Run => self.run_on(agent, end),
            Park::Halt => {
                self.queue.pop();
            }
            Park::Spin => {
                self.queue.pop();
                self.agents[agent].state = AgentState::Spinning;
                self.spinners.push(agent);
            }
            Park::SpinOn(k) => {
                self.queue.pop();
                let a = &mut self.agents[agent];
                a.state = AgentState::Spinning;
                (a.keyed, a.key) = (true, k);
                self.keyed.entry(k).or_default().push(agent);
            }
            Park::Done => {
                self.queue.pop();
                self.agents[agent].state = AgentState::Done;
            }
        }
        for &(a, at) in &env.wakes {
            self.schedule(a, at.max(now));
        }
        for &(a, at) in &env.deadlines {
            let at = at.max(now);
            let s = &mut self.agents[a];
            if s.state == AgentState::Spinning {
                if s.spin_deadline().map_or(true, |d| at < d) {
                    (s.deadline, s.at) = (true, at);
                    self.queue.push(at, a);
                }
            } else {
                self.schedule(a, at);
            }
        }
        if env.notified {
            let mut all = std::mem::take(&mut self.spinners);
            for (_, v) in std::mem::take(&mut self.keyed) {
                all.extend(v);
            }
            all.sort_unstable();
            for s in all {
                if s != agent {
                    self.release(s, end);
                } else {
                    // The notifier itself spins on, on anything.
                    self.agents[s].keyed = false;
                    self.spinners.push(s);
                }
            }
        }
        for &k in &env.keys {
            if let Some(mut v) = self.keyed.remove(&k) {
                v.sort_unstable();
                for s in v {
                    if s != agent {
                        self.release(s, end);
                    } else {
                        // The notifier itself spins on, on the same key.
                        self.keyed.entry(k).or_default().push(s);
                    }
                }
            }
        }
    }

    /// A spinner already taken out of the spinner sets: runnable after the step that notified
    /// it, which ended at `end`.
    fn release(&mut self, s: AgentId, end: Time) {
        self.agents[s].keyed = false;
        let at = self.make_runnable(s, end);
        self.queue.push(at, s);
    }
}

impl TimedDriver {
    /// A driver for `agents` agents, all runnable at time zero.
    pub fn new(agents: usize, seed: u64, stream: u64) -> Self {
        let mut queue = EventQueue::new(agents);
        for a in 0..agents {
            queue.push(Time::ZERO, a);
        }
        TimedDriver {
            sched: Schedule {
                agents: vec![
                    Agent {
                        clock: Time::ZERO,
                        at: Time::ZERO,
                        key: 0,
                        state: AgentState::Scheduled,
                        deadline: false,
                        keyed: false,
                    };
                    agents
                ],
                queue,
                spinners: Vec::new(),
                keyed: HashMap::default(),
                steps: 0,
            },
            rng: DetRng::new(seed, stream),
            trace: None,
        }
    }

    /// Record trace events from now on.
    pub fn enable_trace(&mut self) {
        self.trace = Some(TraceSink::Record(Vec::new()));
    }

    /// Record only the trace events of a window of simulated time ([`WindowSink`]).
    pub fn enable_trace_window(&mut self, start: WindowStart, duration: Time) {
        self.trace = Some(TraceSink::Window(Box::new(WindowSink::new(
            start, duration,
        ))));
    }

    /// The end of the trace window, once its start is known (a run can stop there).
    pub fn trace_window_end(&self) -> Option<Time> {
        match &self.trace {
            Some(TraceSink::Window(w)) => w.end(),
            _ => None,
        }
    }

    /// The trace window's events, every slice closed ([`WindowSink::finish`]).
    pub fn take_trace_window(&mut self, run_end: Time) -> Vec<Stamped> {
        match self.trace.take() {
            Some(TraceSink::Window(w)) => w.finish(run_end),
            other => {
                self.trace = other;
                Vec::new()
            }
        }
    }

    /// Recorded trace events (empty unless [`TimedDriver::enable_trace`] was called).
    pub fn take_trace(&mut self) -> Vec<Stamped> {
        match self.trace.take() {
            Some(TraceSink::Record(v)) => v,
            other => {
                self.trace = other;
                Vec::new()
            }
        }
    }

    /// Profile where agent time goes after `from` (instead of recording a timeline): see
    /// [`crate::profile`].
    pub fn enable_profile(&mut self, from: Time) {
        self.trace = Some(TraceSink::Profile(Profiler::new(
            self.sched.agents.len(),
            from,
        )));
    }

    /// The profile up to `end` (`None` unless [`TimedDriver::enable_profile`] was called).
    pub fn take_profile(&mut self, end: Time) -> Option<Profile> {
        match self.trace.take() {
            Some(TraceSink::Profile(p)) => Some(p.finish(end)),
            other => {
                self.trace = other;
                None
            }
        }
    }

    /// Clock of an agent.
    pub fn clock(&self, agent: AgentId) -> Time {
        self.sched.agents[agent].clock
    }

    /// Run until the model finishes, a limit is hit, or an invariant breaks.
    pub fn run<M: Model>(&mut self, model: &mut M, limits: Limits) -> RunStats {
        let TimedDriver { sched, rng, trace } = self;
        let mut env = StepEnv {
            now: Time::ZERO,
            charged: Time::ZERO,
            rng,
            wakes: Vec::new(),
            deadlines: Vec::new(),
            notified: false,
            keys: Vec::new(),
            trace: trace.as_mut(),
        };
        let prefetching = sched.agents.len() >= PREFETCH_MIN_AGENTS;
        let mut latest = Time::ZERO;
        let mut watch = Stopwatch::start();
        let stop = loop {
            if model.finished() {
                break Stop::Finished;
            }
            if sched.steps >= limits.max_steps {
                break Stop::StepLimit;
            }
            // The earliest entry stays in the queue while its step runs: an agent that goes on
            // running replaces it in place (one sift-down instead of a pop and a push).
            let Some((t, agent)) = sched.queue.peek() else {
                break Stop::Deadlock;
            };
            let a = sched.agents[agent];
            if a.spin_deadline() == Some(t) {
                // A spinner's deadline: it stops waiting for notifications and runs now.
                sched.queue.pop();
                sched.schedule(agent, t);
                continue;
            }
            if !a.is_scheduled_at(t) {
                sched.queue.pop();
                continue; // superseded entry
            }
            if t > limits.max_time {
                // Left in the queue: a later `run` with a later limit resumes here.
                break Stop::TimeLimit;
            }
            let now = t.max(a.clock);
            watch.lap(Phase::Pick);
            if prefetching {
                sched.prefetch_next(model);
            }
            watch.lap(Phase::Prefetch);
            let action = model.timed_action(agent, now);
            env.reset(now);
            let outcome = model.apply(action, &mut env);
            watch.lap(Phase::Step);
            sched.steps += 1;
            let end = now + env.charged;
            sched.agents[agent].clock = end;
            latest = latest.max(end);
            if let Some(v) = outcome.violation {
                sched.queue.pop();
                break Stop::Violation(v);
            }
            if matches!(outcome.park, Park::Run) && env.is_quiet(sched) {
                // Most steps: the agent runs on and nobody else is woken or notified. What
                // `after_step` would do, without its call (30 instructions a step).
                sched.run_on(agent, end);
            } else {
                sched.after_step(agent, outcome.park, now, end, &env);
            }
            watch.lap(Phase::Requeue);
            watch.step();
        };
        RunStats {
            stop,
            steps: sched.steps,
            end: latest,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Outcome, StepKind};

    /// Agent 0 busy-waits on key 7 with a deadline at 100; agent 1 stores to key 7 at
    /// `release` (or never).
    #[derive(Clone, Debug, PartialEq, Eq, Hash)]
    struct Spin {
        release: Option<u64>,
        flag: bool,
        ran_at: Vec<u64>,
    }

    impl Model for Spin {
        type Action = usize;
        fn agents(&self) -> usize {
            2
        }
        fn enabled(&self, out: &mut Vec<usize>) {
            out.extend([0, 1]);
        }
        fn timed_action(&self, agent: usize, _: Time) -> usize {
            agent
        }
        fn agent_of(&self, a: usize) -> usize {
            a
        }
        fn apply<E: Env>(&mut self, a: usize, env: &mut E) -> Outcome {
            let now = env.now().0;
            crate::phases::classify(|| if a == 0 { "spinner" } else { "releaser" });
            let park = if a == 0 {
                self.ran_at.push(now);
                if self.flag {
                    Park::Done
                } else {
                    env.wake_by(0, Time(100));
                    Park::SpinOn(7)
                }
            } else {
                match self.release {
                    Some(t) if now < t => {
                        env.charge(Time(t - now));
                        Park::Run
                    }
                    Some(_) => {
                        self.flag = true;
                        env.notify_key(7);
                        Park::Done
                    }
                    None => Park::Done,
                }
            };
            Outcome {
                park,
                kind: StepKind::Shared,
                violation: None,
            }
        }
        fn describe(&self, a: usize) -> String {
            format!("{a}")
        }
        fn agent_name(&self, a: usize) -> String {
            format!("a{a}")
        }
        fn finished(&self) -> bool {
            false
        }
    }

    fn run(release: Option<u64>) -> Vec<u64> {
        let mut m = Spin {
            release,
            flag: false,
            ran_at: Vec::new(),
        };
        let mut d = TimedDriver::new(2, 1, 0);
        d.run(
            &mut m,
            Limits {
                max_time: Time(1000),
                max_steps: 100,
            },
        );
        m.ran_at
    }

    #[test]
    fn a_spinner_with_a_deadline_still_wakes_on_its_notification() {
        // Notified at 10: runs at 10, not at the deadline.
        assert_eq!(run(Some(10)), vec![0, 10]);
        // Never notified: runs at its deadline (and re-arms it, which stays in the past).
        assert_eq!(&run(None)[..2], &[0, 100]);
    }

    /// Built with `phase-timing`, the driver's loop counts every step it runs, once.
    #[cfg(feature = "phase-timing")]
    #[test]
    fn phase_timing_counts_the_steps_the_driver_ran() {
        crate::phases::take();
        let mut m = Spin {
            release: Some(10),
            flag: false,
            ran_at: Vec::new(),
        };
        let stats = TimedDriver::new(2, 1, 0).run(
            &mut m,
            Limits {
                max_time: Time(1000),
                max_steps: 100,
            },
        );
        let p = crate::phases::take().expect("built with phase-timing");
        assert!(stats.steps > 0);
        assert_eq!(p.steps, stats.steps);
        // The steps' own phase took time (a lap in the wrong phase would leave it empty).
        assert!(p.cycles[crate::phases::Phase::Step as usize] > 0);
        // Every step is in the class its `apply` gave, once.
        let classes: Vec<_> = p.classes.iter().map(|c| c.class).collect();
        assert_eq!(classes, ["spinner", "releaser"]);
        assert_eq!(p.classes.iter().map(|c| c.steps).sum::<u64>(), stats.steps);
    }
}

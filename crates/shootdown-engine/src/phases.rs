//! Where a timed run's host time goes, phase by phase of the driver's loop (feature
//! `phase-timing`; without it every call here compiles to nothing).
//!
//! `perf` tells which functions are hot, but at thousands of CPUs a step's time is mostly
//! waiting for memory, and sampling without hardware counters (a VM's `cpu-clock`) attributes
//! that wait to whatever instruction comes next. These counters read the time-stamp counter
//! at the loop's phase boundaries instead: the queue and the agent's state before the step,
//! the prefetch hints, the step itself (`Model::timed_action` + `Model::apply`), and the
//! re-queueing after it. They cost about 25 cycles per read, so their totals are for
//! comparing runs built the same way, not for absolute figures.
//!
//! Counts live in a thread-local: a run is one thread, and sweeps run points on several.

/// The phases of one iteration of the timed driver's loop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// From the end of the previous step to the prefetch: the queue's earliest entry and
    /// the agent's state.
    Pick = 0,
    /// The prefetch hints for the next two agents ([`crate::Model::prefetch`]).
    Prefetch = 1,
    /// The step: `Model::timed_action` and `Model::apply`.
    Step = 2,
    /// Re-queueing the agent and waking whom the step woke.
    Requeue = 3,
}

impl Phase {
    pub const ALL: [Phase; 4] = [Phase::Pick, Phase::Prefetch, Phase::Step, Phase::Requeue];

    pub fn name(self) -> &'static str {
        match self {
            Phase::Pick => "pick (queue, agent state)",
            Phase::Prefetch => "prefetch hints",
            Phase::Step => "step (timed_action + apply)",
            Phase::Requeue => "requeue and wake-ups",
        }
    }
}

/// Time-stamp-counter cycles per phase and the steps they cover, summed over the runs on
/// this thread since the last [`take`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PhaseCycles {
    pub cycles: [u64; 4],
    pub steps: u64,
}

impl PhaseCycles {
    /// Cycles per step of `phase`.
    pub fn per_step(&self, phase: Phase) -> f64 {
        self.cycles[phase as usize] as f64 / self.steps.max(1) as f64
    }
}

#[cfg(feature = "phase-timing")]
mod imp {
    use super::{Phase, PhaseCycles};
    use std::cell::Cell;

    thread_local! {
        static TOTALS: Cell<PhaseCycles> = const { Cell::new(PhaseCycles { cycles: [0; 4], steps: 0 }) };
    }

    #[inline(always)]
    pub fn now() -> u64 {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `rdtsc` has no preconditions.
        unsafe {
            std::arch::x86_64::_rdtsc()
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            use std::sync::OnceLock;
            static START: OnceLock<std::time::Instant> = OnceLock::new();
            START
                .get_or_init(std::time::Instant::now)
                .elapsed()
                .as_nanos() as u64
        }
    }

    /// The counter at the start of the loop and at each boundary passed so far.
    pub struct Stopwatch {
        last: u64,
        local: PhaseCycles,
    }

    impl Stopwatch {
        pub fn start() -> Self {
            Stopwatch {
                last: now(),
                local: PhaseCycles::default(),
            }
        }
        /// `phase` ends now.
        #[inline(always)]
        pub fn lap(&mut self, phase: Phase) {
            let t = now();
            self.local.cycles[phase as usize] += t.wrapping_sub(self.last);
            self.last = t;
        }
        #[inline(always)]
        pub fn step(&mut self) {
            self.local.steps += 1;
        }
    }

    impl Drop for Stopwatch {
        fn drop(&mut self) {
            TOTALS.with(|t| {
                let mut s = t.get();
                for (a, b) in s.cycles.iter_mut().zip(self.local.cycles) {
                    *a += b;
                }
                s.steps += self.local.steps;
                t.set(s);
            });
        }
    }

    pub fn take() -> Option<PhaseCycles> {
        Some(TOTALS.with(|t| t.take()))
    }
}

#[cfg(not(feature = "phase-timing"))]
mod imp {
    use super::{Phase, PhaseCycles};

    pub struct Stopwatch;

    impl Stopwatch {
        #[inline(always)]
        pub fn start() -> Self {
            Stopwatch
        }
        #[inline(always)]
        pub fn lap(&mut self, _: Phase) {}
        #[inline(always)]
        pub fn step(&mut self) {}
    }

    pub fn take() -> Option<PhaseCycles> {
        None
    }
}

pub(crate) use imp::Stopwatch;

/// The cycles counted on this thread since the last call, and reset them; `None` unless the
/// engine was built with the `phase-timing` feature.
pub fn take() -> Option<PhaseCycles> {
    imp::take()
}

#[cfg(all(test, feature = "phase-timing"))]
mod tests {
    use super::*;

    #[test]
    fn laps_add_up_per_phase_and_take_resets() {
        take();
        {
            let mut w = Stopwatch::start();
            for _ in 0..3 {
                w.lap(Phase::Pick);
                w.lap(Phase::Step);
                w.step();
            }
        }
        let t = take().unwrap();
        assert_eq!(t.steps, 3);
        assert!(t.cycles[Phase::Step as usize] > 0 || t.cycles[Phase::Pick as usize] > 0);
        assert_eq!(t.cycles[Phase::Prefetch as usize], 0);
        assert_eq!(take().unwrap(), PhaseCycles::default());
    }
}

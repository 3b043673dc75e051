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
//! The step's own cycles can be split further by what the model says each step is
//! ([`classify`]: for the Linux machine, the kernel function on top of the CPU's stack), so
//! that a step that costs more at scale shows which kind of step it is.
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

/// What the steps the model did not [`classify`] are counted as.
pub const UNCLASSIFIED: &str = "(unclassified)";

/// The [`Phase::Step`] cycles of the steps of one class ([`classify`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClassCycles {
    pub class: &'static str,
    pub steps: u64,
    pub cycles: u64,
}

/// Time-stamp-counter cycles per phase and the steps they cover, summed over the runs on
/// this thread since the last [`take`]; and the step phase's cycles by class, in the order
/// the classes were first met.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PhaseCycles {
    pub cycles: [u64; 4],
    pub steps: u64,
    pub classes: Vec<ClassCycles>,
}

impl PhaseCycles {
    /// Cycles per step of `phase`.
    pub fn per_step(&self, phase: Phase) -> f64 {
        self.cycles[phase as usize] as f64 / self.steps.max(1) as f64
    }

    /// Count `steps` steps of `class` that took `cycles`.
    #[cfg(feature = "phase-timing")]
    fn add_class(&mut self, class: &'static str, steps: u64, cycles: u64) {
        match self.classes.iter_mut().find(|c| c.class == class) {
            Some(c) => {
                c.steps += steps;
                c.cycles += cycles;
            }
            None => self.classes.push(ClassCycles {
                class,
                steps,
                cycles,
            }),
        }
    }

    /// Add `other`'s counts to these.
    #[cfg(feature = "phase-timing")]
    fn merge(&mut self, other: &PhaseCycles) {
        for (a, b) in self.cycles.iter_mut().zip(other.cycles) {
            *a += b;
        }
        self.steps += other.steps;
        for c in &other.classes {
            self.add_class(c.class, c.steps, c.cycles);
        }
    }
}

#[cfg(feature = "phase-timing")]
mod imp {
    use super::{Phase, PhaseCycles, UNCLASSIFIED};
    use std::cell::{Cell, RefCell};

    thread_local! {
        static TOTALS: RefCell<PhaseCycles> = const { RefCell::new(PhaseCycles { cycles: [0; 4], steps: 0, classes: Vec::new() }) };
        /// The class of the step running now, if the model gave one.
        static CLASS: Cell<Option<&'static str>> = const { Cell::new(None) };
    }

    #[inline(always)]
    pub fn classify(f: impl FnOnce() -> &'static str) {
        CLASS.with(|c| c.set(Some(f())));
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
        /// `phase` ends now. A step's lap also goes to its class; that bookkeeping is left
        /// out of every phase.
        #[inline(always)]
        pub fn lap(&mut self, phase: Phase) {
            let t = now();
            let d = t.wrapping_sub(self.last);
            self.local.cycles[phase as usize] += d;
            self.last = t;
            if phase == Phase::Step {
                let class = CLASS.with(|c| c.take()).unwrap_or(UNCLASSIFIED);
                self.local.add_class(class, 1, d);
                self.last = now();
            }
        }
        #[inline(always)]
        pub fn step(&mut self) {
            self.local.steps += 1;
        }
    }

    impl Drop for Stopwatch {
        fn drop(&mut self) {
            TOTALS.with(|t| t.borrow_mut().merge(&self.local));
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

    #[inline(always)]
    pub fn classify(_: impl FnOnce() -> &'static str) {}

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

/// The step running now is of class `f()` (a model calls this from its step). Without the
/// `phase-timing` feature `f` is never called, so a shipped build pays nothing for it.
#[inline(always)]
pub fn classify(f: impl FnOnce() -> &'static str) {
    imp::classify(f)
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

    #[test]
    fn a_step_lap_goes_to_the_class_its_step_gave_once() {
        take();
        {
            let mut w = Stopwatch::start();
            classify(|| "a");
            w.lap(Phase::Step);
            classify(|| "b");
            w.lap(Phase::Pick);
            w.lap(Phase::Step);
            w.lap(Phase::Step);
            classify(|| "a");
            w.lap(Phase::Step);
        }
        let t = take().unwrap();
        let steps: Vec<_> = t.classes.iter().map(|c| (c.class, c.steps)).collect();
        assert_eq!(steps, [("a", 2), ("b", 1), (UNCLASSIFIED, 1)]);
        let classed: u64 = t.classes.iter().map(|c| c.cycles).sum();
        assert_eq!(classed, t.cycles[Phase::Step as usize]);
    }
}

#[cfg(all(test, not(feature = "phase-timing")))]
mod tests {
    use super::*;

    #[test]
    fn without_the_feature_a_class_is_never_computed() {
        classify(|| panic!("computed a class"));
        assert_eq!(take(), None);
    }
}

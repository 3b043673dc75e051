//! The one narrow trait where protocol models and drivers meet.
//!
//! A [`Model`] is a state (cloneable and hashable, so the explorer can store and compare it) plus
//! *actions*: atomic steps of its agents — one shared-memory access, one IPI send or receipt, one
//! TLB fill or flush, one lock acquire, one coarse piece of local work with a cost. The timed
//! driver asks the model which action an agent takes when its clock comes up
//! ([`Model::timed_action`]); the explorer asks for every enabled action ([`Model::enabled`]).
//! Both then call the same [`Model::apply`].

use crate::intern::Interner;
use crate::time::Time;
use crate::trace::TraceEvent;
use std::fmt::Debug;
use std::hash::Hash;

/// Index of an agent (a CPU, later a vCPU or host thread).
pub type AgentId = usize;

/// A broken invariant, named as in `docs/design/kernel-model.md` / `docs/bugs/CATALOG.md`
/// (e.g. `INV-STALE`, `INV-PTFREE`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Violation {
    pub invariant: &'static str,
    pub detail: String,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.invariant, self.detail)
    }
}

/// What an agent does after a step, for the timed driver.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Park {
    /// Keep running: schedule the agent again when this step's cost has elapsed.
    Run,
    /// Sleep (HLT / idle / blocked task with nothing else to run) until someone calls
    /// [`Env::wake`] for it.
    Halt,
    /// Busy-wait on shared memory: the step changed nothing; run it again after the next
    /// [`Env::notify`] (or an interrupt wake-up).
    Spin,
    /// Busy-wait on one location: like [`Park::Spin`], but only [`Env::notify_key`] with this
    /// key (or a plain [`Env::notify`]) makes the agent retry.
    SpinOn(u64),
    /// The agent has nothing more to do, ever.
    Done,
}

/// What kind of step ran; the explorer uses it for partial-order reduction (a purely local step
/// commutes with every other agent's steps).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StepKind {
    /// Touches only the agent's own private state.
    Local,
    /// Reads or writes state other agents can observe.
    Shared,
}

/// Result of [`Model::apply`].
#[derive(Clone, Debug)]
pub struct Outcome {
    pub park: Park,
    pub kind: StepKind,
    pub violation: Option<Violation>,
}

impl Outcome {
    pub fn run() -> Self {
        Outcome {
            park: Park::Run,
            kind: StepKind::Shared,
            violation: None,
        }
    }
}

/// The driver seen from inside a step. Under the explorer, costs are ignored, randomness is
/// fixed (always 0) and wake-ups are irrelevant (every enabled action is considered anyway).
pub trait Env {
    /// True under the timed driver.
    fn timed(&self) -> bool;
    /// Current simulated time of the running agent (start of this step).
    fn now(&self) -> Time;
    /// Add cost to the running step.
    fn charge(&mut self, t: Time);
    /// Cost charged so far in the running step: `now() + elapsed()` is the moment the step has
    /// reached (when a contended resource such as a cache line is requested).
    fn elapsed(&self) -> Time {
        Time::ZERO
    }
    /// A deterministic random number in `0..n`.
    fn random(&mut self, n: u64) -> u64;
    /// Make sure `agent` runs no later than `at` (IPI arrival, wake-up of a sleeping task).
    fn wake(&mut self, agent: AgentId, at: Time);
    /// A deadline for a busy-waiting agent: it runs at `at` at the latest, but still as soon as a
    /// notification it waits for comes (a spinner stays a spinner; `wake` would make it sleep
    /// until `at`). For anything but a spinning agent this is `wake`. Used for time slices that
    /// end while a vCPU busy-waits.
    fn wake_by(&mut self, agent: AgentId, at: Time) {
        self.wake(agent, at)
    }
    /// Shared state that spinning agents may be waiting on has changed.
    fn notify(&mut self);
    /// The location identified by `key` changed: agents parked with `Park::SpinOn(key)` retry.
    fn notify_key(&mut self, key: u64);
    /// Whether trace events are being recorded (so steps can skip formatting).
    fn tracing(&self) -> bool;
    /// Record a trace event at the current step's time (+ the cost charged so far).
    fn trace(&mut self, ev: TraceEvent);
    /// The step fixed an order over these CPUs by their index (a `for_each_cpu` walk whose
    /// visits are later steps). The explorer's symmetry reduction needs to know: renaming
    /// CPUs does not rename the index order (see the checker's `reduce.rs`).
    fn cpu_order(&mut self, _cpus: &[usize]) {}
}

/// A protocol model: see the module documentation.
pub trait Model: Clone + Eq + Hash + Debug {
    type Action: Copy + Eq + Hash + Debug + Ord;

    /// Number of agents (fixed for a run).
    fn agents(&self) -> usize;
    /// Every action enabled in this state, in a deterministic order (explorer).
    fn enabled(&self, out: &mut Vec<Self::Action>);
    /// The action `agent` performs when the timed driver runs it at time `now`.
    fn timed_action(&self, agent: AgentId, now: Time) -> Self::Action;
    /// Which agent performs `a` (for symmetry reduction and for naming the actor).
    fn agent_of(&self, a: Self::Action) -> AgentId;
    /// Execute one atomic action.
    fn apply<E: Env>(&mut self, a: Self::Action, env: &mut E) -> Outcome;
    /// Describe `a`, as it would execute from this state, in kernel terms
    /// ("switch_mm_irqs_off: set bit in mm_cpumask(mm1)").
    fn describe(&self, a: Self::Action) -> String;
    /// Name of an agent ("cpu1").
    fn agent_name(&self, agent: AgentId) -> String;
    /// The workload is complete (timed driver stops; explorer treats it as a final state).
    fn finished(&self) -> bool;
    /// Invariants that must hold in every reachable state (beyond those checked in steps).
    fn check_state(&self) -> Option<Violation> {
        None
    }
    /// The timed driver's hint that `agent` is likely to run soon: start bringing what its
    /// step will read into the host's cache ([`prefetch`]). It must not change the state (it
    /// only reads), so a wrong hint costs time, never a result. The hints for an agent come
    /// one step apart, `Lead::Two` first: the second may read what the first fetched and
    /// fetch what that leads to (a CPU, then its current task).
    fn prefetch(&self, _agent: AgentId, _lead: Lead) {}
    /// Point the state's components at the interner's copies of their values
    /// ([`Interner`]): the explorer calls it on each state it stores. It changes no value,
    /// digest or fingerprint; the default does nothing.
    fn intern(&mut self, _interner: &Interner) {}
}

/// How many steps ahead a [`Model::prefetch`] hint is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lead {
    One,
    Two,
}

/// Start fetching the cache line at `p` into the host's caches (x86 `PREFETCHT0`; nothing
/// elsewhere). Prefetching never faults, whatever the address.
#[inline(always)]
pub fn prefetch<T>(p: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is a hint; it reads nothing the program sees and cannot fault.
    unsafe {
        std::arch::x86_64::_mm_prefetch(p.cast::<i8>(), std::arch::x86_64::_MM_HINT_T0)
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

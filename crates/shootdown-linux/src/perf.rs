//! Performance-only state: costs, counters, clocks of interruptible work, trace and label
//! bookkeeping. It lives in `Machine::perf` (an `Unhashed`), so it never distinguishes two
//! states for the explorer. Also the machine's own uses of it: its blank at time zero, its
//! counters, and the violation a step reports.

use crate::counters::Counters;
use crate::host::HostPerf;
use crate::machine::Machine;
use shootdown_engine::{Time, Violation};
use shootdown_hw::{CostProfile, CpuId, Topology};
use std::sync::Arc;

/// The run's cost profile: one `Arc` that every state of a run points at.
///
/// Why not a bare `Arc`: copying a state into another that already points at the same profile
/// must leave the reference count alone. `Arc`'s own `clone_from` adds a handle and drops one,
/// two atomic writes to the one cache line every explorer worker's copies then share, on every
/// transition.
#[derive(Debug)]
pub struct Profile(pub Arc<CostProfile>);

impl Clone for Profile {
    fn clone(&self) -> Self {
        Profile(Arc::clone(&self.0))
    }
    fn clone_from(&mut self, source: &Self) {
        if !Arc::ptr_eq(&self.0, &source.0) {
            self.0 = Arc::clone(&source.0);
        }
    }
}

impl std::ops::Deref for Profile {
    type Target = CostProfile;
    fn deref(&self) -> &CostProfile {
        &self.0
    }
}

/// Performance-only state: never distinguishes two states for the explorer.
#[derive(Debug)]
pub struct Perf {
    pub profile: Profile,
    pub lines: shootdown_hw::cacheline::LineDirectory,
    pub counters: Counters,
    /// Per CPU (or vCPU): what its timed steps read and write, one cache line each.
    pub cpu: Vec<CpuPerf>,
    /// Per CPU, on machines large enough for the timed driver's prefetch (else empty): where
    /// its top frame was when its last step ended ([`FrameHint`]).
    pub frames: Vec<FrameHint>,
    /// Per CPU: the trace flow ids of the CALL_FUNCTION IPIs pending on it (several senders'
    /// IPIs coalesce into one interrupt, which ends all their arrows). Tracing only.
    pub ipi_flows: Vec<Vec<u64>>,
    /// The next trace flow id: every IPI gets its own arrow.
    pub next_flow_id: u64,
    /// Workload events at or after `measure_from` count towards the metric.
    pub measure_from: Time,
    pub events_measured: u64,
    pub first_event_at: Option<Time>,
    pub last_event_at: Time,
    /// Per task: times of its `Mark` ops.
    pub marks: Vec<Vec<Time>>,
    /// Per task and per CPU: EEVDF's entities and run queues (`sched = "eevdf"`, `fair.rs`),
    /// grown on first use.
    pub se: Vec<crate::fair::SchedEntity>,
    pub fair_rq: Vec<crate::fair::FairRq>,
    /// Host threads' `Mark` ops: (thread, time).
    pub host_marks: Vec<(usize, Time)>,
    /// Host threads not yet exited.
    pub host_threads_alive: usize,
    /// User tasks not yet exited (kept in step with task states so `finished` is O(1)).
    pub user_tasks_alive: usize,
    /// Translation uses the oracle checked.
    pub uses_checked: u64,
    /// A violation detected by the current step.
    pub violation: Option<Violation>,
    /// Record step descriptions (explorer counterexample replay only).
    pub labels_on: bool,
    pub labels: Vec<String>,
    /// The running step's own text, shown when it produced no more specific label
    /// ([`Machine::summary`]).
    pub summary: Option<String>,
    /// Host scheduling timers (machines with a host only).
    pub host: HostPerf,
    /// The running step entered a shadow-paging `mmu_lock` section while another agent held
    /// or waited for the lock ([`Machine::shadow_mmu_lock`]): the explorer's probe of whether
    /// a vCPU's step must wait for the lock.
    pub shadow_lock_wanted: bool,
    /// Per core: which of its hardware threads execute after their last step — running a
    /// task or handler, or parked for interruptible work; not idle, not busy-waiting (bit `t`
    /// for thread `t`, smt.rs). One byte per core, so that a step learns whether its siblings
    /// execute without reading their state.
    pub core_executing: Vec<u8>,
    /// How much the running step's core-bound costs stretch, in thousandths: set at the start
    /// of each timed step from the SMT siblings' state (smt.rs).
    pub core_scale_permille: u32,
    /// A stored explorer state's blank, whose arrays stand for its own ([`Perf::stow`]).
    pub stowed: Option<Arc<Perf>>,
}

/// `Perf`'s fields, each declared once in one of two lists: `arrays`, sized by the machine and
/// read only by timed steps, which a stored explorer state leaves to the run's blank
/// ([`Perf::stow`]); `scalars`, which every state keeps (whether the run is finished, the
/// step's violation and labels). `Clone` is fieldwise, `clone_from` keeps the destination's
/// allocations (as `clone_by_fields!`), and a copy of a stowed state has the blank's arrays.
/// The destructuring in `clone` is exhaustive: a field in neither list does not compile.
macro_rules! perf_parts {
    (arrays { $($a:ident),* $(,)? } scalars { $($s:ident),* $(,)? }) => {
        impl Clone for Perf {
            fn clone(&self) -> Perf {
                let Perf { $($a: _,)* $($s,)* stowed: _ } = self;
                let arrays = self.stowed.as_deref().unwrap_or(self);
                Perf { $($a: arrays.$a.clone(),)* $($s: $s.clone(),)* stowed: None }
            }
            fn clone_from(&mut self, source: &Perf) {
                self.clone_arrays_from(source.stowed.as_deref().unwrap_or(source));
                $(self.$s.clone_from(&source.$s);)*
                self.stowed = None;
            }
        }

        impl Perf {
            /// The stored form of this performance state: its arrays freed and `blank`'s
            /// standing for them, its scalars kept.
            ///
            /// Why the explorer may: nothing but timed steps reads the arrays (costs, clocks,
            /// cache-line owners, counters), and the explorer never takes a timed step; what it
            /// reads — whether tasks are left, a step's violation — is a scalar. A frontier
            /// state then costs no copy of them (1.6 KB of a `pv_tlb_flush_3vcpu` state), and
            /// the copy a successor is built in takes the blank's, as it would a parent's.
            pub fn stow(&mut self, blank: Arc<Perf>) {
                debug_assert!(blank.stowed.is_none(), "a blank is a whole performance state");
                $(self.$a = Default::default();)*
                self.stowed = Some(blank);
            }

            /// Whole again, with the blank's arrays (a stowed state about to take a step).
            #[cold]
            pub fn unstow(&mut self) {
                if let Some(blank) = self.stowed.take() {
                    self.clone_arrays_from(&blank);
                }
            }

            /// The arrays of `from`, into this state's allocations.
            fn clone_arrays_from(&mut self, from: &Perf) {
                $(self.$a.clone_from(&from.$a);)*
            }
        }
    };
}

perf_parts!(arrays {
    lines,
    counters,
    cpu,
    frames,
    ipi_flows,
    marks,
    se,
    fair_rq,
    host_marks,
    host,
    core_executing,
} scalars {
    profile,
    next_flow_id,
    measure_from,
    events_measured,
    first_event_at,
    last_event_at,
    host_threads_alive,
    user_tasks_alive,
    uses_checked,
    violation,
    shadow_lock_wanted,
    labels_on,
    labels,
    summary,
    core_scale_permille,
});

/// A CPU's performance state. A timed step of a CPU reads or writes most of these, so they
/// share one cache line (an array per field cost a miss per field at thousands of CPUs).
#[derive(Clone, Copy, Debug, Default)]
#[repr(align(64))]
pub struct CpuPerf {
    /// When its pending IPI arrives.
    pub ipi_arrival: Time,
    /// When a vCPU's pending kick IPI arrives.
    pub kick_arrival: Time,
    /// When its current task started its time slice.
    pub slice_start: Time,
    /// Interruptible work in progress ([`Machine::charge_interruptible`]).
    pub busy: Busy,
    /// Whether its timeline has opened the running task's slices yet.
    pub trace_started: bool,
    /// A PV spinlock waiter halted in `pv_wait`, until the unlocker's kick (`spinlock.rs`).
    pub pv_waiting: bool,
    /// When this PV spinlock waiter began its current spin, and whether as the queue head.
    pub pv_since: Option<(Time, bool)>,
    /// When perf's next sampling NMI is due (`perf_sample_hz`, `nmi.rs`).
    pub next_nmi: Time,
    /// LATR: when this CPU's next scheduler tick drains saved flushes (`latr.rs`).
    pub next_tick: Time,
    /// The page the CPU's task touched last: the user stack a perf NMI reads.
    pub last_user_vpn: Option<shootdown_hw::pagetable::Vpn>,
}

/// The other CPU whose state a frame's next step reads ([`FrameHint`]), in one word.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerHint(u32);

/// Who a [`PeerHint`] names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Peer {
    /// A target of this CPU's `smp_call_function_many_cond` walk: its `cpu_tlbstate`, its
    /// `call_single_queue`, and this CPU's csd for it.
    Target(CpuId),
    /// The sender of the csd this CPU's CALL_FUNCTION handler runs next: its `flush_tlb_info`
    /// and its csd for this CPU.
    Sender(CpuId),
}

impl PeerHint {
    const SENDER: u32 = 1 << 31;
    pub const NONE: PeerHint = PeerHint(u32::MAX);

    pub fn new(peer: Peer) -> PeerHint {
        match peer {
            Peer::Target(c) => PeerHint(c as u32),
            Peer::Sender(c) => PeerHint(c as u32 | Self::SENDER),
        }
    }

    pub fn get(self) -> Option<Peer> {
        if self == Self::NONE {
            return None;
        }
        let c = (self.0 & !Self::SENDER) as CpuId;
        Some(if self.0 & Self::SENDER != 0 {
            Peer::Sender(c)
        } else {
            Peer::Target(c)
        })
    }
}

/// Where the top frame of a CPU's stack was when its last step ended and what the frame's next
/// step reads, for the timed driver's prefetch one step ahead. At thousands of CPUs all of it
/// is cold (every other CPU stepped since) and most of it out of the prefetch's reach: the
/// task's stack, unlike the CPU's interrupt stack, is two dependent loads away from the CPU
/// (the task, then its stack's buffer), a large frame's boxed part a third, the element of
/// the frame's walk (the next target of `smp_call_function_many_cond`, the next csd of the
/// CALL_FUNCTION handler) one more, and the CPU that element names (its `struct Cpu`, the
/// directory's entries for its lines, its csd) one more again. Addresses and a CPU only, never
/// dereferenced: a stale hint (the stack grew since, the frame returned) costs a wasted
/// prefetch. No effect on results.
#[derive(Clone, Copy, Debug, Default)]
#[repr(align(32))]
pub struct FrameHint {
    /// The top frame in its stack's buffer (0: none).
    pub slot: usize,
    /// Its boxed part and that part's size (0: none).
    pub boxed: usize,
    pub boxed_len: u32,
    /// The CPU its walk reads about next.
    pub peer: PeerHint,
    /// The element of its walk its next step reads (0: none).
    pub element: usize,
}
const _: () = assert!(std::mem::size_of::<FrameHint>() == 32);

impl FrameHint {
    /// Start fetching the frame (both lines a `Frame` may straddle), every line of its boxed
    /// part, and its walk's next element.
    #[inline]
    pub fn prefetch(&self) {
        use shootdown_engine::prefetch;
        if self.slot != 0 {
            let p = self.slot as *const u8;
            prefetch(p);
            prefetch(p.wrapping_add(std::mem::size_of::<crate::frame::Frame>() - 1));
        }
        if self.boxed != 0 {
            let end = self.boxed + self.boxed_len as usize - 1;
            let (first, last) = (self.boxed / 64, end / 64);
            for line in first..=last {
                prefetch((line * 64) as *const u8);
            }
        }
        if self.element != 0 {
            prefetch(self.element as *const u8);
        }
    }
}

impl Default for PeerHint {
    fn default() -> Self {
        Self::NONE
    }
}

/// Work a CPU does with interrupts enabled and that publishes nothing when it ends (user
/// code, exception and syscall entry, a writeback's cache flushes): the timed driver parks the
/// CPU for it instead of folding it into one step, so an IPI arriving meanwhile is taken at its
/// arrival and the rest of the work resumes after the handler. A step's own cost is otherwise
/// indivisible: an interrupt waits for the step to end.
/// On a host the work of a vCPU stops while the host has it descheduled (`vcpu_put`).
#[derive(Clone, Copy, Debug, Default)]
pub struct Busy {
    /// Charged by the running step, to become a park at its end.
    pub(crate) pending: Time,
    /// The parked work ends here (wake-up time of the CPU).
    pub(crate) until: Time,
    /// What an interrupt cut off, resumed when its handler has returned.
    pub(crate) left: Time,
    /// The SMT stretch (thousandths) the parked work is priced at; 0 = unstretched (smt.rs
    /// rescales the rest of the work when a sibling starts or stops executing).
    pub(crate) scale: u32,
}

impl Perf {
    /// The performance state of a machine of `n` CPUs on the physical CPUs of `topo`.
    pub(crate) fn new(profile: Arc<CostProfile>, n: usize, topo: &Topology) -> Perf {
        let pcpus = topo.nr_cpus();
        Perf {
            lines: shootdown_hw::cacheline::LineDirectory::new(pcpus)
                .with_dense(crate::mem::csd_lines(n))
                .with_flat(crate::mem::percpu_lines(n)),
            counters: Counters::new(),
            cpu: vec![CpuPerf::default(); n],
            frames: if n >= shootdown_engine::PREFETCH_MIN_AGENTS {
                vec![FrameHint::default(); n]
            } else {
                Vec::new()
            },
            ipi_flows: vec![Vec::new(); n],
            next_flow_id: 1,
            measure_from: Time::ZERO,
            events_measured: 0,
            first_event_at: None,
            last_event_at: Time::ZERO,
            marks: Vec::new(),
            se: Vec::new(),
            fair_rq: Vec::new(),
            host_marks: Vec::new(),
            host_threads_alive: 0,
            user_tasks_alive: 0,
            uses_checked: 0,
            violation: None,
            shadow_lock_wanted: false,
            labels_on: false,
            labels: Vec::new(),
            summary: None,
            host: HostPerf::default(),
            core_scale_permille: 1000,
            core_executing: vec![0; topo.nr_cores()],
            profile: Profile(profile),
            stowed: None,
        }
    }
}

impl Machine {
    /// The performance state of this machine at time zero, before any step: what a stored
    /// explorer state's stands for ([`Perf::stow`]). It depends only on what is fixed for the
    /// run (the CPUs, the topology, the host's configuration), so every state of the run
    /// gives the same one.
    pub(crate) fn blank_perf(&self) -> Perf {
        let mut p = Perf::new(
            Arc::clone(&self.perf.profile.0),
            self.cpus.len(),
            &self.topo,
        );
        if let Some(h) = &self.host {
            p.host = h.perf();
        }
        p
    }

    pub fn counters(&self) -> &Counters {
        &self.perf.counters
    }

    pub(crate) fn violate(&mut self, v: Violation) {
        if self.perf.violation.is_none() {
            self.perf.violation = Some(v);
        }
    }
}

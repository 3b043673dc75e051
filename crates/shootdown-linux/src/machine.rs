//! The whole simulated machine: CPUs, tasks, mms, page-table memory, the oracle — and the
//! [`Model`] implementation through which both drivers run it.
//!
//! Actions (what the explorer interleaves; the timed driver picks one per agent turn):
//! * `Step(cpu)` — the next atomic step of whatever the CPU is running (a kernel frame on its
//!   interrupt stack or current task's stack, else the task's next user operation, else idle);
//! * `Interrupt(cpu)` — take a pending IPI (enabled when the CPU has interrupts on);
//! * `Drain(cpu)` — under TSO, the oldest buffered store reaches memory;
//! * `Fill(cpu, page)` — the hardware walker speculatively caches a translation of a page
//!   through whatever CR3 the CPU has loaded (lazy CPUs included);
//! * with a host (`kvm_host.rs`), CPUs are vCPUs and the host acts on them: `VcpuPut(v)` (the
//!   host preempts vCPU `v`), `VcpuLoad(v)` (the next step of its return into the guest) and,
//!   explorer only, `VcpuIoctl(v)` (a load/put pair without entering the guest).

use crate::counters::{Counter, Counters};
use crate::frame::{Flow, Frame};
use crate::kvm_host::{Host, HostEnv, HostPerf, VcpuMode};
use crate::mem::MemoryModel;
use crate::options::{Idle, Options};
use crate::state::*;
use shootdown_engine::trace::TraceEvent;
use shootdown_engine::{Env, Model, Outcome, Park, StepKind, Time, Unhashed, Violation};
use shootdown_hw::oracle::Oracle;
use shootdown_hw::pagetable::{PtPages, Pte, Vpn};
use shootdown_hw::tlb::Tlb;
use shootdown_hw::{CostProfile, CpuId, Topology};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// Performance-only state: never distinguishes two states for the explorer.
#[derive(Clone, Debug)]
pub struct Perf {
    pub profile: Arc<CostProfile>,
    pub lines: shootdown_hw::cacheline::LineDirectory,
    pub counters: Counters,
    /// When each CPU's pending IPI arrives.
    pub ipi_arrival: Vec<Time>,
    /// Per CPU: interruptible work in progress ([`Machine::charge_interruptible`]).
    pub busy: Vec<Busy>,
    /// When each CPU's current task started its time slice.
    pub slice_start: Vec<Time>,
    pub next_flow_id: u64,
    /// Workload events at or after `measure_from` count towards the metric.
    pub measure_from: Time,
    pub events_measured: u64,
    pub first_event_at: Option<Time>,
    pub last_event_at: Time,
    /// Per task: times of its `Mark` ops.
    pub marks: Vec<Vec<Time>>,
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
    /// Per CPU: whether its timeline has opened the running task's slices yet.
    pub trace_started: Vec<bool>,
    /// Host scheduling timers (machines with a host only).
    pub host: HostPerf,
    /// How much the running step's core-bound costs stretch, in thousandths: set at the start
    /// of each timed step from the SMT siblings' state (smt.rs).
    pub core_scale_permille: u32,
    /// Per CPU: executing after its last step — running a task or handler, or parked for
    /// interruptible work; not idle, not busy-waiting (smt.rs).
    pub smt_executing: Vec<bool>,
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

/// An explorer/timed-driver action.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Action {
    Step(u32),
    Interrupt(u32),
    Drain(u32),
    Fill(u32, u32),
    /// Host: preempt vCPU `v` (VM exit, `vcpu_put`, `kvm_steal_time_set_preempted`).
    VcpuPut(u32),
    /// Host: the next step of vCPU `v`'s return into the guest (`vcpu_load`,
    /// `record_steal_time`, VM entry).
    VcpuLoad(u32),
    /// Host (explorer only): `vcpu_load` + `vcpu_put` of a preempted vCPU without entering.
    VcpuIoctl(u32),
}

/// Where a frame came from, so it goes back to the same stack even if the step switched tasks.
#[derive(Clone, Copy)]
enum StackRef {
    Irq,
    Task(TaskId),
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Machine {
    pub opts: Options,
    pub topo: Topology,
    pub pcid_hw: bool,
    pub pti: bool,
    pub invpcid: bool,
    pub memory_model: MemoryModel,
    pub cpus: Vec<Cpu>,
    pub tasks: Vec<Task>,
    pub mms: Vec<Mm>,
    pub pt_pages: PtPages,
    pub oracle: Oracle,
    /// Locked `call_single_data`s.
    pub csd_locked: BTreeSet<CsdKey>,
    /// Each initiator's `flush_tlb_info` (per-CPU since v5.x).
    pub flush_info: Vec<Option<FlushTlbInfo>>,
    /// Pages the explorer lets the walker fill speculatively: (mm, vpn).
    pub spec_pages: Vec<(MmId, Vpn)>,
    /// Files on a DAX filesystem mapped into mms (fdatasync writes back their dirty entries).
    pub dax_files: Vec<DaxFile>,
    /// `(mm, start) -> index into dax_files`, to find the file a fault address belongs to.
    pub dax_index: BTreeMap<(MmId, Vpn), u32>,
    /// sysbench fileio's process-wide request generator, if a workload uses one.
    pub fileio: Option<FileioGen>,
    /// Last page frame number handed out by the fault path.
    pub next_pfn: u32,
    /// The host under the guests: None for a native machine (kvm_host.rs).
    pub host: Option<Box<Host>>,
    pub perf: Unhashed<Perf>,
}

impl Machine {
    /// A machine with every CPU idle in init_mm.
    pub fn new(
        topo: Topology,
        profile: Arc<CostProfile>,
        opts: Options,
        memory_model: MemoryModel,
    ) -> Machine {
        let n = topo.nr_cpus();
        Machine::with_cpus(topo, n, profile, opts, memory_model)
    }

    /// A machine of `n` CPUs on topology `topo` (`n` = the topology's CPUs natively; the vCPUs
    /// of every VM on a host, whose physical CPUs `topo` describes).
    pub(crate) fn with_cpus(
        topo: Topology,
        n: usize,
        profile: Arc<CostProfile>,
        opts: Options,
        memory_model: MemoryModel,
    ) -> Machine {
        let f = &profile.features;
        let mut m = Machine {
            pcid_hw: f.pcid,
            pti: f.pti,
            invpcid: f.invpcid,
            opts,
            memory_model,
            cpus: Vec::with_capacity(n),
            tasks: Vec::new(),
            mms: vec![Mm::new(0, n, "init_mm".into())],
            pt_pages: PtPages::default(),
            oracle: Oracle::new(1),
            csd_locked: BTreeSet::new(),
            flush_info: vec![None; n],
            spec_pages: Vec::new(),
            dax_files: Vec::new(),
            dax_index: BTreeMap::new(),
            fileio: None,
            next_pfn: 1 << 24,
            host: None,
            perf: Unhashed(Perf {
                lines: shootdown_hw::cacheline::LineDirectory::new(topo.nr_cpus()),
                counters: Counters::new(),
                ipi_arrival: vec![Time::ZERO; n],
                busy: vec![Busy::default(); n],
                slice_start: vec![Time::ZERO; n],
                next_flow_id: 1,
                measure_from: Time::ZERO,
                events_measured: 0,
                first_event_at: None,
                last_event_at: Time::ZERO,
                marks: Vec::new(),
                user_tasks_alive: 0,
                uses_checked: 0,
                violation: None,
                labels_on: false,
                labels: Vec::new(),
                summary: None,
                trace_started: vec![false; n],
                host: HostPerf::default(),
                core_scale_permille: 1000,
                smt_executing: vec![false; n],
                profile: profile.clone(),
            }),
            topo,
        };
        for c in 0..n {
            let idle = m.tasks.len() as TaskId;
            m.tasks.push(Task {
                name: format!("swapper/{c}"),
                mm: None,
                state: TaskState::Running,
                cpu: c,
                stack: Vec::new(),
                program: Vec::new(),
                pc: 0,
                loop_left: Vec::new(),
                op_progress: 0,
                op_base: None,
                fsync_file: None,
                cpus: Vec::new(),
                on_cpu: true,
            });
            m.cpus.push(Cpu {
                tlb: Tlb::new(profile.features.tlb_entries, profile.features.psc_entries),
                cr3_mm: INIT_MM,
                cr3_pcid: 0,
                tlbstate: TlbState::default(),
                irq_stack: Vec::new(),
                irq_off: 0,
                ipi_pending: false,
                call_queue: Vec::new(),
                curr: idle,
                idle_task: idle,
                runqueue: Default::default(),
                need_resched: false,
                sb: Default::default(),
                halted: false,
            });
        }
        m
    }

    /// A machine that has been up a while: other processes have run on every CPU since boot,
    /// so each CPU's `cpu_tlbstate.next_asid` rotor (`choose_new_asid`) stands anywhere in
    /// `0..TLB_NR_DYN_ASIDS`, drawn uniformly from `seed`. A workload's mm then gets a
    /// different `ctxs[]` slot on different CPUs — which matters for cost, since `ctxs[0..2]`
    /// share a cache line with `is_lazy` before v5.13 (`mem::tlbstate_ctx_line`). A fresh
    /// machine (the checker's) hands the first user mm ASID 1 everywhere.
    pub fn age_asid_rotors(&mut self, seed: u64) {
        let mut rng = shootdown_engine::rng::DetRng::new(seed, 0xa51d);
        for c in &mut self.cpus {
            c.tlbstate.next_asid = rng.below(TLB_NR_DYN_ASIDS as u64) as u16;
        }
    }

    /// Create a process address space (`mm_alloc`); `ctx_id`s are never reused.
    pub fn add_mm(&mut self, name: &str) -> MmId {
        let id = self.mms.len() as MmId;
        self.mms
            .push(Mm::new(id as u64 + 1, self.cpus.len(), name.to_string()));
        self.oracle.add_mm();
        id
    }

    /// Create a user task on `cpu`, runnable.
    pub fn add_task(&mut self, name: &str, mm: MmId, cpu: CpuId, program: Vec<UserOp>) -> TaskId {
        let id = self.tasks.len() as TaskId;
        self.tasks.push(Task {
            name: name.to_string(),
            mm: Some(mm),
            state: TaskState::Runnable,
            cpu,
            stack: Vec::new(),
            program,
            pc: 0,
            loop_left: Vec::new(),
            op_progress: 0,
            op_base: None,
            fsync_file: None,
            cpus: vec![cpu],
            on_cpu: false,
        });
        self.cpus[cpu].runqueue.push_back(id);
        self.cpus[cpu].need_resched = true;
        self.perf.user_tasks_alive += 1;
        id
    }

    /// Populate PTEs directly (pre-faulted memory), creating page-table pages as needed.
    pub fn map_pages(&mut self, mm: MmId, start: Vpn, npages: u64, writable: bool) {
        if npages == 0 {
            return;
        }
        let end = start + npages;
        // One page-table page per 512-page group: allocate each once, not once per page.
        let mut vpn = start;
        while vpn < end {
            self.ensure_table(mm, vpn);
            vpn = (vpn / 512 + 1) * 512;
        }
        let pte_at = |old: Option<&Pte>, vpn: Vpn| Pte {
            present: true,
            writable,
            pfn: (vpn & 0xffff_ffff) as u32,
            ..old.copied().unwrap_or(Pte::NONE)
        };
        let ptes = &mut self.mms[mm as usize].space.ptes;
        if ptes.range(start..end).next().is_none() {
            // Fresh range (workload set-up maps up to millions of pages): build the new entries
            // as a tree in one pass and merge it, instead of one insertion per page.
            let mut fresh: BTreeMap<Vpn, Pte> =
                (start..end).map(|v| (v, pte_at(None, v))).collect();
            ptes.append(&mut fresh);
        } else {
            for vpn in start..end {
                let pte = pte_at(ptes.get(&vpn), vpn);
                ptes.insert(vpn, pte);
            }
        }
    }

    /// Map a file of a DAX filesystem at `[start, start+npages)` of `mm` (write faults mark
    /// entries dirty, fdatasync writes them back). Returns the file's index.
    pub fn add_dax_file(&mut self, mm: MmId, start: Vpn, npages: u64) -> u32 {
        let id = self.dax_files.len() as u32;
        self.dax_files.push(DaxFile {
            mm,
            start,
            npages,
            dirty: BTreeSet::new(),
            xa_lock: 0,
        });
        self.dax_index.insert((mm, start), id);
        id
    }

    /// The DAX file of `mm` that maps `vpn`, if any.
    pub(crate) fn dax_file_of(&self, mm: MmId, vpn: Vpn) -> Option<u32> {
        let (_, &id) = self.dax_index.range(..=(mm, vpn)).next_back()?;
        let f = &self.dax_files[id as usize];
        (f.mm == mm && vpn < f.start + f.npages).then_some(id)
    }

    /// Allocate the page-table page covering `vpn` if the PMD has none.
    pub(crate) fn ensure_table(&mut self, mm: MmId, vpn: Vpn) {
        let idx = shootdown_hw::pagetable::pt_index(vpn);
        if !self.mms[mm as usize].space.pmd.contains_key(&idx) {
            let t = self.pt_pages.alloc();
            self.mms[mm as usize].space.pmd.insert(idx, t);
        }
    }

    pub fn counters(&self) -> &Counters {
        &self.perf.counters
    }

    /// Describe what the current step does, in kernel terms (kept only while replaying a
    /// counterexample, so the closure costs nothing in normal runs).
    #[inline]
    pub(crate) fn say(&mut self, f: impl FnOnce() -> String) {
        if self.perf.labels_on {
            let s = f();
            self.perf.labels.push(s);
        }
    }

    /// What the current step does, in kernel terms, when nothing it calls says more (kept only
    /// while replaying a counterexample). A later summary of the same step replaces an earlier
    /// one.
    #[inline]
    pub(crate) fn summary(&mut self, f: impl FnOnce() -> String) {
        if self.perf.labels_on {
            self.perf.summary = Some(f());
        }
    }

    pub(crate) fn violate(&mut self, v: Violation) {
        if self.perf.violation.is_none() {
            self.perf.violation = Some(v);
        }
    }

    /// Kernel (kPCID) hardware PCID of an ASID slot: `kern_pcid(asid) = asid + 1`; 0 without PCID.
    pub(crate) fn kern_pcid(&self, asid: u16) -> u16 {
        if self.pcid_enabled() {
            asid + 1
        } else {
            0
        }
    }
    /// The PCID user mode runs with: `user_pcid() = kern_pcid | 1<<11` under PTI.
    pub fn user_pcid(&self, asid: u16) -> u16 {
        let k = self.kern_pcid(asid);
        if self.pti {
            k | (1 << 11)
        } else {
            k
        }
    }
    pub(crate) fn pcid_enabled(&self) -> bool {
        self.pcid_hw && self.opts.pcid
    }

    /// Like [`Machine::charge`], for interruptible work of `cpu`'s running step (see [`Busy`]).
    pub(crate) fn charge_interruptible<E: Env>(
        &mut self,
        env: &mut E,
        cpu: CpuId,
        t: impl Fn(&shootdown_hw::profile::Costs) -> Time,
    ) {
        if env.timed() {
            let cost = self.core_time(t(&self.perf.profile.costs));
            self.perf.busy[cpu].pending += cost;
        }
    }

    /// The CPU (a vCPU the host deschedules) stops its interruptible work now; the rest is
    /// resumed when it next runs with an empty interrupt stack.
    pub(crate) fn suspend_busy(&mut self, cpu: CpuId, now: Time) {
        let b = &mut self.perf.busy[cpu];
        if b.until > now {
            b.left += b.until - now;
        }
        b.until = Time::ZERO;
    }

    /// Parked for interruptible work (not halted, not spinning).
    pub(crate) fn is_busy(&self, cpu: CpuId) -> bool {
        self.perf.busy[cpu].until > Time::ZERO
    }

    /// Timed driver: before `a` runs, account for interruptible work in progress. An interrupt
    /// cuts the work off (the rest is resumed after the handler); a step woken before the work
    /// ends, or the first step after a handler, parks for what is left (`Some` = a no-op step).
    /// That work was priced when charged: the step keeps its SMT stretch.
    fn busy_before<E: Env>(&mut self, a: Action, env: &mut E) -> Option<()> {
        let now = env.now();
        match a {
            Action::Interrupt(c) => {
                self.suspend_busy(c as usize, now);
                None
            }
            Action::Step(c) => {
                let c = c as usize;
                let irq_idle = self.cpus[c].irq_stack.is_empty();
                let b = &mut self.perf.busy[c];
                let resumed = if b.until > now {
                    b.pending = b.until - now;
                    true
                } else if irq_idle && b.left > Time::ZERO {
                    b.pending = std::mem::take(&mut b.left);
                    true
                } else {
                    false
                };
                b.until = Time::ZERO;
                if resumed {
                    self.perf.core_scale_permille = b.scale.max(1000);
                    return Some(());
                }
                None
            }
            _ => None,
        }
    }

    /// Timed driver: after a step, turn the interruptible work it charged into a park until the
    /// work ends (only if the CPU goes on running with interrupts enabled; else it is charged).
    fn busy_after<E: Env>(&mut self, a: Action, park: Park, env: &mut E) -> Park {
        let (Action::Step(c) | Action::Interrupt(c)) = a else {
            return park;
        };
        let c = c as usize;
        let pending = std::mem::take(&mut self.perf.busy[c].pending);
        if pending == Time::ZERO {
            return park;
        }
        if park == Park::Run && self.irqs_enabled(c) {
            let until = env.now() + env.elapsed() + pending;
            self.perf.busy[c].until = until;
            self.perf.busy[c].scale = self.perf.core_scale_permille;
            env.wake(c, until);
            Park::Halt
        } else {
            env.charge(pending);
            park
        }
    }

    /// Interrupts enabled on `cpu` (no handler running, no IRQs-off frame on top).
    pub fn irqs_enabled(&self, cpu: CpuId) -> bool {
        let c = &self.cpus[cpu];
        if !c.irq_stack.is_empty() || c.irq_off > 0 {
            return false;
        }
        match self.tasks[c.curr as usize].stack.last() {
            Some(f) => !f.irqs_off(),
            None => true,
        }
    }

    /// Is `cpu` running its idle task?
    pub fn is_idle_cpu(&self, cpu: CpuId) -> bool {
        self.is_idle(cpu)
    }

    pub(crate) fn is_idle(&self, cpu: CpuId) -> bool {
        self.cpus[cpu].curr == self.cpus[cpu].idle_task
    }

    /// Would `Step(cpu)` only spin (or halt)? Mirrors the wait conditions in the step code.
    pub fn step_blocked(&self, cpu: CpuId) -> bool {
        let c = &self.cpus[cpu];
        let top = if let Some(f) = c.irq_stack.last() {
            Some(f)
        } else {
            self.tasks[c.curr as usize].stack.last()
        };
        match top {
            Some(f) => self.frame_spins(cpu, f),
            None => {
                let t = &self.tasks[c.curr as usize];
                if c.curr == c.idle_task {
                    c.runqueue.is_empty()
                } else {
                    t.state == TaskState::Dead
                }
            }
        }
    }

    fn pop_frame(&mut self, cpu: CpuId) -> (StackRef, Option<Frame>) {
        let c = &mut self.cpus[cpu];
        if let Some(f) = c.irq_stack.pop() {
            return (StackRef::Irq, Some(f));
        }
        let t = c.curr;
        (StackRef::Task(t), self.tasks[t as usize].stack.pop())
    }

    fn push_frame(&mut self, cpu: CpuId, at: StackRef, f: Frame) {
        match at {
            StackRef::Irq => self.cpus[cpu].irq_stack.push(f),
            StackRef::Task(t) => self.tasks[t as usize].stack.push(f),
        }
    }

    /// Push a new call on the current stack of `cpu` (used by user-mode code entering the kernel).
    pub(crate) fn call<E: Env>(&mut self, cpu: CpuId, env: &mut E, f: Frame) {
        if env.tracing() {
            env.trace(TraceEvent::Begin {
                agent: cpu,
                name: f.name(),
                detail: None,
            });
        }
        let (at, top) = self.pop_frame(cpu);
        if let Some(t) = top {
            self.push_frame(cpu, at, t);
        }
        self.push_frame(cpu, at, f);
    }

    /// Open `task`'s slices on `cpu`'s timeline: a bottom slice (`user` or `idle`, with the
    /// task's name) and one per kernel frame on its stack, outermost first. With
    /// [`Machine::trace_task_out`] at every context switch, each CPU's track shows exactly what
    /// runs on that CPU, and a task's half-done kernel call reappears when it runs again.
    pub(crate) fn trace_task_in<E: Env>(&self, cpu: CpuId, task: TaskId, env: &mut E) {
        let t = &self.tasks[task as usize];
        env.trace(TraceEvent::Begin {
            agent: cpu,
            name: if t.mm.is_some() { "user" } else { "idle" },
            detail: Some(t.name.clone()),
        });
        for f in &t.stack {
            env.trace(TraceEvent::Begin {
                agent: cpu,
                name: f.name(),
                detail: None,
            });
        }
    }

    /// Close `task`'s slices on `cpu`'s timeline (see [`Machine::trace_task_in`]); `popped`
    /// counts its frames being stepped (off its stack) that have open slices.
    pub(crate) fn trace_task_out<E: Env>(
        &self,
        cpu: CpuId,
        task: TaskId,
        popped: usize,
        env: &mut E,
    ) {
        for _ in 0..self.tasks[task as usize].stack.len() + popped + 1 {
            env.trace(TraceEvent::End { agent: cpu });
        }
    }

    fn step_cpu<E: Env>(&mut self, cpu: CpuId, env: &mut E) -> Park {
        if env.tracing() && !self.perf.trace_started[cpu] {
            self.perf.trace_started[cpu] = true;
            self.trace_task_in(cpu, self.cpus[cpu].curr, env);
        }
        let (at, frame) = self.pop_frame(cpu);
        let Some(mut f) = frame else {
            return if self.is_idle(cpu) {
                self.idle_step(cpu, env)
            } else {
                self.user_step(cpu, env)
            };
        };
        let flow = self.step_frame(cpu, &mut f, env);
        match flow {
            Flow::Next => {
                self.push_frame(cpu, at, f);
                Park::Run
            }
            Flow::Call(callee) => {
                if env.tracing() {
                    env.trace(TraceEvent::Begin {
                        agent: cpu,
                        name: callee.name(),
                        detail: None,
                    });
                }
                self.push_frame(cpu, at, f);
                self.push_frame(cpu, at, callee);
                Park::Run
            }
            Flow::Return => {
                if env.tracing() {
                    env.trace(TraceEvent::End { agent: cpu });
                }
                Park::Run
            }
            Flow::Spin(key) => {
                self.push_frame(cpu, at, f);
                self.charge(env, |c| c.spin_poll);
                Park::SpinOn(key)
            }
        }
    }

    fn step_frame<E: Env>(&mut self, cpu: CpuId, f: &mut Frame, env: &mut E) -> Flow {
        match f {
            Frame::FlushMmRange(s) => self.flush_tlb_mm_range_step(cpu, s, env),
            Frame::FlushFunc(s) => self.flush_tlb_func_step(cpu, s, env),
            Frame::SmpCallMany(s) => self.smp_call_function_many_step(cpu, s, env),
            Frame::CallFunctionIrq(s) => self.call_function_interrupt_step(cpu, s, env),
            Frame::SwitchMm(s) => self.switch_mm_irqs_off_step(cpu, s, env),
            Frame::Schedule(s) => self.schedule_step(cpu, s, env),
            Frame::RwSemDown(s) => self.rwsem_down_step(cpu, s, env),
            Frame::Syscall(s) => self.syscall_step(cpu, s, env),
            Frame::PvFlushTlbMulti(s) => self.pv_flush_tlb_multi_step(cpu, s, env),
        }
    }

    fn frame_spins(&self, cpu: CpuId, f: &Frame) -> bool {
        match f {
            Frame::SmpCallMany(s) => self.smp_call_spins(cpu, s),
            Frame::Schedule(s) => self.schedule_spins(cpu, s),
            _ => false,
        }
    }

    /// Take the pending CALL_FUNCTION IPI: enter `call_function_interrupt`.
    fn take_interrupt<E: Env>(&mut self, cpu: CpuId, env: &mut E) -> Park {
        let c = &mut self.cpus[cpu];
        c.ipi_pending = false;
        let was_halted = std::mem::replace(&mut c.halted, false);
        // The slice opens before the entry cost so that a profile counts it in the handler.
        if env.tracing() {
            env.trace(TraceEvent::FlowIn {
                agent: cpu,
                id: cpu as u64,
                name: "CALL_FUNCTION IPI",
            });
            env.trace(TraceEvent::Begin {
                agent: cpu,
                name: "call_function_interrupt",
                detail: None,
            });
        }
        if env.timed() {
            let costs = &self.perf.profile.costs;
            let mut t = self.core_time(costs.irq_entry_exit);
            if was_halted && self.opts.idle == Idle::Halt {
                t += costs.idle_wakeup;
            }
            if self.host.is_some() && !self.opts.posted_interrupts {
                // Without APICv: the kick exit that injects the interrupt, and the EOI exit.
                t += Time(self.vm_exit_cost().0 * 2);
                self.perf
                    .counters
                    .add(crate::counters::Counter::KvmExits, 2);
            }
            env.charge(t);
        }
        self.cpus[cpu]
            .irq_stack
            .push(Frame::CallFunctionIrq(crate::smp::CallFunctionIrq::new()));
        Park::Run
    }

    /// Send the CALL_FUNCTION IPI to `targets` (one ICR write, x2APIC cluster-style: the first
    /// target costs `ipi_send`, each further one `ipi_send_per_target`).
    pub(crate) fn send_call_function_ipi<E: Env>(
        &mut self,
        src: CpuId,
        targets: &[CpuId],
        env: &mut E,
    ) {
        if targets.is_empty() {
            return;
        }
        let now = env.now();
        if env.timed() {
            let c = self.perf.profile.clone();
            let c = &c.costs;
            let k = targets.len() as u64;
            let send = if self.host.is_none() {
                c.ipi_send + Time(c.ipi_send_per_target.0 * (k - 1))
            } else if self.opts.pv_send_ipi {
                // One KVM_HC_SEND_IPI hypercall for the whole set.
                self.perf.counters.inc(crate::counters::Counter::KvmExits);
                self.vm_exit_cost() + c.ipi_send + Time(c.ipi_send_per_target.0 * (k - 1))
            } else {
                // x2APIC cluster mode in a guest without PV IPIs: one ICR write per cluster of
                // 16 logical CPUs among the targets, and every ICR write exits to KVM, which
                // then delivers to each destination.
                let mut clusters: Vec<usize> = targets.iter().map(|&t| t / 16).collect();
                clusters.dedup();
                let n = clusters.len() as u64;
                self.perf
                    .counters
                    .add(crate::counters::Counter::KvmExits, n);
                Time((self.vm_exit_cost().0 + c.ipi_send.0) * n + c.ipi_send_per_target.0 * (k - n))
            };
            env.charge(send);
        }
        for &t in targets {
            self.perf.counters.inc(Counter::CallFunctionIpis);
            self.cpus[t].ipi_pending = true;
            if env.timed() {
                let c = &self.perf.profile.costs;
                let lat = match self.topo.distance(self.phys_cpu(src), self.phys_cpu(t)) {
                    shootdown_hw::Distance::CrossSocket => c.ipi_latency_cross_socket,
                    _ => c.ipi_latency_same_socket,
                };
                // The ICR write completes at the end of this step's send cost.
                let arrival = now + lat;
                self.perf.ipi_arrival[t] = arrival;
                env.wake(t, arrival);
            }
            if env.tracing() {
                env.trace(TraceEvent::FlowOut {
                    agent: src,
                    id: t as u64,
                    name: "CALL_FUNCTION IPI",
                });
            }
        }
    }

    /// Wake a sleeping/halted CPU because work was queued for it (`resched_curr` /
    /// `wake_up_idle_cpu`).
    pub(crate) fn kick_cpu<E: Env>(&mut self, from: CpuId, cpu: CpuId, env: &mut E) {
        self.cpus[cpu].need_resched = true;
        if !env.timed() || cpu == from {
            return;
        }
        let c = &self.perf.profile.costs;
        let at = if self.opts.idle == Idle::Poll {
            env.now() + c.poll_idle_notice
        } else {
            let lat = match self.topo.distance(self.phys_cpu(from), self.phys_cpu(cpu)) {
                shootdown_hw::Distance::CrossSocket => c.ipi_latency_cross_socket,
                _ => c.ipi_latency_same_socket,
            };
            env.charge(c.ipi_send);
            env.now() + lat + c.idle_wakeup + c.irq_entry_exit
        };
        env.wake(cpu, at);
    }
}

impl Model for Machine {
    type Action = Action;

    fn agents(&self) -> usize {
        self.cpus.len()
    }

    fn enabled(&self, out: &mut Vec<Action>) {
        for cpu in 0..self.cpus.len() {
            let c = cpu as u32;
            if let Some(h) = &self.host {
                match h.vcpus[cpu].mode {
                    VcpuMode::InGuest => {
                        if self.host_may_preempt(cpu) {
                            out.push(Action::VcpuPut(c));
                        }
                    }
                    VcpuMode::Runnable => {
                        out.push(Action::VcpuLoad(c));
                        if h.cfg.ioctl_puts && self.vcpu_ioctl_would_change(cpu) {
                            out.push(Action::VcpuIoctl(c));
                        }
                        continue;
                    }
                    VcpuMode::Entering(_) => {
                        out.push(Action::VcpuLoad(c));
                        continue;
                    }
                    VcpuMode::Blocked => continue,
                }
            }
            if self.cpus[cpu].ipi_pending && self.irqs_enabled(cpu) {
                out.push(Action::Interrupt(c));
            }
            if !self.step_blocked(cpu) {
                out.push(Action::Step(c));
            }
            if !self.cpus[cpu].sb.is_empty() {
                out.push(Action::Drain(c));
            }
            let cr3 = self.cpus[cpu].cr3_mm;
            if cr3 != INIT_MM {
                for (i, &(mm, vpn)) in self.spec_pages.iter().enumerate() {
                    if mm == cr3 && self.fill_would_change(cpu, vpn) {
                        out.push(Action::Fill(c, i as u32));
                    }
                }
            }
        }
    }

    fn timed_action(&self, agent: usize, now: Time) -> Action {
        if let Some(h) = &self.host {
            match h.vcpus[agent].mode {
                VcpuMode::Entering(_) => return Action::VcpuLoad(agent as u32),
                VcpuMode::Runnable
                    if h.pcpus[h.vcpus[agent].pcpu as usize].curr == Some(agent as u32) =>
                {
                    return Action::VcpuLoad(agent as u32)
                }
                // Not current on its pCPU: `Step` is a no-op that parks the agent.
                VcpuMode::Runnable | VcpuMode::Blocked => return Action::Step(agent as u32),
                VcpuMode::InGuest => {
                    if self.host_preempt_due(agent, now) {
                        return Action::VcpuPut(agent as u32);
                    }
                }
            }
        }
        if self.cpus[agent].ipi_pending
            && now >= self.perf.ipi_arrival[agent]
            && self.irqs_enabled(agent)
        {
            Action::Interrupt(agent as u32)
        } else {
            Action::Step(agent as u32)
        }
    }

    fn agent_of(&self, a: Action) -> usize {
        match a {
            Action::Step(c)
            | Action::Interrupt(c)
            | Action::Drain(c)
            | Action::Fill(c, _)
            | Action::VcpuPut(c)
            | Action::VcpuLoad(c)
            | Action::VcpuIoctl(c) => c as usize,
        }
    }

    fn apply<E: Env>(&mut self, a: Action, env: &mut E) -> Outcome {
        if self.host.is_some() && env.timed() {
            return self.apply_on_host(a, env);
        }
        self.apply_step(a, env)
    }

    fn describe(&self, a: Action) -> String {
        crate::describe::describe(self, a)
    }

    fn agent_name(&self, agent: usize) -> String {
        if self.host.is_some() {
            format!("vcpu{agent}")
        } else {
            format!("cpu{agent}")
        }
    }

    fn finished(&self) -> bool {
        self.perf.user_tasks_alive == 0
    }
}

impl Machine {
    /// The timed driver on a host: run the step with wake-ups collected, then let the host act
    /// on them (kvm_host.rs `HostEnv`), block a vCPU whose guest halted, and make sure a
    /// busy-waiting vCPU is preempted when its pCPU is wanted.
    fn apply_on_host<E: Env>(&mut self, a: Action, env: &mut E) -> Outcome {
        let v = self.agent_of(a);
        let now = env.now();
        let (out, charged, wakes) = {
            let mut henv = HostEnv {
                inner: &mut *env,
                charged: Time::ZERO,
                wakes: Vec::new(),
            };
            let out = self.apply_step(a, &mut henv);
            (out, henv.charged, henv.wakes)
        };
        let guest = matches!(a, Action::Step(_) | Action::Interrupt(_));
        let idle_poll = self.opts.idle == Idle::Poll;
        if guest
            && out.park == Park::Halt
            && self.vcpu_in_guest(v)
            && !(self.cpus[v].ipi_pending && self.irqs_enabled(v))
        {
            // Parked for interruptible work, the vCPU is running guest code, not halted.
            if idle_poll || self.is_busy(v) {
                // idle=poll: the guest's idle loop spins in guest mode and never executes HLT,
                // so the vCPU thread stays runnable and keeps its pCPU until the host wants it.
                if let Some(t) = self.host_next_preempt(v) {
                    env.wake_by(v, t);
                }
            } else {
                self.host_block(v, now + charged, env);
            }
        }
        if let Action::VcpuLoad(_) = a {
            // An IPI that waited for this vCPU's thread: how long, from its arrival to entry.
            if self.vcpu_in_guest(v) && self.cpus[v].ipi_pending {
                let waited = (now + charged).saturating_sub(self.perf.ipi_arrival[v]);
                self.perf.counters.add(
                    Counter::PreemptedIpiWaitUs,
                    waited.as_us_f64().round() as u64,
                );
            }
        }
        for (w, at) in wakes {
            match self.host_ref().vcpus[w].mode {
                VcpuMode::InGuest | VcpuMode::Entering(_) => env.wake(w, at),
                VcpuMode::Runnable => {
                    if self.cpus[w].ipi_pending {
                        self.perf.counters.inc(Counter::IpisToPreemptedVcpus);
                    }
                }
                VcpuMode::Blocked => self.host_kick(w, at, env),
            }
        }
        for (w, at) in std::mem::take(&mut self.perf.host.switched_in) {
            env.wake(w, at);
        }
        if matches!(out.park, Park::Spin | Park::SpinOn(_)) && self.vcpu_in_guest(v) {
            if let Some(t) = self.host_next_preempt(v) {
                env.wake_by(v, t);
            }
        }
        out
    }

    fn apply_step<E: Env>(&mut self, a: Action, env: &mut E) -> Outcome {
        if let Action::Step(c) = a {
            if !self.vcpu_in_guest(c as usize) {
                // Timed driver: a vCPU thread that is not current on its pCPU does nothing.
                return Outcome {
                    park: Park::Halt,
                    kind: StepKind::Local,
                    violation: None,
                };
            }
        }
        let timed = env.timed();
        if timed {
            self.perf.core_scale_permille = self.smt_core_scale(self.agent_of(a));
        }
        if timed && self.busy_before(a, env).is_some() {
            let park = self.busy_after(a, Park::Run, env);
            self.smt_after_step(self.agent_of(a), park, env);
            return Outcome {
                park,
                kind: StepKind::Local,
                violation: None,
            };
        }
        let (park, kind) = match a {
            Action::VcpuPut(c) => (self.vcpu_put_step(c as usize, env), StepKind::Shared),
            Action::VcpuLoad(c) => (self.vcpu_load_step(c as usize, env), StepKind::Shared),
            Action::VcpuIoctl(c) => (self.vcpu_ioctl_step(c as usize, env), StepKind::Shared),
            Action::Step(c) => (self.step_cpu(c as usize, env), StepKind::Shared),
            Action::Interrupt(c) => (self.take_interrupt(c as usize, env), StepKind::Shared),
            Action::Drain(c) => {
                self.drain_one(c as usize);
                (Park::Run, StepKind::Shared)
            }
            Action::Fill(c, i) => {
                let (_, vpn) = self.spec_pages[i as usize];
                self.speculative_fill(c as usize, vpn, env);
                (Park::Run, StepKind::Shared)
            }
        };
        let park = if timed {
            let park = self.busy_after(a, park, env);
            self.smt_after_step(self.agent_of(a), park, env);
            park
        } else {
            park
        };
        // An IPI that arrived while this CPU had interrupts off must still be taken: a CPU that
        // now parks (spins or halts) with interrupts on is woken for it.
        if matches!(park, Park::Spin | Park::SpinOn(_) | Park::Halt) {
            let c = self.agent_of(a);
            if self.cpus[c].ipi_pending && self.irqs_enabled(c) {
                env.wake(c, self.perf.ipi_arrival[c]);
            }
        }
        Outcome {
            park,
            kind,
            violation: self.perf.violation.take(),
        }
    }
}

impl Machine {
    /// A human-readable snapshot of every CPU (stacks, pending IPIs, queues): for diagnosing a
    /// deadlock or a violation.
    pub fn dump(&self) -> String {
        let mut s = String::new();
        for (i, c) in self.cpus.iter().enumerate() {
            let t = &self.tasks[c.curr as usize];
            let frames: Vec<String> = t
                .stack
                .iter()
                .map(|f| format!("{}@{}", f.name(), f.step_name()))
                .collect();
            let irq: Vec<String> = c
                .irq_stack
                .iter()
                .map(|f| format!("{}@{}", f.name(), f.step_name()))
                .collect();
            s += &format!(
                "cpu{i}: task={} state={:?} stack={frames:?} irq={irq:?} ipi_pending={} irqs_on={} queue={:?} rq={:?} halted={} loaded_mm={} lazy={}\n",
                t.name, t.state, c.ipi_pending, self.irqs_enabled(i), c.call_queue, c.runqueue, c.halted, c.tlbstate.loaded_mm, c.tlbstate.is_lazy
            );
        }
        s += &format!("csd_locked={:?}\n", self.csd_locked);
        s
    }
}

//! The whole simulated machine — CPUs, tasks, mms, page-table memory, the oracle, and the host
//! with its vCPUs — and the [`Model`] implementation through which both drivers run it. This
//! file only holds the state and dispatches; each concept lives in its own file (`stack.rs`
//! runs frames, `apic.rs` delivers IPIs, `busy.rs` accounts interruptible work, `kvm/` is the
//! host side of KVM, …).
//!
//! Actions (what the explorer interleaves; the timed driver picks one per agent turn):
//! * `Step(cpu)` — the next atomic step of whatever the CPU is running (a kernel frame on its
//!   interrupt stack or current task's stack, else the task's next user operation, else idle;
//!   for a vCPU outside the guest, the next step of its host code, `vcpu_run`);
//! * `Interrupt(cpu)` — take a pending IPI (enabled when the CPU has interrupts on);
//! * `Drain(cpu)` — under TSO, the oldest buffered store reaches memory;
//! * `Fill(cpu, page)` — the hardware walker speculatively caches a translation of a page
//!   through whatever CR3 the CPU has loaded (lazy CPUs included);
//! * with a host, CPUs are vCPUs and the host acts on them: `VcpuPut(v)` (the host preempts
//!   vCPU `v`) and, explorer only, `VcpuIoctl(v)` (a load/put pair without entering the guest).

use crate::counters::Counters;
use crate::host::{Host, HostConfig};
use crate::mem::MemoryModel;
use crate::mem::{call_queue_line, csd_line, flush_info_line, percpu_line, PerCpuLine};
use crate::options::Options;
use crate::perf::{Peer, Perf};
use crate::state::*;
use shootdown_engine::{
    prefetch, Components, Env, HashCached, Interner, Lead, Model, Outcome, Park, StepKind, Time,
    Unhashed, Violation,
};
use shootdown_hw::oracle::Oracle;
use shootdown_hw::pagetable::{PtPages, Vpn};
use shootdown_hw::tlb::Tlb;
use shootdown_hw::{CostProfile, CpuId, Topology};
use std::collections::BTreeMap;
use std::hash::Hash;
use std::sync::Arc;

/// An explorer/timed-driver action.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Action {
    Step(u32),
    Interrupt(u32),
    Drain(u32),
    Fill(u32, u32),
    /// Host: preempt vCPU `v` (VM exit, `vcpu_put`, `kvm_steal_time_set_preempted`).
    VcpuPut(u32),
    /// Host (explorer only): `vcpu_load` + `vcpu_put` of a preempted vCPU without entering.
    VcpuIoctl(u32),
    /// Host: a pending kick IPI reaches vCPU `v`'s pCPU: a VM exit if it runs the guest, else
    /// (host interrupts on) `ack_flush`.
    HostIrq(u32),
}

#[derive(Debug, PartialEq, Eq)]
pub struct Machine {
    pub opts: Options,
    pub topo: Topology,
    pub pcid_hw: bool,
    pub pti: bool,
    pub invpcid: bool,
    pub memory_model: MemoryModel,
    /// CPUs, tasks, mms, EPT pages and the oracle (and the host's vCPUs, KVMs and threads) are
    /// [`HashCached`]: shared copy-on-write between states, with their fingerprint digests, so
    /// a successor the explorer builds copies and rehashes only those its step changed.
    pub cpus: Vec<HashCached<Cpu>>,
    pub tasks: Vec<HashCached<Task>>,
    pub mms: Vec<HashCached<Mm>>,
    pub pt_pages: PtPages,
    /// EPT page-table memory of every VM with a KVM MMU.
    pub ept: shootdown_hw::ept::EptMemory,
    pub oracle: HashCached<Oracle>,
    /// Locked `call_single_data`s.
    pub csd_locked: CsdLocks,
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
    /// The host under the guests: None for a native machine (`host/`, `kvm/`).
    pub host: Option<Box<Host>>,
    /// Guest memory words boot scripts lock and meet on (`boot.rs`), and the guest page of each.
    pub guest_words: Vec<u64>,
    pub guest_word_pages: Vec<Option<u64>>,
    pub perf: Unhashed<Perf>,
}

shootdown_engine::state_fields!(Machine {
    cpus,
    tasks,
    mms,
    pt_pages,
    ept,
    oracle,
    csd_locked,
    flush_info,
    spec_pages,
    dax_files,
    dax_index,
    fileio,
    next_pfn,
    host,
    guest_words,
    guest_word_pages,
    perf,
} fixed {
    opts,
    topo,
    pcid_hw,
    pti,
    invpcid,
    memory_model,
});

impl Machine {
    /// Every [`HashCached`] component of the state, to `v`.
    fn visit_components(&mut self, v: &mut impl Components) {
        fn each<T: Clone + Hash + Send + Sync + 'static>(
            v: &mut impl Components,
            list: &mut [HashCached<T>],
        ) {
            list.iter_mut()
                .enumerate()
                .for_each(|(i, c)| v.component(i, c));
        }
        each(v, &mut self.cpus);
        each(v, &mut self.tasks);
        each(v, &mut self.mms);
        each(v, &mut self.ept.pages);
        v.component(0, &mut self.oracle);
        if let Some(h) = &mut self.host {
            each(v, &mut h.vcpus);
            each(v, &mut h.kvms);
            each(v, &mut h.threads);
        }
    }

    /// Forget every remembered component digest ([`HashCached`]), so that the next
    /// fingerprint is computed from scratch (tests compare it with the remembered one).
    pub fn forget_digests(&mut self) {
        struct Forget;
        impl Components for Forget {
            fn component<T: Clone + Hash + Send + Sync + 'static>(
                &mut self,
                _: usize,
                c: &mut HashCached<T>,
            ) {
                c.forget();
            }
        }
        self.visit_components(&mut Forget);
    }

    /// The performance state of this machine at time zero, before any step: what a stored
    /// explorer state's stands for ([`Perf::stow`]). It depends only on what is fixed for the
    /// run (the CPUs, the topology, the host's configuration), so every state of the run
    /// gives the same one.
    fn blank_perf(&self) -> Perf {
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
            mms: vec![Mm::new(0, n, "init_mm".into()).into()],
            pt_pages: PtPages::default(),
            ept: Default::default(),
            oracle: HashCached::new(Oracle::new(1)),
            csd_locked: CsdLocks::new(n),
            flush_info: vec![None; n],
            spec_pages: Vec::new(),
            dax_files: Vec::new(),
            dax_index: BTreeMap::new(),
            fileio: None,
            next_pfn: 1 << 24,
            host: None,
            guest_words: Vec::new(),
            guest_word_pages: Vec::new(),
            perf: Unhashed(Perf::new(profile.clone(), n, &topo)),
            topo,
        };
        for c in 0..n {
            let idle = m.tasks.len() as TaskId;
            m.tasks.push(HashCached::new(Task {
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
                op_started: None,
                fsync_file: None,
                cpus: Vec::new(),
                on_cpu: true,
            }));
            m.cpus.push(HashCached::new(Cpu {
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
            }));
        }
        m
    }

    /// A machine whose CPUs are the vCPUs of `cfg.vms` VMs on a host with topology `topo`
    /// (the pCPUs). Call `cfg.validate(topo.nr_cpus())` first.
    pub fn with_host(
        topo: Topology,
        profile: Arc<CostProfile>,
        opts: Options,
        memory_model: MemoryModel,
        cfg: HostConfig,
    ) -> Machine {
        let pcpus = topo.nr_cpus();
        let n = cfg.vms * cfg.vcpus_per_vm;
        let mut m = Machine::with_cpus(topo, n, profile, opts, memory_model);
        m.host = Some(Box::new(Host::new(cfg, pcpus)));
        // With the host's scheduling timers.
        m.perf = Unhashed(m.blank_perf());
        m
    }

    pub fn counters(&self) -> &Counters {
        &self.perf.counters
    }

    pub(crate) fn violate(&mut self, v: Violation) {
        if self.perf.violation.is_none() {
            self.perf.violation = Some(v);
        }
    }

    /// The pCPU an agent runs on (a CPU itself without a host; a vCPU's or a host thread's).
    #[inline]
    pub fn phys_cpu(&self, cpu: CpuId) -> CpuId {
        match &self.host {
            None => cpu,
            Some(h) => match h.vcpus.get(cpu) {
                Some(v) => v.pcpu as usize,
                None => h.threads[cpu - self.cpus.len()].pcpu as usize,
            },
        }
    }

    /// Is this CPU running guest code (always, without a host)?
    #[inline]
    pub fn vcpu_in_guest(&self, cpu: CpuId) -> bool {
        match &self.host {
            None => true,
            Some(h) => h.vcpus.get(cpu).is_some_and(|v| v.in_guest()),
        }
    }

    /// Is this vCPU's thread in host code (a frame on its host stack)?
    #[inline]
    pub fn in_host_code(&self, cpu: CpuId) -> bool {
        self.host
            .as_ref()
            .is_some_and(|h| h.vcpus.get(cpu).is_some_and(|v| !v.stack.is_empty()))
    }

    pub(crate) fn host_ref(&self) -> &Host {
        self.host.as_deref().expect("machine has a host")
    }
    pub(crate) fn host_mut(&mut self) -> &mut Host {
        self.host.as_deref_mut().expect("machine has a host")
    }
}

impl Model for Machine {
    type Action = Action;

    fn agents(&self) -> usize {
        self.cpus.len() + self.host.as_ref().map_or(0, |h| h.threads.len())
    }

    fn enabled(&self, out: &mut Vec<Action>) {
        for cpu in 0..self.cpus.len() {
            let c = cpu as u32;
            if self.host.is_some() && !self.vcpu_enabled(cpu, out) {
                if !self.cpus[cpu].sb.is_empty() {
                    out.push(Action::Drain(c));
                }
                continue;
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
        self.host_threads_enabled(out);
    }

    #[inline]
    fn timed_action(&self, agent: usize, now: Time) -> Action {
        if agent >= self.cpus.len() {
            return Action::Step(agent as u32);
        }
        if self.host.is_some() {
            if let Some(a) = self.vcpu_timed_action(agent, now) {
                return a;
            }
        }
        if self.cpus[agent].ipi_pending
            && now >= self.perf.cpu[agent].ipi_arrival
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
            | Action::VcpuIoctl(c)
            | Action::HostIrq(c) => c as usize,
        }
    }

    #[inline]
    fn apply<E: Env>(&mut self, a: Action, env: &mut E) -> Outcome {
        if self.perf.stowed.is_some() {
            // A stored explorer state stepped in place (the searches step copies, which
            // are whole): its steps write the arrays it left to the blank.
            self.perf.unstow();
        }
        if self.host.is_some() && env.timed() {
            return self.apply_on_host(a, env);
        }
        self.apply_step(a, env)
    }

    fn describe(&self, a: Action) -> String {
        crate::describe::describe(self, a)
    }

    fn agent_name(&self, agent: usize) -> String {
        if agent >= self.cpus.len() {
            self.host_ref().threads[agent - self.cpus.len()]
                .name
                .clone()
        } else if self.host.is_some() {
            format!("vcpu{agent}")
        } else {
            format!("cpu{agent}")
        }
    }

    fn finished(&self) -> bool {
        self.perf.user_tasks_alive == 0 && self.perf.host_threads_alive == 0
    }

    fn intern(&mut self, interner: &Interner) {
        struct Intern<'a>(&'a Interner);
        impl Components for Intern<'_> {
            fn component<T: Clone + Hash + Send + Sync + 'static>(
                &mut self,
                index: usize,
                c: &mut HashCached<T>,
            ) {
                self.0.intern(index, c);
            }
        }
        self.visit_components(&mut Intern(interner));
        let blank = interner.constant(|| self.blank_perf());
        self.perf.stow(blank);
    }

    /// Two steps ahead: the CPU's first lines (what `timed_action` and the stack code read
    /// first), its performance line and its frame hint. One step ahead: through the CPU, now
    /// cached, its current task; through the hint its last step left
    /// ([`crate::perf::FrameHint`]), its top frame (of the interrupt stack, else of the
    /// task's) and what the frame's walk over other CPUs reads next. (The interrupt stack's
    /// top was also fetched through the CPU, a load the hint already answers: 4 % slower.)
    fn prefetch(&self, agent: usize, lead: Lead) {
        let Some(c) = self.cpus.get(agent) else {
            return;
        };
        match lead {
            Lead::Two => {
                let p: *const Cpu = &**c;
                prefetch(p);
                prefetch(p.cast::<u8>().wrapping_add(64));
                prefetch(&self.perf.cpu[agent]);
                if let Some(h) = self.perf.frames.get(agent) {
                    prefetch(h);
                }
                let lines = &self.perf.lines;
                lines.prefetch(percpu_line(agent, PerCpuLine::Tlbstate0));
                lines.prefetch(percpu_line(agent, PerCpuLine::CallQueue));
            }
            Lead::One => {
                if let Some(t) = self.tasks.get(c.curr as usize) {
                    let p: *const Task = &**t;
                    prefetch(p);
                }
                // The hint's line is cached: it was fetched two steps ahead.
                if let Some(h) = self.perf.frames.get(agent) {
                    h.prefetch();
                    if let Some(peer) = h.peer.get() {
                        self.prefetch_peer(agent, peer);
                    }
                }
            }
        }
    }
}

impl Machine {
    /// What `agent`'s next step reads about `peer` ([`crate::perf::FrameHint`]): a target's
    /// `struct Cpu` (its `call_single_queue` in the first line, `cpu_tlbstate` in the next
    /// two) and the directory's entries for its lines, or a sender's `flush_tlb_info`; and
    /// their csd's lock bit and line.
    fn prefetch_peer(&self, agent: CpuId, peer: Peer) {
        let n = self.cpus.len();
        let lines = &self.perf.lines;
        let k = match peer {
            Peer::Target(t) => {
                let Some(c) = self.cpus.get(t) else { return };
                let p: *const Cpu = &**c;
                for off in [0, 64, 128] {
                    prefetch(p.cast::<u8>().wrapping_add(off));
                }
                // What cond_func reads (`loaded_mm`, and `is_lazy` in either of the lines it
                // has had; `line_of` is a match over every location, too slow here), then
                // llist_add's line.
                for kind in [PerCpuLine::Tlbstate0, PerCpuLine::TlbstateShared] {
                    // Every flushing CPU reads these lines: the bit that says whether
                    // `agent` holds a copy is in a word of its own.
                    lines.prefetch(percpu_line(t, kind));
                    lines.prefetch_sharer(percpu_line(t, kind), agent);
                }
                lines.prefetch(call_queue_line(t));
                CsdKey { src: agent, dst: t }
            }
            Peer::Sender(s) => {
                let Some(info) = self.flush_info.get(s) else {
                    return;
                };
                prefetch(info);
                lines.prefetch(flush_info_line(s));
                lines.prefetch_sharer(flush_info_line(s), agent);
                CsdKey { src: s, dst: agent }
            }
        };
        if k.src < n && k.dst < n {
            lines.prefetch(csd_line(n, k));
            self.csd_locked.prefetch(k);
        }
    }
}

impl Machine {
    /// Run one action: dispatch to the concept that implements it, with the timed driver's
    /// accounting of interruptible work and SMT sharing around guest and native steps.
    pub(crate) fn apply_step<E: Env>(&mut self, a: Action, env: &mut E) -> Outcome {
        if let Action::Step(c) = a {
            let c = c as usize;
            if c >= self.cpus.len() {
                return self.step_host_thread(c, env);
            }
            if self.in_host_code(c) {
                return self.step_host(c, env);
            }
            if !self.vcpu_in_guest(c) {
                // Timed driver: a blocked vCPU thread does nothing.
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
            Action::VcpuIoctl(c) => (self.vcpu_ioctl_step(c as usize, env), StepKind::Shared),
            Action::HostIrq(c) => (self.host_irq(c as usize, env), StepKind::Shared),
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
                env.wake(c, self.perf.cpu[c].ipi_arrival);
            }
            // Likewise a host kick on its way to a vCPU that parks (the wake its sender asked
            // for may have been merged into an earlier one of this agent).
            if timed && c < self.cpus.len() && self.host.is_some() && self.kick_deliverable(c) {
                env.wake(c, self.perf.cpu[c].kick_arrival);
            }
        }
        Outcome {
            park,
            kind,
            violation: self.perf.violation.take(),
        }
    }
}

//! The whole simulated machine — CPUs, tasks, mms, page-table memory, the oracle, and the host
//! with its vCPUs — and the [`Model`] implementation through which both drivers run it. This
//! file only holds the state and dispatches; each concept lives in its own file (`setup.rs`
//! builds the machine, `stack.rs` runs frames, `apic.rs` delivers IPIs, `busy.rs` accounts
//! interruptible work, `host/` and `kvm/` are the host and its side of KVM, `components.rs`
//! shares the state's components between explorer states, `prefetch.rs` gives the timed
//! driver its prefetch hints, …).
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

use crate::host::Host;
use crate::mem::MemoryModel;
use crate::options::Options;
use crate::perf::Perf;
use crate::state::*;
use shootdown_engine::{
    Env, HashCached, Interner, Lead, Model, Outcome, Park, StepKind, Time, Unhashed,
};
use shootdown_hw::oracle::Oracle;
use shootdown_hw::pagetable::{PtPages, Vpn};
use shootdown_hw::Topology;
use std::collections::BTreeMap;

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
    /// Host: vCPU `v`'s guest PAUSE loop ran out its window: `handle_pause`, directed yield,
    /// and back into the guest (the yield that gives the pCPU away is `VcpuPut`).
    PleExit(u32),
    /// An NMI reaches CPU `c` (`nmi.rs`): perf's handler samples the interrupted task's user
    /// stack, interrupts on or off.
    Nmi(u32),
    /// LATR: CPU `c`'s scheduler tick drains the saved flushes that name it (`latr.rs`).
    Tick(u32),
}

#[derive(Debug, PartialEq, Eq)]
pub struct Machine {
    pub opts: Options,
    pub topo: Topology,
    pub pcid_hw: bool,
    pub pti: bool,
    pub invpcid: bool,
    /// The CPU's INVLPG may miss Global entries while PCIDs are on (`Features`).
    pub invlpg_miss_global: bool,
    /// AMD's INVLPGB and TLBSYNC, with the pages one INVLPGB may name (`Features`).
    pub invlpgb: bool,
    pub invlpgb_count_max: u16,
    /// The global ASID allocator (`global_asid.rs`; under `global_asid_lock`).
    pub global_asids: crate::global_asid::GlobalAsids,
    pub memory_model: MemoryModel,
    /// NMIs may arrive (a scenario's `[[nmi]]`, or `perf_sample_hz`): `switch_mm_irqs_off`
    /// then publishes `loaded_mm` in a step of its own after the CR3 write, a window only an
    /// NMI on the switching CPU can see (`nmi.rs`).
    pub nmis_possible: bool,
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
    /// What each sender's queued csds run (`csd->func`; `smp.rs`).
    pub cfd_func: Vec<crate::smp::CallFunc>,
    /// Pages the explorer lets the walker fill speculatively: (mm, vpn).
    pub spec_pages: Vec<(MmId, Vpn)>,
    /// Files on a DAX filesystem mapped into mms (fdatasync writes back their dirty entries).
    pub dax_files: Vec<DaxFile>,
    /// `(mm, start) -> index into dax_files`, to find the file a fault address belongs to.
    pub dax_index: BTreeMap<(MmId, Vpn), u32>,
    /// Files mapped into mms through VMAs (`vma.rs`): their page cache, `i_mmap` and size.
    pub files: Vec<crate::vma::File>,
    /// Pipes between tasks (`pipe.rs`): hackbench's.
    pub pipes: Vec<crate::pipe::Pipe>,
    /// sysbench fileio's process-wide request generator, if a workload uses one.
    pub fileio: Option<FileioGen>,
    /// Last fresh page frame number handed out (`page_alloc.rs`).
    pub next_pfn: u32,
    /// Frames freed and not reused yet (`page_alloc.rs`).
    pub free_frames: crate::page_alloc::FreeFrames,
    /// The host under the guests: None for a native machine (`host/`, `kvm/`).
    pub host: Option<Box<Host>>,
    /// Guest memory words boot scripts lock and meet on (`boot.rs`), and the guest page of each.
    pub guest_words: Vec<u64>,
    pub guest_word_pages: Vec<Option<u64>>,
    /// Guest (or native) kernel spinlocks (`spinlock.rs`): each kernel's `lru_lock` and
    /// `zone->lock` (`page_lists.rs`).
    pub kernel_locks: Vec<crate::spinlock::QueuedSpinlock>,
    /// Per CPU: its page allocator and LRU lists (`page_lists.rs`).
    pub page_lists: Vec<crate::page_lists::PageLists>,
    /// LATR's saved flushes (`latr.rs`).
    pub latr: crate::latr::LatrStates,
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
    cfd_func,
    spec_pages,
    dax_files,
    dax_index,
    files,
    pipes,
    fileio,
    next_pfn,
    free_frames,
    host,
    guest_words,
    guest_word_pages,
    kernel_locks,
    page_lists,
    latr,
    global_asids,
    perf,
} fixed {
    opts,
    topo,
    pcid_hw,
    pti,
    invpcid,
    invlpg_miss_global,
    invlpgb,
    invlpgb_count_max,
    memory_model,
    nmis_possible,
});

impl Model for Machine {
    type Action = Action;

    fn agents(&self) -> usize {
        self.cpus.len() + self.host.as_ref().map_or(0, |h| h.threads.len())
    }

    fn enabled(&self, out: &mut Vec<Action>) {
        for cpu in 0..self.cpus.len() {
            let first = out.len();
            self.cpu_enabled(cpu, out);
            if self.shadow_paging(cpu) {
                // A step that would take `mmu_lock` while a host thread holds or waits for it
                // spins instead (`shadow.rs`).
                let mut i = first;
                while i < out.len() {
                    if self.shadow_step_waits(out[i]) {
                        out.remove(i);
                    } else {
                        i += 1;
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
        if self.nmi_due(agent, now) {
            return Action::Nmi(agent as u32);
        }
        if self.latr_tick_due(agent, now) {
            return Action::Tick(agent as u32);
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
            | Action::HostIrq(c)
            | Action::PleExit(c)
            | Action::Nmi(c)
            | Action::Tick(c) => c as usize,
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
        self.name_mms(&crate::describe::describe(self, a))
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
        self.intern_components(interner);
    }

    /// Fetch ahead what `agent`'s next steps read (`prefetch.rs`).
    fn prefetch(&self, agent: usize, lead: Lead) {
        self.prefetch_ahead(agent, lead);
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
            Action::PleExit(c) => (self.ple_exit_step(c as usize, env), StepKind::Shared),
            Action::Step(c) => (self.step_cpu(c as usize, env), StepKind::Shared),
            Action::Interrupt(c) => (self.take_interrupt(c as usize, env), StepKind::Shared),
            Action::Nmi(c) => (self.take_nmi(c as usize, env), StepKind::Shared),
            Action::Tick(c) => {
                self.take_latr_tick(c as usize, env);
                (Park::Run, StepKind::Shared)
            }
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
            // Likewise a host kick on its way to a vCPU that parks.
            self.wake_for_kick(c, env);
            // A spinning CPU's cycles count: perf's next sample interrupts it.
            if timed && matches!(park, Park::Spin | Park::SpinOn(_)) {
                self.wake_for_nmi(c, env);
            }
            if timed {
                self.wake_for_tick(c, env);
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
    /// The actions of CPU (vCPU) `cpu` in this state.
    fn cpu_enabled(&self, cpu: usize, out: &mut Vec<Action>) {
        let c = cpu as u32;
        if self.host.is_some() && !self.vcpu_enabled(cpu, out) {
            if !self.cpus[cpu].sb.is_empty() {
                out.push(Action::Drain(c));
            }
            return;
        }
        if self.cpus[cpu].ipi_pending && self.irqs_enabled(cpu) {
            out.push(Action::Interrupt(c));
        }
        if self.cpus[cpu].nmis_left > 0 {
            out.push(Action::Nmi(c));
        }
        if self.latr_tick_enabled(cpu) {
            out.push(Action::Tick(c));
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

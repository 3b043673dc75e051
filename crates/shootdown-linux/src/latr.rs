//! LATR, lazy translation coherence (Kumar et al., ASPLOS'18), as its released artifact
//! implements it on Linux 4.10 (`sslab-gatech/latr`: `native_flush_tlb_others`,
//! `native_flush_save_state`, `native_flush_saved_states`, `tlb_flush_mmu_free`), on top of
//! this model's mainline flush code. A research design, never merged: option `latr`, off by
//! default (`docs/designs.md`).
//!
//! * **Saving instead of IPIs.** A flush that `munmap` or `madvise(MADV_DONTNEED)` asks for
//!   (the artifact's `mm->munmap_inprogress`) flushes the initiating CPU as before, but instead
//!   of IPIing the other CPUs of `mm_cpumask` it saves a *LATR state* — the flush's
//!   `flush_tlb_info` and the CPUs still to flush — and returns at once. Every other flush
//!   (mprotect, copy-on-write, reclaim's batch, kernel ranges) keeps its IPIs. A full ring (256
//!   states per initiating CPU) falls back to IPIs.
//! * **Draining.** Each CPU, at its scheduler tick, runs `flush_tlb_func()` for every saved
//!   state that names it and removes itself from the state ([`Action::Tick`]). Until then it
//!   may go on using the translations the call removed: LATR's contract lets user code touch
//!   memory it unmapped for up to a tick, so the system call returns without `INV-SYSRET`'s
//!   promise.
//! * **Reuse.** What keeps this safe is that nothing the call freed is reused while a CPU may
//!   still hold its translation. `latr = "lazy_free"` (the artifact's `LAZY_MEM_FREE`) hands
//!   the call's gathered pages and page tables to the state, which frees them when its last CPU
//!   has drained it; `latr = "latr"` is the artifact's default configuration
//!   (`LAZY_MEM_FREE=n`), which frees them as soon as the call returns — `INV-FREEPAGE` then
//!   catches the reuse.
//!
//! Simplified: only the tick drains (the artifact also drains before each context switch, and
//! a 1 s background thread IPIs CPUs still named after two passes; every modelled CPU ticks,
//! idle or not, so neither backstop is needed); `lazy_free` frees when the state is drained,
//! where the artifact waits a fixed `2 * HZ`; the state's CPUs are the `mm_cpumask` the flush
//! read, without the lazy filter of the IPIs it replaces.
//!
//! [`Action::Tick`]: crate::machine::Action::Tick

use crate::counters::Counter;
use crate::frame::{Flow, Frame};
use crate::machine::Machine;
use crate::options::Latr;
use crate::page_alloc::FrameRun;
use crate::state::{FlushTlbInfo, MmId};
use crate::tlb::FlushFunc;
use shootdown_engine::trace::TraceEvent;
use shootdown_engine::{Env, Time};
use shootdown_hw::pagetable::PtPageId;
use shootdown_hw::CpuId;

/// The artifact's ring size (`shootdown_entries_t`: 256 states per initiating CPU).
pub const LATR_RING: usize = 256;

/// The scheduler tick (HZ = 250).
pub const TICK: Time = Time::from_ns(4_000_000);

/// A `struct cpumask`: one bit per CPU (a state may name thousands).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct CpuMask(Vec<u64>);

impl CpuMask {
    pub fn from_cpus(cpus: &[CpuId]) -> CpuMask {
        let mut m = CpuMask::default();
        for &c in cpus {
            let w = c / 64;
            if m.0.len() <= w {
                m.0.resize(w + 1, 0);
            }
            m.0[w] |= 1 << (c % 64);
        }
        m
    }
    pub fn test(&self, c: CpuId) -> bool {
        self.0.get(c / 64).is_some_and(|w| w & (1 << (c % 64)) != 0)
    }
    /// `cpumask_clear_cpu`; returns whether the bit was set.
    pub fn clear_cpu(&mut self, c: CpuId) -> bool {
        let set = self.test(c);
        if set {
            self.0[c / 64] &= !(1 << (c % 64));
        }
        set
    }
    pub fn is_empty(&self) -> bool {
        self.0.iter().all(|&w| w == 0)
    }
    /// The CPUs set, in order.
    pub fn cpus(&self) -> Vec<CpuId> {
        (0..self.0.len() * 64).filter(|&c| self.test(c)).collect()
    }
}

/// One saved flush (the artifact's `lazytlb_shootdown_t`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct LatrState {
    /// The CPU that saved it (whose ring holds it).
    pub initiator: CpuId,
    pub mm: MmId,
    pub info: FlushTlbInfo,
    /// CPUs that have not drained it yet (`cpu_mask`).
    pub cpus: CpuMask,
    /// `lazy_free`: what the call freed, held until the state is drained (then checked
    /// against every TLB: no epoch needed).
    pub frames: Vec<FrameRun>,
    pub tables: Vec<PtPageId>,
}

/// The scheduler tick's `native_flush_saved_states()` on one CPU: an interrupt handler.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct LatrTick {
    pub pc: LatrTickPc,
    /// The states naming this CPU when the tick came, by key in `Machine::latr` (a flush's
    /// begin epoch: unique), still to drain; the last one is running.
    pub todo: Vec<u64>,
    /// The tick arrived in user mode (timed runs only: it prices the return).
    pub from_user: bool,
}

/// The steps of a tick's drain.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LatrTickPc {
    /// Find the next saved state naming this CPU and run its `flush_tlb_func()` (or return
    /// from the interrupt).
    Next,
    /// Its flush returned: `cpumask_clear_cpu(self)`; the last CPU frees what it holds.
    Done,
}

/// LATR's saved states: every CPU's ring, keyed by the flush's begin epoch, with the counts
/// the hot paths ask for (how many states name each CPU, how many each CPU's ring holds).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct LatrStates {
    /// Keyed by the begin epoch of the saved flush (unique per flush).
    pub states: std::collections::BTreeMap<u64, LatrState>,
    pub named: Vec<u32>,
    pub ring: Vec<u32>,
}

impl LatrStates {
    /// No state saved, on a machine of `cpus` CPUs.
    pub fn new(cpus: usize) -> LatrStates {
        LatrStates {
            states: Default::default(),
            named: vec![0; cpus],
            ring: vec![0; cpus],
        }
    }
}

impl Machine {
    /// Should `flush_tlb_mm_range()` save this flush for LATR (a munmap/madvise flush, LATR
    /// on, room in the initiator's ring)?
    pub(crate) fn latr_saves(&self, cpu: CpuId, lazy_call: bool) -> bool {
        lazy_call && self.opts.latr != Latr::Off && (self.latr.ring[cpu] as usize) < LATR_RING
    }

    /// `native_flush_save_state()`: save the flush for `targets` instead of IPIing them. With
    /// `lazy_free`, the calling task's gathered pages (and a munmap's unlinked page tables)
    /// move into the state.
    pub(crate) fn latr_save(
        &mut self,
        cpu: CpuId,
        info: FlushTlbInfo,
        begin: u64,
        targets: Vec<CpuId>,
    ) {
        let mm = info.mm.expect("a LATR flush names its mm");
        let t = self.cpus[cpu].curr as usize;
        self.tasks[t].latr_saved = true;
        let (frames, tables) = if self.opts.latr == Latr::LazyFree {
            (
                std::mem::take(&mut self.tasks[t].gathered),
                std::mem::take(&mut self.mms[mm as usize].tables_to_free),
            )
        } else {
            (Vec::new(), Vec::new())
        };
        self.perf.counters.inc(Counter::LatrSaved);
        self.summary(|| {
            format!("native_flush_save_state: mm{mm}'s flush saved for cpus {targets:?}, no IPI")
        });
        let l = &mut self.latr;
        l.ring[cpu] += 1;
        for &c in &targets {
            l.named[c] += 1;
        }
        l.states.insert(
            begin,
            LatrState {
                initiator: cpu,
                mm,
                info,
                cpus: CpuMask::from_cpus(&targets),
                frames,
                tables,
            },
        );
    }

    /// Does a saved state name `cpu` (its tick has a flush to run)?
    pub(crate) fn latr_pending(&self, cpu: CpuId) -> bool {
        self.latr.named[cpu] > 0
    }

    /// The checker: may a tick interrupt `cpu` now (a state names it, interrupts are on)?
    pub(crate) fn latr_tick_enabled(&self, cpu: CpuId) -> bool {
        self.opts.latr != Latr::Off && self.irqs_enabled(cpu) && self.latr_pending(cpu)
    }

    /// The timed driver: is `cpu`'s tick due, with a state to drain?
    pub(crate) fn latr_tick_due(&self, cpu: CpuId, now: Time) -> bool {
        self.opts.latr != Latr::Off
            && now >= self.perf.cpu[cpu].next_tick
            && self.irqs_enabled(cpu)
            && self.latr_pending(cpu)
            && (self.host.is_none() || self.vcpu_in_guest(cpu))
    }

    /// The timed driver: a CPU that parks (spins, halts, or does interruptible work) wakes
    /// for its next tick while a saved state names it.
    pub(crate) fn wake_for_tick<E: Env>(&self, cpu: CpuId, env: &mut E) {
        if self.opts.latr != Latr::Off && cpu < self.cpus.len() && self.latr_pending(cpu) {
            env.wake_by(cpu, self.perf.cpu[cpu].next_tick);
        }
    }

    /// The timer interrupt: enter `scheduler_tick()`'s drain.
    pub(crate) fn take_latr_tick<E: Env>(&mut self, cpu: CpuId, env: &mut E) {
        let from_user = env.timed() && !self.in_kernel_mode(cpu);
        let was_halted = std::mem::replace(&mut self.cpus[cpu].halted, false);
        if env.timed() {
            let t = self.irq_entry_time(from_user, was_halted);
            env.charge(t);
            let next = self.perf.cpu[cpu].next_tick + TICK;
            self.perf.cpu[cpu].next_tick = next.max(env.now() + TICK);
            if env.tracing() {
                env.trace(TraceEvent::Instant {
                    agent: cpu,
                    name: "LATR tick",
                    detail: None,
                });
            }
        }
        self.perf.counters.inc(Counter::LatrTicks);
        self.cpus[cpu].irq_stack.push(Frame::LatrTick(LatrTick {
            pc: LatrTickPc::Next,
            todo: self
                .latr
                .states
                .iter()
                .rev()
                .filter(|(_, st)| st.cpus.test(cpu))
                .map(|(&k, _)| k)
                .collect(),
            from_user,
        }));
    }

    /// One step of a tick's drain.
    pub(crate) fn latr_tick_step<E: Env>(
        &mut self,
        cpu: CpuId,
        s: &mut LatrTick,
        env: &mut E,
    ) -> Flow {
        match s.pc {
            LatrTickPc::Next => {
                // The next state still naming this CPU (a mutant may have retired one).
                while s
                    .todo
                    .last()
                    .is_some_and(|k| !self.latr.states.get(k).is_some_and(|st| st.cpus.test(cpu)))
                {
                    s.todo.pop();
                }
                let Some(&key) = s.todo.last() else {
                    if env.timed() {
                        let t = self.irq_exit_time(s.from_user);
                        env.charge(t);
                    }
                    self.summary(|| "tick: no saved flush left for this CPU; return".into());
                    return Flow::Return;
                };
                s.pc = LatrTickPc::Done;
                let st = &self.latr.states[&key];
                let (src, mm, info) = (st.initiator, st.mm, st.info);
                self.summary(|| {
                    format!("tick: flush_tlb_func for cpu{src}'s saved flush of mm{mm}")
                });
                self.perf.counters.inc(Counter::LatrFlushes);
                Flow::Call(FlushFunc::call(info, true))
            }
            LatrTickPc::Done => {
                // Only this CPU's drain removes it from the mask, so the state is still there
                // (unless a mutant retired it early).
                if let Some(key) = s.todo.pop() {
                    if self.latr.states.contains_key(&key) {
                        self.latr_drained(cpu, key);
                    }
                }
                s.pc = LatrTickPc::Next;
                Flow::Next
            }
        }
    }

    /// `cpu` has drained state `i`: it leaves the state's mask (`cpumask_clear_cpu`); the last
    /// CPU retires the state (`valid = 0`): the flush has now reached every CPU it named, and
    /// what the state holds is freed.
    fn latr_drained(&mut self, cpu: CpuId, key: u64) {
        let l = &mut self.latr;
        let st = l.states.get_mut(&key).expect("a live state");
        let cleared = if self.opts.mutants.latr_drain_clears_whole_mask() {
            st.cpus.cpus()
        } else {
            vec![cpu]
        };
        for c in cleared {
            if st.cpus.clear_cpu(c) {
                l.named[c] -= 1;
            }
        }
        if !st.cpus.is_empty() {
            self.summary(|| "tick: flushed; cpumask_clear_cpu(self) in the saved state".into());
            return;
        }
        self.summary(|| "tick: flushed; last CPU of the saved state: valid = 0".into());
        let l = &mut self.latr;
        let st = l.states.remove(&key).expect("a live state");
        l.ring[st.initiator] -= 1;
        // The flush has now reached every CPU it named: it returned, as of its begin epoch.
        let range =
            (st.info.end != crate::state::TLB_FLUSH_ALL).then_some((st.info.start, st.info.end));
        self.oracle.flush_returned(st.mm, range, key);
        if !st.frames.is_empty() {
            let n: u32 = st.frames.iter().map(|f| f.1).sum();
            self.say(|| format!("LATR state drained everywhere: free its {n} page(s)"));
            // As tlb_flush_mmu_free() would have: not the zero page, not a file's pages.
            let frames = crate::page_alloc::without_zero_page(st.frames);
            let frames = self.drop_file_refs(frames);
            self.free_frames_checked(frames);
        }
        for t in &st.tables {
            self.pt_pages.free(*t);
        }
    }

    /// Is the task on `cpu` returning from a call whose flush LATR saved? (Clears the mark.)
    pub(crate) fn latr_take_saved(&mut self, cpu: CpuId) -> bool {
        let t = self.cpus[cpu].curr as usize;
        std::mem::take(&mut self.tasks[t].latr_saved)
    }

    /// Rename the CPUs of the saved states (symmetry reduction).
    pub(crate) fn rename_latr(&mut self, pc: &dyn Fn(CpuId) -> CpuId) {
        let l = &mut self.latr;
        for st in l.states.values_mut() {
            st.initiator = pc(st.initiator);
            st.info.initiator = pc(st.info.initiator);
            let renamed: Vec<CpuId> = st.cpus.cpus().into_iter().map(pc).collect();
            st.cpus = CpuMask::from_cpus(&renamed);
        }
        let (named, ring) = (l.named.clone(), l.ring.clone());
        for c in 0..named.len() {
            l.named[pc(c)] = named[c];
            l.ring[pc(c)] = ring[c];
        }
    }
}

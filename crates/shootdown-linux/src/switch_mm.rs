//! `switch_mm_irqs_off()` and `enter_lazy_tlb()` in each version of docs/design/kernel-model.md §1.5–1.6.
//!
//! The ordering every version must keep (and the mutants break): **set our bit in
//! `mm_cpumask(next)` → read `next->context.tlb_gen` → CR3 write**, pairing with the flusher's
//! **PTE write → atomic `tlb_gen` increment → read `mm_cpumask`** — a store-buffer pattern in
//! which at least one side must see the other.

use crate::frame::{Flow, Frame};
use crate::global_asid::is_global_asid;
use crate::machine::Machine;
use crate::mem::{tlbstate_ctx_line, tlbstate_line, Loc, TLBSTATE_ASID_OFFSET};
use crate::options::LazyTlb;
use crate::state::*;
use shootdown_engine::Env;
use shootdown_hw::CpuId;

/// `switch_mm_irqs_off(prev, next)`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SwitchMm {
    pub pc: SwitchMmPc,
    pub next: MmId,
    pub prev: u64,
    pub was_lazy: bool,
    pub gen: u64,
    pub asid: u16,
    pub need_flush: bool,
}

/// The steps of `switch_mm_irqs_off()`; their order depends on the version (and on the
/// `switch_mm_gen_before_cpumask` mutant):
/// * v4.12: `Start` → `ReadGen` → `JoinNext` → `LoadCr3` → `ClearPrev`;
/// * seed 002 (`tlb_gen`): `Start` → `LeavePrev` → `JoinNext` → `ReadGen` → `LoadCr3`;
/// * v4.20+ (`is_lazy`, `v6_13`, `v6_17`, mainline): the same, `LeavePrev` announcing
///   `LOADED_MM_SWITCHING` from v6.13's form on;
/// * returning to the same mm from lazy mode: `Start` → `CatchUp` (→ `LoadCr3`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SwitchMmPc {
    /// Read `loaded_mm` (and `is_lazy`); same mm: nothing to do, or catch up.
    Start,
    /// Same mm, leaving lazy mode: did we miss a flush?
    CatchUp,
    /// Leave the previous mm: clear our bit in its cpumask (or, v6.13+, announce
    /// `LOADED_MM_SWITCHING` and keep it).
    LeavePrev,
    /// Join `next`: set our bit in its cpumask (v6.13+: only if clear; mainline: else
    /// `smp_mb()`).
    JoinNext,
    /// Read `next->context.tlb_gen` (and choose the ASID).
    ReadGen,
    /// Record the ASID slot, write CR3, publish `loaded_mm` (the last in a step of its own,
    /// [`SwitchMmPc::PublishLoadedMm`], when NMIs may arrive).
    LoadCr3,
    /// `this_cpu_write(cpu_tlbstate.loaded_mm, next)` after the CR3 write: a step of its own
    /// only on a machine where NMIs may arrive, the one observer of the window
    /// (`Machine::nmis_possible`; nothing else runs on this CPU in between, and other CPUs
    /// read `loaded_mm`, not CR3).
    PublishLoadedMm,
    /// v4.12: clear our bit in the previous mm's cpumask after the switch.
    ClearPrev,
}

impl SwitchMm {
    /// A call of `switch_mm_irqs_off(…, next)`.
    pub fn call(next: MmId) -> Frame {
        Frame::SwitchMm(SwitchMm {
            pc: SwitchMmPc::Start,
            next,
            prev: 0,
            was_lazy: false,
            gen: 0,
            asid: 0,
            need_flush: false,
        })
    }
}

impl Machine {
    fn bit(&mut self, env: &mut impl Env, cpu: CpuId, mm: MmId) -> bool {
        self.load(env, cpu, Loc::CpumaskBit(mm, cpu as u32)) != 0
    }
    fn set_bit(&mut self, env: &mut impl Env, cpu: CpuId, mm: MmId, on: bool) {
        self.say(|| {
            format!(
                "{} cpu{cpu} in mm_cpumask(mm{mm})",
                if on { "set" } else { "clear" }
            )
        });
        self.rmw(env, cpu, Loc::CpumaskBit(mm, cpu as u32), |_| on as u64);
    }

    /// The common tail: record the ASID slot, write CR3, publish `loaded_mm`. Where NMIs may
    /// arrive the publication is the next step ([`SwitchMmPc::PublishLoadedMm`]): the caller
    /// goes on with [`Machine::after_cr3`].
    fn switch_mm_finish<E: Env>(&mut self, cpu: CpuId, s: &SwitchMm, env: &mut E) {
        let ctx_id = self.mms[s.next as usize].ctx_id;
        let ts = &mut self.cpus[cpu].tlbstate;
        if s.need_flush {
            ts.ctxs[s.asid as usize] = TlbContext {
                ctx_id,
                tlb_gen: s.gen,
            };
        }
        ts.loaded_mm_asid = s.asid;
        if s.prev != s.next as u64 {
            // In-context flushes: a range deferred for the previous mm's ASID must not be
            // taken for the next one's; its bit stays set, and flushes the whole user PCID.
            ts.user_flush_end = TLB_FLUSH_ALL;
        }
        if s.need_flush {
            self.touch_line(env, cpu, tlbstate_ctx_line(cpu, s.asid), true);
        }
        self.touch_line(env, cpu, tlbstate_line(cpu, TLBSTATE_ASID_OFFSET), true);
        self.say(|| {
            format!(
                "CR3 <- mm{} asid {} ({}), ctxs[{}].tlb_gen = {}",
                s.next,
                s.asid,
                if s.need_flush { "flush" } else { "NOFLUSH" },
                s.asid,
                s.gen
            )
        });
        self.load_new_mm_cr3(cpu, s.next, s.asid, s.need_flush, env);
        if !self.nmis_possible {
            self.store(env, cpu, Loc::LoadedMm(cpu as u32), s.next as u64);
        }
    }

    /// After [`Machine::switch_mm_finish`]: `then` (the step's own flow), or first the
    /// `loaded_mm` store as a step of its own where NMIs may arrive.
    fn after_cr3(&self, s: &mut SwitchMm, then: Flow) -> Flow {
        if self.nmis_possible {
            s.pc = SwitchMmPc::PublishLoadedMm;
            Flow::Next
        } else {
            then
        }
    }

    /// [`SwitchMmPc::PublishLoadedMm`]: `loaded_mm = next`, then what follows the CR3 write
    /// (v4.12 clears its bit in the previous mm's cpumask if it switched mms).
    fn publish_loaded_mm<E: Env>(&mut self, cpu: CpuId, s: &mut SwitchMm, env: &mut E) -> Flow {
        self.say(|| format!("loaded_mm = mm{}", s.next));
        self.store(env, cpu, Loc::LoadedMm(cpu as u32), s.next as u64);
        if self.opts.lazy_tlb == LazyTlb::Legacy && s.prev != s.next as u64 {
            s.pc = SwitchMmPc::ClearPrev;
            Flow::Next
        } else {
            Flow::Return
        }
    }

    /// One step of `switch_mm_irqs_off(prev, next)`.
    pub(crate) fn switch_mm_irqs_off_step<E: Env>(
        &mut self,
        cpu: CpuId,
        s: &mut SwitchMm,
        env: &mut E,
    ) -> Flow {
        match self.opts.lazy_tlb {
            LazyTlb::Legacy => self.switch_mm_v412(cpu, s, env),
            LazyTlb::TlbGen => self.switch_mm_tlb_gen(cpu, s, env),
            LazyTlb::IsLazy | LazyTlb::V6_13 | LazyTlb::V6_17 | LazyTlb::Mainline => {
                self.switch_mm_is_lazy(cpu, s, env)
            }
        }
    }

    /// v4.12 (V0): `cpu_tlbstate.state = TLBSTATE_OK`; no PCID; always a flushing CR3 load.
    fn switch_mm_v412<E: Env>(&mut self, cpu: CpuId, s: &mut SwitchMm, env: &mut E) -> Flow {
        let next = s.next;
        use SwitchMmPc::*;
        match s.pc {
            Start => {
                self.cpus[cpu].tlbstate.legacy_lazy = false;
                s.prev = self.load(env, cpu, Loc::LoadedMm(cpu as u32));
                if s.prev == next as u64 {
                    if next == INIT_MM || self.bit(env, cpu, next) {
                        self.say(|| format!("prev == next (mm{next}), bit set: nothing to do"));
                        return Flow::Return;
                    }
                    // We left lazily (bit cleared by leave_mm): rejoin and reload.
                    self.set_bit(env, cpu, next, true);
                    s.asid = 0;
                    s.need_flush = true;
                    s.gen = self.mms[next as usize].tlb_gen;
                    self.switch_mm_finish(cpu, s, env);
                    return self.after_cr3(s, Flow::Return);
                }
                s.pc = ReadGen;
                Flow::Next
            }
            ReadGen => {
                s.gen = self.load(env, cpu, Loc::TlbGen(next));
                self.say(|| format!("loaded_mm = mm{next}; read mm{next}.tlb_gen = {}", s.gen));
                s.pc = JoinNext;
                Flow::Next
            }
            JoinNext => {
                if next != INIT_MM {
                    self.set_bit(env, cpu, next, true);
                } else {
                    self.say(|| "next is init_mm: no mm_cpumask".into());
                }
                s.pc = LoadCr3;
                Flow::Next
            }
            LoadCr3 => {
                s.asid = 0;
                s.need_flush = true;
                self.switch_mm_finish(cpu, s, env);
                s.pc = ClearPrev;
                self.after_cr3(s, Flow::Next)
            }
            PublishLoadedMm => self.publish_loaded_mm(cpu, s, env),
            LeavePrev | CatchUp => unreachable!("v4.12 switch_mm has no {:?} step", s.pc),
            ClearPrev => {
                if s.prev != INIT_MM as u64 {
                    self.set_bit(env, cpu, s.prev as MmId, false);
                }
                Flow::Return
            }
        }
    }

    /// Andy Lutomirski's rework, seed 002 (V1): lazy = not in `mm_cpumask`; on re-entry rejoin the
    /// mask, then compare `tlb_gen` to catch up on missed flushes.
    fn switch_mm_tlb_gen<E: Env>(&mut self, cpu: CpuId, s: &mut SwitchMm, env: &mut E) -> Flow {
        let next = s.next;
        let gen_first = self.opts.mutants.switch_mm_gen_before_cpumask();
        use SwitchMmPc::*;
        match s.pc {
            Start => {
                s.prev = self.load(env, cpu, Loc::LoadedMm(cpu as u32));
                if s.prev == next as u64 {
                    if next == INIT_MM || self.bit(env, cpu, next) {
                        self.say(|| {
                            format!("prev == next (mm{next}), in mm_cpumask: nothing to do")
                        });
                        return Flow::Return;
                    }
                    self.set_bit(env, cpu, next, true);
                    s.pc = CatchUp;
                    return Flow::Next;
                }
                self.say(|| format!("leaving mm{}", s.prev));
                s.pc = LeavePrev;
                Flow::Next
            }
            CatchUp => {
                let g = self.load(env, cpu, Loc::TlbGen(next));
                let asid = self.cpus[cpu].tlbstate.loaded_mm_asid;
                if is_global_asid(asid) {
                    return Flow::Return;
                }
                let local = self.cpus[cpu].tlbstate.ctxs[asid as usize].tlb_gen;
                self.say(|| format!("read mm{next}.tlb_gen = {g} (have {local})"));
                if local < g {
                    s.asid = asid;
                    s.need_flush = true;
                    s.gen = g;
                    self.switch_mm_finish(cpu, s, env);
                    return self.after_cr3(s, Flow::Return);
                }
                Flow::Return
            }
            LeavePrev => {
                if s.prev != INIT_MM as u64 && self.bit(env, cpu, s.prev as MmId) {
                    self.set_bit(env, cpu, s.prev as MmId, false);
                } else {
                    self.say(|| {
                        format!("cpu{cpu} not in mm_cpumask(mm{}): nothing to clear", s.prev)
                    });
                }
                s.pc = if gen_first { ReadGen } else { JoinNext };
                Flow::Next
            }
            JoinNext => {
                if next != INIT_MM {
                    self.set_bit(env, cpu, next, true);
                } else {
                    self.say(|| "next is init_mm: no mm_cpumask".into());
                }
                s.pc = if gen_first { LoadCr3 } else { ReadGen };
                Flow::Next
            }
            ReadGen => {
                s.gen = self.load(env, cpu, Loc::TlbGen(next));
                self.say(|| format!("read mm{next}.tlb_gen = {}", s.gen));
                s.pc = if gen_first { JoinNext } else { LoadCr3 };
                Flow::Next
            }
            ClearPrev => unreachable!("only v4.12 clears the previous mm's bit last"),
            LoadCr3 => {
                let (asid, need_flush) = self.choose_asid(cpu, next, s.gen, env);
                s.asid = asid;
                s.need_flush = need_flush;
                self.switch_mm_finish(cpu, s, env);
                self.after_cr3(s, Flow::Return)
            }
            PublishLoadedMm => self.publish_loaded_mm(cpu, s, env),
        }
    }

    /// v4.20–v6.12 "lazier" (V3, V4 with Nadav's v5.13 changes) and the lazily updated
    /// cpumask of v6.13, v6.17 and mainline (V5): switching away keeps the old mm's bit and
    /// announces `LOADED_MM_SWITCHING` first.
    fn switch_mm_is_lazy<E: Env>(&mut self, cpu: CpuId, s: &mut SwitchMm, env: &mut E) -> Flow {
        let next = s.next;
        let keeps_bit = self.opts.lazy_tlb.trims_lazily();
        let gen_first = self.opts.mutants.switch_mm_gen_before_cpumask();
        use SwitchMmPc::*;
        match s.pc {
            Start => {
                s.prev = self.load(env, cpu, Loc::LoadedMm(cpu as u32));
                s.was_lazy = self.load(env, cpu, Loc::IsLazy(cpu as u32)) != 0;
                if s.was_lazy || !self.opts.is_lazy_write_conditional {
                    self.store(env, cpu, Loc::IsLazy(cpu as u32), 0);
                }
                if s.prev == next as u64 {
                    if next != INIT_MM && self.broadcast_tlb_enabled() {
                        // v6.15+: mm_needs_global_asid(): move to the mm's global ASID (no
                        // flush: INVLPGB keeps it current); on one already, nothing to catch up.
                        let g = self.mm_global_asid(cpu, next, env);
                        let cur = self.cpus[cpu].tlbstate.loaded_mm_asid;
                        if g != 0 && cur != g {
                            s.gen = self.load(env, cpu, Loc::TlbGen(next));
                            s.asid = g;
                            s.need_flush = false;
                            self.say(|| {
                                format!("prev == next (mm{next}) on dynamic ASID {cur}: move to global ASID {g}")
                            });
                            s.pc = LoadCr3;
                            return Flow::Next;
                        }
                        if is_global_asid(cur) {
                            self.say(|| {
                                format!(
                                    "prev == next (mm{next}) on global ASID {cur}: nothing to do"
                                )
                            });
                            return Flow::Return;
                        }
                    }
                    if next == INIT_MM || !s.was_lazy {
                        self.say(|| format!("prev == next (mm{next}), not lazy: nothing to do"));
                        return Flow::Return;
                    }
                    s.pc = CatchUp;
                    return Flow::Next;
                }
                self.say(|| format!("leaving mm{} (was_lazy={})", s.prev, s.was_lazy));
                s.pc = LeavePrev;
                Flow::Next
            }
            CatchUp => {
                // Leaving lazy mode on the same mm: smp_mb(), then did we miss a flush?
                self.fence(cpu);
                let g = self.load(env, cpu, Loc::TlbGen(next));
                let asid = self.cpus[cpu].tlbstate.loaded_mm_asid;
                let local = self.cpus[cpu].tlbstate.ctxs[asid as usize].tlb_gen;
                self.say(|| format!("smp_mb(); read mm{next}.tlb_gen = {g} (have {local})"));
                if local == g {
                    return Flow::Return;
                }
                s.asid = asid;
                s.need_flush = true;
                s.gen = g;
                s.pc = LoadCr3;
                Flow::Next
            }
            LeavePrev => {
                if keeps_bit {
                    // v6.13+: announce SWITCHING first; the old mm keeps our bit (trimmed lazily).
                    self.announce_switching(cpu, env);
                } else if s.prev != INIT_MM as u64 {
                    self.set_bit(env, cpu, s.prev as MmId, false);
                } else {
                    self.say(|| "prev is init_mm: no mm_cpumask bit to clear".into());
                }
                s.pc = if gen_first { ReadGen } else { JoinNext };
                Flow::Next
            }
            JoinNext => {
                if next != INIT_MM {
                    if !keeps_bit || !self.bit(env, cpu, next) {
                        self.set_bit(env, cpu, next, true);
                    } else if !self.switch_mm_skips_barrier() {
                        self.say(|| format!("cpu{cpu} already in mm_cpumask(mm{next}): smp_mb()"));
                        self.fence(cpu);
                    } else {
                        self.say(|| {
                            format!("cpu{cpu} already in mm_cpumask(mm{next}): no barrier")
                        });
                    }
                } else {
                    self.say(|| "next is init_mm: no mm_cpumask".into());
                }
                s.pc = if gen_first { LoadCr3 } else { ReadGen };
                Flow::Next
            }
            ReadGen => {
                s.gen = self.load(env, cpu, Loc::TlbGen(next));
                let (asid, need_flush) = self.choose_asid(cpu, next, s.gen, env);
                s.asid = asid;
                s.need_flush = need_flush;
                self.say(|| format!("read mm{next}.tlb_gen = {}; choose_new_asid -> {asid} (need_flush={need_flush})", s.gen));
                if !keeps_bit {
                    self.announce_switching(cpu, env);
                }
                s.pc = if gen_first { JoinNext } else { LoadCr3 };
                Flow::Next
            }
            ClearPrev => unreachable!("only v4.12 clears the previous mm's bit last"),
            LoadCr3 => {
                self.switch_mm_finish(cpu, s, env);
                self.after_cr3(s, Flow::Return)
            }
            PublishLoadedMm => self.publish_loaded_mm(cpu, s, env),
        }
    }

    /// v6.13–v6.17 (and the seeded mutant): no `smp_mb()` in `switch_mm_irqs_off` when the
    /// CPU's bit in the next mm's cpumask is already set (83b0177a6c48 added it).
    fn switch_mm_skips_barrier(&self) -> bool {
        matches!(self.opts.lazy_tlb, LazyTlb::V6_13 | LazyTlb::V6_17)
            || self.opts.mutants.switch_mm_no_barrier()
    }

    /// `this_cpu_write(cpu_tlbstate.loaded_mm, LOADED_MM_SWITCHING)` before the CR3 write
    /// (v4.19+, for `nmi_uaccess_okay()`; mainline's `should_flush_tlb()` reads it too).
    fn announce_switching<E: Env>(&mut self, cpu: CpuId, env: &mut E) {
        if self.opts.mutants.loaded_mm_switching_omitted() {
            self.say(|| "loaded_mm left as it is (no LOADED_MM_SWITCHING)".into());
            return;
        }
        self.say(|| "loaded_mm = LOADED_MM_SWITCHING".into());
        self.store(env, cpu, Loc::LoadedMm(cpu as u32), LOADED_MM_SWITCHING);
    }

    /// `enter_lazy_tlb()`: the CPU switches to a kernel thread (idle) and keeps the user mm
    /// loaded.
    pub(crate) fn enter_lazy_tlb<E: Env>(&mut self, cpu: CpuId, env: &mut E) {
        let loaded = self.load(env, cpu, Loc::LoadedMm(cpu as u32));
        if loaded == INIT_MM as u64 || loaded == LOADED_MM_SWITCHING {
            return;
        }
        let mm = loaded as MmId;
        match self.opts.lazy_tlb {
            LazyTlb::Legacy => {
                self.say(|| "enter_lazy_tlb: cpu_tlbstate.state = TLBSTATE_LAZY".into());
                self.cpus[cpu].tlbstate.legacy_lazy = true;
            }
            LazyTlb::TlbGen => {
                self.say(|| format!("enter_lazy_tlb: leave mm_cpumask(mm{mm})"));
                if self.bit(env, cpu, mm) {
                    self.rmw(env, cpu, Loc::CpumaskBit(mm, cpu as u32), |_| 0);
                }
            }
            LazyTlb::IsLazy | LazyTlb::V6_13 | LazyTlb::V6_17 | LazyTlb::Mainline => {
                self.say(|| "enter_lazy_tlb: is_lazy = true".into());
                self.store(env, cpu, Loc::IsLazy(cpu as u32), 1);
            }
        }
    }
}

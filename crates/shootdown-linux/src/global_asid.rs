//! arch/x86/mm/tlb.c since v6.15 (Rik van Riel's "AMD broadcast TLB invalidation"): global
//! ASIDs and broadcast flushes with INVLPGB and TLBSYNC, on a CPU that has them and with
//! `broadcast_tlb_flush` (`CONFIG_BROADCAST_TLB_FLUSH`).
//!
//! * **Global ASIDs.** After an IPI flush, `consider_global_asid()` gives an mm that at least
//!   `global_asid_min_cpus` CPUs run (not lazily) an ASID from the shared space above the six
//!   dynamic ones (`use_global_asid`, `allocate_global_asid`): `asid_transition` is set, then
//!   `global_asid` published (release). The mm keeps it for its life; `destroy_context` marks
//!   it freed, and freed ASIDs are reused only after the allocator wraps and
//!   `reset_global_asid_space()` has flushed every non-global translation everywhere.
//! * **Switching** to an mm with a global ASID uses it without a flush and without a dynamic
//!   slot (`choose_new_asid`); a CPU that still runs the mm on a dynamic ASID moves over at
//!   its next `switch_mm_irqs_off(prev == next)` or flush IPI (`mm_needs_global_asid`), and
//!   `flush_tlb_func()` returns at once for a global ASID: INVLPGB keeps it current.
//! * **Flushing** an mm with a global ASID (`broadcast_tlb_flush`): INVLPGBs of the kernel
//!   (and, under PTI, user) PCID over the range, up to `invlpgb_count_max` pages each, or of
//!   the whole PCID; then `finish_asid_transition()`, which IPIs the whole mask if some CPU
//!   still runs the mm on a dynamic ASID (waiting out CPUs in `LOADED_MM_SWITCHING`) and
//!   otherwise ends the transition; then TLBSYNC. No IPI reaches a lazy CPU for freed page
//!   tables: INVLPGB (never "final translations only") drops paging-structure entries too.
//!   `arch_tlbbatch_flush()` flushes every non-global translation of every PCID and waits,
//!   with no IPIs (0b7eb55cb706), and `flush_tlb_kernel_range()` broadcasts the range in
//!   every PCID, Global translations included (`kernel_map.rs`).
//!
//! Simplifications: an INVLPGB takes effect on every TLB at the issuer's TLBSYNC, the latest
//! the architecture allows, and costs the receiving CPUs nothing; `global_asid_lock` is one
//! step (allocation is atomic); another CPU's `loaded_mm_asid` is read as the CPU's CR3 write
//! left it; `consider_global_asid`'s rate limit (`(pid & 31) == (jiffies & 31)`) applies in
//! the timed driver only (the explorer considers every time); the Zen 2 quirk (a74bb5f202da) is
//! the profile's business.

use crate::counters::Counter;
use crate::frame::{CallCond, Flow};
use crate::machine::Machine;
use crate::mem::{spin_key, Loc};
use crate::smp::SmpCallMany;
use crate::state::*;
use crate::tlb::{FlushMmRange, FlushMmRangePc};
use shootdown_engine::Env;
use shootdown_hw::tlb::Invlpgb;
use shootdown_hw::CpuId;
use std::collections::BTreeSet;

/// `CONFIG_HZ = 250`: a jiffy, for `consider_global_asid`'s rate limit.
const JIFFY_NS: u64 = 4_000_000;

/// The global ASID allocator (`global_asid_used`, `global_asid_freed`, `last_global_asid`),
/// under `global_asid_lock`. `last == 0` is the boot state (`MAX_ASID_AVAILABLE`: the first
/// allocation resets).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct GlobalAsids {
    pub used: BTreeSet<u16>,
    pub freed: BTreeSet<u16>,
    pub last: u16,
}

/// `is_global_asid()`: above the per-CPU dynamic ASIDs.
pub fn is_global_asid(asid: u16) -> bool {
    asid as usize >= TLB_NR_DYN_ASIDS
}

impl Machine {
    /// INVLPGB in use: the CPU has it (with PCIDs) and the kernel is v6.15+.
    pub(crate) fn broadcast_tlb_enabled(&self) -> bool {
        self.invlpgb && self.opts.broadcast_tlb_flush && self.pcid_enabled()
    }

    /// `MAX_ASID_AVAILABLE`: `(1 << CR3_AVAIL_PCID_BITS) - 2`, one PCID bit fewer under PTI.
    fn max_asid_available(&self) -> u16 {
        if self.pti {
            (1 << 11) - 2
        } else {
            (1 << 12) - 2
        }
    }

    /// `mm_global_asid(mm)` as `cpu` reads it (`smp_load_acquire`): 0 if none.
    pub(crate) fn mm_global_asid<E: Env>(&mut self, cpu: CpuId, mm: MmId, env: &mut E) -> u16 {
        if !self.broadcast_tlb_enabled() || mm == INIT_MM {
            return 0;
        }
        self.load(env, cpu, Loc::GlobalAsid(mm)) as u16
    }

    /// `choose_new_asid(next, next_tlb_gen)` with v6.15's first branch: an mm with a global
    /// ASID uses it, without a flush and without touching the dynamic slots.
    pub(crate) fn choose_asid<E: Env>(
        &mut self,
        cpu: CpuId,
        next: MmId,
        gen: u64,
        env: &mut E,
    ) -> (u16, bool) {
        match self.mm_global_asid(cpu, next, env) {
            0 => self.choose_new_asid(cpu, next, gen),
            g => (g, false),
        }
    }

    /// `reset_global_asid_space()`: `invlpgb_flush_all_nonglobals()` (every CPU's TLB drops
    /// every non-global translation; TLBSYNC), then the freed ASIDs become usable again.
    fn reset_global_asid_space<E: Env>(&mut self, env: &mut E) {
        for c in 0..self.cpus.len() {
            self.cpus[c].tlb.invlpgb(&Invlpgb::ALL_NONGLOBALS);
        }
        self.perf.counters.inc(Counter::Invlpgb);
        self.perf.counters.inc(Counter::Tlbsync);
        self.charge(env, |c| c.invlpgb);
        self.charge(env, |c| c.tlbsync);
        let g = &mut self.global_asids;
        let freed = std::mem::take(&mut g.freed);
        g.used.retain(|a| !freed.contains(a));
        g.last = TLB_NR_DYN_ASIDS as u16;
    }

    /// `allocate_global_asid()`: the next unused ASID after the last one handed out (a reset
    /// first when the search would run off the end); 0 if none is left.
    fn allocate_global_asid<E: Env>(&mut self, env: &mut E) -> u16 {
        let max = self.max_asid_available();
        if self.global_asids.last == 0 || self.global_asids.last >= max - 1 {
            self.reset_global_asid_space(env);
        }
        let g = &mut self.global_asids;
        let Some(a) = (g.last..max).find(|a| !g.used.contains(a)) else {
            return 0;
        };
        g.used.insert(a);
        g.last = a;
        a
    }

    /// `mm_free_global_asid(mm)` (`destroy_context`, at the last `mmdrop`): the ASID goes to
    /// the freed set, reusable after the next reset's flush.
    pub(crate) fn mm_free_global_asid(&mut self, mm: MmId) {
        let a = self.mms[mm as usize].global_asid;
        if a == 0 {
            return;
        }
        self.global_asids.freed.insert(a);
        self.mms[mm as usize].global_asid = 0;
    }

    /// `consider_global_asid(mm)` after an IPI flush: `mm_active_cpus_exceeds(mm, min - 1)`
    /// counts the CPUs of the mask that run the mm, not lazily (racy reads); enough of them
    /// and `use_global_asid()` assigns one: `asid_transition = true`, then
    /// `smp_store_release(global_asid)`.
    fn consider_global_asid<E: Env>(&mut self, cpu: CpuId, mm: MmId, env: &mut E) {
        if env.timed() {
            let pid = self.cpus[cpu].curr as u64;
            let jiffies = env.now().0 / 1000 / JIFFY_NS;
            if pid & 0x1f != jiffies & 0x1f {
                return;
            }
        }
        let min = self.opts.global_asid_min_cpus.0 as usize;
        let mask = self.mms[mm as usize].cpumask_cpus();
        if mask.len() < min {
            self.summary(|| {
                format!(
                    "consider_global_asid(mm{mm}): {} CPU(s) in the mask",
                    mask.len()
                )
            });
            return;
        }
        let mut active = 0;
        for &c in &mask {
            let loaded = self.load(env, cpu, Loc::LoadedMm(c as u32));
            if loaded == mm as u64 && self.load(env, cpu, Loc::IsLazy(c as u32)) == 0 {
                active += 1;
            }
        }
        if active < min || self.mms[mm as usize].global_asid != 0 {
            self.summary(|| format!("consider_global_asid(mm{mm}): {active} CPU(s) run it"));
            return;
        }
        let a = self.allocate_global_asid(env);
        if a == 0 {
            return;
        }
        self.perf.counters.inc(Counter::GlobalAsidsAssigned);
        self.store(env, cpu, Loc::AsidTransition(mm), 1);
        self.store(env, cpu, Loc::GlobalAsid(mm), a as u64);
        self.say(|| {
            format!("consider_global_asid(mm{mm}): {active} CPUs run it: use_global_asid = {a}, asid_transition = true")
        });
    }

    /// TLBSYNC on `cpu`: every INVLPGB it issued is done on every CPU when it returns.
    pub(crate) fn tlbsync<E: Env>(&mut self, cpu: CpuId, env: &mut E) {
        let pending = std::mem::take(&mut self.cpus[cpu].invlpgb_pending);
        for b in &pending {
            for c in 0..self.cpus.len() {
                self.cpus[c].tlb.invlpgb(b);
            }
        }
        self.perf.counters.inc(Counter::Tlbsync);
        self.charge(env, |c| c.tlbsync);
    }

    /// The INVLPGB loop of `broadcast_tlb_flush()` and `invlpgb_kernel_range_flush()`: pages
    /// `[start, end)` a `1 << stride_shift` stride apart, at most `invlpgb_count_max` per
    /// instruction (one per instruction above a 2 MiB stride), each chunk for every PCID of
    /// `pcids`, with `template`'s flags. Returns how many INVLPGBs it issued.
    pub(crate) fn invlpgb_range<E: Env>(
        &mut self,
        cpu: CpuId,
        template: Invlpgb,
        pcids: &[Option<u16>],
        (start, end): (u64, u64),
        stride_shift: u8,
        env: &mut E,
    ) -> u32 {
        let max = u64::from(self.invlpgb_count_max.max(1));
        let mut n = 0;
        let mut addr = start;
        while addr < end {
            let nr = if stride_shift > 9 {
                1
            } else {
                ((end - addr) >> stride_shift).clamp(1, max)
            };
            let next = addr + (nr << stride_shift);
            for &pcid in pcids {
                let b = Invlpgb {
                    pcid,
                    range: Some((addr, next)),
                    ..template
                };
                self.invlpgb(cpu, b, env);
                n += 1;
            }
            addr = next;
        }
        n
    }

    /// Issue INVLPGB `b` on `cpu` (done at its TLBSYNC).
    pub(crate) fn invlpgb<E: Env>(&mut self, cpu: CpuId, b: Invlpgb, env: &mut E) {
        self.cpus[cpu].invlpgb_pending.push(b);
        self.perf.counters.inc(Counter::Invlpgb);
        self.charge(env, |c| c.invlpgb);
    }

    /// The steps of `flush_tlb_mm_range()` (and `arch_tlbbatch_flush()`) that v6.15 added:
    /// the broadcast, the end of an ASID transition, TLBSYNC, and `consider_global_asid()`
    /// after an IPI flush.
    pub(crate) fn broadcast_tlb_flush_step<E: Env>(
        &mut self,
        cpu: CpuId,
        s: &mut FlushMmRange,
        env: &mut E,
    ) -> Flow {
        use FlushMmRangePc::*;
        let mm = s.mm;
        match s.pc {
            BroadcastAll => {
                // arch_tlbbatch_flush(): invlpgb_flush_all_nonglobals().
                self.invlpgb(cpu, Invlpgb::ALL_NONGLOBALS, env);
                self.summary(|| "invlpgb_flush_all_nonglobals (no IPIs)".into());
                s.pc = Tlbsync;
                Flow::Next
            }
            Broadcast => {
                let asid = s.global_asid;
                let mut pcids = vec![self.kern_pcid(asid)];
                if self.pti {
                    pcids.push(self.user_pcid(asid));
                }
                let f = s.info;
                // The kernel never asks for final translations only (the patch that would
                // have, when no tables are freed, was not merged); the mutant always does.
                let final_only = self.opts.mutants.invlpgb_final_only();
                let mut n = 0;
                if f.end == TLB_FLUSH_ALL {
                    for &p in &pcids {
                        let b = Invlpgb {
                            pcid: Some(p),
                            range: None,
                            final_only,
                            include_global: false,
                        };
                        self.invlpgb(cpu, b, env);
                        n += 1;
                    }
                } else {
                    let template = Invlpgb {
                        pcid: None,
                        range: None,
                        final_only,
                        include_global: false,
                    };
                    let pcids: Vec<Option<u16>> = pcids.into_iter().map(Some).collect();
                    n = self.invlpgb_range(
                        cpu,
                        template,
                        &pcids,
                        (f.start, f.end),
                        f.stride_shift,
                        env,
                    );
                }
                self.say(|| {
                    format!(
                        "broadcast_tlb_flush: {n} INVLPGB(s) of global ASID {asid} ({})",
                        crate::tlb::range_text(f.start, f.end)
                    )
                });
                s.pc = FinishTransition;
                Flow::Next
            }
            FinishTransition => self.finish_asid_transition(cpu, s, env),
            Tlbsync => {
                s.pc = Done;
                if self.opts.mutants.broadcast_skips_tlbsync() {
                    self.say(|| "return without TLBSYNC".into());
                    return Flow::Next;
                }
                self.tlbsync(cpu, env);
                self.say(|| "TLBSYNC: this CPU's INVLPGBs are done everywhere".into());
                Flow::Next
            }
            Consider => {
                s.pc = Done;
                self.consider_global_asid(cpu, mm, env);
                Flow::Next
            }
            _ => unreachable!("not a broadcast step"),
        }
    }

    /// Would `finish_asid_transition()`'s next step only wait for a CPU in
    /// `LOADED_MM_SWITCHING`? (Its scan as `cpu` sees memory now: a CPU found on another ASID
    /// first means IPIs, not a wait.)
    pub(crate) fn finish_asid_transition_waits(&self, cpu: CpuId, s: &FlushMmRange) -> bool {
        if s.pc != FlushMmRangePc::FinishTransition
            || self.opts.mutants.asid_transition_cleared_early()
            || self.value_seen_by(cpu, Loc::AsidTransition(s.mm)) == 0
        {
            return false;
        }
        for c in 0..self.cpus.len() {
            if self.value_seen_by(cpu, Loc::CpumaskBit(s.mm, c as u32)) == 0 {
                continue;
            }
            let loaded = self.value_seen_by(cpu, Loc::LoadedMm(c as u32));
            if loaded == LOADED_MM_SWITCHING {
                return true;
            }
            if loaded == s.mm as u64 && self.cpus[c].tlbstate.loaded_mm_asid != s.global_asid {
                return false;
            }
        }
        false
    }

    /// `finish_asid_transition()`: while the mm is in transition, look at every CPU of its mask
    /// (waiting out one in `LOADED_MM_SWITCHING`); one that runs the mm on another ASID gets,
    /// with the whole mask, a flush IPI (whose handler moves it over) and the transition goes
    /// on; none, and it ends.
    fn finish_asid_transition<E: Env>(
        &mut self,
        cpu: CpuId,
        s: &mut FlushMmRange,
        env: &mut E,
    ) -> Flow {
        let mm = s.mm;
        let asid = s.global_asid;
        if self.load(env, cpu, Loc::AsidTransition(mm)) == 0 {
            self.summary(|| format!("mm{mm} not in ASID transition"));
            s.pc = FlushMmRangePc::Tlbsync;
            return Flow::Next;
        }
        if self.opts.mutants.asid_transition_cleared_early() {
            self.store(env, cpu, Loc::AsidTransition(mm), 0);
            self.say(|| format!("finish_asid_transition: asid_transition(mm{mm}) = false"));
            s.pc = FlushMmRangePc::Tlbsync;
            return Flow::Next;
        }
        let (others, me) = self.read_cpumask_others(cpu, mm, env);
        let mut mask = others.clone();
        if me {
            mask.push(cpu);
            mask.sort_unstable();
        }
        for &c in &mask {
            let loaded = self.load(env, cpu, Loc::LoadedMm(c as u32));
            if loaded == LOADED_MM_SWITCHING {
                self.summary(|| format!("finish_asid_transition: cpu{c} is switching: wait"));
                return Flow::Spin(spin_key(Loc::LoadedMm(c as u32)));
            }
            if loaded != mm as u64 {
                continue;
            }
            let on = self.cpus[c].tlbstate.loaded_mm_asid;
            if on != asid {
                self.perf.counters.inc(Counter::AsidTransitionIpis);
                self.perf.counters.inc(Counter::NrTlbRemoteFlush);
                self.say(|| {
                    format!("finish_asid_transition: cpu{c} runs mm{mm} on ASID {on}: flush_tlb_multi(mm_cpumask)")
                });
                s.pc = FlushMmRangePc::Tlbsync;
                let call = SmpCallMany {
                    run_local: me,
                    ..SmpCallMany::new(CallCond::All, others, s.info)
                };
                return Flow::Call(self.flush_others_frame(call));
            }
        }
        self.store(env, cpu, Loc::AsidTransition(mm), 0);
        self.say(|| {
            format!("finish_asid_transition: every CPU runs mm{mm} on ASID {asid}: asid_transition = false")
        });
        s.pc = FlushMmRangePc::Tlbsync;
        Flow::Next
    }
}

//! arch/x86/mm/tlb.c: `flush_tlb_mm_range`, `flush_tlb_func`, `choose_new_asid`, and the local
//! flush primitives. Variants follow docs/design/kernel-model.md §1.3, §1.7–§1.9.

use crate::counters::Counter;
use crate::frame::{CallCond, Flow, Frame};
use crate::global_asid::is_global_asid;
use crate::machine::Machine;
use crate::mem::{
    flush_info_line, tlbstate_ctx_line, tlbstate_line, Loc, TLBSTATE_USER_PCID_FLUSH_MASK_OFFSET,
};
use crate::options::{FlushStride, LazyTlb, PtiUserFlush, SmpCall};
use crate::smp::SmpCallMany;
use crate::state::*;
use crate::switch_mm::SwitchMm;
use shootdown_engine::Env;
use shootdown_hw::pagetable::Vpn;
use shootdown_hw::CpuId;

/// `flush_tlb_mm_range()` (or, with `batch_targets`, `arch_tlbbatch_flush()`).
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct FlushMmRange {
    pub pc: FlushMmRangePc,
    pub mm: MmId,
    pub info: FlushTlbInfo,
    /// Oracle: epoch at which the flush began.
    pub begin: u64,
    /// `arch_tlbbatch_flush`: targets precomputed, `tlb_gen` already bumped.
    pub batch_targets: Option<Vec<CpuId>>,
    /// v6.15+: the mm's global ASID as the flush read it (0: none; `global_asid.rs`).
    pub global_asid: u16,
    /// LATR: asked for by munmap or madvise (the artifact's `mm->munmap_inprogress`), so its
    /// remote part may be saved for the other CPUs' ticks (`latr.rs`); and whether it was.
    pub munmap_in_progress: bool,
    pub latr_saved: bool,
}

shootdown_engine::clone_by_fields!(FlushMmRange {
    pc,
    mm,
    info,
    begin,
    batch_targets,
    global_asid,
    munmap_in_progress,
    latr_saved,
});

/// The steps of `flush_tlb_mm_range()`. v5.13+ (`concurrent`): `Start` → `Multi` → `Done`, or
/// `Local` → `Done` when no other CPU is in the mask. ≤v5.12: `Start` → `Local` → `Others` →
/// `Done`. v6.15+ on a CPU with INVLPGB (`global_asid.rs`): an mm with a global ASID goes
/// `Start` → `Broadcast` → `FinishTransition` → `Tlbsync` → `Done`, a reclaim batch `Start` →
/// `BroadcastAll` → `Tlbsync` → `Done`, and an IPI flush `Multi` → `Consider` → `Done`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FlushMmRangePc {
    /// `get_flush_tlb_info()` and `inc_mm_tlb_gen()`.
    Start,
    /// Read `mm_cpumask`: other CPUs ⇒ `flush_tlb_multi()` (remote and local together).
    Multi,
    /// The local flush, if this CPU has the mm loaded.
    Local,
    /// Read `mm_cpumask`: other CPUs ⇒ `flush_tlb_others()`.
    Others,
    /// v6.15+, an mm with a global ASID: `broadcast_tlb_flush()`'s INVLPGBs.
    Broadcast,
    /// v6.15+ `arch_tlbbatch_flush()`: `invlpgb_flush_all_nonglobals()`.
    BroadcastAll,
    /// `finish_asid_transition()` (may IPI the mask).
    FinishTransition,
    /// TLBSYNC.
    Tlbsync,
    /// After an IPI flush: `consider_global_asid()`.
    Consider,
    /// Return: the flush is complete (the oracle records it).
    Done,
}

impl FlushMmRange {
    /// A call of `flush_tlb_mm_range(mm, start, end, PAGE_SHIFT, freed_tables)`.
    pub fn call(mm: MmId, start: Vpn, end: Vpn, freed_tables: bool) -> Frame {
        Self::call_stride(mm, start, end, 0, freed_tables)
    }

    /// A call of `flush_tlb_mm_range(mm, start, end, stride_shift, freed_tables)`;
    /// `stride_shift` in pages (9: 2 MiB).
    pub fn call_stride(
        mm: MmId,
        start: Vpn,
        end: Vpn,
        stride_shift: u8,
        freed_tables: bool,
    ) -> Frame {
        Frame::FlushMmRange(Box::new(FlushMmRange {
            pc: FlushMmRangePc::Start,
            mm,
            info: FlushTlbInfo {
                mm: Some(mm),
                start,
                end,
                new_tlb_gen: 0,
                stride_shift,
                freed_tables,
                trim_cpumask: false,
                initiator: 0,
                kernel: false,
            },
            begin: 0,
            batch_targets: None,
            global_asid: 0,
            munmap_in_progress: false,
            latr_saved: false,
        }))
    }

    /// `frame` (a `flush_tlb_mm_range` call) as munmap's or madvise's, which LATR may save.
    pub(crate) fn in_munmap(mut frame: Frame) -> Frame {
        if let Frame::FlushMmRange(f) = &mut frame {
            f.munmap_in_progress = true;
        }
        frame
    }
}

/// `flush_tlb_func()` on one CPU, for a request from `info.initiator`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct FlushFunc {
    pub pc: FlushFuncPc,
    pub info: FlushTlbInfo,
    pub local: bool,
    pub local_gen: u64,
    pub mm_gen: u64,
    pub asid: u16,
    pub mm: MmId,
}

/// The steps of `flush_tlb_func()`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FlushFuncPc {
    /// The guards: another mm, init_mm, lazy, already up to date.
    Guards,
    /// Read `mm->context.tlb_gen`.
    ReadGen,
    /// Partial or full flush; record the generation in the ASID slot.
    Flush,
    /// v4.12: flush the requested range, no generations.
    LegacyFlush,
    /// Back from `leave_mm()`: return.
    LeftMm,
    /// v6.15+: back from moving to the mm's global ASID: return.
    Transitioned,
}

impl FlushFunc {
    /// A call of `flush_tlb_func(info)`: `local` from the initiator itself, else from an IPI
    /// (or `on_each_cpu_mask`'s local call of `flush_tlb_func_remote`).
    pub fn call(info: FlushTlbInfo, local: bool) -> Frame {
        Frame::FlushFunc(FlushFunc {
            pc: FlushFuncPc::Guards,
            info,
            local,
            local_gen: 0,
            mm_gen: 0,
            asid: 0,
            mm: 0,
        })
    }
}

/// How a counterexample names a flush range.
pub(crate) fn range_text(start: Vpn, end: Vpn) -> String {
    if end == TLB_FLUSH_ALL {
        "full".into()
    } else if end == start + 1 {
        format!("page {start:#x}")
    } else {
        format!("pages {start:#x}..{end:#x}")
    }
}

/// How a counterexample names an `mm` value of `cpu_tlbstate.loaded_mm`.
pub(crate) fn loaded_mm_text(v: u64) -> String {
    if v == LOADED_MM_SWITCHING {
        "LOADED_MM_SWITCHING".into()
    } else {
        format!("mm{v}")
    }
}

impl Machine {
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

    /// CR4.PCIDE: the CPU has PCIDs, the kernel uses them, and (v6.4+) not on a CPU with
    /// the INVLPG erratum (`setup_pcid()`).
    pub(crate) fn pcid_enabled(&self) -> bool {
        self.pcid_hw
            && self.opts.pcid
            && !(self.invlpg_miss_global && self.opts.invlpg_miss_global_no_pcid)
    }

    /// INVLPG of `vpn` under `pcid`: with PCIDs on, a CPU with the erratum leaves Global
    /// entries of the address cached.
    pub(crate) fn invlpg(&mut self, cpu: CpuId, pcid: u16, vpn: Vpn) {
        if self.invlpg_miss_global && self.pcid_enabled() {
            self.cpus[cpu].tlb.invlpg_missing_globals(pcid, vpn);
        } else {
            self.cpus[cpu].tlb.invlpg(pcid, vpn);
        }
    }

    /// `choose_new_asid(next, next_tlb_gen)`: reuse the ASID slot that already holds `next`
    /// (flushing only if it is behind `gen`), else take the next slot round-robin and flush.
    /// Simplification: no `invalidate_other` (PTI kernel-mapping flushes). v6.15's global-ASID
    /// branch, which comes first, is [`Machine::choose_asid`].
    pub fn choose_new_asid(&mut self, cpu: CpuId, next: MmId, gen: u64) -> (u16, bool) {
        if !self.pcid_enabled() {
            return (0, true);
        }
        let ctx_id = self.mms[next as usize].ctx_id;
        let ts = &mut self.cpus[cpu].tlbstate;
        for a in 0..TLB_NR_DYN_ASIDS {
            if ts.ctxs[a].ctx_id == ctx_id {
                return (a as u16, ts.ctxs[a].tlb_gen < gen);
            }
        }
        let mut a = ts.next_asid;
        ts.next_asid += 1;
        if a as usize >= TLB_NR_DYN_ASIDS {
            a = 0;
            ts.next_asid = 1;
        }
        (a, true)
    }

    /// `load_new_mm_cr3()`: a serializing CR3 write, flushing the new kernel PCID unless NOFLUSH
    /// (and under PTI marking the user PCID for a deferred flush).
    pub(crate) fn load_new_mm_cr3<E: Env>(
        &mut self,
        cpu: CpuId,
        mm: MmId,
        asid: u16,
        need_flush: bool,
        env: &mut E,
    ) {
        self.fence(cpu);
        let kp = self.kern_pcid(asid);
        if need_flush {
            self.invalidate_user_asid(cpu, asid, env);
            self.cpus[cpu].tlb.flush_pcid(kp);
            self.perf.counters.inc(Counter::FlushOnTaskSwitch);
            self.charge(env, |c| c.cr3_write_flush);
        } else {
            self.charge(env, |c| c.cr3_write_noflush);
        }
        let c = &mut self.cpus[cpu];
        c.cr3_mm = mm;
        c.cr3_pcid = kp;
        self.perf.counters.inc(Counter::Cr3Writes);
        self.kvm_shadow_cr3_load(cpu, need_flush, env);
    }

    /// `native_flush_tlb_one_user(addr)`: INVLPG in the kernel PCID, and under PTI either
    /// INVPCID for the user PCID or a deferred user flush. With in-context flushes
    /// (`defer_user`: the RFC's `__flush_tlb_range` for a shootdown) only the kernel PCID's
    /// INVLPG; the caller records the user range ([`Machine::flush_user_tlb_deferred`]).
    pub(crate) fn flush_tlb_one_user<E: Env>(
        &mut self,
        cpu: CpuId,
        vpn: Vpn,
        defer_user: bool,
        env: &mut E,
    ) {
        self.fence(cpu);
        let asid = self.cpus[cpu].tlbstate.loaded_mm_asid;
        let kp = self.kern_pcid(asid);
        let up = self.user_pcid(asid);
        self.invlpg(cpu, kp, vpn);
        self.charge(env, |c| c.invlpg);
        self.perf.counters.inc(Counter::InvlpgCount);
        if self.pti && !defer_user {
            if self.invpcid {
                self.cpus[cpu].tlb.invlpg(up, vpn);
                self.charge(env, |c| c.invpcid_single);
            } else {
                self.invalidate_user_asid(cpu, asid, env);
            }
        }
        // With shadow paging INVLPG exits (kvm_mmu_invlpg), and so does the user PCID's
        // INVPCID of the address (kvm_handle_invpcid → kvm_mmu_invpcid_gva: the same
        // FNAME(invlpg), a root of that PCID being the current one).
        if self.shadow_paging(cpu) {
            self.kvm_mmu_invlpg(cpu, vpn, env);
            if self.pti && !defer_user && self.invpcid {
                self.vm_exit(env);
                let what = self.kvm_mmu_invalidate_gva(cpu, vpn, env);
                self.say(|| {
                    format!(
                        "INVPCID (user PCID, page {vpn:#x}): VM exit, kvm_mmu_invpcid_gva: {what}"
                    )
                });
            }
        }
    }

    /// `invalidate_user_asid(asid)`: under PTI, mark the user PCID for a flush at the next
    /// return to user (`SWITCH_TO_USER_CR3`): a write to `cpu_tlbstate.user_pcid_flush_mask`,
    /// on the line other CPUs read `is_lazy` from before v5.13.
    fn invalidate_user_asid<E: Env>(&mut self, cpu: CpuId, asid: u16, env: &mut E) {
        // A global ASID (v6.15+) never needs the deferred flush: its flushes are broadcast, and
        // the 16-bit mask has no bit for it.
        if !self.pti || is_global_asid(asid) {
            return;
        }
        let ts = &mut self.cpus[cpu].tlbstate;
        ts.user_pcid_flush_mask |= 1 << asid;
        // In-context flushes: whatever range was deferred, the next return flushes it all.
        ts.user_flush_end = TLB_FLUSH_ALL;
        self.touch_line(
            env,
            cpu,
            tlbstate_line(cpu, TLBSTATE_USER_PCID_FLUSH_MASK_OFFSET),
            true,
        );
    }

    /// In-context flushes (`pti_user_flush = "deferred"`, Nadav Amit's RFC v2 "x86/mm/tlb:
    /// Defer PTI flushes", 2019; a research design): `flush_user_tlb_deferred()` records the
    /// user-PCID range a shootdown leaves for the return to user. The first deferral for the
    /// ASID (its `user_pcid_flush_mask` bit clear) records the range; a later one finds it
    /// full already, or merges if it starts at or above the recorded start, has its stride and
    /// the merged range stays under `tlb_single_page_flush_ceiling`, or else widens it to a
    /// full flush. Reconstructed from the RFC's description of the rules (the merged range
    /// keeps the recorded start and the larger end).
    fn flush_user_tlb_deferred<E: Env>(
        &mut self,
        cpu: CpuId,
        (start, end, stride): (Vpn, Vpn, u8),
        env: &mut E,
    ) {
        let asid = self.cpus[cpu].tlbstate.loaded_mm_asid;
        if is_global_asid(asid) {
            return;
        }
        let ceiling = self.opts.tlb_single_page_flush_ceiling.0;
        let ts = &mut self.cpus[cpu].tlbstate;
        let first = ts.user_pcid_flush_mask & (1 << asid) == 0;
        ts.user_pcid_flush_mask |= 1 << asid;
        let what = if first {
            ts.user_flush_start = start;
            ts.user_flush_end = end;
            ts.user_flush_stride_shift = stride;
            "recorded"
        } else if ts.user_flush_end == TLB_FLUSH_ALL {
            "already a full flush"
        } else if (start >= ts.user_flush_start
            || self.opts.mutants.deferred_user_flush_merge_ignores_start())
            && stride == ts.user_flush_stride_shift
            && (end.max(ts.user_flush_end) - ts.user_flush_start) >> stride < ceiling
        {
            ts.user_flush_end = ts.user_flush_end.max(end);
            "merged"
        } else {
            ts.user_flush_end = TLB_FLUSH_ALL;
            self.perf.counters.inc(Counter::UserFlushDeferredFull);
            "widened to a full flush"
        };
        self.perf.counters.inc(Counter::UserFlushDeferred);
        let ts = &self.cpus[cpu].tlbstate;
        let (now_start, now_end) = (ts.user_flush_start, ts.user_flush_end);
        self.say(|| {
            format!(
                "defer the user-PCID flush of {}: {what} (user range now {})",
                range_text(start, end),
                range_text(now_start, now_end)
            )
        });
        self.touch_line(
            env,
            cpu,
            tlbstate_line(cpu, TLBSTATE_USER_PCID_FLUSH_MASK_OFFSET),
            true,
        );
    }

    /// `native_flush_tlb_local()`: defer the user-PCID flush, rewrite CR3 (flushes the current
    /// kernel PCID's non-global entries).
    pub(crate) fn flush_tlb_local<E: Env>(&mut self, cpu: CpuId, env: &mut E) {
        self.fence(cpu);
        let asid = self.cpus[cpu].tlbstate.loaded_mm_asid;
        let kp = self.kern_pcid(asid);
        self.invalidate_user_asid(cpu, asid, env);
        self.cpus[cpu].tlb.flush_pcid(kp);
        self.charge(env, |c| c.cr3_write_flush);
        self.perf.counters.inc(Counter::Cr3Writes);
        self.kvm_shadow_cr3_load(cpu, true, env);
    }

    /// Read `mm_cpumask(mm)` (one step, bit by bit through the memory model) minus `cpu`;
    /// also whether `cpu`'s own bit is set. The remote CPUs come in CPU-id order, the order
    /// `for_each_cpu` visits them later, and the environment is told (`Env::cpu_order`).
    ///
    /// The walk goes a word of 64 CPUs at a time, as `for_each_cpu`'s `find_next_bit` does:
    /// only set bits (in memory or in `cpu`'s store buffer) are loaded. The first load of
    /// each 512-bit line asks the cache directory; the line's other bits are then L1 hits,
    /// which is what the directory would answer ([`Machine::load_hit`]).
    pub(crate) fn read_cpumask_others<E: Env>(
        &mut self,
        cpu: CpuId,
        mm: MmId,
        env: &mut E,
    ) -> (Vec<CpuId>, bool) {
        let mut others = Vec::new();
        let mut me = false;
        // Bits with a store buffered by `cpu` (whatever its value) are loaded too.
        let mut buffered = Vec::new();
        for &(loc, _) in self.buffered_stores(cpu) {
            if let Loc::CpumaskBit(m, c) = loc {
                if m == mm {
                    buffered.push(c as usize);
                }
            }
        }
        let mut line = None;
        for w in 0..self.mms[mm as usize].cpumask.len() {
            let mut bits = self.mms[mm as usize].cpumask[w];
            if buffered.is_empty() {
                // Nothing buffered (always so under SC): every set bit reads 1 from memory.
                // The same loads and charges as the loop below, without a call per CPU (at
                // 4096 CPUs that was 4 % of a row's time): the line's first load through the
                // directory, then its other bits' L1 hits in one charge.
                if bits == 0 {
                    continue;
                }
                let first = Loc::CpumaskBit(mm, (w * 64) as u32 + bits.trailing_zeros());
                let l = crate::mem::line_of(self, first);
                let mut hits = u64::from(bits.count_ones());
                if line != Some(l) {
                    line = Some(l);
                    let v = self.load(env, cpu, first);
                    debug_assert_eq!(v, 1);
                    hits -= 1;
                }
                self.charge_l1_hits(env, hits);
            } else {
                for &c in &buffered {
                    if c / 64 == w {
                        bits |= 1 << (c % 64);
                    }
                }
                // Load bit by bit; keep the bits that read 1.
                let mut set = 0;
                while bits != 0 {
                    let b = bits.trailing_zeros();
                    bits &= bits - 1;
                    let loc = Loc::CpumaskBit(mm, (w * 64) as u32 + b);
                    let l = crate::mem::line_of(self, loc);
                    let v = if line == Some(l) {
                        self.load_hit(env, cpu, loc)
                    } else {
                        line = Some(l);
                        self.load(env, cpu, loc)
                    };
                    if v != 0 {
                        set |= 1 << b;
                    }
                }
                bits = set;
            }
            while bits != 0 {
                let c = w * 64 + bits.trailing_zeros() as usize;
                bits &= bits - 1;
                if c == cpu {
                    me = true;
                } else {
                    others.push(c);
                }
            }
        }
        if others.len() > 1 {
            env.cpu_order(&others);
        }
        (others, me)
    }

    /// Which remote CPUs the native flush path filters with (`native_flush_tlb_multi` /
    /// `native_flush_tlb_others`).
    pub(crate) fn flush_cond(&self, info: &FlushTlbInfo) -> CallCond {
        let freed = info.freed_tables && !self.opts.mutants.lazy_ignores_freed_tables();
        match self.opts.lazy_tlb {
            // v4.12 and Andy's rework: every CPU in the mask (lazy ones are not in it in V1).
            LazyTlb::Legacy | LazyTlb::TlbGen => CallCond::All,
            _ if freed => CallCond::All,
            // v4.20–v6.13: `tlb_is_not_lazy`.
            LazyTlb::IsLazy | LazyTlb::V6_13 => CallCond::NotLazy,
            LazyTlb::V6_17 | LazyTlb::Mainline => CallCond::ShouldFlush,
        }
    }

    /// One step of `flush_tlb_mm_range(mm, start, end, stride, freed_tables)`.
    ///
    /// Before Nadav (≤v5.12): bump `tlb_gen`, flush locally if `mm` is loaded, then
    /// `flush_tlb_others()` — IPI and wait. After (v5.13+): bump `tlb_gen`, then if any other CPU is
    /// in `mm_cpumask`, `flush_tlb_multi()` — IPIs, local flush, wait — else flush locally.
    /// With `batch_targets` this is `arch_tlbbatch_flush()` (mm = NULL, full flush, gen 0).
    pub(crate) fn flush_tlb_mm_range_step<E: Env>(
        &mut self,
        cpu: CpuId,
        s: &mut FlushMmRange,
        env: &mut E,
    ) -> Flow {
        use FlushMmRangePc::*;
        let concurrent = self.opts.smp_call == SmpCall::Concurrent;
        let o1 = concurrent && self.opts.mutants.inc_tlb_gen_after_ipis();
        match s.pc {
            Start => {
                let asked = range_text(s.info.start, s.info.end);
                if let Some(t) = &s.batch_targets {
                    self.summary(|| {
                        format!(
                            "flush_tlb_info = {{mm = NULL, full, new_tlb_gen = 0}} for cpus {t:?}"
                        )
                    });
                } else {
                    s.begin = self.oracle.flush_begin();
                    // get_flush_tlb_info(): above the ceiling, flush everything. Before v4.20
                    // the range counts in 4 KiB pages and is flushed page by page.
                    let i = &mut s.info;
                    if self.opts.flush_stride == FlushStride::V4_19 {
                        i.stride_shift = 0;
                    }
                    if i.end != TLB_FLUSH_ALL
                        && (i.end - i.start) >> i.stride_shift
                            > self.opts.tlb_single_page_flush_ceiling.0
                    {
                        i.start = 0;
                        i.end = TLB_FLUSH_ALL;
                    }
                    // inc_mm_tlb_gen(): atomic64_inc_return, a full barrier pairing with switch_mm.
                    let mm = s.mm;
                    i.new_tlb_gen = if o1 {
                        let g = self.load(env, cpu, Loc::TlbGen(mm)) + 1;
                        self.summary(|| {
                            format!("new_tlb_gen = {g} (mm{mm}.tlb_gen not bumped yet); {asked}")
                        });
                        g
                    } else {
                        let g = self.rmw(env, cpu, Loc::TlbGen(mm), |g| g + 1) + 1;
                        self.summary(|| {
                            format!("inc_mm_tlb_gen(mm{mm}) = {g} (locked: full barrier); {asked}")
                        });
                        g
                    };
                    if self.opts.lazy_tlb.trims_once_a_second() && env.timed() {
                        // should_trim_cpumask(): at most once a second per mm.
                        let now_ns = env.now().0 / 1000;
                        let m = &mut self.mms[s.mm as usize];
                        if now_ns >= m.next_trim_ns {
                            m.next_trim_ns = now_ns + 1_000_000_000;
                            s.info.trim_cpumask = true;
                        }
                    }
                }
                s.info.initiator = cpu;
                self.flush_info[cpu] = Some(s.info);
                self.touch_line(env, cpu, flush_info_line(cpu), true);
                s.pc = if concurrent { Multi } else { Local };
                // v6.15+: broadcast for an mm with a global ASID (and for a reclaim batch).
                if self.broadcast_tlb_enabled() {
                    if s.batch_targets.is_some() {
                        s.pc = BroadcastAll;
                    } else {
                        s.global_asid = self.mm_global_asid(cpu, s.mm, env);
                        if s.global_asid != 0 {
                            s.pc = Broadcast;
                        }
                    }
                }
                Flow::Next
            }
            Broadcast | BroadcastAll | FinishTransition | Tlbsync | Consider => {
                self.broadcast_tlb_flush_step(cpu, s, env)
            }
            Multi => {
                let (others, me) = self.flush_targets(cpu, s, env);
                if others.is_empty() {
                    self.summary(|| "no (other) CPU to flush here".into());
                    s.pc = Local;
                    return Flow::Next;
                }
                if self.latr_saves(cpu, s.munmap_in_progress) {
                    // LATR: no IPIs; the other CPUs flush at their ticks.
                    self.latr_save(cpu, s.info, s.begin, others);
                    s.latr_saved = true;
                    s.pc = Local;
                    return Flow::Next;
                }
                self.perf.counters.inc(Counter::NrTlbRemoteFlush);
                s.pc = if self.broadcast_tlb_enabled() && s.batch_targets.is_none() {
                    Consider
                } else {
                    Done
                };
                let call = SmpCallMany::new(self.flush_cond(&s.info), others, s.info);
                let call = SmpCallMany {
                    run_local: me,
                    inc_gen_locally: o1,
                    ..call
                };
                self.flush_others_call(s.mm, call)
            }
            Local => {
                s.pc = if concurrent { Done } else { Others };
                if o1 {
                    self.rmw(env, cpu, Loc::TlbGen(s.mm), |g| g + 1);
                }
                if self.local_flush_wanted(cpu, s, env) {
                    self.summary(|| "mm loaded here: flush_tlb_func (local)".into());
                    return Flow::Call(FlushFunc::call(s.info, true));
                }
                self.summary(|| "no (other) CPU to flush here".into());
                Flow::Next
            }
            Others => {
                s.pc = Done;
                let (others, me) = self.flush_targets(cpu, s, env);
                if others.is_empty() {
                    self.summary(|| "no (other) CPU to flush here".into());
                    return Flow::Next;
                }
                if self.latr_saves(cpu, s.munmap_in_progress) {
                    self.latr_save(cpu, s.info, s.begin, others);
                    s.latr_saved = true;
                    return Flow::Next;
                }
                self.perf.counters.inc(Counter::NrTlbRemoteFlush);
                let cond = self.flush_cond(&s.info);
                // Before v5.6 the lazy filter went through on_each_cpu_cond_mask(): a
                // temporary cpumask per call, and the function also runs here afterwards.
                let alloc = self.opts.smp_cond_alloc_mask && cond != CallCond::All;
                if alloc {
                    self.charge(env, |c| c.cpumask_alloc);
                }
                let call = SmpCallMany {
                    local_after: alloc && me,
                    ..SmpCallMany::new(cond, others, s.info)
                };
                self.flush_others_call(s.mm, call)
            }
            Done => {
                // A flush LATR saved has not reached the other CPUs: it proves nothing yet.
                if s.batch_targets.is_none() && !s.latr_saved {
                    let range = if s.info.end == TLB_FLUSH_ALL {
                        None
                    } else {
                        Some((s.info.start, s.info.end))
                    };
                    self.oracle.flush_returned(s.mm, range, s.begin);
                }
                let mm = s.mm;
                self.summary(|| format!("return: flush of mm{mm} complete"));
                Flow::Return
            }
        }
    }

    /// Call the cross call of a flush (`flush_tlb_multi` / `flush_tlb_others`): the native one
    /// or, in a guest with PV flush, `kvm_flush_tlb_multi` in front of it.
    fn flush_others_call(&mut self, mm: MmId, call: SmpCallMany) -> Flow {
        let frame = self.flush_others_frame(call);
        match &frame {
            Frame::PvFlushTlbMulti(p) => {
                let c = &p.call.candidates;
                self.summary(|| {
                    format!(
                        "read mm_cpumask(mm{mm}): remote vcpus {c:?} -> kvm_flush_tlb_multi (PV)"
                    )
                });
            }
            Frame::SmpCallMany(p) => {
                let c = &p.candidates;
                self.summary(|| {
                    format!("read mm_cpumask(mm{mm}): remote cpus {c:?} -> flush_tlb_multi/others")
                });
            }
            Frame::Shoot4u(p) => {
                let c = &p.call.candidates;
                self.summary(|| {
                    format!(
                        "read mm_cpumask(mm{mm}): remote vcpus {c:?} -> shoot4u_flush_tlb_others"
                    )
                });
            }
            Frame::HvFlushTlbMulti(p) => {
                let c = &p.call.candidates;
                self.summary(|| {
                    format!("read mm_cpumask(mm{mm}): remote vcpus {c:?} -> hyperv_flush_tlb_multi")
                });
            }
            _ => {}
        }
        Flow::Call(frame)
    }

    fn flush_targets<E: Env>(
        &mut self,
        cpu: CpuId,
        s: &FlushMmRange,
        env: &mut E,
    ) -> (Vec<CpuId>, bool) {
        match &s.batch_targets {
            Some(t) => (
                t.iter().copied().filter(|&c| c != cpu).collect(),
                t.contains(&cpu),
            ),
            None => self.read_cpumask_others(cpu, s.mm, env),
        }
    }

    fn local_flush_wanted<E: Env>(&mut self, cpu: CpuId, s: &FlushMmRange, env: &mut E) -> bool {
        let loaded = self.load(env, cpu, Loc::LoadedMm(cpu as u32));
        match &s.batch_targets {
            Some(t) => t.contains(&cpu),
            None => loaded == s.mm as u64,
        }
    }

    /// One step of `flush_tlb_func()` (the handler run locally and from the IPI).
    ///
    /// `Guards` ([`Machine::flush_tlb_func_guards`]); `ReadGen` reads `mm->context.tlb_gen`;
    /// `Flush` flushes partially iff the end is not ALL, `new_tlb_gen == local_gen + 1` and
    /// `new_tlb_gen == mm_gen`, else fully, then records `mm_gen` in the ASID slot. v4.12
    /// (`Legacy`) has no generations: `LegacyFlush` flushes the range, or a lazy CPU calls
    /// `leave_mm()`.
    pub(crate) fn flush_tlb_func_step<E: Env>(
        &mut self,
        cpu: CpuId,
        s: &mut FlushFunc,
        env: &mut E,
    ) -> Flow {
        use FlushFuncPc::*;
        let f = s.info;
        match s.pc {
            Guards => {
                if !s.local {
                    self.perf.counters.inc(Counter::NrTlbRemoteFlushReceived);
                    self.perf.counters.inc(Counter::TlbShootdowns);
                    self.touch_line(env, cpu, flush_info_line(f.initiator), false);
                }
                if f.kernel {
                    // flush_tlb_kernel_range()'s function: no mm, no generations.
                    self.do_kernel_range_flush(cpu, &f, env);
                    return Flow::Return;
                }
                // The request as this CPU finds it (counterexample text only).
                let req = self.perf.labels_on.then(|| {
                    let ts = &self.cpus[cpu].tlbstate;
                    let local = ts
                        .ctxs
                        .get(ts.loaded_mm_asid as usize)
                        .map_or(0, |c| c.tlb_gen);
                    format!(
                        "request {{mm = {}, {}, new_tlb_gen = {}}}{}, loaded_mm = {}, local tlb_gen = {local}",
                        f.mm.map(|x| format!("mm{x}")).unwrap_or_else(|| "NULL".into()),
                        range_text(f.start, f.end),
                        f.new_tlb_gen,
                        if f.freed_tables { " (freed tables)" } else { "" },
                        loaded_mm_text(ts.loaded_mm),
                    )
                });
                let flow = self.flush_tlb_func_guards(cpu, s, env);
                if let Some(req) = req {
                    let out = match flow {
                        Flow::Return => "nothing to do: return",
                        Flow::Call(_) if s.pc == Transitioned => {
                            "on a dynamic ASID: move to the mm's global ASID"
                        }
                        Flow::Call(_) => "lazy: switch to init_mm",
                        _ => "go on",
                    };
                    self.summary(|| format!("{req}: {out}"));
                }
                flow
            }
            ReadGen => {
                s.mm_gen = self.load(env, cpu, Loc::TlbGen(s.mm));
                let (mm, local) = (s.mm, s.local_gen);
                if s.local_gen == s.mm_gen {
                    self.perf.counters.inc(Counter::FlushSkippedUpToDate);
                    let g = self.mms[mm as usize].tlb_gen;
                    self.summary(|| {
                        format!("read mm{mm}.tlb_gen = {g} (local {local}): up to date, return")
                    });
                    return Flow::Return;
                }
                let g = s.mm_gen;
                self.summary(|| format!("read mm{mm}.tlb_gen = {g} (local {local})"));
                s.pc = Flush;
                Flow::Next
            }
            Flush => {
                let next_gen_ok = f.new_tlb_gen == s.local_gen + 1
                    || self.opts.mutants.partial_flush_when_full_owed();
                let partial = f.end != TLB_FLUSH_ALL && next_gen_ok && f.new_tlb_gen == s.mm_gen;
                self.do_flush(
                    cpu,
                    s.local,
                    if partial {
                        Some((f.start, f.end, f.stride_shift))
                    } else {
                        None
                    },
                    f.freed_tables,
                    env,
                );
                self.cpus[cpu].tlbstate.ctxs[s.asid as usize].tlb_gen = s.mm_gen;
                self.touch_line(env, cpu, tlbstate_ctx_line(cpu, s.asid), true);
                let (asid, g) = (s.asid, s.mm_gen);
                self.summary(|| {
                    let how = if partial {
                        format!("partial ({}, INVLPG)", range_text(f.start, f.end))
                    } else {
                        "full".into()
                    };
                    format!("{how} flush; ctxs[{asid}].tlb_gen = {g}")
                });
                Flow::Return
            }
            LegacyFlush => {
                // v4.12: TLBSTATE_OK ⇒ flush what was asked, no generation bookkeeping.
                let range = if f.end == TLB_FLUSH_ALL {
                    None
                } else {
                    Some((f.start, f.end, f.stride_shift))
                };
                self.do_flush(cpu, s.local, range, f.freed_tables, env);
                self.summary(|| "flush the requested range (v4.12)".into());
                Flow::Return
            }
            LeftMm => {
                self.summary(|| "back from leave_mm: return".into());
                Flow::Return
            }
            Transitioned => {
                self.summary(|| "now on the global ASID: return".into());
                Flow::Return
            }
        }
    }

    /// `flush_tlb_func()`'s guards, in order: a request for another mm (mainline: drop our
    /// stale cpumask bit), init_mm loaded, v6.15's global ASID (move over to it, or return on
    /// it), lazy (V1: bit clear ⇒ skip; V3+: switch to init_mm), mainline's "already at
    /// new_tlb_gen" shortcut. v4.12 (`Legacy`) has no
    /// generations: flush the range or, when lazy, `leave_mm()`.
    fn flush_tlb_func_guards<E: Env>(
        &mut self,
        cpu: CpuId,
        s: &mut FlushFunc,
        env: &mut E,
    ) -> Flow {
        use FlushFuncPc::*;
        let f = s.info;
        let loaded = self.load(env, cpu, Loc::LoadedMm(cpu as u32));
        let lazy_tlb = self.opts.lazy_tlb;
        if let Some(m) = f.mm {
            if m as u64 != loaded {
                if lazy_tlb.trims_lazily() && !s.local {
                    // Stale cpumask bit: remove ourselves (lazy cpumask trimming).
                    self.rmw(env, cpu, Loc::CpumaskBit(m, cpu as u32), |_| 0);
                    self.perf.counters.inc(Counter::CpumaskTrimmed);
                }
                return Flow::Return;
            }
        }
        if loaded == INIT_MM as u64 || loaded == LOADED_MM_SWITCHING {
            return Flow::Return;
        }
        let mm = loaded as MmId;
        s.mm = mm;
        if self.broadcast_tlb_enabled() {
            // v6.15+: a CPU still on a dynamic ASID for an mm with a global one moves over
            // (switch_mm_irqs_off(NULL, loaded_mm, NULL)); on a global ASID there is nothing to
            // do: INVLPGB keeps it current.
            let g = self.mm_global_asid(cpu, mm, env);
            let cur = self.cpus[cpu].tlbstate.loaded_mm_asid;
            if g != 0 && cur != g {
                s.pc = Transitioned;
                return Flow::Call(SwitchMm::call(mm));
            }
            if is_global_asid(cur) {
                return Flow::Return;
            }
        }
        match lazy_tlb {
            LazyTlb::Legacy => {
                if self.cpus[cpu].tlbstate.legacy_lazy {
                    self.perf.counters.inc(Counter::LeaveMm);
                    s.pc = LeftMm;
                    return Flow::Call(leave_mm());
                }
                s.pc = LegacyFlush;
                return Flow::Next;
            }
            LazyTlb::TlbGen => {
                if self.load(env, cpu, Loc::CpumaskBit(mm, cpu as u32)) == 0 {
                    return Flow::Return; // lazy: not in mm_cpumask, catch up at switch
                }
            }
            LazyTlb::IsLazy | LazyTlb::V6_13 | LazyTlb::V6_17 | LazyTlb::Mainline => {
                if self.load(env, cpu, Loc::IsLazy(cpu as u32)) != 0 {
                    // Lazy and page tables were freed: stop referencing them at all.
                    self.perf.counters.inc(Counter::LeaveMm);
                    s.pc = LeftMm;
                    return Flow::Call(leave_mm());
                }
            }
        }
        s.asid = self.cpus[cpu].tlbstate.loaded_mm_asid;
        s.local_gen = self.cpus[cpu].tlbstate.ctxs[s.asid as usize].tlb_gen;
        if lazy_tlb.trims_lazily()
            && (f.new_tlb_gen != TLB_GENERATION_INVALID || self.opts.mutants.batch_flush_gen_zero())
            && f.new_tlb_gen <= s.local_gen
        {
            self.perf.counters.inc(Counter::FlushSkippedUpToDate);
            return Flow::Return;
        }
        s.pc = ReadGen;
        Flow::Next
    }

    /// The flush itself: a partial range of INVLPGs, one per `1 << stride_shift` pages, or a
    /// full local flush, with counters.
    ///
    /// With in-context flushes a shootdown's partial flush leaves the user PCID to the return
    /// to user: not on the initiating CPU (it "has cycles to burn" while it waits), nor for a
    /// flush that frees page tables.
    fn do_flush<E: Env>(
        &mut self,
        cpu: CpuId,
        local: bool,
        range: Option<(Vpn, Vpn, u8)>,
        freed_tables: bool,
        env: &mut E,
    ) {
        match range {
            Some((start, end, stride_shift)) => {
                let defer = self.pti
                    && self.opts.pti_user_flush == PtiUserFlush::Deferred
                    && !local
                    && !freed_tables;
                for v in (start..end).step_by(1 << stride_shift) {
                    self.flush_tlb_one_user(cpu, v, defer, env);
                }
                if defer {
                    self.flush_user_tlb_deferred(cpu, (start, end, stride_shift), env);
                }
                let n = (end - start).div_ceil(1 << stride_shift);
                self.perf.counters.add(Counter::NrTlbLocalFlushOne, n);
                self.perf.counters.add(
                    if local {
                        Counter::FlushLocalMmShootdown
                    } else {
                        Counter::FlushRemoteShootdown
                    },
                    n,
                );
            }
            None => {
                self.flush_tlb_local(cpu, env);
                self.perf.counters.inc(Counter::NrTlbLocalFlushAll);
                self.perf.counters.inc(if local {
                    Counter::FlushLocalMmShootdown
                } else {
                    Counter::FlushRemoteShootdown
                });
            }
        }
    }
}

/// `leave_mm()` / `switch_mm_irqs_off(NULL, &init_mm, NULL)`.
fn leave_mm() -> Frame {
    SwitchMm::call(INIT_MM)
}

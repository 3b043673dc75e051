//! Kernel mappings with the Global bit, and their flush (arch/x86/mm/tlb.c
//! `flush_tlb_kernel_range`, `do_kernel_range_flush`, `flush_tlb_one_kernel`,
//! `do_flush_tlb_all`; mm/vmalloc.c `vunmap_range`).
//!
//! The kernel half of every address space is init_mm's: vmalloc'd pages live in init_mm's
//! page tables at [`VMALLOC_START_VPN`] and up, and without PTI they are Global, so a CPU's
//! TLB entry for one, filled under one PCID, serves every PCID (`Tlb::lookup`) and survives
//! CR3 writes. Only INVLPG of the address (in any PCID, as the SDM gives it) or a flush of
//! everything (INVPCID all-context or a CR4.PGE toggle: `__flush_tlb_all`) removes it — which
//! is why `flush_tlb_kernel_range()` IPIs *every* CPU (`on_each_cpu`), lazy and idle ones
//! included, and why PCIDs stay off on CPUs whose INVLPG may leave Global entries behind
//! (`invlpg_miss_global`, option `invlpg_miss_global_no_pcid`).
//!
//! Simplifications: kernel accesses are reads of whole pages by kernel code in any task; PTI
//! (kernel mappings non-Global, `invalidate_other`) is refused by the checker's scenarios; the
//! lazy purge of vmap areas (`vfree` batching its flushes) is not modelled, only
//! `vunmap_range`'s immediate flush; the pages' frames are not freed.

use crate::counters::Counter;
use crate::frame::{CallCond, Flow, Frame};
use crate::machine::Machine;
use crate::mem::flush_info_line;
use crate::smp::SmpCallMany;
use crate::state::{FlushTlbInfo, INIT_MM, TLB_FLUSH_ALL, TLB_GENERATION_INVALID};
use shootdown_engine::Env;
use shootdown_hw::pagetable::Vpn;
use shootdown_hw::tlb::{Invlpgb, TlbEntry};
use shootdown_hw::CpuId;

/// `VMALLOC_START` (0xffffc90000000000, 4-level paging) as a page number.
pub const VMALLOC_START_VPN: Vpn = 0xffff_c900_0000_0000 >> 12;

/// The steps of `vunmap_range(addr, end)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum VunmapPc {
    /// `vunmap_range_noflush()`: clear the PTEs.
    Unmap,
    /// `flush_tlb_kernel_range()`: `on_each_cpu(do_kernel_range_flush)` — or, v6.15+ on a CPU
    /// with INVLPGB, `invlpgb_kernel_range_flush()` (or `invlpgb_flush_all()`): INVLPGBs of
    /// the range in every PCID, Global translations included, no IPIs.
    Flush,
    /// v6.15+ with INVLPGB: `__tlbsync()`.
    Tlbsync,
    /// The flush has run everywhere: return.
    Done,
}

impl Machine {
    /// Kernel code on `cpu` reads kernel page `vpn`: a TLB hit (any PCID's Global entry), or
    /// a walk of init_mm's tables and a fill, Global without PTI.
    pub(crate) fn kernel_access<E: Env>(&mut self, cpu: CpuId, vpn: Vpn, env: &mut E) {
        let pcid = self.kern_pcid(self.cpus[cpu].tlbstate.loaded_mm_asid);
        if let Some(e) = self.cpus[cpu].tlb.lookup(pcid, vpn) {
            let pte = self.mms[INIT_MM as usize].space.leaf(vpn, e.huge);
            self.perf.uses_checked += 1;
            if let Err(v) = self.oracle.check_use(INIT_MM, e.mm, vpn, e.version, &pte) {
                self.violate(v);
            }
            let g = if e.global { "Global " } else { "" };
            self.say(|| {
                format!(
                    "kernel read of page {vpn:#x}: {g}TLB hit (PTE version {})",
                    e.version
                )
            });
            return;
        }
        self.charge(env, |c| c.tlb_miss_walk);
        self.perf.counters.inc(Counter::TlbMisses);
        let pte = self.mms[INIT_MM as usize].space.leaf(vpn, false);
        if !pte.present {
            // vmalloc'd memory read after its vunmap: a kernel bug (an oops), not the flush's.
            self.say(|| format!("kernel read of page {vpn:#x}: not mapped (would oops): skipped"));
            return;
        }
        let victim = env.random(u64::MAX);
        let global = !self.pti;
        self.cpus[cpu].tlb.insert(
            pcid,
            vpn,
            TlbEntry {
                pfn: pte.pfn,
                writable: pte.writable,
                global,
                mm: INIT_MM,
                version: pte.version,
                ept: None,
                huge: false,
            },
            victim,
        );
        self.perf.uses_checked += 1;
        self.say(|| {
            format!(
                "kernel read of page {vpn:#x}: walk, fill TLB ({}PTE version {})",
                if global { "Global, " } else { "" },
                pte.version
            )
        });
    }

    /// One step of `vunmap_range(start, start + npages)`.
    pub(crate) fn vunmap_range_step<E: Env>(
        &mut self,
        cpu: CpuId,
        pc: &mut VunmapPc,
        start: Vpn,
        npages: u64,
        begin: &mut u64,
        env: &mut E,
    ) -> Flow {
        match *pc {
            VunmapPc::Unmap => {
                let n = self.zap_range(INIT_MM, start, npages, None, env);
                self.summary(|| {
                    format!("vunmap_range_noflush: clear {n} kernel PTEs from {start:#x}")
                });
                *pc = VunmapPc::Flush;
                Flow::Next
            }
            VunmapPc::Flush => {
                *begin = self.oracle.flush_begin();
                let end = if npages > self.opts.tlb_single_page_flush_ceiling.0 {
                    TLB_FLUSH_ALL
                } else {
                    start + npages
                };
                if self.broadcast_tlb_enabled() {
                    return self.invlpgb_kernel_range_flush(cpu, pc, start, end, env);
                }
                let info = FlushTlbInfo {
                    mm: None,
                    start,
                    end,
                    new_tlb_gen: TLB_GENERATION_INVALID,
                    stride_shift: 0,
                    freed_tables: false,
                    trim_cpumask: false,
                    initiator: cpu,
                    kernel: true,
                };
                self.flush_info[cpu] = Some(info);
                self.touch_line(env, cpu, flush_info_line(cpu), true);
                *pc = VunmapPc::Done;
                let others: Vec<CpuId> = (0..self.cpus.len()).filter(|&c| c != cpu).collect();
                let cond = if self.opts.mutants.flush_tlb_kernel_range_skips_lazy() {
                    CallCond::NotLazy
                } else {
                    CallCond::All
                };
                self.perf.counters.inc(Counter::NrTlbRemoteFlush);
                self.summary(|| {
                    format!(
                        "flush_tlb_kernel_range: on_each_cpu({}) to cpus {others:?} and here",
                        if end == TLB_FLUSH_ALL {
                            "do_flush_tlb_all"
                        } else {
                            "do_kernel_range_flush"
                        }
                    )
                });
                Flow::Call(Frame::SmpCallMany(Box::new(SmpCallMany {
                    run_local: true,
                    ..SmpCallMany::new(cond, others, info)
                })))
            }
            VunmapPc::Tlbsync => {
                *pc = VunmapPc::Done;
                if self.opts.mutants.broadcast_skips_tlbsync() {
                    self.say(|| "return without TLBSYNC".into());
                    return Flow::Next;
                }
                self.tlbsync(cpu, env);
                self.say(|| "__tlbsync: this CPU's INVLPGBs are done everywhere".into());
                Flow::Next
            }
            VunmapPc::Done => {
                let range = Some((start, start + npages));
                self.oracle.flush_returned(INIT_MM, range, *begin);
                self.summary(|| "return: kernel range flushed on every CPU".into());
                Flow::Return
            }
        }
    }

    /// v6.15+ `flush_tlb_kernel_range()` on a CPU with INVLPGB: `invlpgb_flush_all()` for a
    /// full flush, else `invlpgb_kernel_range_flush()` — one `invlpgb_flush_addr_nosync()` per
    /// `invlpgb_count_max` pages (every PCID, Global translations included) — then TLBSYNC.
    fn invlpgb_kernel_range_flush<E: Env>(
        &mut self,
        cpu: CpuId,
        pc: &mut VunmapPc,
        start: Vpn,
        end: Vpn,
        env: &mut E,
    ) -> Flow {
        // Every PCID, Global translations included (`invlpgb_flush_all` when it is all).
        let all_pcids = Invlpgb {
            include_global: true,
            ..Invlpgb::ALL_NONGLOBALS
        };
        let n = if end == TLB_FLUSH_ALL {
            self.invlpgb(cpu, all_pcids, env);
            1
        } else {
            self.invlpgb_range(cpu, all_pcids, &[None], (start, end), 0, env)
        };
        self.say(|| {
            format!(
                "flush_tlb_kernel_range: {n} INVLPGB(s) of {} in every PCID, Global included (no IPIs)",
                crate::tlb::range_text(start, end)
            )
        });
        *pc = VunmapPc::Tlbsync;
        Flow::Next
    }

    /// `do_kernel_range_flush()` (INVLPG of each page: `flush_tlb_one_kernel`) or, for
    /// `TLB_FLUSH_ALL`, `do_flush_tlb_all()` (`__flush_tlb_all`: INVPCID all-context, or a
    /// CR4.PGE toggle, Global entries included).
    pub(crate) fn do_kernel_range_flush<E: Env>(
        &mut self,
        cpu: CpuId,
        f: &FlushTlbInfo,
        env: &mut E,
    ) {
        if f.end == TLB_FLUSH_ALL {
            self.fence(cpu);
            self.cpus[cpu].tlb.flush_all();
            self.charge(env, |c| c.cr3_write_flush);
            self.perf.counters.inc(Counter::NrTlbLocalFlushAll);
            self.summary(|| "do_flush_tlb_all: __flush_tlb_all (Global entries too)".into());
            return;
        }
        for vpn in f.start..f.end {
            self.flush_tlb_one_user(cpu, vpn, false, env);
            self.perf.counters.inc(Counter::NrTlbLocalFlushOne);
        }
        let (s, e) = (f.start, f.end);
        let erratum = self.invlpg_miss_global && self.pcid_enabled();
        self.summary(|| {
            format!(
                "do_kernel_range_flush: INVLPG pages {s:#x}..{e:#x}{}",
                if erratum {
                    " (erratum: Global entries stay)"
                } else {
                    ""
                }
            )
        });
    }
}

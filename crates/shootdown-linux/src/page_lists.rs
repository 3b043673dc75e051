//! The per-CPU page lists and the locks behind them (v4.15), for pages whose faults and frees a
//! workload charges in bulk instead of modelling each translation (ebizzy's chunks):
//!
//! * **The page allocator's per-CPU lists** (`mm/page_alloc.c`): an order-0 allocation takes a
//!   page from the CPU's `per_cpu_pages` list (`rmqueue_pcplist`); an empty list is refilled
//!   with `pcp->batch` pages under `zone->lock` (`rmqueue_bulk`). A free puts the page back
//!   (`free_hot_cold_page`, later `free_unref_page_commit`); a list at `pcp->high` gives
//!   `pcp->batch` pages back to the buddy allocator under `zone->lock` (`free_pcppages_bulk`).
//!   `zone_batchsize` gives 31 for any zone above 128 MiB and `high` is 6 × batch. A thread
//!   that frees on the CPU it allocated on therefore rarely takes `zone->lock` at all.
//! * **The LRU** (`mm/swap.c`): each faulted anonymous page goes to the CPU's `lru_add_pvec`
//!   (`lru_cache_add`), and a full pagevec (`PAGEVEC_SIZE` = 14 in v4.15) is moved onto the
//!   node's LRU list under `pgdat->lru_lock` (`__pagevec_lru_add`). Freeing the pages of an
//!   `mmu_gather` batch (`free_pages_and_swap_cache`) first drains the CPU's pagevec
//!   (`lru_add_drain`), then `release_pages` takes them off the LRU under `lru_lock`, dropping
//!   and retaking it every `SWAP_CLUSTER_MAX` (32) pages, and frees them to the per-CPU list
//!   (`free_unref_page_list`). `tlb_finish_mmu` frees the gather's first batch (its
//!   `MMU_GATHER_BUNDLE` = 8 pages on the stack) and then the rest.
//!
//! Both locks are taken with interrupts off (`spin_lock_irqsave`, or under `local_irq_save`):
//! a CPU waiting for or holding one takes a flush IPI only after it dropped it. They are the
//! guest's kernel spinlocks ([`crate::spinlock`]), so how a waiter waits is the `spinlock`
//! option. Each kernel (the native machine, or each VM) has its own pair.
//!
//! Costs: each section pays for its lock word (the locked operation, a line transfer from the
//! previous holder) and for its data line (the LRU list heads and sizes, `lruvec`; the zone's
//! free areas), then `lru_page` or `buddy_page` per page. Taking pages off (or putting one onto)
//! a list also writes the list neighbours' `struct page`s: pages go onto the LRU a pagevec at a
//! time, so the neighbours of a run of a CPU's pages are another CPU's — one miss per pagevec
//! added, two per pagevec-sized run released, priced as the data line's own transfer (when it
//! came from another CPU, so did they). Simplified: one zone and one LRU list per kernel; no
//! reclaim, no page cache, no memcg; the pages the workload tracks one by one (its real page
//! faults) do not go through these lists.

use crate::counters::Counter;
use crate::frame::{Flow, Frame};
use crate::machine::Machine;
use crate::mem::Loc;
use shootdown_engine::{Env, Time};
use shootdown_hw::CpuId;

/// `PAGEVEC_SIZE` (v4.15).
pub const PAGEVEC_SIZE: u32 = 14;
/// `pcp->batch` for a zone above 128 MiB (`zone_batchsize`).
pub const PCP_BATCH: u32 = 31;
/// `pcp->high` = 6 × batch (`pageset_set_batch`).
pub const PCP_HIGH: u32 = 6 * PCP_BATCH;
/// `SWAP_CLUSTER_MAX`: `release_pages` drops `lru_lock` after this many pages.
pub const SWAP_CLUSTER_MAX: u32 = 32;
/// `MMU_GATHER_BUNDLE`: the pages of an `mmu_gather`'s first (on-stack) batch.
pub const MMU_GATHER_BUNDLE: u32 = 8;
/// `MAX_GATHER_BATCH`: pages of each further batch (a page of pointers).
pub const MAX_GATHER_BATCH: u32 = 510;
/// Faults charged per step, so that a flush IPI waits at most this many faults' time for the
/// end of the step (a step is atomic for the timed driver).
const FAULTS_PER_STEP: u32 = 4;

/// One CPU's page lists.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct PageLists {
    /// Pages in its `lru_add_pvec`.
    pub pvec: u32,
    /// `pcp->count` of its per-CPU page list.
    pub pcp: u32,
}

/// A section of page-list work under one of the kernel's two locks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Section {
    /// `__pagevec_lru_add`: a pagevec onto the LRU (`lru_lock`).
    PagevecLruAdd,
    /// `release_pages`: up to `SWAP_CLUSTER_MAX` pages off the LRU (`lru_lock`).
    ReleasePages,
    /// `rmqueue_bulk`: refill the per-CPU list (`zone->lock`).
    RmqueueBulk,
    /// `free_pcppages_bulk`: give a batch back to the buddy allocator (`zone->lock`).
    FreePcppagesBulk,
}

impl Section {
    pub fn name(self) -> &'static str {
        match self {
            Section::PagevecLruAdd => "__pagevec_lru_add",
            Section::ReleasePages => "release_pages",
            Section::RmqueueBulk => "rmqueue_bulk",
            Section::FreePcppagesBulk => "free_pcppages_bulk",
        }
    }

    fn lru(self) -> bool {
        matches!(self, Section::PagevecLruAdd | Section::ReleasePages)
    }

    /// Its lock's counters: sections run, and sections that found the lock taken.
    fn counters(self) -> (Counter, Counter) {
        if self.lru() {
            (Counter::LruLock, Counter::LruLockContended)
        } else {
            (Counter::ZoneLock, Counter::ZoneLockContended)
        }
    }

    /// List neighbours written that belong to other CPUs' runs of pages.
    fn neighbour_misses(self, pages: u32) -> u64 {
        match self {
            Section::PagevecLruAdd => 1,
            Section::ReleasePages => 2 * pages.div_ceil(PAGEVEC_SIZE) as u64,
            Section::RmqueueBulk | Section::FreePcppagesBulk => 0,
        }
    }
}

/// `spin_lock_irqsave(lock)`; a [`Section`] over `pages` pages; `spin_unlock_irqrestore`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PageListLocked {
    pub pc: PageListLockedPc,
    pub section: Section,
    pub pages: u32,
    /// Found the lock taken (counted once).
    pub contended: bool,
}

/// The steps of a [`PageListLocked`] section.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PageListLockedPc {
    /// `spin_lock`: take the lock, or wait as the `spinlock` option says.
    Lock,
    /// Holding it: the section's work.
    Hold,
    /// `spin_unlock` (and, for a PV lock, kick a halted next waiter).
    Unlock,
}

/// Page faults or frees of `left` pages the workload does not track one by one.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct BulkPages {
    pub pc: BulkPagesPc,
    /// Pages not yet faulted in (or not yet put in a gather batch).
    pub left: u32,
    /// Pages of the current gather batch still on the LRU.
    pub gather: u32,
    /// Pages of the current gather batch off the LRU, to free to the per-CPU list.
    pub unref: u32,
    /// Gather batches begun (the first is the on-stack bundle).
    pub batches: u32,
}

/// The steps of [`BulkPages`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BulkPagesPc {
    /// Anonymous faults (`do_anonymous_page`): allocate from the per-CPU list, zero, map,
    /// `lru_cache_add`.
    Fault,
    /// Free: the next gather batch; `lru_add_drain()`.
    Drain,
    /// Free: `release_pages`, one `lru_lock` section at a time.
    Release,
    /// Free: `free_unref_page_list` of the batch's pages.
    FreeUnref,
}

impl BulkPages {
    /// `npages` anonymous page faults.
    pub fn faults(npages: u32) -> Frame {
        Frame::BulkPages(BulkPages {
            pc: BulkPagesPc::Fault,
            left: npages,
            gather: 0,
            unref: 0,
            batches: 0,
        })
    }

    /// The freeing half of `tlb_finish_mmu` for `npages` zapped pages.
    pub fn frees(npages: u32) -> Frame {
        Frame::BulkPages(BulkPages {
            pc: BulkPagesPc::Drain,
            left: npages,
            gather: 0,
            unref: 0,
            batches: 0,
        })
    }

    pub fn name(&self) -> &'static str {
        match self.pc {
            BulkPagesPc::Fault => "do_anonymous_page",
            _ => "free_pages_and_swap_cache",
        }
    }
}

fn locked(section: Section, pages: u32) -> Flow {
    Flow::Call(Frame::PageListLocked(PageListLocked {
        pc: PageListLockedPc::Lock,
        section,
        pages,
        contended: false,
    }))
}

impl Machine {
    /// Kernel `k`'s `lru_lock` and `zone->lock` for `count` more kernels (`setup.rs`).
    pub(crate) fn add_kernel_page_locks(&mut self, count: usize) {
        for _ in 0..2 * count {
            self.add_kernel_lock();
        }
    }

    /// The kernel lock a section of CPU `cpu` takes: its kernel's `lru_lock` or `zone->lock`.
    fn section_lock(&self, cpu: CpuId, s: Section) -> u32 {
        let kernel = self.host.as_ref().map_or(0, |h| h.vcpus[cpu].vm);
        2 * kernel + u32::from(!s.lru())
    }

    /// One step of [`BulkPages`].
    pub(crate) fn bulk_pages_step<E: Env>(
        &mut self,
        cpu: CpuId,
        b: &mut BulkPages,
        env: &mut E,
    ) -> Flow {
        let lists = self.opts.page_lists;
        match b.pc {
            BulkPagesPc::Fault => {
                if b.left == 0 {
                    return Flow::Return;
                }
                let pl = self.page_lists[cpu];
                if lists && pl.pcp == 0 {
                    self.say(|| "rmqueue_pcplist: per-CPU list empty, rmqueue_bulk".into());
                    return locked(Section::RmqueueBulk, PCP_BATCH);
                }
                let mut n = b.left.min(FAULTS_PER_STEP);
                if lists {
                    n = n.min(pl.pcp).min(PAGEVEC_SIZE - pl.pvec);
                }
                self.charge(env, |c| {
                    let one =
                        c.page_fault_entry_exit.0 + c.page_alloc.0 + c.page_zero.0 + c.pte_update.0;
                    Time(one * n as u64)
                });
                self.perf.counters.add(Counter::PageFaults, n as u64);
                b.left -= n;
                self.say(|| format!("{n} anonymous page fault(s)"));
                if !lists {
                    return Flow::Next;
                }
                let pl = &mut self.page_lists[cpu];
                pl.pcp -= n;
                pl.pvec += n;
                if pl.pvec == PAGEVEC_SIZE {
                    return locked(Section::PagevecLruAdd, PAGEVEC_SIZE);
                }
                Flow::Next
            }
            BulkPagesPc::Drain => {
                if b.left == 0 {
                    return Flow::Return;
                }
                // The next batch of the gather: its first is the on-stack bundle.
                let cap = if b.batches == 0 {
                    MMU_GATHER_BUNDLE
                } else {
                    MAX_GATHER_BATCH
                };
                b.batches += 1;
                b.gather = b.left.min(cap);
                b.left -= b.gather;
                b.pc = BulkPagesPc::Release;
                let pvec = self.page_lists[cpu].pvec;
                if lists && pvec > 0 {
                    self.say(|| "lru_add_drain".into());
                    return locked(Section::PagevecLruAdd, pvec);
                }
                Flow::Next
            }
            BulkPagesPc::Release => {
                let k = if lists {
                    b.gather.min(SWAP_CLUSTER_MAX)
                } else {
                    b.gather
                };
                b.gather -= k;
                b.unref += k;
                if b.gather == 0 {
                    b.pc = BulkPagesPc::FreeUnref;
                }
                if lists {
                    return locked(Section::ReleasePages, k);
                }
                Flow::Next
            }
            BulkPagesPc::FreeUnref => {
                if b.unref > 0 {
                    let n = b.unref as u64;
                    self.charge(env, |c| Time(c.page_free.0 * n));
                    if lists {
                        self.page_lists[cpu].pcp += b.unref;
                    }
                    b.unref = 0;
                }
                if lists && self.page_lists[cpu].pcp >= PCP_HIGH {
                    return locked(Section::FreePcppagesBulk, PCP_BATCH);
                }
                b.pc = BulkPagesPc::Drain;
                Flow::Next
            }
        }
    }

    /// One step of a [`PageListLocked`] section.
    pub(crate) fn page_list_locked_step<E: Env>(
        &mut self,
        cpu: CpuId,
        s: &mut PageListLocked,
        env: &mut E,
    ) -> Flow {
        let id = self.section_lock(cpu, s.section);
        match s.pc {
            PageListLockedPc::Lock => {
                let (taken, contended) = s.section.counters();
                if let Some(wait) = self.kernel_spin_lock(cpu, id, env) {
                    if !s.contended {
                        s.contended = true;
                        self.perf.counters.inc(contended);
                        self.say(|| format!("{}: lock held, wait", s.section.name()));
                    }
                    return wait;
                }
                self.perf.counters.inc(taken);
                self.say(|| format!("{}: lock taken", s.section.name()));
                s.pc = PageListLockedPc::Hold;
                Flow::Next
            }
            PageListLockedPc::Hold => {
                let data = self.kernel_lock_data_line(id);
                let moved = if env.timed() {
                    self.line_cost(env, cpu, data, true)
                } else {
                    Time::ZERO
                };
                let misses = if moved > Time(2 * self.perf.profile.costs.l1_hit.0) {
                    s.section.neighbour_misses(s.pages)
                } else {
                    0
                };
                let pages = s.pages as u64;
                self.charge(env, |c| {
                    let per = if s.section.lru() {
                        c.lru_page
                    } else {
                        c.buddy_page
                    };
                    Time(moved.0 * (1 + misses) + per.0 * pages)
                });
                let pl = &mut self.page_lists[cpu];
                match s.section {
                    Section::PagevecLruAdd => pl.pvec -= s.pages,
                    Section::ReleasePages => {}
                    Section::RmqueueBulk => pl.pcp += s.pages,
                    Section::FreePcppagesBulk => pl.pcp -= s.pages,
                }
                self.say(|| format!("{}: {} page(s)", s.section.name(), s.pages));
                s.pc = PageListLockedPc::Unlock;
                Flow::Next
            }
            PageListLockedPc::Unlock => {
                self.kernel_spin_unlock(cpu, id, env);
                Flow::Return
            }
        }
    }

    /// Would this section's next step only wait for its lock?
    pub(crate) fn page_list_locked_spins(&self, cpu: CpuId, s: &PageListLocked) -> bool {
        s.pc == PageListLockedPc::Lock
            && self.kernel_lock_waits(cpu, self.section_lock(cpu, s.section))
    }

    /// The data a kernel lock protects, as one cache line beside the lock's.
    fn kernel_lock_data_line(&self, id: u32) -> u64 {
        crate::mem::line_of(self, Loc::KernelLock(id)) | 1
    }
}

//! Shared kernel memory: the variables other CPUs read, as *locations*.
//!
//! Every protocol step that touches shared state goes through [`Machine::load`],
//! [`Machine::store`] or [`Machine::rmw`]. That is where the two things the drivers care about
//! happen: the timed driver charges the cache-line transfer the access implies (so false sharing
//! and needless atomics cost something), and the explorer under x86-TSO routes stores through the
//! CPU's store buffer (a locked RMW or a fence drains it first).
//!
//! Simplification: PTE stores go straight to memory. Every PTE change in the model is followed
//! by a locked `inc_mm_tlb_gen` (or a lock release) before anything depends on it, which would
//! drain the store buffer anyway.

use crate::machine::Machine;
use crate::state::{CsdKey, MmId};
use shootdown_engine::{Env, Time};
use shootdown_hw::cacheline::LineId;
use shootdown_hw::store_buffer::StoreBuffer;
use shootdown_hw::CpuId;

/// The location table: each shared variable is declared once — its `Loc` variant and fields,
/// the cache line it lives on (`line`), where the model keeps it (`read`, `write`) and, for
/// locations indexed by CPU, how it is renamed with the CPUs (`rename`, for symmetry
/// reduction; identity if absent); `holder = true` marks a spinlock whose value is the holding CPU
/// + 1 (renamed too).
macro_rules! locations {
    ($(
        $(#[doc = $doc:literal])*
        $var:ident ( $($f:ident : $t:ty),* ) {
            line($lm:ident) = $line:expr;
            read($rm:ident) = $read:expr;
            write($wm:ident, $wv:ident) = $write:expr;
            $( rename($pf:ident) = $rename:expr; )?
            $( holder = $holder:literal; )?
        }
    )+) => {
        /// A shared kernel variable.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum Loc { $( $(#[doc = $doc])* $var($($t),*), )+ }

        /// Cache-line identities: which variables share a line is the point (docs/design/kernel-model.md
        /// §1.2).
        #[allow(unused_variables)]
        pub(crate) fn line_of(m: &Machine, loc: Loc) -> LineId {
            match loc { $( Loc::$var($($f),*) => { let $lm = m; $line } )+ }
        }

        impl Loc {
            /// Whether the value is a holding CPU + 1 (a spinlock taken by `spin_trylock`),
            /// which renames with the CPUs.
            pub fn value_is_holder(self) -> bool {
                match self { $( Loc::$var(..) => false $( || $holder )?, )+ }
            }

            /// The location with CPUs renamed by `f` (symmetry reduction).
            #[allow(unused_variables)]
            pub fn rename_cpus(self, f: &dyn Fn(u32) -> u32) -> Loc {
                match self {
                    $( Loc::$var($($f),*) => {
                        $( let $pf = f; return $rename; )?
                        #[allow(unreachable_code)]
                        Loc::$var($($f),*)
                    } )+
                }
            }
        }

        impl Machine {
            /// The value of `loc` in memory (past every store buffer).
            #[allow(unused_variables)]
            pub(crate) fn raw_read(&self, loc: Loc) -> u64 {
                match loc { $( Loc::$var($($f),*) => { let $rm = self; $read } )+ }
            }

            /// Write `v` to `loc` in memory.
            #[allow(unused_variables)]
            pub(crate) fn raw_write(&mut self, loc: Loc, v: u64) {
                match loc { $( Loc::$var($($f),*) => { let $wm = &mut *self; let $wv = v; $write } )+ }
            }
        }
    };
}

const MM_LINES: u64 = 1 << 56;
const CSD_LINES: u64 = 4 << 56;
/// Each CPU's own lines (its per-CPU variables), numbered densely: [`percpu_line`].
const PERCPU_LINES: u64 = 22 << 56;

/// The lines of one CPU's per-CPU variables ([`percpu_line`]).
#[derive(Clone, Copy)]
pub(crate) enum PerCpuLine {
    /// `cpu_tlbstate`'s first line (`loaded_mm`, `loaded_mm_asid`, `is_lazy` until v5.13,
    /// `ctxs[0..2]`) and its second (`ctxs[2..6]`): [`tlbstate_line`].
    Tlbstate0,
    Tlbstate1,
    /// `cpu_tlbstate_shared` (`is_lazy` from v5.13).
    TlbstateShared,
    /// The CPU's `flush_tlb_info`.
    FlushInfo,
    /// Its `call_single_queue` head.
    CallQueue,
    /// A vCPU's steal-time area (one 64-byte aligned struct per vCPU).
    StealTime,
    /// A vCPU's `mode` and `requests` (neighbours in `struct kvm_vcpu`).
    VcpuMode,
}
const PERCPU_KINDS: u64 = 8;

/// The line of `cpu`'s per-CPU variable `kind`, numbered CPU-major so that the directory keeps
/// each CPU's lines side by side in one array ([`percpu_lines`]).
pub(crate) fn percpu_line(cpu: CpuId, kind: PerCpuLine) -> LineId {
    PERCPU_LINES + cpu as u64 * PERCPU_KINDS + kind as u64
}
/// Every per-CPU line of a machine of `n` CPUs (or vCPUs).
pub(crate) fn percpu_lines(n: usize) -> std::ops::Range<LineId> {
    PERCPU_LINES..PERCPU_LINES + n as u64 * PERCPU_KINDS
}

locations! {
    /// `mm->context.tlb_gen`.
    TlbGen(mm: MmId) {
        line(m) = MM_LINES | (mm as u64) << 24;
        read(m) = m.mms[mm as usize].tlb_gen;
        write(m, v) = m.mms[mm as usize].tlb_gen = v;
    }
    /// `mm->context.global_asid` (v6.15+): written with `smp_store_release`, read with
    /// `smp_load_acquire` (plain moves on x86), beside `tlb_gen` in `mm->context`.
    GlobalAsid(mm: MmId) {
        line(m) = MM_LINES | (mm as u64) << 24;
        read(m) = m.mms[mm as usize].global_asid as u64;
        write(m, v) = m.mms[mm as usize].global_asid = v as u16;
    }
    /// `mm->context.asid_transition` (v6.15+).
    AsidTransition(mm: MmId) {
        line(m) = MM_LINES | (mm as u64) << 24;
        read(m) = m.mms[mm as usize].asid_transition as u64;
        write(m, v) = m.mms[mm as usize].asid_transition = v != 0;
    }
    /// One bit of `mm_cpumask(mm)`.
    CpumaskBit(mm: MmId, c: u32) {
        // 512 bits of cpumask per 64-byte line.
        line(m) = MM_LINES | (mm as u64) << 24 | (1 + c as u64 / 512);
        read(m) = m.mms[mm as usize].cpumask_test(c as usize) as u64;
        write(m, v) = m.mms[mm as usize].cpumask_assign(c as usize, v != 0);
        rename(f) = Loc::CpumaskBit(mm, f(c));
    }
    /// `cpu_tlbstate.loaded_mm` of a CPU.
    LoadedMm(c: u32) {
        line(m) = tlbstate_line(c as CpuId, 0);
        read(m) = m.cpus[c as usize].tlbstate.loaded_mm;
        write(m, v) = m.cpus[c as usize].tlbstate.loaded_mm = v;
        rename(f) = Loc::LoadedMm(f(c));
    }
    /// `cpu_tlbstate(_shared).is_lazy` of a CPU.
    IsLazy(c: u32) {
        line(m) = if m.opts.tlbstate_shared {
            percpu_line(c as CpuId, PerCpuLine::TlbstateShared)
        } else {
            tlbstate_line(c as CpuId, TLBSTATE_IS_LAZY_OFFSET)
        };
        read(m) = m.cpus[c as usize].tlbstate.is_lazy as u64;
        write(m, v) = m.cpus[c as usize].tlbstate.is_lazy = v != 0;
        rename(f) = Loc::IsLazy(f(c));
    }
    /// `mm->tlb_flush_pending` (`inc_tlb_flush_pending` in `tlb_gather_mmu`, read by
    /// `mm_tlb_flush_nested`).
    TlbFlushPending(mm: MmId) {
        // Beside tlb_flush_batched in struct mm_struct, away from mm->context.
        line(m) = MM_LINES | (mm as u64) << 24 | 0xff_ffff;
        read(m) = m.mms[mm as usize].tlb_flush_pending;
        write(m, v) = m.mms[mm as usize].tlb_flush_pending = v;
    }
    /// `mm->tlb_flush_batched` (set by reclaim's `set_tlb_ubc_flush_pending`, read and reset by
    /// `flush_tlb_batched_pending`).
    TlbFlushBatched(mm: MmId) {
        line(m) = MM_LINES | (mm as u64) << 24 | 0xff_ffff;
        read(m) = m.mms[mm as usize].tlb_flush_batched;
        write(m, v) = m.mms[mm as usize].tlb_flush_batched = v;
    }
    /// The split page-table lock of page-table page `pt` (its index in the PMD) of `mm`: 0
    /// free, else holder CPU + 1.
    Ptl(mm: MmId, pt: u64) {
        line(m) = (20u64 << 56) | (mm as u64) << 40 | pt;
        read(m) = m.mms[mm as usize].ptl_held.get(&pt).copied().unwrap_or(0);
        write(m, v) = if v == 0 {
            m.mms[mm as usize].ptl_held.remove(&pt);
        } else {
            m.mms[mm as usize].ptl_held.insert(pt, v);
        };
        holder = true;
    }
    /// The lock bit of a `call_single_data`.
    CsdLock(k: CsdKey) {
        line(m) = csd_line(m.cpus.len(), k);
        read(m) = m.csd_locked.contains(k) as u64;
        write(m, v) = if v != 0 {
            m.csd_locked.insert(k);
        } else {
            m.csd_locked.remove(k);
        };
        rename(f) = Loc::CsdLock(CsdKey {
            src: f(k.src as u32) as CpuId,
            dst: f(k.dst as u32) as CpuId,
        });
    }
    /// Guest memory: `struct kvm_steal_time.preempted` of a vCPU (`KVM_VCPU_PREEMPTED`,
    /// `KVM_VCPU_FLUSH_TLB`), shared by the guest's PV flush and the host (docs/design/kernel-model.md §3.1).
    Preempted(c: u32) {
        line(m) = percpu_line(c as CpuId, PerCpuLine::StealTime);
        read(m) = m.host.as_ref().map_or(0, |h| h.steal_preempted[c as usize]) as u64;
        write(m, v) = if let Some(h) = m.host.as_mut() {
            h.steal_preempted[c as usize] = v as u8;
        };
        rename(f) = Loc::Preempted(f(c));
    }
    /// The `xa_lock` spinlock of a DAX file's mapping (a `Machine::dax_files` index): 0 free,
    /// else holder CPU + 1.
    XaLock(file: u32) {
        line(m) = (9u64 << 56) | file as u64;
        read(m) = m.dax_files[file as usize].xa_lock;
        write(m, v) = m.dax_files[file as usize].xa_lock = v;
        holder = true;
    }
    /// KVM: `vcpu->mode` (`kvm::mode`).
    VcpuMode(v: u32) {
        line(m) = percpu_line(v as CpuId, PerCpuLine::VcpuMode);
        read(m) = m.host_ref().vcpus[v as usize].mode;
        write(m, x) = m.host_mut().vcpus[v as usize].mode = x;
        rename(f) = Loc::VcpuMode(f(v));
    }
    /// KVM: `vcpu->requests` (a bit per `kvm::Request`).
    VcpuRequests(v: u32) {
        line(m) = percpu_line(v as CpuId, PerCpuLine::VcpuMode);
        read(m) = m.host_ref().vcpus[v as usize].requests;
        write(m, x) = m.host_mut().vcpus[v as usize].requests = x;
        rename(f) = Loc::VcpuRequests(f(v));
    }
    /// KVM: `kvm->memslots[as]`, the published memslot set (which of the address space's two).
    /// Its write is the publication the oracle dates (`rcu_assign_pointer` reaching memory).
    Memslots(vm: u32, as_id: u32) {
        line(m) = (13u64 << 56) | (vm as u64) << 8 | as_id as u64;
        read(m) = m.kvm(vm as usize).address_spaces[as_id as usize].active as u64;
        write(m, x) = m.publish_memslots(vm as usize, as_id as usize, x as u8);
    }
    /// KVM: `slots->generation` of one of an address space's two memslot sets.
    SlotsGen(vm: u32, as_id: u32, set: u8) {
        line(m) = (14u64 << 56) | (vm as u64) << 16 | (as_id as u64) << 8 | set as u64;
        read(m) = m.kvm(vm as usize).address_spaces[as_id as usize].sets[set as usize].generation;
        write(m, x) = m.kvm_mut(vm as usize).address_spaces[as_id as usize].sets[set as usize].generation = x;
    }
    /// KVM: `mmu_lock`'s lock word (the holder agent + 1, or 0; its waiters queue in
    /// `QueuedSpinlock::queue`).
    MmuLock(vm: u32) {
        line(m) = (15u64 << 56) | vm as u64;
        read(m) = m.kvm(vm as usize).mmu_lock.val;
        write(m, x) = m.kvm_mut(vm as usize).mmu_lock.val = x;
    }
    /// KVM (TDP MMU): `mmu_lock`'s `cnts` as a queued rwlock (`kvm::mmu::rwlock`).
    MmuRwlock(vm: u32) {
        line(m) = (15u64 << 56) | 1 << 40 | vm as u64;
        read(m) = m.kvm(vm as usize).mmu_rwlock.cnts;
        write(m, x) = m.kvm_mut(vm as usize).mmu_rwlock.cnts = x;
    }
    /// KVM (TDP MMU): the word of the rwlock's `wait_lock` (holder agent + 1, or 0; waiters
    /// queue in its `QueuedSpinlock::queue`). Same line as `cnts` (one `struct qrwlock`).
    MmuWaitLock(vm: u32) {
        line(m) = (15u64 << 56) | 1 << 40 | vm as u64;
        read(m) = m.kvm(vm as usize).mmu_rwlock.wait_lock.val;
        write(m, x) = m.kvm_mut(vm as usize).mmu_rwlock.wait_lock.val = x;
    }
    /// A guest (or native) kernel spinlock's word (`Machine::kernel_locks`, `spinlock.rs`):
    /// the holder CPU + 1, or 0.
    KernelLock(id: u32) {
        line(m) = (22u64 << 56) | (id as u64) << 1;
        read(m) = m.kernel_locks[id as usize].val;
        write(m, x) = m.kernel_locks[id as usize].val = x;
        holder = true;
    }
    /// Guest memory: a word a boot script locks or meets on (`Machine::guest_words`).
    GuestWord(id: u32) {
        line(m) = (21u64 << 56) | id as u64;
        read(m) = m.guest_words[id as usize];
        write(m, x) = m.guest_words[id as usize] = x;
    }
    /// KVM: `kvm->arch.noncoherent_dma_count` (as 0 or 1).
    NoncoherentDma(vm: u32) {
        line(m) = (20u64 << 56) | 2 << 40 | vm as u64;
        read(m) = m.kvm(vm as usize).noncoherent_dma as u64;
        write(m, x) = m.kvm_mut(vm as usize).noncoherent_dma = x != 0;
    }
    /// KVM (seed 004's patch 9): `kvm->arch.mtrr_zap_list_lock`.
    MtrrZapListLock(vm: u32) {
        line(m) = (20u64 << 56) | vm as u64;
        read(m) = m.kvm(vm as usize).mtrr_zap_list_lock;
        write(m, x) = m.kvm_mut(vm as usize).mtrr_zap_list_lock = x;
    }
    /// KVM (seed 004's patch 9): `kvm->arch.mtrr_zapping`.
    MtrrZapping(vm: u32) {
        line(m) = (20u64 << 56) | 1 << 40 | vm as u64;
        read(m) = m.kvm(vm as usize).mtrr_zapping;
        write(m, x) = m.kvm_mut(vm as usize).mtrr_zapping = x;
    }
    /// KVM: `kvm->slots_lock` (a mutex): holder agent + 1, or 0.
    SlotsLock(vm: u32) {
        line(m) = (19u64 << 56) | vm as u64;
        read(m) = m.kvm(vm as usize).slots_lock;
        write(m, x) = m.kvm_mut(vm as usize).slots_lock = x;
    }
    /// KVM: `kvm->mmu_notifier_seq` (`mmu_invalidate_seq`).
    MmuNotifierSeq(vm: u32) {
        line(m) = (16u64 << 56) | vm as u64;
        read(m) = m.kvm(vm as usize).mmu_notifier_seq;
        write(m, x) = m.kvm_mut(vm as usize).mmu_notifier_seq = x;
    }
    /// KVM: `kvm->mmu_notifier_count` (`mmu_invalidate_in_progress`).
    MmuNotifierCount(vm: u32) {
        line(m) = (16u64 << 56) | vm as u64;
        read(m) = m.kvm(vm as usize).mmu_notifier_count;
        write(m, x) = m.kvm_mut(vm as usize).mmu_notifier_count = x;
    }
    /// Host: the lock bit of the `call_single_data` agent `src` queued to kick vCPU `dst`
    /// (`kvm_kick_many_cpus` with wait: `smp_call_function_many(..., ack_flush, ...)`).
    KickCsd(src: u32, dst: u32) {
        line(m) = (17u64 << 56) | (src as u64) << 24 | dst as u64;
        read(m) = m.host_ref().kick_csd.contains(&(src, dst)) as u64;
        write(m, x) = if x != 0 {
            m.host_mut().kick_csd.insert((src, dst));
        } else {
            m.host_mut().kick_csd.remove(&(src, dst));
        };
    }
    /// KVM: `kvm->srcu`'s index (which per-CPU counters new readers use).
    SrcuIdx(vm: u32) {
        line(m) = (18u64 << 56) | 1 << 40 | vm as u64;
        read(m) = m.kvm(vm as usize).srcu_idx;
        write(m, x) = m.kvm_mut(vm as usize).srcu_idx = x;
    }
    /// KVM: word `w` of the dirty bitmap of memslot `slot` (`dirty_log::slot_key`):
    /// `set_bit_le` sets bits, `KVM_GET_DIRTY_LOG` takes words with `xchg`.
    DirtyBitmap(vm: u32, slot: u32, w: u32) {
        line(m) = (23u64 << 56) | (vm as u64) << 40 | (slot as u64) << 8 | (w / 8) as u64;
        read(m) = m.kvm(vm as usize).dirty_log.word(slot, w);
        write(m, x) = m.kvm_mut(vm as usize).dirty_log.set_word(slot, w, x);
    }
    /// Host: an agent's SRCU read section on `kvm->srcu` (its per-CPU counters): 1 + the index
    /// it entered with, 0 outside one.
    SrcuReader(agent: u32) {
        line(m) = (18u64 << 56) | agent as u64;
        read(m) = m.srcu_of(agent as usize);
        write(m, x) = m.set_srcu_of(agent as usize, x);
    }
}

/// Whether the model runs with sequential consistency or x86-TSO.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MemoryModel {
    Sc,
    Tso,
}

/// User-space and filesystem lines that only cost something (no protocol reads them): sysbench's
/// globals, ext4's journal. `k` names the line.
pub(crate) fn misc_line(k: u64) -> LineId {
    (10u64 << 56) | k
}
/// sysbench: `sb_globals.exec_mutex`.
pub(crate) const LINE_SB_EXEC_MUTEX: u64 = 1;
/// sysbench fileio: `req_performed`, `is_dirty`, `fsynced_file` (adjacent statics).
pub(crate) const LINE_SB_FILEIO_STATE: u64 = 2;
/// jbd2: `journal->j_state_lock` (an rwlock: readers RMW it too).
pub(crate) const LINE_JBD2_STATE_LOCK: u64 = 3;
/// jbd2: the running transaction's `t_updates` / `t_outstanding_credits`.
pub(crate) const LINE_JBD2_TRANSACTION: u64 = 4;

/// Byte offsets in `struct tlb_state` as laid out from v4.15 until `cpu_tlbstate_shared` split
/// it (v5.13): `loaded_mm` 0, `last_user_mm_ibpb` 8, `loaded_mm_asid` 16, `next_asid` 18,
/// `is_lazy` 20, `invalidate_other` 21, `user_pcid_flush_mask` 22, `cr4` 24, then
/// `ctxs[TLB_NR_DYN_ASIDS]` of 16 bytes from 32. The per-CPU variable is cache-line aligned.
pub(crate) const TLBSTATE_ASID_OFFSET: u64 = 16;
const TLBSTATE_IS_LAZY_OFFSET: u64 = 20;
pub(crate) const TLBSTATE_USER_PCID_FLUSH_MASK_OFFSET: u64 = 22;
const TLBSTATE_CTXS_OFFSET: u64 = 32;

/// The `cpu_tlbstate` line holding byte `offset` of `cpu`'s struct: what a CPU-private write
/// (`loaded_mm_asid`, `user_pcid_flush_mask`, `ctxs[]`) moves when other CPUs have been reading
/// `is_lazy` from line 0. `loaded_mm` and `is_lazy` themselves are [`Loc`]s.
pub(crate) fn tlbstate_line(cpu: CpuId, offset: u64) -> LineId {
    match offset / 64 {
        0 => percpu_line(cpu, PerCpuLine::Tlbstate0),
        1 => percpu_line(cpu, PerCpuLine::Tlbstate1),
        _ => unreachable!("struct tlb_state spans two lines (offset {offset})"),
    }
}

/// The line of `cpu_tlbstate.ctxs[asid]`: `ctxs[0]` and `ctxs[1]` share line 0 with `is_lazy`,
/// `ctxs[2..6]` are on line 1. Which slot a process gets on a CPU depends on what ran there
/// before ([`Machine::age_asid_rotors`]).
pub(crate) fn tlbstate_ctx_line(cpu: CpuId, asid: u16) -> LineId {
    tlbstate_line(cpu, TLBSTATE_CTXS_OFFSET + 16 * asid as u64)
}
/// `struct file` of a DAX file (a `Machine::dax_files` index): `f_count`, which `msync()`'s
/// `get_file()` / `fput()` bump.
pub(crate) fn struct_file_line(file: u32) -> LineId {
    (11u64 << 56) | file as u64
}
/// A pipe's `struct pipe_inode_info` (its `mutex`, ring indices and wait queues), and the
/// message just written into it (`pipe.rs`).
pub(crate) fn pipe_line(pipe: u32) -> LineId {
    (12u64 << 56) | pipe as u64
}
/// The initiator's `flush_tlb_info` (per-CPU, or on its stack before v5.x: also local).
pub(crate) fn flush_info_line(cpu: CpuId) -> LineId {
    percpu_line(cpu, PerCpuLine::FlushInfo)
}
/// The line of the `call_single_data` `k` on a machine of `n` CPUs: numbered densely, sender
/// major, so that the directory keeps them in one flat array ([`csd_lines`]) and a sender's
/// walk over its targets touches neighbouring entries. Each csd has its own line, as each
/// target's copy of a sender's per-CPU `cfd->csd` is in that target's per-CPU area.
pub(crate) fn csd_line(n: usize, k: CsdKey) -> LineId {
    debug_assert!(k.src < n && k.dst < n);
    CSD_LINES + (k.src * n + k.dst) as u64
}
/// Every csd line of a machine of `n` CPUs.
pub(crate) fn csd_lines(n: usize) -> std::ops::Range<LineId> {
    CSD_LINES..CSD_LINES + (n * n) as u64
}
/// A CPU's `call_single_queue` head.
pub(crate) fn call_queue_line(cpu: CpuId) -> LineId {
    percpu_line(cpu, PerCpuLine::CallQueue)
}

/// Wake-up key of a location: a CPU spinning on `loc` parks with this key and a store to `loc`
/// wakes it (timed driver only; the explorer re-evaluates everything anyway). A fixed hash of
/// the location (no seed: the same on every machine), in the lower half of the key space.
pub(crate) fn spin_key(loc: Loc) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = rustc_hash::FxHasher::default();
    loc.hash(&mut h);
    h.finish() >> 1
}

/// Wake-up key of a task's `on_cpu` flag (the upper half of the key space).
pub(crate) fn on_cpu_key(task: crate::state::TaskId) -> u64 {
    1 << 63 | task as u64
}

impl Machine {
    /// Charge the cost of touching a cache line (timed driver only).
    pub(crate) fn touch_line<E: Env>(
        &mut self,
        env: &mut E,
        cpu: CpuId,
        line: LineId,
        write: bool,
    ) {
        if env.timed() {
            let t = self.line_cost(env, cpu, line, write);
            env.charge(t);
        }
    }

    /// What an access to `line` by `cpu` costs now (timed driver only), updating the line's
    /// whereabouts. Caches belong to physical CPUs: a vCPU touches lines from the pCPU it runs on.
    pub(crate) fn line_cost<E: Env>(
        &mut self,
        env: &E,
        cpu: CpuId,
        line: LineId,
        write: bool,
    ) -> Time {
        let cpu = self.phys_cpu(cpu);
        let at = env.now() + env.elapsed();
        let perf = &mut *self.perf;
        perf.lines
            .access(&self.topo, &perf.profile.costs, cpu, line, write, at)
    }

    /// An atomic read-modify-write of a cost-only line (`misc_line`): transfer + locked op.
    pub(crate) fn atomic_on_line<E: Env>(&mut self, env: &mut E, cpu: CpuId, line: LineId) {
        self.touch_line(env, cpu, line, true);
        self.charge(env, |c| c.atomic_rmw);
    }

    /// The store buffer of an agent: a CPU's, or a host thread's.
    pub fn sb(&self, agent: usize) -> &StoreBuffer<Loc> {
        match self.cpus.get(agent) {
            Some(c) => &c.sb,
            None => &self.host_ref().threads[agent - self.cpus.len()].sb,
        }
    }
    pub(crate) fn sb_mut(&mut self, agent: usize) -> &mut StoreBuffer<Loc> {
        let n = self.cpus.len();
        if agent < n {
            &mut self.cpus[agent].sb
        } else {
            &mut self.host_mut().threads[agent - n].sb
        }
    }

    /// A load by `cpu`: its own buffered store if any, else memory.
    pub(crate) fn load<E: Env>(&mut self, env: &mut E, cpu: CpuId, loc: Loc) -> u64 {
        let line = line_of(self, loc);
        self.touch_line(env, cpu, line, false);
        self.value_seen_by(cpu, loc)
    }

    /// The value `cpu` reads at `loc`: its newest buffered store to it (store forwarding),
    /// else memory. Under SC nothing is ever buffered ([`Machine::store`] writes memory), so
    /// the store buffer is not looked at: in a timed run (always SC) it sits in a line of
    /// `struct Cpu` that most steps do not otherwise read, a cache miss a load at thousands
    /// of CPUs.
    pub(crate) fn value_seen_by(&self, cpu: CpuId, loc: Loc) -> u64 {
        if self.memory_model == MemoryModel::Tso {
            if let Some(v) = self.sb(cpu).forward(loc) {
                return v;
            }
        }
        self.raw_read(loc)
    }

    /// `cpu`'s buffered stores, oldest first: none under SC, where the buffer is not looked
    /// at (see [`Machine::value_seen_by`]).
    pub(crate) fn buffered_stores(&self, cpu: CpuId) -> impl Iterator<Item = &(Loc, u64)> {
        let sb = (self.memory_model == MemoryModel::Tso).then(|| self.sb(cpu));
        sb.into_iter().flat_map(|sb| sb.iter())
    }

    /// A load of `loc` whose line `cpu` read earlier in this same step: an L1 hit. That read
    /// left `cpu` owning or sharing the line, and no other agent runs within a step, so the
    /// directory would answer a hit and change nothing; it is not asked.
    pub(crate) fn load_hit<E: Env>(&mut self, env: &mut E, cpu: CpuId, loc: Loc) -> u64 {
        self.charge_l1_hits(env, 1);
        self.value_seen_by(cpu, loc)
    }

    /// The cost of `n` loads that hit in L1 ([`Machine::load_hit`]'s, charged at once where
    /// their values are known without loading each).
    pub(crate) fn charge_l1_hits<E: Env>(&self, env: &mut E, n: u64) {
        if env.timed() && n > 0 {
            env.charge(Time(self.perf.profile.costs.l1_hit.0 * n));
        }
    }

    /// A load that is one of a loop of independent loads (`for_each_cpu(...) cond_func(cpu)`):
    /// the core overlaps up to `mlp` such misses, so each pays its transfer / `mlp`.
    pub(crate) fn load_overlapped<E: Env>(&mut self, env: &mut E, cpu: CpuId, loc: Loc) -> u64 {
        if env.timed() {
            let line = line_of(self, loc);
            let t = self.line_cost(env, cpu, line, false);
            env.charge(Time(t.0 / self.perf.profile.features.mlp.max(1) as u64));
        }
        self.value_seen_by(cpu, loc)
    }

    /// `spin_lock` (test-and-test-and-set): `None` if the lock is held (spin on the key), else
    /// takes it. Charges `hold` for the critical section that follows.
    pub(crate) fn spin_trylock<E: Env>(&mut self, env: &mut E, cpu: CpuId, loc: Loc) -> Option<()> {
        if self.load(env, cpu, loc) != 0 {
            return None;
        }
        self.rmw(env, cpu, loc, |_| cpu as u64 + 1);
        Some(())
    }

    /// `spin_unlock`: a release store.
    pub(crate) fn spin_unlock<E: Env>(&mut self, env: &mut E, cpu: CpuId, loc: Loc) {
        self.store(env, cpu, loc, 0);
    }

    /// A store by `cpu`: buffered under TSO, immediate under SC.
    pub(crate) fn store<E: Env>(&mut self, env: &mut E, cpu: CpuId, loc: Loc, v: u64) {
        let line = line_of(self, loc);
        self.touch_line(env, cpu, line, true);
        match self.memory_model {
            MemoryModel::Sc => self.raw_write(loc, v),
            MemoryModel::Tso => self.sb_mut(cpu).push(loc, v),
        }
        env.notify_key(spin_key(loc));
    }

    /// A locked read-modify-write: drains the store buffer, then updates memory atomically.
    /// Returns the old value.
    pub(crate) fn rmw<E: Env>(
        &mut self,
        env: &mut E,
        cpu: CpuId,
        loc: Loc,
        f: impl FnOnce(u64) -> u64,
    ) -> u64 {
        self.fence(cpu);
        let line = line_of(self, loc);
        self.touch_line(env, cpu, line, true);
        self.charge(env, |c| c.atomic_rmw);
        let old = self.raw_read(loc);
        self.raw_write(loc, f(old));
        env.notify_key(spin_key(loc));
        old
    }

    /// MFENCE / serializing instruction / locked op: every buffered store reaches memory now.
    pub(crate) fn fence(&mut self, cpu: CpuId) {
        if self.memory_model == MemoryModel::Sc {
            return; // nothing is buffered (see `value_seen_by`)
        }
        while let Some((loc, v)) = self.sb_mut(cpu).pop_oldest() {
            self.raw_write(loc, v);
        }
    }

    /// One buffered store of `cpu` reaches memory (an explorer action under TSO).
    pub(crate) fn drain_one(&mut self, cpu: CpuId) -> Option<Loc> {
        let (loc, v) = self.sb_mut(cpu).pop_oldest()?;
        self.raw_write(loc, v);
        Some(loc)
    }

    /// Charge a fixed cost from the profile (timed only): core-bound work, stretched while the
    /// SMT sibling executes ([`Machine::core_time`]). Line transfers are charged by
    /// [`Machine::touch_line`], unstretched.
    pub(crate) fn charge<E: Env>(
        &self,
        env: &mut E,
        t: impl Fn(&shootdown_hw::profile::Costs) -> Time,
    ) {
        if env.timed() {
            env.charge(self.core_time(t(&self.perf.profile.costs)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `struct tlb_state` before v5.13: `ctxs[0]` and `ctxs[1]` share `is_lazy`'s line (the
    /// false sharing seed 000 removed), the other slots do not; the PTI flush mask is on it too.
    #[test]
    fn tlbstate_lines_follow_the_struct_layout() {
        let lazy_line = tlbstate_line(3, TLBSTATE_IS_LAZY_OFFSET);
        assert_eq!(tlbstate_line(3, 0), lazy_line);
        assert_eq!(tlbstate_ctx_line(3, 0), lazy_line);
        assert_eq!(tlbstate_ctx_line(3, 1), lazy_line);
        for asid in 2..crate::state::TLB_NR_DYN_ASIDS as u16 {
            assert_ne!(tlbstate_ctx_line(3, asid), lazy_line);
            assert_eq!(tlbstate_ctx_line(3, asid), tlbstate_ctx_line(3, 2));
        }
        assert_eq!(
            tlbstate_line(3, TLBSTATE_USER_PCID_FLUSH_MASK_OFFSET),
            lazy_line
        );
        assert_ne!(tlbstate_line(4, TLBSTATE_IS_LAZY_OFFSET), lazy_line);
    }
}

//! virt/kvm/kvm_main.c: a vCPU thread's preempt notifiers (`kvm_sched_out` / `kvm_sched_in`),
//! vCPU requests and kicks (`kvm_make_all_cpus_request`), `kvm_flush_remote_tlbs`, SRCU on
//! `kvm->srcu`, memslot updates (`__kvm_set_memory_region`, `install_new_memslots`) and the MMU
//! notifiers (docs/design/kernel-model.md §4.2–§4.3; docs/design/kvm-mmu-seeds.md §1.2).

use crate::counters::Counter;
use crate::frame::{Flow, Frame};
use crate::kvm::memslot::{Memslot, GEN_UPDATE_IN_PROGRESS, KVM_ADDRESS_SPACE_NUM};
use crate::kvm::mmu::tdp_mmu::ZapGfnRange;
use crate::kvm::mmu::zap::ZapMemslot;
use crate::kvm::{mode, Kvm, Request, ThreadState, VcpuRun};
use crate::machine::Machine;
use crate::mem::{spin_key, Loc};
use crate::options::{KvmVersion, ShadowSyncFlush};
use shootdown_engine::trace::TraceEvent;
use shootdown_engine::{Env, Park};
use shootdown_hw::ept::Gfn;
use shootdown_hw::CpuId;

impl Machine {
    /// `struct kvm` of VM `vm` (a VM whose MMU is modelled).
    pub(crate) fn kvm(&self, vm: usize) -> &Kvm {
        self.host_ref().kvms[vm]
            .as_ref()
            .expect("a VM with a modelled MMU")
    }
    pub(crate) fn kvm_mut(&mut self, vm: usize) -> &mut Kvm {
        self.host_mut().kvms[vm]
            .as_mut()
            .expect("a VM with a modelled MMU")
    }

    /// Whether vCPU (CPU) `cpu` belongs to a VM whose MMU is modelled.
    pub(crate) fn has_kvm_mmu(&self, cpu: CpuId) -> bool {
        self.host.as_ref().is_some_and(|h| {
            h.vcpus
                .get(cpu)
                .is_some_and(|v| h.kvms[v.vm as usize].is_some())
        })
    }

    /// Does any VM of this machine have a modelled KVM MMU?
    pub(crate) fn has_any_kvm_mmu(&self) -> bool {
        self.host
            .as_ref()
            .is_some_and(|h| h.kvms.iter().any(|k| k.is_some()))
    }

    /// The VM an agent (vCPU or host thread) works for.
    pub(crate) fn vm_of(&self, agent: usize) -> usize {
        let h = self.host_ref();
        match h.vcpus.get(agent) {
            Some(v) => v.vm as usize,
            None => h.threads[agent - self.cpus.len()].vm as usize,
        }
    }

    /// The value of an agent's `Loc::SrcuReader`.
    pub(crate) fn srcu_of(&self, agent: usize) -> u64 {
        let h = self.host_ref();
        match h.vcpus.get(agent) {
            Some(v) => v.srcu,
            None => h.threads[agent - self.cpus.len()].srcu,
        }
    }
    pub(crate) fn set_srcu_of(&mut self, agent: usize, x: u64) {
        let n = self.cpus.len();
        let h = self.host_mut();
        if agent < n {
            h.vcpus[agent].srcu = x;
        } else {
            h.threads[agent - n].srcu = x;
        }
    }

    /// `srcu_read_lock(&kvm->srcu)`: read the index, the per-CPU counter increment and its full
    /// barrier. The oracle notes which memslots of each address space the section sees at least.
    pub(crate) fn srcu_read_lock<E: Env>(&mut self, agent: usize, env: &mut E) {
        let vm = self.vm_of(agent);
        let idx = self.load(env, agent, Loc::SrcuIdx(vm as u32));
        self.rmw(env, agent, Loc::SrcuReader(agent as u32), |_| idx + 1);
        if agent < self.cpus.len() {
            let mut sees = [0; KVM_ADDRESS_SPACE_NUM as usize];
            for (s, a) in sees.iter_mut().zip(&self.kvm(vm).address_spaces) {
                *s = a.active_set().version;
            }
            self.host_mut().vcpus[agent].srcu_sees = sees;
        }
    }

    /// `srcu_read_unlock(&kvm->srcu)`: a full barrier, then the per-CPU counter increment.
    pub(crate) fn srcu_read_unlock<E: Env>(&mut self, agent: usize, env: &mut E) {
        self.rmw(env, agent, Loc::SrcuReader(agent as u32), |_| 0);
    }

    /// `kvm->memslots[as]` now points to set `set` (the location's write: under TSO, when the
    /// store reaches memory).
    pub(crate) fn publish_memslots(&mut self, vm: usize, as_id: usize, set: u8) {
        self.kvm_mut(vm).address_spaces[as_id].active = set;
    }

    /// Host action `VcpuPut(v)` enabled in the explorer? A preemptible vCPU in the guest, or a
    /// spinning one whose PLE exit's directed yield gives its pCPU away
    /// ([`Machine::ple_may_exit`]), within the scenario's preemption bound.
    pub(crate) fn host_may_preempt(&self, v: CpuId) -> bool {
        let h = self.host_ref();
        h.vcpus[v].in_guest()
            && (h.cfg.preemptible.contains(&v) || self.ple_may_exit(v))
            && (h.cfg.max_preemptions == 0
                || (h.vcpus[v].preemptions as u32) < h.cfg.max_preemptions)
    }

    /// Host action `VcpuPut(v)` (H1+H2): a host interrupt (or a PLE exit whose yield found
    /// another thread for the pCPU) exits vCPU `v`, and the host scheduler switches its thread
    /// out ([`Machine::kvm_sched_out`]).
    pub(crate) fn vcpu_put_step<E: Env>(&mut self, v: CpuId, env: &mut E) -> Park {
        // The exit orders the guest's stores before anything the host does.
        self.fence(v);
        self.suspend_busy(v, env.now());
        self.vm_exit(env);
        if !env.timed() && !self.host_ref().cfg.preemptible.contains(&v) {
            self.say(|| {
                format!("PLE exit (vcpu{v}): kvm_vcpu_on_spin yields; schedule() switches away")
            });
        }
        self.kvm_sched_out(v, env)
    }

    /// The vCPU thread of `v`, out of the guest, is switched out (`kvm_sched_out` →
    /// `kvm_arch_vcpu_put`) and marked preempted; the thread will come back through `vcpu_run`.
    /// With a KVM MMU the exit also leaves guest mode (`vcpu->mode = OUTSIDE_GUEST_MODE`, kicks
    /// acknowledged once interrupts are on), and `vcpu_run` drops SRCU around `cond_resched()`.
    /// The timed driver then runs the host scheduler on that pCPU.
    pub(crate) fn kvm_sched_out<E: Env>(&mut self, v: CpuId, env: &mut E) -> Park {
        self.perf.counters.inc(Counter::HostPreemptions);
        self.say(|| format!("preempt vcpu{v}: VM exit, kvm_sched_out, vcpu_put"));
        if self.has_kvm_mmu(v) {
            self.store(env, v, Loc::VcpuMode(v as u32), mode::OUTSIDE_GUEST_MODE);
            self.fence(v);
            self.ack_kicks(v, env);
        }
        self.kvm_steal_time_set_preempted(v, env);
        let bounded = self.host_ref().cfg.max_preemptions > 0;
        self.push_host_frame(v, VcpuRun::call(), env);
        let h = self.host_mut();
        h.vcpus[v].thread = ThreadState::Runnable;
        if bounded {
            h.vcpus[v].preemptions = h.vcpus[v].preemptions.saturating_add(1);
        }
        if env.timed() {
            let p = h.vcpus[v].pcpu as usize;
            h.pcpus[p].rq.push_back(v as u32);
            // `kvm_arch_vcpu_put` of a preempted vCPU records its guest's mode (directed
            // yield's `kvm_arch_vcpu_in_kernel`).
            let in_kernel = self.in_kernel_mode(v);
            self.perf.host.preempted_in_kernel[v] = in_kernel;
            let t = env.now() + self.vm_exit_cost();
            self.fair_sched_out(v, t);
            let h = self.host_mut();
            h.pcpus[p].curr = None;
            self.perf.host.resched_at[p] = None;
            self.host_switch(p, t, env);
        }
        Park::Halt
    }

    /// A HLT exit: the guest on `v` halted with nothing pending, so its thread blocks in
    /// `kvm_vcpu_block` (marked preempted with `set_preempted = every_put`, as v4.16's
    /// `kvm_arch_vcpu_put` did), outside guest mode and outside SRCU, until a kick wakes it; it
    /// will come back through `vcpu_run`.
    pub(crate) fn kvm_vcpu_block<E: Env>(&mut self, v: CpuId, env: &mut E) {
        self.kvm_vcpu_block_put(v, true, env);
    }

    /// [`Machine::kvm_vcpu_block`], with the `vcpu_put` (and its steal-time mark) only if
    /// `put`: a thread that halt-polls first is put only if it then sleeps
    /// ([`Machine::halt_poll_give_up`]).
    pub(crate) fn kvm_vcpu_block_put<E: Env>(&mut self, v: CpuId, put: bool, env: &mut E) {
        self.perf.counters.inc(Counter::KvmHaltExits);
        self.vm_exit(env);
        if self.has_kvm_mmu(v) {
            self.store(env, v, Loc::VcpuMode(v as u32), mode::OUTSIDE_GUEST_MODE);
            self.fence(v);
            self.ack_kicks(v, env);
        }
        if put && self.opts.set_preempted == crate::options::SetPreempted::EveryPut {
            self.kvm_steal_time_set_preempted(v, env);
        }
        self.say(|| "HLT: VM exit, kvm_vcpu_block".into());
        self.push_host_frame(v, VcpuRun::call(), env);
        self.host_mut().vcpus[v].thread = ThreadState::Blocked;
    }

    /// `kvm_vcpu_kick` of a blocked vCPU in the explorer (an interrupt for its guest is
    /// pending): its thread is runnable again.
    pub(crate) fn kvm_vcpu_wake(&mut self, v: CpuId) {
        self.say(|| format!("kvm_vcpu_kick: vcpu{v} woken"));
        self.host_mut().vcpus[v].thread = ThreadState::Runnable;
    }

    /// Explorer action `VcpuIoctl(v)`: a preempted vCPU is loaded and put again without entering
    /// the guest (a userspace ioctl on it, or a second preemption between `vcpu_load` and
    /// `record_steal_time`): `kvm_arch_vcpu_put` runs `set_preempted` once more.
    pub(crate) fn vcpu_ioctl_step<E: Env>(&mut self, v: CpuId, env: &mut E) -> Park {
        self.say(|| format!("vcpu_load + vcpu_put of vcpu{v} without entering the guest (ioctl)"));
        self.kvm_steal_time_set_preempted(v, env);
        Park::Halt
    }

    /// The kick IPIs pending on vCPU `v`'s pCPU are taken (interrupts on): `ack_flush` runs and
    /// each sender's csd is unlocked.
    pub(crate) fn ack_kicks<E: Env>(&mut self, v: CpuId, env: &mut E) {
        for _ in 0..std::mem::take(&mut self.host_mut().vcpus[v].shoot4u_flushes) {
            self.flush_tlb_func_shoot4u(v, env);
        }
        let senders = std::mem::take(&mut self.host_mut().vcpus[v].kicks);
        for src in senders {
            self.store(env, v, Loc::KickCsd(src, v as u32), 0);
            let who = self.agent_label(src as usize);
            self.say(|| format!("kick IPI from {who} acknowledged"));
        }
    }

    /// A short name of an agent for step texts.
    pub(crate) fn agent_label(&self, a: usize) -> String {
        if a < self.cpus.len() {
            format!("vcpu{a}")
        } else {
            self.host_ref().threads[a - self.cpus.len()].name.clone()
        }
    }
}

/// `kvm_make_all_cpus_request(kvm, req)`, or `kvm_make_vcpus_request_mask(kvm, req, mask)`
/// with a `mask` of vCPUs: set the request on each vCPU, IPI those not outside guest mode, and
/// with `KVM_REQUEST_WAIT` (`wait`) wait until each took the IPI.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct MakeAllCpusRequest {
    pub pc: MakeAllCpusRequestPc,
    pub req: Request,
    /// The vCPUs (every vCPU of the VM if `None`).
    pub mask: Option<Vec<u32>>,
    /// `KVM_REQUEST_WAIT`: wait for the IPIs to be taken.
    pub wait: bool,
    /// The vCPUs still to look at / wait for.
    pub i: usize,
    /// vCPUs that need the IPI (`kvm_request_needs_ipi`), in order.
    pub targets: Vec<u32>,
    /// Some IPI was sent (`called`).
    pub called: bool,
    /// `vcpu_request_mode_first` mutant: the current vCPU's mode was read already.
    pub mode_read: bool,
}

shootdown_engine::clone_by_fields!(MakeAllCpusRequest {
    pc,
    req,
    mask,
    wait,
    i,
    targets,
    called,
    mode_read,
});

/// The steps of `kvm_make_all_cpus_request()`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MakeAllCpusRequestPc {
    /// `kvm_make_request()`: `set_bit(req, &vcpu->requests)` on the next vCPU.
    SetRequest,
    /// `kvm_request_needs_ipi()`: `cmpxchg(&vcpu->mode, IN_GUEST_MODE, EXITING_GUEST_MODE)`;
    /// an IPI is needed unless the vCPU was outside guest mode.
    ExitingGuestMode,
    /// `kvm_kick_many_cpus()`: lock a csd per target and send the IPIs.
    Kick,
    /// Wait for each target's acknowledgement.
    Wait,
}

impl MakeAllCpusRequest {
    pub fn call(req: Request) -> Frame {
        Self::call_mask(req, None, true)
    }

    /// `kvm_make_vcpus_request_mask(kvm, req, mask)` (`wait`: the request has
    /// `KVM_REQUEST_WAIT`).
    pub fn call_mask(req: Request, mask: Option<Vec<u32>>, wait: bool) -> Frame {
        Frame::MakeAllCpusRequest(Box::new(MakeAllCpusRequest {
            pc: MakeAllCpusRequestPc::SetRequest,
            req,
            mask,
            wait,
            i: 0,
            targets: Vec::new(),
            called: false,
            mode_read: false,
        }))
    }
}

/// `kvm_flush_remote_tlbs(kvm)`: `KVM_REQ_TLB_FLUSH` to every vCPU, waited for.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct FlushRemoteTlbs {
    pub pc: FlushRemoteTlbsPc,
    /// Oracle: the epoch the flush began at.
    pub begin: u64,
    /// `dirty_count`: `kvm->tlbs_dirty` as the flush read it first (shadow paging).
    pub dirty_count: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FlushRemoteTlbsPc {
    /// Make the request of every vCPU.
    Request,
    /// Every vCPU has it and none is still in guest mode on an old translation: return.
    Done,
}

impl FlushRemoteTlbs {
    pub fn call() -> Frame {
        Frame::FlushRemoteTlbs(FlushRemoteTlbs {
            pc: FlushRemoteTlbsPc::Request,
            begin: 0,
            dirty_count: 0,
        })
    }
}

/// `synchronize_srcu_expedited(&kvm->srcu)`: wait for every SRCU read section of the VM that
/// began before it. Modelled by the index flip at its heart: new readers use the new index;
/// the grace period waits for the readers of the old one.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SynchronizeSrcu {
    pub pc: SynchronizeSrcuPc,
    /// The index readers used before the flip.
    pub old: u64,
    /// Readers (agents) still to wait for, in order.
    pub i: usize,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SynchronizeSrcuPc {
    /// Flip the index: the grace period begins.
    Start,
    /// Wait for the next reader still in a section it entered with the old index.
    Wait,
}

impl SynchronizeSrcu {
    pub fn call() -> Frame {
        Frame::SynchronizeSrcu(SynchronizeSrcu {
            pc: SynchronizeSrcuPc::Start,
            old: 0,
            i: 0,
        })
    }
}

/// `install_new_memslots(kvm, as_id, slots)` (v5.x; mainline's `kvm_swap_active_memslots`):
/// publish the inactive set, built by the caller, with the generation protocol.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct InstallMemslots {
    pub pc: InstallMemslotsPc,
    pub as_id: u32,
    /// The set being installed (the inactive one when the update began).
    pub set: u8,
    /// The generation before the update.
    pub old_gen: u64,
    /// The generation after it (computed once the readers are gone).
    pub gen: u64,
}

/// The steps of `install_new_memslots()`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum InstallMemslotsPc {
    /// Mark the new set's generation "update in progress" (v5.1+: bit 63; v5.0: odd).
    MarkInProgress,
    /// Mainline: wait until no MMU-notifier invalidation is in flight.
    WaitNotifiers,
    /// `rcu_assign_pointer(kvm->memslots[as_id], slots)`.
    Publish,
    /// `synchronize_srcu_expedited()`.
    Sync,
    /// `kvm_arch_memslots_updated(kvm, gen)`: on an MMIO-generation wrap, zap MMIO SPTEs.
    ArchHook,
    /// `slots->generation = gen`.
    StoreGen,
    /// (K6 / v5.0) the arch hook after the generation is visible.
    LateArchHook,
    Done,
}

/// What a memslot ioctl changes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MemslotChange {
    Create,
    Delete,
    /// `KVM_MR_FLAGS_ONLY` adding `KVM_MEM_LOG_DIRTY_PAGES` (`dirty_log.rs`).
    FlagsOnly,
}

/// `kvm_set_memory_region()` → `__kvm_set_memory_region()` for a CREATE or DELETE of one
/// memslot of address space 0, under `slots_lock`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SetMemoryRegion {
    pub pc: SetMemoryRegionPc,
    pub change: MemslotChange,
    /// The slot's address space (`mem->slot >> 16`).
    pub as_id: u8,
    pub slot: Memslot,
    /// FLAGS_ONLY: the TDP MMU's `mmu_lock` (read) for the commit's write-protect, and how
    /// many SPTEs it changed.
    pub lock: crate::kvm::mmu::rwlock::RwlockWait,
    pub wrprot: u32,
}

/// The steps of `__kvm_set_memory_region()`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SetMemoryRegionPc {
    /// `mutex_lock(&kvm->slots_lock)`.
    Lock,
    /// DELETE: copy the memslots with the slot marked `KVM_MEMSLOT_INVALID` and install them.
    InstallInvalid,
    /// DELETE: `kvm_arch_flush_shadow_memslot()` (the zap strategy).
    FlushShadow,
    /// Build the final set (the slot added or gone) and install it.
    InstallFinal,
    /// FLAGS_ONLY (logging on): `kvm_arch_commit_memory_region()` →
    /// `kvm_mmu_slot_apply_flags()`: take `mmu_lock`.
    ApplyFlagsLock,
    /// Write-protect the slot's SPTEs (with PML: clear the D bits of its 4 KiB ones), drop
    /// `mmu_lock`, flush (b64d740ea7dd: always).
    ApplyFlags,
    /// `kvm_arch_commit_memory_region()`, `mutex_unlock(&kvm->slots_lock)`; return.
    Done,
}

/// An MMU-notifier invalidation of the host pages behind guest frames `[gfn, gfn + npages)`:
/// `kvm_mmu_notifier_invalidate_range_start()` → (the host frees the pages) →
/// `kvm_mmu_notifier_invalidate_range_end()`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct MmuNotifierInvalidate {
    pub pc: MmuNotifierPc,
    pub gfn: Gfn,
    pub npages: u64,
    /// The oracle epoch the invalidation began at.
    pub begin: u64,
    /// `kvm_unmap_hva_range()` zapped something: a flush is owed.
    pub flush: bool,
    /// The TDP MMU: where `invalidate_range_end`'s `write_lock` is.
    pub lock: crate::kvm::mmu::rwlock::RwlockWait,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MmuNotifierPc {
    /// `srcu_read_lock`; take `mmu_lock`.
    StartLock,
    /// `mmu_notifier_count++`, `kvm_unmap_hva_range()` over every memslot (INVALID ones too).
    Unmap,
    /// Flush if anything was zapped.
    Flush,
    /// Drop `mmu_lock` and SRCU: `invalidate_range_start` returns (the host may free the pages).
    StartUnlock,
    /// `invalidate_range_end`: take `mmu_lock`.
    EndLock,
    /// `mmu_notifier_seq++`, `mmu_notifier_count--`, unlock.
    EndUnlock,
}

impl Machine {
    /// One step of `kvm_make_all_cpus_request(kvm, req)` or `kvm_make_vcpus_request_mask()`
    /// (`NO_WAKEUP`; `KVM_REQUEST_WAIT` unless `s.wait` is off). The `vcpu_request_mode_first`
    /// mutant reads each vCPU's mode before it sets the request.
    pub(crate) fn make_all_cpus_request_step<E: Env>(
        &mut self,
        me: usize,
        s: &mut MakeAllCpusRequest,
        env: &mut E,
    ) -> Flow {
        use MakeAllCpusRequestPc::*;
        let name = s.req.name();
        let vcpu_at = |m: &Machine, i: usize| -> Option<usize> {
            match &s.mask {
                Some(mask) => mask.get(i).map(|&v| v as usize),
                None => m.kvm(m.vm_of(me)).vcpus.clone().nth(i),
            }
        };
        let mode_first = self.opts.mutants.vcpu_request_mode_first();
        match s.pc {
            SetRequest => {
                let Some(v) = vcpu_at(self, s.i) else {
                    s.pc = Kick;
                    s.i = 0;
                    if s.mask.is_some() {
                        self.say(|| format!("{name} requested of the vCPUs in the mask"));
                    } else {
                        self.say(|| format!("{name} requested of every vCPU"));
                    }
                    return Flow::Next;
                };
                if mode_first && v != me && !s.mode_read {
                    // The mutant's order: the mode first, the request after it.
                    s.pc = ExitingGuestMode;
                    return self.make_all_cpus_request_step(me, s, env);
                }
                // smp_wmb(); set_bit(): a locked op.
                let bit = s.req.bit();
                self.rmw(env, me, Loc::VcpuRequests(v as u32), |r| r | bit);
                self.say(|| format!("kvm_make_request({name}, vcpu{v})"));
                if v == me || mode_first {
                    s.mode_read = false;
                    s.i += 1;
                    s.pc = SetRequest;
                } else {
                    s.pc = ExitingGuestMode;
                }
                Flow::Next
            }
            ExitingGuestMode => {
                let v = vcpu_at(self, s.i).expect("a vCPU");
                let ipi = if self.has_kvm_mmu(v) {
                    let old = self.rmw(env, me, Loc::VcpuMode(v as u32), |m| {
                        if m == mode::IN_GUEST_MODE {
                            mode::EXITING_GUEST_MODE
                        } else {
                            m
                        }
                    });
                    self.say(|| {
                        format!(
                            "kvm_vcpu_exiting_guest_mode(vcpu{v}): mode was {}{}",
                            mode_name(old),
                            if old != mode::OUTSIDE_GUEST_MODE {
                                ": needs an IPI"
                            } else {
                                ": no IPI"
                            }
                        )
                    });
                    old != mode::OUTSIDE_GUEST_MODE
                } else {
                    // A VM without a modelled MMU enters the guest in one step (its requests
                    // looked at in the same step): whether the vCPU runs guest code is its mode.
                    let in_guest = self.vcpu_in_guest(v);
                    self.say(|| {
                        format!(
                            "kvm_vcpu_exiting_guest_mode(vcpu{v}): {}",
                            if in_guest {
                                "in the guest: needs an IPI"
                            } else {
                                "outside the guest: no IPI"
                            }
                        )
                    });
                    in_guest
                };
                if ipi {
                    s.targets.push(v as u32);
                }
                s.pc = SetRequest;
                if mode_first {
                    s.mode_read = true;
                } else {
                    s.i += 1;
                }
                Flow::Next
            }
            Kick => {
                let targets = s.targets.clone();
                for &t in &targets {
                    self.rmw(env, me, Loc::KickCsd(me as u32, t), |_| 1);
                    self.send_kick(me, t as usize, env);
                }
                s.called = !targets.is_empty();
                let wait = s.wait;
                self.say(|| {
                    if targets.is_empty() {
                        "kvm_kick_many_cpus: no vCPU to IPI".into()
                    } else {
                        format!(
                            "kvm_kick_many_cpus: IPI vcpus {targets:?}, {}",
                            if wait {
                                "wait"
                            } else {
                                "no wait (no KVM_REQUEST_WAIT)"
                            }
                        )
                    }
                });
                if !s.wait {
                    return Flow::Return;
                }
                s.pc = Wait;
                s.i = 0;
                Flow::Next
            }
            Wait => {
                let Some(&t) = s.targets.get(s.i) else {
                    if s.mask.is_some() {
                        self.summary(|| format!("every vCPU in the mask has {name}"));
                    } else {
                        self.summary(|| format!("every vCPU has {name}"));
                    }
                    return Flow::Return;
                };
                if self.make_all_cpus_request_spins(me, s) {
                    return Flow::Spin(spin_key(Loc::KickCsd(me as u32, t)));
                }
                self.load(env, me, Loc::KickCsd(me as u32, t));
                self.say(|| format!("csd_lock_wait(vcpu{t}): IPI acknowledged"));
                s.i += 1;
                Flow::Next
            }
        }
    }

    /// Would the request's next step only wait?
    pub(crate) fn make_all_cpus_request_spins(&self, me: usize, s: &MakeAllCpusRequest) -> bool {
        s.pc == MakeAllCpusRequestPc::Wait
            && s.targets.get(s.i).is_some_and(|&t| {
                let loc = Loc::KickCsd(me as u32, t);
                self.value_seen_by(me, loc) != 0
            })
    }

    /// Send a kick IPI from agent `src` to vCPU `v`'s pCPU.
    pub(crate) fn send_kick<E: Env>(&mut self, src: usize, v: usize, env: &mut E) {
        self.perf.counters.inc(Counter::KvmKickIpis);
        let pending = !self.host_ref().vcpus[v].kicks.is_empty();
        self.host_mut().vcpus[v].kicks.push(src as u32);
        if env.timed() {
            let lat = self.ipi_latency(src, v);
            let send = self.perf.profile.costs.ipi_send;
            env.charge(send);
            let at = env.now() + env.elapsed() + lat;
            // With a kick already on its way, the vCPU takes the first to arrive and
            // acknowledges every pending one then (simplified: a later IPI is acknowledged
            // with the first rather than at its own arrival).
            let at = if pending {
                self.perf.cpu[v].kick_arrival.min(at)
            } else {
                at
            };
            self.perf.cpu[v].kick_arrival = at;
            env.wake(v, at);
        }
    }

    /// One step of `kvm_flush_remote_tlbs(kvm)`.
    pub(crate) fn flush_remote_tlbs_step<E: Env>(
        &mut self,
        me: usize,
        s: &mut FlushRemoteTlbs,
        _env: &mut E,
    ) -> Flow {
        let vm = self.vm_of(me);
        match s.pc {
            FlushRemoteTlbsPc::Request => {
                // smp_load_acquire(&kvm->tlbs_dirty) before the request.
                s.dirty_count = self.kvm(vm).shadow.tlbs_dirty;
                s.begin = self.oracle.flush_begin();
                self.kvm_mut(vm).mmu.last_flush_begin = s.begin;
                self.perf.counters.inc(Counter::KvmRemoteTlbFlush);
                self.summary(|| "KVM_REQ_TLB_FLUSH to every vCPU".into());
                s.pc = FlushRemoteTlbsPc::Done;
                Flow::Call(MakeAllCpusRequest::call(Request::TlbFlush))
            }
            FlushRemoteTlbsPc::Done => {
                self.oracle.ept_flush_returned(vm, s.begin);
                // cmpxchg(&kvm->tlbs_dirty, dirty_count, 0): SPTEs dropped since the read
                // still count.
                let k = &mut self.kvm_mut(vm).shadow;
                if k.tlbs_dirty == s.dirty_count {
                    k.tlbs_dirty = 0;
                }
                self.summary(|| "remote TLB flush complete: return".into());
                Flow::Return
            }
        }
    }

    /// One step of `synchronize_srcu_expedited(&kvm->srcu)`: the readers are the VM's vCPUs and
    /// host threads.
    pub(crate) fn synchronize_srcu_step<E: Env>(
        &mut self,
        me: usize,
        s: &mut SynchronizeSrcu,
        env: &mut E,
    ) -> Flow {
        let readers = self.srcu_readers(me);
        match s.pc {
            SynchronizeSrcuPc::Start => {
                let vm = self.vm_of(me) as u32;
                s.old = self.rmw(env, me, Loc::SrcuIdx(vm), |i| i ^ 1);
                self.charge(env, |c| c.srcu_sync_expedited);
                let (old, new) = (s.old, s.old ^ 1);
                self.summary(|| format!("grace period begins: srcu index {old} -> {new}"));
                s.pc = SynchronizeSrcuPc::Wait;
                Flow::Next
            }
            SynchronizeSrcuPc::Wait => {
                let Some(&r) = readers.get(s.i) else {
                    self.summary(|| "grace period over: every earlier reader is gone".into());
                    return Flow::Return;
                };
                if self.srcu_waits(me, s) {
                    return Flow::Spin(spin_key(Loc::SrcuReader(r as u32)));
                }
                let at = self.load(env, me, Loc::SrcuReader(r as u32));
                let who = self.agent_label(r);
                self.say(|| {
                    format!(
                        "{who}: {}",
                        if at == 0 {
                            "not in an SRCU read section"
                        } else {
                            "its read section began after the flip"
                        }
                    )
                });
                s.i += 1;
                Flow::Next
            }
        }
    }

    /// The SRCU readers of the VM agent `me` works for: its vCPUs and host threads.
    fn srcu_readers(&self, me: usize) -> Vec<usize> {
        let vm = self.vm_of(me);
        let n = self.cpus.len();
        let mut r: Vec<usize> = self.kvm(vm).vcpus.clone().collect();
        let h = self.host_ref();
        r.extend(
            (0..h.threads.len())
                .filter(|&t| h.threads[t].vm as usize == vm)
                .map(|t| n + t),
        );
        r.retain(|&a| a != me);
        r
    }

    /// Would the grace period's next step only wait for a reader?
    pub(crate) fn srcu_waits(&self, me: usize, s: &SynchronizeSrcu) -> bool {
        if s.pc != SynchronizeSrcuPc::Wait {
            return false;
        }
        let readers = self.srcu_readers(me);
        readers.get(s.i).is_some_and(|&r| {
            let loc = Loc::SrcuReader(r as u32);
            self.value_seen_by(me, loc) == s.old + 1
        })
    }

    /// One step of `install_new_memslots()`: the caller built the inactive set of `as_id`.
    pub(crate) fn install_memslots_step<E: Env>(
        &mut self,
        me: usize,
        s: &mut InstallMemslots,
        env: &mut E,
    ) -> Flow {
        use InstallMemslotsPc::*;
        let vm = self.vm_of(me);
        let version = self.opts.kvm;
        let a = s.as_id as usize;
        let late_hook =
            version == KvmVersion::V5_0 || self.opts.mutants.memslots_updated_after_gen();
        match s.pc {
            MarkInProgress => {
                let active = self.kvm(vm).address_spaces[a].active;
                s.set = 1 - active;
                s.old_gen = self.load(env, me, Loc::SlotsGen(vm as u32, s.as_id, active));
                let marked = match version {
                    KvmVersion::V5_0 => s.old_gen + 1,
                    _ => s.old_gen | GEN_UPDATE_IN_PROGRESS,
                };
                self.store(env, me, Loc::SlotsGen(vm as u32, s.as_id, s.set), marked);
                self.charge(env, |c| c.memslot_install);
                let old = gen_text(s.old_gen);
                self.say(|| {
                    format!(
                        "new slots->generation = {} (update in progress; was {old})",
                        gen_text(marked)
                    )
                });
                s.pc = if version == KvmVersion::Mainline {
                    WaitNotifiers
                } else {
                    Publish
                };
                Flow::Next
            }
            WaitNotifiers => {
                // kvm_swap_active_memslots(): rcuwait until mn_active_invalidate_count == 0
                // (modelled with the notifier count itself).
                if self.memslots_wait_notifiers(me) {
                    return Flow::Spin(spin_key(Loc::MmuNotifierCount(vm as u32)));
                }
                self.load(env, me, Loc::MmuNotifierCount(vm as u32));
                self.summary(|| "no MMU-notifier invalidation in flight".into());
                s.pc = Publish;
                Flow::Next
            }
            Publish => {
                self.store(env, me, Loc::Memslots(vm as u32, s.as_id), s.set as u64);
                self.perf.counters.inc(Counter::KvmMemslotUpdates);
                self.say(|| format!("rcu_assign_pointer(kvm->memslots[{a}], new slots)"));
                if env.tracing() {
                    env.trace(TraceEvent::Instant {
                        agent: me,
                        name: "memslot swap",
                        detail: None,
                    });
                }
                s.pc = Sync;
                Flow::Next
            }
            Sync => {
                s.pc = if late_hook { StoreGen } else { ArchHook };
                self.summary(|| "synchronize_srcu_expedited(&kvm->srcu)".into());
                Flow::Call(SynchronizeSrcu::call())
            }
            ArchHook | LateArchHook => {
                if s.pc == ArchHook {
                    s.gen = self.final_gen(s.old_gen);
                }
                s.pc = if s.pc == ArchHook { StoreGen } else { Done };
                self.kvm_arch_memslots_updated(me, s.gen, env)
            }
            StoreGen => {
                if late_hook {
                    s.gen = self.final_gen(s.old_gen);
                }
                let g = s.gen;
                self.store(env, me, Loc::SlotsGen(vm as u32, s.as_id, s.set), g);
                self.say(|| format!("slots->generation = {g}"));
                s.pc = if late_hook { LateArchHook } else { Done };
                Flow::Next
            }
            Done => {
                self.summary(|| "return: the new memslots are in place".into());
                Flow::Return
            }
        }
    }

    /// The generation after an update from `old` (v5.0: odd +3 = +4 in all; v5.1+: +2).
    fn final_gen(&self, old: u64) -> u64 {
        match self.opts.kvm {
            KvmVersion::V5_0 => old + 4,
            _ => (old & !GEN_UPDATE_IN_PROGRESS) + KVM_ADDRESS_SPACE_NUM,
        }
    }

    /// Would mainline's swap only wait for in-flight notifier invalidations?
    pub(crate) fn memslots_wait_notifiers(&self, me: usize) -> bool {
        let vm = self.vm_of(me);
        let loc = Loc::MmuNotifierCount(vm as u32);
        self.value_seen_by(me, loc) != 0
    }

    /// One step of `__kvm_set_memory_region()` (CREATE or DELETE of a slot of address space
    /// `s.as_id`).
    pub(crate) fn set_memory_region_step<E: Env>(
        &mut self,
        me: usize,
        s: &mut SetMemoryRegion,
        env: &mut E,
    ) -> Flow {
        use SetMemoryRegionPc::*;
        let vm = self.vm_of(me);
        let id = s.slot.id;
        match s.pc {
            Lock => {
                if self.slots_lock_busy(me) {
                    return Flow::Spin(spin_key(Loc::SlotsLock(vm as u32)));
                }
                self.rmw(env, me, Loc::SlotsLock(vm as u32), |_| me as u64 + 1);
                self.say(|| "mutex_lock(&kvm->slots_lock)".into());
                s.pc = match s.change {
                    MemslotChange::Delete => InstallInvalid,
                    MemslotChange::Create => InstallFinal,
                    MemslotChange::FlagsOnly => {
                        let a = s.as_id as usize;
                        let logs = self.kvm(vm).address_spaces[a]
                            .active_set()
                            .slots
                            .iter()
                            .any(|sl| sl.id == id && sl.dirty_log);
                        if logs {
                            // __kvm_set_memory_region(): the flags do not change: "Nothing to
                            // change", return 0.
                            self.store(env, me, Loc::SlotsLock(vm as u32), 0);
                            self.say(|| {
                                format!("slot {id} logs dirty pages already: nothing to change; mutex_unlock(&kvm->slots_lock); return 0")
                            });
                            return Flow::Return;
                        }
                        // kvm_prepare_memory_region(): kvm_alloc_dirty_bitmap().
                        let (a, slot) = (s.as_id, s.slot.clone());
                        let all_set = self.opts.dirty_log_initially_set
                            && !self.opts.mutants.initially_set_bitmap_clear();
                        self.kvm_mut(vm).dirty_log.alloc(a, &slot, all_set);
                        InstallFinal
                    }
                };
                Flow::Next
            }
            InstallInvalid => {
                let a = s.as_id as usize;
                self.build_inactive_set(vm, a, |slots| {
                    for sl in slots.iter_mut().filter(|sl| sl.id == id) {
                        sl.invalid = true;
                    }
                });
                if let Some(sl) = self.kvm(vm).address_spaces[a]
                    .active_set()
                    .slots
                    .iter()
                    .find(|sl| sl.id == id)
                {
                    s.slot = sl.clone();
                }
                self.say(|| format!("copy the memslots with slot {id} KVM_MEMSLOT_INVALID"));
                s.pc = FlushShadow;
                Flow::Call(install_memslots(a as u32))
            }
            FlushShadow => {
                s.pc = InstallFinal;
                self.summary(|| "kvm_arch_flush_shadow_memslot".into());
                Flow::Call(ZapMemslot::call(
                    self.opts.memslot_zap,
                    s.as_id,
                    s.slot.clone(),
                ))
            }
            InstallFinal => {
                let slot = s.slot.clone();
                let change = s.change;
                let a = s.as_id as usize;
                let all_set = self.opts.dirty_log_initially_set
                    && !self.opts.mutants.initially_set_bitmap_clear();
                self.build_inactive_set(vm, a, |slots| match change {
                    MemslotChange::Delete => slots.retain(|sl| sl.id != slot.id),
                    MemslotChange::FlagsOnly => {
                        for sl in slots.iter_mut().filter(|sl| sl.id == slot.id) {
                            sl.dirty_log = slot.dirty_log;
                        }
                    }
                    MemslotChange::Create => {
                        slots.retain(|sl| sl.id != slot.id);
                        slots.push(slot.clone());
                        slots.sort_by_key(|sl| sl.base_gfn);
                    }
                });
                self.say(|| match change {
                    MemslotChange::Delete => format!("copy the memslots without slot {id}"),
                    MemslotChange::FlagsOnly => format!(
                        "kvm_alloc_dirty_bitmap{}; copy the memslots with slot {id} logging dirty pages",
                        if all_set { ", bitmap_set (initially all set)" } else { "" }
                    ),
                    MemslotChange::Create => format!(
                        "copy the memslots with new slot {id} (gfns {:#x}..{:#x})",
                        s.slot.base_gfn,
                        s.slot.end()
                    ),
                });
                // kvm_mmu_slot_apply_flags(): initially-all-set write-protects nothing (every
                // page counts as dirty).
                s.pc = if change == MemslotChange::FlagsOnly && !self.opts.dirty_log_initially_set {
                    ApplyFlagsLock
                } else {
                    Done
                };
                Flow::Call(install_memslots(a as u32))
            }
            ApplyFlagsLock | ApplyFlags => self.kvm_mmu_slot_apply_flags_step(me, s, env),
            Done => {
                if s.change == MemslotChange::FlagsOnly {
                    self.enable_dirty_log_returned(vm, s.as_id, &s.slot);
                }
                if s.change == MemslotChange::Delete {
                    self.check_memslot_deleted(vm, s.as_id, &s.slot);
                    let freed = (s.as_id, s.slot.clone());
                    self.kvm_mut(vm).freed_slots.push(freed);
                }
                self.store(env, me, Loc::SlotsLock(vm as u32), 0);
                let init_set =
                    s.change == MemslotChange::FlagsOnly && self.opts.dirty_log_initially_set;
                self.say(|| {
                    if init_set {
                        "kvm_mmu_slot_apply_flags: initially-all-set: nothing to write-protect; mutex_unlock(&kvm->slots_lock); return".into()
                    } else {
                        "mutex_unlock(&kvm->slots_lock); return".into()
                    }
                });
                Flow::Return
            }
        }
    }

    /// Would taking `slots_lock` only wait?
    pub(crate) fn slots_lock_busy(&self, me: usize) -> bool {
        let vm = self.vm_of(me);
        let loc = Loc::SlotsLock(vm as u32);
        let holder = self.value_seen_by(me, loc);
        holder != 0 && holder != me as u64 + 1
    }

    /// Fill the inactive set of address space `as_id` from the active one, changed by `f`
    /// (under `slots_lock`, while readers may still use the active set).
    fn build_inactive_set(&mut self, vm: usize, as_id: usize, f: impl FnOnce(&mut Vec<Memslot>)) {
        let a = &mut self.kvm_mut(vm).address_spaces[as_id];
        let (cur, next) = (a.active as usize, 1 - a.active as usize);
        let mut slots = a.sets[cur].slots.clone();
        f(&mut slots);
        let version = a.sets[cur].version.max(a.sets[next].version) + 1;
        a.sets[next].slots = slots;
        a.sets[next].version = version;
    }

    /// One step of an MMU-notifier invalidation (`kvm_mmu_notifier_invalidate_range_start` and
    /// `_end`, v5.x: the count and sequence under `mmu_lock`).
    pub(crate) fn mmu_notifier_step<E: Env>(
        &mut self,
        me: usize,
        s: &mut MmuNotifierInvalidate,
        env: &mut E,
    ) -> Flow {
        use MmuNotifierPc::*;
        let vm = self.vm_of(me);
        match s.pc {
            StartLock if self.opts.tdp_mmu => {
                self.perf.counters.inc(Counter::KvmMmuNotifierInvalidations);
                // v5.13+: kvm_handle_hva_range() under write_lock(&kvm->mmu_lock), the TDP
                // MMU's roots walked with yields (`tdp_mmu.rs`).
                self.srcu_read_lock(me, env);
                s.begin = self.oracle.tick();
                s.pc = StartUnlock;
                self.summary(|| "invalidate_range_start: srcu_read_lock; kvm_handle_hva_range (TDP MMU: write lock)".into());
                Flow::Call(ZapGfnRange::notifier(s.gfn, s.gfn + s.npages))
            }
            EndLock if self.opts.tdp_mmu => {
                if let Some(spin) = self.mmu_write_lock(me, &mut s.lock, env) {
                    return spin;
                }
                s.pc = EndUnlock;
                Flow::Next
            }
            StartLock | EndLock => {
                if s.pc == StartLock && !self.mmu_lock_queued(me) {
                    self.perf.counters.inc(Counter::KvmMmuNotifierInvalidations);
                    self.srcu_read_lock(me, env);
                    s.begin = self.oracle.tick();
                }
                if let Some(spin) = self.mmu_lock_acquire(me, env) {
                    return spin;
                }
                s.pc = if s.pc == StartLock { Unmap } else { EndUnlock };
                Flow::Next
            }
            Unmap => {
                self.rmw(env, me, Loc::MmuNotifierCount(vm as u32), |c| c + 1);
                let zapped = if self.opts.ept {
                    self.unmap_gfn_range(vm, s.gfn, s.gfn + s.npages, env)
                } else {
                    self.shadow_unmap_gfn_range(vm, s.gfn, s.gfn + s.npages, env)
                };
                // ..v5.14 with shadow paging: `if (need_tlb_flush || kvm->tlbs_dirty)`.
                let dirty = self.kvm(vm).shadow.tlbs_dirty;
                let owed = !self.opts.ept
                    && self.opts.shadow_sync_flush == ShadowSyncFlush::TlbsDirty
                    && dirty > 0
                    && !self.opts.mutants.notifier_ignores_tlbs_dirty();
                s.flush = zapped > 0 || owed;
                let (g, n) = (s.gfn, s.npages);
                self.say(|| {
                    format!(
                        "invalidate_range_start(gfns {g:#x}..{:#x}): mmu_notifier_count++, kvm_unmap_hva_range zaps {zapped} SPTE(s){}",
                        g + n,
                        match (owed, dirty) {
                            (true, _) => format!("; kvm->tlbs_dirty = {dirty}: a flush is owed"),
                            (false, 0) => String::new(),
                            (false, _) => format!("; kvm->tlbs_dirty = {dirty} is not looked at"),
                        }
                    )
                });
                s.pc = Flush;
                Flow::Next
            }
            Flush => {
                s.pc = StartUnlock;
                if s.flush {
                    self.summary(|| "flush before the pages can be freed".into());
                    return Flow::Call(FlushRemoteTlbs::call());
                }
                self.summary(|| "nothing zapped: no flush".into());
                Flow::Next
            }
            StartUnlock => {
                if !self.opts.tdp_mmu {
                    self.mmu_lock_release(me, env);
                }
                self.srcu_read_unlock(me, env);
                self.oracle
                    .ept_gfns_invalidated(vm, s.gfn..s.gfn + s.npages, s.begin);
                self.check_gfns_unmapped(vm, s.gfn, s.npages);
                self.say(|| "invalidate_range_start returns: the host may free the pages".into());
                s.pc = EndLock;
                Flow::Next
            }
            EndUnlock => {
                self.rmw(env, me, Loc::MmuNotifierSeq(vm as u32), |q| q + 1);
                self.rmw(env, me, Loc::MmuNotifierCount(vm as u32), |c| c - 1);
                self.kvm_mmu_unlock(me, false, env);
                self.say(|| {
                    "invalidate_range_end: mmu_notifier_seq++, mmu_notifier_count--".into()
                });
                Flow::Return
            }
        }
    }
}

/// A call of `install_new_memslots()` for address space `as_id`.
fn install_memslots(as_id: u32) -> Frame {
    Frame::InstallMemslots(InstallMemslots {
        pc: InstallMemslotsPc::MarkInProgress,
        as_id,
        set: 0,
        old_gen: 0,
        gen: 0,
    })
}

/// `vcpu->mode` by name.
pub(crate) fn mode_name(m: u64) -> &'static str {
    match m {
        mode::OUTSIDE_GUEST_MODE => "OUTSIDE_GUEST_MODE",
        mode::IN_GUEST_MODE => "IN_GUEST_MODE",
        mode::EXITING_GUEST_MODE => "EXITING_GUEST_MODE",
        _ => "READING_SHADOW_PAGE_TABLES",
    }
}

/// A memslot generation as a counterexample shows it.
pub(crate) fn gen_text(g: u64) -> String {
    if g & GEN_UPDATE_IN_PROGRESS != 0 {
        format!("{} | IN_PROGRESS", g & !GEN_UPDATE_IN_PROGRESS)
    } else {
        g.to_string()
    }
}

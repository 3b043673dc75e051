//! The host under the guests (issue #4, seed 001): its pCPUs, the vCPU threads it schedules on
//! them, and the guest memory it shares with the guests (each vCPU's steal-time `preempted`
//! byte). KVM itself — what a vCPU thread runs on the host side — is in [`crate::kvm`].
//!
//! A machine with a host runs every VM's vCPUs as the CPUs of one `Machine`: CPU `v` is vCPU
//! `v % vcpus_per_vm` of VM `v / vcpus_per_vm`. Each VM has its own mms, so its guest kernel only
//! ever sees (cpumasks, IPIs) its own vCPUs; each vCPU keeps its own TLB, which stands for the
//! pCPU's TLB partition tagged with that vCPU's VPID (entries inside are tagged by guest PCID).
//!
//! * [`config`] — the `[host]` settings, declared once;
//! * [`actions`] — the actions the host offers for a vCPU agent, in each driver;
//! * [`sched`] — the host's scheduling policy for vCPU threads (timed driver only, like the
//!   guest scheduler's time slices): time slices, wake-up preemption, housekeeping noise,
//!   blocking in HLT and kicks;
//! * [`fair`] — CFS's vruntime, as far as `yield_to` needs it (timed driver only);
//! * [`ple`] — pause-loop exiting and directed yield (the exit in both drivers, its windows
//!   and the yield's effect on run queues in the timed driver);
//! * [`halt_poll`] — halt-polling of a blocked vCPU's thread (timed driver only);
//! * [`env`] — the timed driver's environment for guest steps on a host;
//! * [`thread`] — host threads that are not vCPUs (the VMM's ioctl thread, an MMU-notifier
//!   caller): agents with programs of their own; [`vmm`] runs their programs.
//!
//! This file also says where an agent runs: its pCPU ([`Machine::phys_cpu`]) and whether a vCPU
//! is in the guest or in host code.
//!
//! Simplifications: no load balancing
//! or migration of vCPU threads, no steal-time accounting (only the `preempted` byte), one
//! `vm_exit_entry` cost for every exit reason plus the emulation cost where it matters.

pub mod actions;
pub mod config;
pub mod env;
pub mod fair;
pub mod halt_poll;
pub mod ple;
pub mod sched;
pub mod thread;
pub mod vmm;

pub use config::{HostConfig, HOST_KEYS, MAX_VCPUS_PER_PCPU, MAX_VMS};

use crate::kvm::{Kvm, ThreadState, Vcpu, VcpuRun, KVM_VCPU_PREEMPTED};
use crate::machine::Machine;
use shootdown_engine::Time;
use shootdown_hw::CpuId;
use std::collections::{BTreeSet, VecDeque};
pub use thread::{HostOp, HostThread};

/// Host scheduler state of one pCPU (timed driver only; constant under the explorer).
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct Pcpu {
    pub curr: Option<u32>,
    pub rq: VecDeque<u32>,
}

shootdown_engine::clone_by_fields!(Pcpu { curr, rq });

/// The host: configuration, vCPU threads, pCPU run queues, and the guest memory it shares with
/// the guests (each vCPU's steal-time `preempted` byte).
#[derive(Debug, PartialEq, Eq)]
pub struct Host {
    pub cfg: HostConfig,
    pub vcpus: Vec<shootdown_engine::HashCached<Vcpu>>,
    pub pcpus: Vec<Pcpu>,
    /// Guest memory: `struct kvm_steal_time.preempted` of each vCPU (`Loc::Preempted`).
    pub steal_preempted: Vec<u8>,
    /// Per VM, its KVM MMU state if it is modelled (`None`: a VM whose guest-physical memory is
    /// taken as mapped, as in the PV-flush experiments).
    pub kvms: Vec<shootdown_engine::HashCached<Option<Kvm>>>,
    /// Host threads that are not vCPUs (agents after the vCPUs).
    pub threads: Vec<shootdown_engine::HashCached<HostThread>>,
    /// Locked `call_single_data`s of host cross calls kicking vCPUs (`Loc::KickCsd`).
    pub kick_csd: BTreeSet<(u32, u32)>,
}

shootdown_engine::state_fields!(Host {
    vcpus,
    pcpus,
    steal_preempted,
    kvms,
    threads,
    kick_csd,
} fixed {
    cfg,
});

/// Performance-only host state (time slices, housekeeping timers).
#[derive(Debug, Default)]
pub struct HostPerf {
    pub slice_start: Vec<Time>,
    pub slice_end: Vec<Time>,
    /// Next housekeeping run per pCPU (`Time::MAX` without housekeeping).
    pub next_hk: Vec<Time>,
    /// Pending wake-up preemption per pCPU.
    pub resched_at: Vec<Option<Time>>,
    /// vCPU threads the host scheduler switched to during the current step, and when they run
    /// (handed to the driver after the step, past the guest wake-up filter).
    pub switched_in: Vec<(usize, Time)>,
    /// Per vCPU: its PAUSE-loop window (`vmx->ple_window`, TSC ticks) and when the current
    /// loop's window runs out (`Time::MAX`: not in a loop) ([`ple`]).
    pub ple_window: Vec<u64>,
    pub ple_due: Vec<Time>,
    /// Per vCPU: preempted while its guest was in kernel mode (`arch.preempted_in_kernel`).
    pub preempted_in_kernel: Vec<bool>,
    /// Per VM: `kvm->last_boosted_vcpu`, as an index within the VM.
    pub last_boosted: Vec<usize>,
    /// Per vCPU thread: its CFS `vruntime` when it last stopped running, and when it last
    /// started ([`fair`]).
    pub vruntime: Vec<Time>,
    pub run_start: Vec<Time>,
    /// Per pCPU: its run queue's `min_vruntime`.
    pub min_vruntime: Vec<Time>,
    /// Per vCPU: `vcpu->halt_poll_ns` ([`halt_poll`]).
    pub halt_poll: Vec<u64>,
    /// Per vCPU: when its current halt began, and until when its thread polls (`Time::MAX`:
    /// not polling).
    pub halt_start: Vec<Time>,
    pub poll_until: Vec<Time>,
}

shootdown_engine::clone_by_fields!(HostPerf {
    slice_start,
    slice_end,
    next_hk,
    resched_at,
    switched_in,
    ple_window,
    ple_due,
    preempted_in_kernel,
    last_boosted,
    vruntime,
    run_start,
    min_vruntime,
    halt_poll,
    halt_start,
    poll_until,
});

/// A deterministic phase in `[0, 1)` per pCPU, so that the pCPUs' time slices and housekeeping
/// runs are not in lock-step at time zero.
fn phase(p: usize, salt: u64) -> f64 {
    let mut x = (p as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ salt;
    x ^= x >> 29;
    x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x ^= x >> 32;
    (x % 1_000_000) as f64 / 1e6
}

impl Host {
    /// A host of `pcpus` pCPUs carrying `cfg.vms × cfg.vcpus_per_vm` vCPUs, pinned round-robin.
    /// On each pCPU the first vCPU placed (VM 0's) is running in the guest; the others are
    /// runnable and were preempted before time zero (their steal-time byte says so, and their
    /// threads wait in `vcpu_run` to be loaded).
    pub fn new(cfg: HostConfig, pcpus: usize) -> Host {
        let n = cfg.vms * cfg.vcpus_per_vm;
        let mut h = Host {
            vcpus: Vec::with_capacity(n),
            pcpus: vec![
                Pcpu {
                    curr: None,
                    rq: VecDeque::new(),
                };
                pcpus
            ],
            steal_preempted: vec![0; n],
            kvms: (0..cfg.vms).map(|_| None.into()).collect(),
            threads: Vec::new(),
            kick_csd: BTreeSet::new(),
            cfg,
        };
        for v in 0..n {
            let vm = v / h.cfg.vcpus_per_vm;
            let p = (v % h.cfg.vcpus_per_vm) % pcpus;
            let mut vc = Vcpu::new(vm as u32, p as u32);
            if h.pcpus[p].curr.is_none() {
                h.pcpus[p].curr = Some(v as u32);
            } else {
                vc.thread = ThreadState::Runnable;
                vc.stack.push(VcpuRun::call());
                vc.st_preempted = KVM_VCPU_PREEMPTED as u8;
                h.steal_preempted[v] = KVM_VCPU_PREEMPTED as u8;
                h.pcpus[p].rq.push_back(v as u32);
            }
            h.vcpus.push(vc.into());
        }
        h
    }

    /// The first CPU index of VM `vm` and its vCPU count.
    pub fn vm_cpus(&self, vm: usize) -> std::ops::Range<CpuId> {
        let k = self.cfg.vcpus_per_vm;
        vm * k..(vm + 1) * k
    }

    /// The scheduling timers of a fresh host.
    pub(crate) fn perf(&self) -> HostPerf {
        let n = self.pcpus.len();
        let slice = Time::from_us(self.cfg.timeslice_us);
        let mut hp = HostPerf {
            slice_start: vec![Time::ZERO; n],
            slice_end: vec![Time::ZERO; n],
            next_hk: vec![Time::MAX; n],
            resched_at: vec![None; n],
            switched_in: Vec::new(),
            ple_window: vec![self.cfg.ple_window; self.vcpus.len()],
            ple_due: vec![Time::MAX; self.vcpus.len()],
            preempted_in_kernel: vec![false; self.vcpus.len()],
            last_boosted: vec![0; self.cfg.vms],
            vruntime: vec![Time::ZERO; self.vcpus.len()],
            run_start: vec![Time::ZERO; self.vcpus.len()],
            min_vruntime: vec![Time::ZERO; n],
            halt_poll: vec![0; self.vcpus.len()],
            halt_start: vec![Time::ZERO; self.vcpus.len()],
            poll_until: vec![Time::MAX; self.vcpus.len()],
        };
        for p in 0..n {
            hp.slice_end[p] = Time::from_ns_f64(slice.as_ns_f64() * (0.05 + 0.95 * phase(p, 1)));
            if self.cfg.housekeeping_interval_us > 0 {
                let i = self.cfg.housekeeping_interval_us as f64 * 1000.0;
                hp.next_hk[p] = Time::from_ns_f64(i * phase(p, 2));
            }
        }
        hp
    }
}

impl Machine {
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

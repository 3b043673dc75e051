//! The host under the guests (issue #4, seed 001): pCPUs, VMs whose vCPUs are host threads, a
//! host scheduler, VM exits and entries, and the host side of KVM's paravirtual TLB flush —
//! `kvm_arch_vcpu_put()` → `kvm_steal_time_set_preempted()` and `vcpu_enter_guest()` →
//! `record_steal_time()` (arch/x86/kvm/x86.c; kernel-model.md §3.3–§3.5).
//!
//! A machine with a host runs every VM's vCPUs as the CPUs of one [`Machine`]: CPU `v` is vCPU
//! `v % vcpus_per_vm` of VM `v / vcpus_per_vm`. Each VM has its own mms, so its guest kernel only
//! ever sees (cpumasks, IPIs) its own vCPUs; each vCPU keeps its own TLB, which stands for the
//! pCPU's TLB partition tagged with that vCPU's VPID (entries inside are tagged by guest PCID).
//!
//! **Protocol steps** (shared by both drivers, kernel-model.md §3.5): `VcpuPut(v)` is H1+H2 (the
//! host preempts the vCPU thread; `set_preempted` writes `KVM_VCPU_PREEMPTED` unless the host
//! shadow says it already did); `VcpuLoad(v)` is H3..H7 (vcpu_load raises
//! `KVM_REQ_STEAL_UPDATE`, `record_steal_time` exchanges the byte with 0 and flushes the
//! vCPU's guest TLB if `KVM_VCPU_FLUSH_TLB` was set, then VM entry) — one atomic step, or two
//! with the K2 mutant (read the struct into a host copy; clear/flush/write the copy back);
//! `VcpuIoctl(v)` (explorer only) is a `vcpu_load`+`vcpu_put` pair without entering the guest
//! (a userspace ioctl, or a preemption between `vcpu_load` and `record_steal_time`). Host
//! accesses to the steal-time byte go straight to memory: VM exits and the host's locked
//! operations around them (run-queue lock) order them; the guest side goes through the vCPU's
//! store buffer like any guest access.
//!
//! **Scheduling policy** (timed driver only, like the guest scheduler's time slices): vCPU `i` of
//! every VM is pinned to pCPU `i % pcpus`; each pCPU round-robins its runnable vCPU threads with
//! a time slice (`timeslice_us`), a woken (kicked) vCPU goes to the head of the queue and may
//! preempt the running one after `wakeup_granularity_us` (`wakeup_preemption`), and an optional
//! housekeeping task preempts whatever runs: sporadic host work arriving at random (Poisson,
//! mean interval `housekeeping_interval_us`) and running for an exponentially distributed time
//! (mean `housekeeping_run_us`, capped at ten times that). A vCPU agent runs only while its thread is current on its pCPU; while
//! descheduled it is parked and its clock jumps to the moment it is picked again. A guest that
//! halts (HLT exit) blocks its thread (`kvm_vcpu_block`); an IPI to it kicks it awake. A guest
//! booted with `idle=poll` never halts: its idle vCPU keeps running (polling) in guest mode
//! until the host preempts it, like a busy-waiting one.
//!
//! Simplifications: no halt-polling, no pause-loop exiting / directed yield, no load balancing
//! or migration of vCPU threads, no steal-time accounting (only the `preempted` byte), one
//! `vm_exit_entry` cost for every exit reason plus the emulation cost where it matters.

use crate::counters::Counter;
use crate::machine::Machine;
use crate::mem::{line_of, spin_key, Loc};
use crate::options::{OptValue, SetPreempted};
use shootdown_engine::{Env, Park, Time};
use shootdown_hw::CpuId;
use std::collections::VecDeque;

/// `KVM_VCPU_PREEMPTED`.
pub const KVM_VCPU_PREEMPTED: u64 = 1 << 0;
/// `KVM_VCPU_FLUSH_TLB`.
pub const KVM_VCPU_FLUSH_TLB: u64 = 1 << 1;

/// Most vCPU threads one pCPU may carry (overcommit bound of the host settings).
pub const MAX_VCPUS_PER_PCPU: usize = 8;
/// Most VMs on one host.
pub const MAX_VMS: usize = 16;

/// Host settings: the experiment's `[host]` table (and a scenario's `[host]`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct HostConfig {
    pub vms: usize,
    pub vcpus_per_vm: usize,
    /// Host scheduler time slice of a vCPU thread when others wait for its pCPU.
    pub timeslice_us: u64,
    /// A kicked (woken) vCPU preempts the running one (CFS wake-up preemption).
    pub wakeup_preemption: bool,
    /// How long the running vCPU keeps the pCPU before a woken one preempts it.
    pub wakeup_granularity_us: u64,
    /// Mean interval between housekeeping-task runs on each pCPU (0 = no housekeeping).
    pub housekeeping_interval_us: u64,
    /// How long each housekeeping run keeps the pCPU.
    pub housekeeping_run_us: u64,
    /// VMREAD/VMWRITEs on the path of one VM exit + entry (each pays the error-check fast path).
    pub vmcs_accesses_per_exit: u64,
    /// Explorer only: vCPUs the host may preempt (`VcpuPut`); empty = none.
    pub preemptible: Vec<usize>,
    /// Explorer only: a preempted vCPU may also be loaded and put again without entering.
    pub ioctl_puts: bool,
    /// Explorer only: at most this many preemptions per vCPU (0 = unbounded).
    pub max_preemptions: u32,
}

impl Default for HostConfig {
    fn default() -> Self {
        HostConfig {
            vms: 1,
            vcpus_per_vm: 1,
            timeslice_us: 3000,
            wakeup_preemption: true,
            wakeup_granularity_us: 1000,
            housekeeping_interval_us: 0,
            housekeeping_run_us: 0,
            vmcs_accesses_per_exit: 20,
            preemptible: Vec::new(),
            ioctl_puts: false,
            max_preemptions: 0,
        }
    }
}

/// Every `[host]` key of an experiment file with its accepted values.
pub const HOST_KEYS: &[(&str, &str)] = &[
    ("vms", "number of VMs (1..=16)"),
    (
        "vcpus_per_vm",
        "vCPUs of each VM (>= 1); vCPU i runs on pCPU i % pcpus",
    ),
    (
        "timeslice_us",
        "host time slice of a vCPU thread, microseconds (>= 1)",
    ),
    (
        "wakeup_preemption",
        "true | false: a kicked vCPU preempts the running one",
    ),
    (
        "wakeup_granularity_us",
        "microseconds the running vCPU keeps its pCPU before a wake-up preempts it (>= 0)",
    ),
    (
        "housekeeping_interval_us",
        "mean interval of a housekeeping task on each pCPU, microseconds (0 = none)",
    ),
    (
        "housekeeping_run_us",
        "how long each housekeeping run takes, microseconds",
    ),
    (
        "vmcs_accesses_per_exit",
        "VMREAD/VMWRITEs per VM exit + entry (>= 0)",
    ),
];

impl HostConfig {
    /// Set one `[host]` key; the error is the reason (the caller adds file and key).
    pub fn set(&mut self, key: &str, v: &OptValue) -> Result<(), String> {
        // Bounded above too, so that no typo'd value overflows a time or a product later.
        fn int(v: &OptValue, min: i64, max: i64) -> Result<u64, String> {
            match v {
                OptValue::Int(i) if (min..=max).contains(i) => Ok(*i as u64),
                OptValue::Int(i) => Err(format!("must be between {min} and {max} (got {i})")),
                _ => Err("expected an integer".into()),
            }
        }
        /// One simulated hour, in µs.
        const MAX_US: i64 = 3_600_000_000;
        let cpus = shootdown_hw::MAX_CPUS as i64;
        match key {
            "vms" => self.vms = int(v, 1, MAX_VMS as i64)? as usize,
            "vcpus_per_vm" => self.vcpus_per_vm = int(v, 1, cpus)? as usize,
            "timeslice_us" => self.timeslice_us = int(v, 1, MAX_US)?,
            "wakeup_preemption" => {
                self.wakeup_preemption = match v {
                    OptValue::Bool(b) => *b,
                    _ => return Err("expected true or false".into()),
                }
            }
            "wakeup_granularity_us" => self.wakeup_granularity_us = int(v, 0, MAX_US)?,
            "housekeeping_interval_us" => self.housekeeping_interval_us = int(v, 0, MAX_US)?,
            "housekeeping_run_us" => self.housekeeping_run_us = int(v, 0, MAX_US)?,
            "vmcs_accesses_per_exit" => self.vmcs_accesses_per_exit = int(v, 0, 10_000)?,
            _ => {
                let keys: Vec<_> = HOST_KEYS.iter().map(|k| k.0).collect();
                return Err(format!("unknown host setting (known: {})", keys.join(", ")));
            }
        }
        Ok(())
    }

    /// vCPU threads that share the busiest pCPU.
    pub fn vcpus_per_pcpu(&self, pcpus: usize) -> usize {
        self.vms * self.vcpus_per_vm.div_ceil(pcpus.max(1))
    }

    /// Check the settings against a host of `pcpus` pCPUs; errors are `(key, reason)`.
    pub fn validate(&self, pcpus: usize) -> Result<(), (String, String)> {
        let e = |k: &str, r: String| Err((k.to_string(), r));
        if self.vms == 0 || self.vms > MAX_VMS {
            return e(
                "vms",
                format!("must be between 1 and {MAX_VMS} (got {})", self.vms),
            );
        }
        if self.vcpus_per_vm == 0 {
            return e("vcpus_per_vm", "must be at least 1".into());
        }
        let per = self.vcpus_per_pcpu(pcpus);
        if per > MAX_VCPUS_PER_PCPU {
            return e(
                if self.vms > 1 { "vms" } else { "vcpus_per_vm" },
                format!(
                    "{} VM(s) x {} vCPUs on {pcpus} pCPUs puts {per} vCPU threads on one pCPU; at most {MAX_VCPUS_PER_PCPU} are supported",
                    self.vms, self.vcpus_per_vm
                ),
            );
        }
        if self.timeslice_us == 0 {
            return e("timeslice_us", "must be at least 1".into());
        }
        if self.housekeeping_interval_us > 0 {
            if self.housekeeping_run_us == 0 {
                return e(
                    "housekeeping_run_us",
                    "must be at least 1 when housekeeping_interval_us is set".into(),
                );
            }
            if self.housekeeping_run_us >= self.housekeeping_interval_us {
                return e(
                    "housekeeping_run_us",
                    format!(
                        "must be shorter than housekeeping_interval_us ({} >= {})",
                        self.housekeeping_run_us, self.housekeeping_interval_us
                    ),
                );
            }
        } else if self.housekeeping_run_us > 0 {
            return e(
                "housekeeping_run_us",
                "set housekeeping_interval_us too (0 = no housekeeping)".into(),
            );
        }
        Ok(())
    }
}

/// Where a vCPU thread is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum VcpuMode {
    /// Current on its pCPU and running guest code.
    InGuest,
    /// Preempted: runnable, waiting for its pCPU (or picked by the host scheduler, which runs
    /// its `VcpuLoad` when the switch is done).
    Runnable,
    /// Blocked in `kvm_vcpu_block` after a HLT exit (timed driver only).
    Blocked,
    /// Current on its pCPU, host side of `vcpu_enter_guest` at this step > 0 (only the K2
    /// mutant splits the entry in two steps; step 0 starts from `Runnable`).
    Entering(u8),
}

/// Host-side state of one vCPU.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Vcpu {
    pub vm: u32,
    pub pcpu: u32,
    pub mode: VcpuMode,
    /// The host's copy of the steal-time `preempted` byte (`vcpu->arch.st.steal.preempted`,
    /// later `vcpu->arch.st.preempted`): the "already preempted" shadow, and with the K2 mutant
    /// the copy `record_steal_time` works on.
    pub st_preempted: u8,
    /// Preemptions so far (counted only under an explorer bound).
    pub preemptions: u8,
}

/// Host scheduler state of one pCPU (timed driver only; constant under the explorer).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Pcpu {
    pub curr: Option<u32>,
    pub rq: VecDeque<u32>,
}

/// The host: configuration, vCPU threads, pCPU run queues, and the guest memory it shares with
/// the guests (each vCPU's steal-time `preempted` byte).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Host {
    pub cfg: HostConfig,
    pub vcpus: Vec<Vcpu>,
    pub pcpus: Vec<Pcpu>,
    /// Guest memory: `struct kvm_steal_time.preempted` of each vCPU ([`Loc::Preempted`]).
    pub steal_preempted: Vec<u8>,
}

/// Performance-only host state (time slices, housekeeping timers).
#[derive(Clone, Debug, Default)]
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
}

/// An exponentially distributed number with mean 1, from the run's random numbers.
fn exponential<E: Env>(env: &mut E) -> f64 {
    let u = (env.random(1 << 30) as f64 + 0.5) / (1u64 << 30) as f64;
    -u.ln()
}

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
    /// runnable and were preempted before time zero (their steal-time byte says so).
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
            cfg,
        };
        for v in 0..n {
            let vm = v / h.cfg.vcpus_per_vm;
            let p = (v % h.cfg.vcpus_per_vm) % pcpus;
            let mut vc = Vcpu {
                vm: vm as u32,
                pcpu: p as u32,
                mode: VcpuMode::InGuest,
                st_preempted: 0,
                preemptions: 0,
            };
            if h.pcpus[p].curr.is_none() {
                h.pcpus[p].curr = Some(v as u32);
            } else {
                vc.mode = VcpuMode::Runnable;
                vc.st_preempted = KVM_VCPU_PREEMPTED as u8;
                h.steal_preempted[v] = KVM_VCPU_PREEMPTED as u8;
                h.pcpus[p].rq.push_back(v as u32);
            }
            h.vcpus.push(vc);
        }
        h
    }

    /// The first CPU index of VM `vm` and its vCPU count.
    pub fn vm_cpus(&self, vm: usize) -> std::ops::Range<CpuId> {
        let k = self.cfg.vcpus_per_vm;
        vm * k..(vm + 1) * k
    }

    fn perf(&self) -> HostPerf {
        let n = self.pcpus.len();
        let slice = Time::from_us(self.cfg.timeslice_us);
        let mut hp = HostPerf {
            slice_start: vec![Time::ZERO; n],
            slice_end: vec![Time::ZERO; n],
            next_hk: vec![Time::MAX; n],
            resched_at: vec![None; n],
            switched_in: Vec::new(),
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
    /// A machine whose CPUs are the vCPUs of `cfg.vms` VMs on a host with topology `topo`
    /// (the pCPUs). Call `cfg.validate(topo.nr_cpus())` first.
    pub fn with_host(
        topo: shootdown_hw::Topology,
        profile: std::sync::Arc<shootdown_hw::CostProfile>,
        opts: crate::Options,
        memory_model: crate::MemoryModel,
        cfg: HostConfig,
    ) -> Machine {
        let pcpus = topo.nr_cpus();
        let n = cfg.vms * cfg.vcpus_per_vm;
        let mut m = Machine::with_cpus(topo, n, profile, opts, memory_model);
        let host = Host::new(cfg, pcpus);
        m.perf.host = host.perf();
        m.host = Some(Box::new(host));
        m
    }

    /// The pCPU a CPU runs on (itself without a host).
    #[inline]
    pub fn phys_cpu(&self, cpu: CpuId) -> CpuId {
        match &self.host {
            None => cpu,
            Some(h) => h.vcpus[cpu].pcpu as usize,
        }
    }

    /// Is this CPU running guest code (always, without a host)?
    #[inline]
    pub fn vcpu_in_guest(&self, cpu: CpuId) -> bool {
        match &self.host {
            None => true,
            Some(h) => h.vcpus[cpu].mode == VcpuMode::InGuest,
        }
    }

    pub(crate) fn host_ref(&self) -> &Host {
        self.host.as_deref().expect("machine has a host")
    }
    fn host_mut(&mut self) -> &mut Host {
        self.host.as_deref_mut().expect("machine has a host")
    }

    /// Cost of one VM exit + entry on this host, with the VMX-instruction error checks of
    /// `vmcs_accesses_per_exit` VMREAD/VMWRITEs (seed 000's second cover letter, §6).
    pub fn vm_exit_cost(&self) -> Time {
        let c = &self.perf.profile.costs;
        let n = self
            .host
            .as_ref()
            .map_or(20, |h| h.cfg.vmcs_accesses_per_exit);
        let instrs = self.opts.vmx_insn_error_check.instructions();
        c.vm_exit_entry + Time(c.vmx_insn_error_check.0 * instrs * n)
    }

    /// Charge one VM exit + entry and count it.
    pub(crate) fn vm_exit<E: Env>(&mut self, env: &mut E) {
        self.perf.counters.inc(Counter::KvmExits);
        if env.timed() {
            env.charge(self.vm_exit_cost());
        }
    }

    /// A host-side access to a vCPU's steal-time byte: straight to memory (see module doc).
    fn host_write_byte<E: Env>(&mut self, v: CpuId, val: u8, env: &mut E) {
        let loc = Loc::Preempted(v as u32);
        let line = line_of(self, loc);
        self.touch_line(env, v, line, true);
        self.raw_write(loc, val as u64);
        env.notify_key(spin_key(loc));
    }
    fn host_read_byte<E: Env>(&mut self, v: CpuId, env: &mut E) -> u8 {
        let loc = Loc::Preempted(v as u32);
        let line = line_of(self, loc);
        self.touch_line(env, v, line, false);
        self.raw_read(loc) as u8
    }

    /// Host action `VcpuPut(v)` enabled in the explorer?
    pub(crate) fn host_may_preempt(&self, v: CpuId) -> bool {
        let h = self.host_ref();
        h.vcpus[v].mode == VcpuMode::InGuest
            && h.cfg.preemptible.contains(&v)
            && (h.cfg.max_preemptions == 0
                || (h.vcpus[v].preemptions as u32) < h.cfg.max_preemptions)
    }

    /// Would `VcpuIoctl(v)` change anything? (Like a speculative fill, it is only offered when it
    /// would: in the fixed protocol the host copy already says "preempted", so a second put
    /// writes nothing.)
    pub(crate) fn vcpu_ioctl_would_change(&self, v: CpuId) -> bool {
        let h = self.host_ref();
        let k1 = self.opts.mutants.pv_set_preempted_clobbers_flush;
        (h.vcpus[v].st_preempted == 0 || k1) && h.steal_preempted[v] as u64 != KVM_VCPU_PREEMPTED
    }

    /// `kvm_steal_time_set_preempted(vcpu)` (H2), from `kvm_arch_vcpu_put`: mark the vCPU
    /// preempted in its steal-time area. Fixed (8c6de56a42e0): nothing to do if the host copy
    /// says it already did, so a `KVM_VCPU_FLUSH_TLB` the guest set since is kept. K1 mutant:
    /// write the byte anyway (a plain store of `KVM_VCPU_PREEMPTED`).
    fn kvm_steal_time_set_preempted<E: Env>(&mut self, v: CpuId, env: &mut E) {
        let k1 = self.opts.mutants.pv_set_preempted_clobbers_flush;
        if self.host_ref().vcpus[v].st_preempted != 0 && !k1 {
            self.say(|| {
                format!("kvm_steal_time_set_preempted(vcpu{v}): host copy says already preempted, nothing written")
            });
            return;
        }
        self.host_mut().vcpus[v].st_preempted = KVM_VCPU_PREEMPTED as u8;
        let before = self.host_ref().steal_preempted[v];
        self.host_write_byte(v, KVM_VCPU_PREEMPTED as u8, env);
        self.say(|| {
            format!("kvm_steal_time_set_preempted(vcpu{v}): st[{v}].preempted = PREEMPTED (was {before:#x})")
        });
    }

    /// Host action `VcpuPut(v)` (H1+H2): a host interrupt exits vCPU `v`, the host scheduler
    /// preempts its thread (`kvm_sched_out` → `kvm_arch_vcpu_put`) and marks it preempted. The
    /// timed driver then runs the host scheduler on that pCPU.
    pub(crate) fn vcpu_put_step<E: Env>(&mut self, v: CpuId, env: &mut E) -> Park {
        // The exit orders the guest's stores before anything the host does.
        self.fence(v);
        self.suspend_busy(v, env.now());
        self.vm_exit(env);
        self.perf.counters.inc(Counter::HostPreemptions);
        self.say(|| format!("preempt vcpu{v}: VM exit, kvm_sched_out, vcpu_put"));
        self.kvm_steal_time_set_preempted(v, env);
        let bounded = self.host_ref().cfg.max_preemptions > 0;
        let h = self.host.as_deref_mut().expect("host");
        h.vcpus[v].mode = VcpuMode::Runnable;
        if bounded {
            h.vcpus[v].preemptions = h.vcpus[v].preemptions.saturating_add(1);
        }
        if env.timed() {
            let p = h.vcpus[v].pcpu as usize;
            h.pcpus[p].rq.push_back(v as u32);
            h.pcpus[p].curr = None;
            self.perf.host.resched_at[p] = None;
            let t = env.now() + self.vm_exit_cost();
            self.host_switch(p, t, env);
        }
        Park::Halt
    }

    /// Explorer action `VcpuIoctl(v)`: a preempted vCPU is loaded and put again without entering
    /// the guest (a userspace ioctl on it, or a second preemption between `vcpu_load` and
    /// `record_steal_time`): `kvm_arch_vcpu_put` runs `set_preempted` once more.
    pub(crate) fn vcpu_ioctl_step<E: Env>(&mut self, v: CpuId, env: &mut E) -> Park {
        self.say(|| format!("vcpu_load + vcpu_put of vcpu{v} without entering the guest (ioctl)"));
        self.kvm_steal_time_set_preempted(v, env);
        Park::Halt
    }

    /// `kvm_vcpu_flush_tlb(vcpu)` (H5): INVVPID single-context — every guest-linear translation
    /// of the vCPU, all guest PCIDs (and paging-structure caches).
    fn kvm_vcpu_flush_tlb<E: Env>(&mut self, v: CpuId, env: &mut E) {
        self.cpus[v].tlb.flush_all();
        self.perf.counters.inc(Counter::KvmTlbFlush);
        self.charge(env, |c| c.invvpid_single);
    }

    /// VM entry (H6+H7): the vCPU runs guest code again.
    fn vm_enter<E: Env>(&mut self, v: CpuId, _env: &mut E) {
        self.host_mut().vcpus[v].mode = VcpuMode::InGuest;
    }

    /// Host action `VcpuLoad(v)`: the vCPU thread has its pCPU again and enters the guest.
    ///
    /// Fixed protocol (b043138246a4), one step: `vcpu_load` raises `KVM_REQ_STEAL_UPDATE`
    /// (H3); `record_steal_time` does `xchg(&st->preempted, 0)` on guest memory and clears the
    /// host copy (H4); if the old value had `KVM_VCPU_FLUSH_TLB`, `kvm_vcpu_flush_tlb` (H5); VM
    /// entry (H6/H7). K2 mutant, two steps: H3 + `kvm_read_guest_cached` of the whole struct into
    /// the host copy (H4a); then `xchg(&copy.preempted, 0)` (H4b), the flush if the *copy* had
    /// the flag, the write-back of the copy (H4c) and entry.
    pub(crate) fn vcpu_load_step<E: Env>(&mut self, v: CpuId, env: &mut E) -> Park {
        let pc = match self.host_ref().vcpus[v].mode {
            VcpuMode::Runnable => 0,
            VcpuMode::Entering(pc) => pc,
            _ => return Park::Run,
        };
        let k2 = self.opts.mutants.pv_record_steal_time_nonatomic;
        match (pc, k2) {
            (0, false) => {
                let loc = Loc::Preempted(v as u32);
                let line = line_of(self, loc);
                self.touch_line(env, v, line, true);
                self.charge(env, |c| c.atomic_rmw);
                let old = self.raw_read(loc);
                self.raw_write(loc, 0);
                env.notify_key(spin_key(loc));
                self.host_mut().vcpus[v].st_preempted = 0;
                let flush = old & KVM_VCPU_FLUSH_TLB != 0;
                self.say(|| {
                    format!(
                        "vcpu_load(vcpu{v}); record_steal_time: xchg(st[{v}].preempted, 0) = {old:#x}{}; VM entry",
                        if flush { " ⇒ kvm_vcpu_flush_tlb (INVVPID)" } else { ", no flush" }
                    )
                });
                if flush {
                    self.kvm_vcpu_flush_tlb(v, env);
                }
                self.vm_enter(v, env);
            }
            (0, true) => {
                let b = self.host_read_byte(v, env);
                let h = self.host_mut();
                h.vcpus[v].st_preempted = b;
                h.vcpus[v].mode = VcpuMode::Entering(1);
                self.say(|| {
                    format!("vcpu_load(vcpu{v}); record_steal_time: kvm_read_guest_cached: host copy.preempted = {b:#x}")
                });
            }
            _ => {
                let old = std::mem::replace(&mut self.host_mut().vcpus[v].st_preempted, 0);
                let flush = old as u64 & KVM_VCPU_FLUSH_TLB != 0;
                if flush {
                    self.kvm_vcpu_flush_tlb(v, env);
                }
                let before = self.host_ref().steal_preempted[v];
                self.host_write_byte(v, 0, env);
                self.say(|| {
                    format!(
                        "record_steal_time: xchg(copy.preempted, 0) = {old:#x}{}; kvm_write_guest_cached: st[{v}].preempted = 0 (was {before:#x}); VM entry",
                        if flush { " ⇒ kvm_vcpu_flush_tlb (INVVPID)" } else { ", no flush" }
                    )
                });
                self.vm_enter(v, env);
            }
        }
        Park::Run
    }

    // ---- Host scheduling policy (timed driver only) ----

    /// Should the host take the pCPU away from running vCPU `v` now?
    pub(crate) fn host_preempt_due(&self, v: CpuId, now: Time) -> bool {
        let h = self.host_ref();
        let p = h.vcpus[v].pcpu as usize;
        let hp = &self.perf.host;
        (now >= hp.slice_end[p] && !h.pcpus[p].rq.is_empty())
            || now >= hp.next_hk[p]
            || hp.resched_at[p].is_some_and(|t| now >= t)
    }

    /// When the host will next want the pCPU of `v` (slice end with others waiting,
    /// housekeeping, pending wake-up preemption).
    pub(crate) fn host_next_preempt(&self, v: CpuId) -> Option<Time> {
        let h = self.host_ref();
        let p = h.vcpus[v].pcpu as usize;
        let hp = &self.perf.host;
        let mut t = hp.next_hk[p];
        if !h.pcpus[p].rq.is_empty() {
            t = t.min(hp.slice_end[p]);
        }
        if let Some(r) = hp.resched_at[p] {
            t = t.min(r);
        }
        (t != Time::MAX).then_some(t)
    }

    /// The host scheduler on pCPU `p` at time `t` (its current vCPU thread is gone): run the
    /// housekeeping task if it is due, then switch to the next runnable vCPU thread.
    fn host_switch<E: Env>(&mut self, p: usize, mut t: Time, env: &mut E) {
        let cfg_hk = self.host_ref().cfg.housekeeping_interval_us;
        if cfg_hk > 0 && t >= self.perf.host.next_hk[p] {
            // Sporadic host work: Poisson arrivals, exponentially distributed run times
            // (capped at ten times the mean).
            self.perf.counters.inc(Counter::HostHousekeeping);
            let run = self.host_ref().cfg.housekeeping_run_us as f64;
            t += Time::from_ns_f64(1000.0 * run * exponential(env).min(10.0));
            let gap = cfg_hk as f64 * exponential(env);
            self.perf.host.next_hk[p] = t + Time::from_ns_f64(1000.0 * gap);
        }
        t += self.perf.profile.costs.vcpu_context_switch;
        let slice = Time::from_us(self.host_ref().cfg.timeslice_us);
        let h = self.host.as_deref_mut().expect("host");
        match h.pcpus[p].rq.pop_front() {
            Some(w) => {
                // `w` stays Runnable until its thread really runs (at `t`): a kick before
                // that must not bring it in early.
                h.pcpus[p].curr = Some(w);
                let hp = &mut self.perf.host;
                hp.slice_start[p] = t;
                hp.slice_end[p] = t + slice;
                hp.resched_at[p] = None;
                hp.switched_in.push((w as usize, t));
            }
            None => h.pcpus[p].curr = None,
        }
    }

    /// The guest on `v` halted with nothing pending (HLT exit): its thread blocks in
    /// `kvm_vcpu_block` (marked preempted with `set_preempted = every_put`, as v4.16's
    /// `kvm_arch_vcpu_put` did) and the pCPU runs another vCPU thread.
    pub(crate) fn host_block<E: Env>(&mut self, v: CpuId, end: Time, env: &mut E) {
        self.perf.counters.inc(Counter::KvmHaltExits);
        self.vm_exit(env);
        if self.opts.set_preempted == SetPreempted::EveryPut {
            self.kvm_steal_time_set_preempted(v, env);
        }
        let t = end + self.vm_exit_cost();
        let h = self.host.as_deref_mut().expect("host");
        h.vcpus[v].mode = VcpuMode::Blocked;
        let p = h.vcpus[v].pcpu as usize;
        h.pcpus[p].curr = None;
        self.perf.host.resched_at[p] = None;
        self.host_switch(p, t, env);
    }

    /// `kvm_vcpu_kick` of a blocked vCPU (an IPI or a reschedule for its guest): wake its thread.
    /// On an idle pCPU it runs at once; otherwise it queues first in line and, with wake-up
    /// preemption, takes the pCPU after `wakeup_granularity_us` of the running vCPU's slice.
    pub(crate) fn host_kick<E: Env>(&mut self, w: CpuId, at: Time, env: &mut E) {
        self.perf.counters.inc(Counter::VcpuWakeups);
        let wake_cost = self.perf.profile.costs.vcpu_wakeup;
        let slice = Time::from_us(self.host_ref().cfg.timeslice_us);
        let gran = Time::from_us(self.host_ref().cfg.wakeup_granularity_us);
        let preempt = self.host_ref().cfg.wakeup_preemption;
        let h = self.host.as_deref_mut().expect("host");
        let p = h.vcpus[w].pcpu as usize;
        match h.pcpus[p].curr {
            None => {
                h.pcpus[p].curr = Some(w as u32);
                h.vcpus[w].mode = VcpuMode::Runnable;
                let t = at + wake_cost;
                let hp = &mut self.perf.host;
                hp.slice_start[p] = t;
                hp.slice_end[p] = t + slice;
                hp.switched_in.push((w, t));
            }
            Some(u) => {
                h.vcpus[w].mode = VcpuMode::Runnable;
                h.pcpus[p].rq.push_front(w as u32);
                if preempt {
                    let running = h.vcpus[u as usize].mode == VcpuMode::InGuest;
                    let hp = &mut self.perf.host;
                    let when = at.max(hp.slice_start[p] + gran);
                    let r = hp.resched_at[p].map_or(when, |r| r.min(when));
                    hp.resched_at[p] = Some(r);
                    // A vCPU still switching in sees the request at its first guest step.
                    if running {
                        env.wake(u as usize, r);
                    }
                }
            }
        }
    }
}

/// The timed driver's [`Env`] seen by a guest step on a host: wake-ups of vCPUs are collected so
/// the host can turn them into what they mean for a vCPU thread (deliver to a running vCPU, kick
/// a blocked one, nothing for a preempted one: it sees its pending interrupt when it runs).
pub(crate) struct HostEnv<'a, E: Env> {
    pub inner: &'a mut E,
    pub charged: Time,
    pub wakes: Vec<(usize, Time)>,
}

impl<E: Env> Env for HostEnv<'_, E> {
    fn timed(&self) -> bool {
        self.inner.timed()
    }
    fn now(&self) -> Time {
        self.inner.now()
    }
    fn charge(&mut self, t: Time) {
        self.charged += t;
        self.inner.charge(t);
    }
    fn elapsed(&self) -> Time {
        self.inner.elapsed()
    }
    fn random(&mut self, n: u64) -> u64 {
        self.inner.random(n)
    }
    fn wake(&mut self, agent: usize, at: Time) {
        self.wakes.push((agent, at));
    }
    fn wake_by(&mut self, agent: usize, at: Time) {
        self.inner.wake_by(agent, at)
    }
    fn notify(&mut self) {
        self.inner.notify()
    }
    fn notify_key(&mut self, key: u64) {
        self.inner.notify_key(key)
    }
    fn tracing(&self) -> bool {
        self.inner.tracing()
    }
    fn trace(&mut self, ev: shootdown_engine::trace::TraceEvent) {
        self.inner.trace(ev)
    }
}

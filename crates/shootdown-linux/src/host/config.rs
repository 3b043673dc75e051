//! Host settings: the experiment's `[host]` table (and a scenario's `[host]`). Every setting an
//! experiment file may give is declared once, in the [`host_settings!`] table below (key, type,
//! default, bounds, documentation); the struct, the key list and the parser come from it.

use crate::options::OptValue;

/// Most vCPU threads one pCPU may carry (overcommit bound of the host settings).
pub const MAX_VCPUS_PER_PCPU: usize = 8;
/// Most VMs on one host.
pub const MAX_VMS: usize = 16;
/// One simulated hour, in µs: the bound of every duration setting (so that no typo'd value
/// overflows a time or a product later).
const MAX_US: u64 = 3_600_000_000;

/// How one setting's value is read; the error is the reason (the caller adds file and key).
trait Setting: Sized {
    fn parse(v: &OptValue, min: u64, max: u64) -> Result<Self, String>;
}

impl Setting for u64 {
    fn parse(v: &OptValue, min: u64, max: u64) -> Result<u64, String> {
        match v {
            OptValue::Int(i) if *i >= 0 && (min..=max).contains(&(*i as u64)) => Ok(*i as u64),
            OptValue::Int(i) => Err(format!("must be between {min} and {max} (got {i})")),
            _ => Err("expected an integer".into()),
        }
    }
}

impl Setting for usize {
    fn parse(v: &OptValue, min: u64, max: u64) -> Result<usize, String> {
        u64::parse(v, min, max).map(|x| x as usize)
    }
}

impl Setting for bool {
    fn parse(v: &OptValue, _: u64, _: u64) -> Result<bool, String> {
        match v {
            OptValue::Bool(b) => Ok(*b),
            _ => Err("expected true or false".into()),
        }
    }
}

/// The settings table: `key: type = default, (min, max), "what it means";` for each setting an
/// experiment's `[host]` may give (`experiment { … }`), then the fields scenarios set in code
/// (`explorer { … }`).
macro_rules! host_settings {
    (
        experiment { $( $(#[doc = $doc:literal])* $key:ident : $ty:ty = $default:expr, ($min:expr, $max:expr), $help:literal; )+ }
        explorer { $( $(#[doc = $xdoc:literal])* $xkey:ident : $xty:ty = $xdefault:expr; )* }
    ) => {
        /// Host settings: the experiment's `[host]` table (and a scenario's `[host]`).
        #[derive(Clone, Debug, PartialEq, Eq, Hash)]
        pub struct HostConfig {
            $( $(#[doc = $doc])* pub $key: $ty, )+
            $( $(#[doc = $xdoc])* pub $xkey: $xty, )*
        }

        impl Default for HostConfig {
            fn default() -> Self {
                HostConfig { $( $key: $default, )+ $( $xkey: $xdefault, )* }
            }
        }

        /// Every `[host]` key of an experiment file with its accepted values.
        pub const HOST_KEYS: &[(&str, &str)] = &[ $( (stringify!($key), $help), )+ ];

        impl HostConfig {
            /// Set one `[host]` key; the error is the reason (the caller adds file and key).
            pub fn set(&mut self, key: &str, v: &OptValue) -> Result<(), String> {
                match key {
                    $( stringify!($key) => self.$key = <$ty as Setting>::parse(v, $min, $max)?, )+
                    _ => {
                        let keys: Vec<_> = HOST_KEYS.iter().map(|k| k.0).collect();
                        return Err(format!("unknown host setting (known: {})", keys.join(", ")));
                    }
                }
                Ok(())
            }
        }
    };
}

host_settings! {
    experiment {
    vms: usize = 1, (1, MAX_VMS as u64), "number of VMs (1..=16)";
    vcpus_per_vm: usize = 1, (1, shootdown_hw::MAX_CPUS as u64),
        "vCPUs of each VM (>= 1); vCPU i runs on pCPU i % pcpus";
    /// Host scheduler time slice of a vCPU thread when others wait for its pCPU.
    timeslice_us: u64 = 3000, (1, MAX_US), "host time slice of a vCPU thread, microseconds (>= 1)";
    /// A kicked (woken) vCPU preempts the running one (CFS wake-up preemption).
    wakeup_preemption: bool = true, (0, 1), "true | false: a kicked vCPU preempts the running one";
    /// The host's scheduler tick (`1000000 / HZ` µs; v4.15 distribution kernels: HZ=250, 4000).
    /// 0: a running vCPU thread with others waiting is preempted after a fixed `timeslice_us`;
    /// otherwise at the first tick at which CFS's `check_preempt_tick` says so ([`crate::host::fair`]).
    tick_us: u64 = 0, (0, 1_000_000), "host scheduler tick, microseconds (HZ=250: 4000); 0 = fixed slices of timeslice_us, else CFS's check_preempt_tick at each tick";
    /// CFS's `sysctl_sched_min_granularity`, scaled like `sched_latency` (v4.15: 0.75 ms × 4 =
    /// 3 ms from 8 CPUs): the least a thread runs before `check_preempt_tick` compares its
    /// vruntime, and the period's share per thread beyond `sched_nr_latency` (8) threads.
    sched_min_granularity_us: u64 = 3000, (1, MAX_US), "CFS sched_min_granularity, microseconds (v4.15 on 8+ CPUs: 3000)";
    /// CFS's `sysctl_sched_latency`, scaled for the host's CPUs (v4.15: 6 ms × (1 + ilog2(min(
    /// CPUs, 8))), 24 ms from 8 CPUs): a woken thread is placed at most half of it below its
    /// run queue's `min_vruntime` (`place_entity`).
    sched_latency_us: u64 = 24000, (1, MAX_US), "CFS sched_latency, microseconds (v4.15 on 8+ CPUs: 24000); a woken thread's vruntime credit is half of it";
    /// CFS's `sysctl_sched_wakeup_granularity`, scaled like `sched_latency` (v4.15: 1 ms × (1 +
    /// ilog2(min(CPUs, 8))), 4 ms from 8 CPUs): a woken thread preempts the running one if
    /// that one's vruntime is more than this past its own (`check_preempt_wakeup`), and a
    /// yield's buddies run only within it of the leftmost (`pick_next_entity`).
    wakeup_granularity_us: u64 = 4000, (0, MAX_US),
        "CFS wakeup_gran, microseconds (v4.15 on 8+ CPUs: 4000): a wake-up preempts a thread more than this ahead in vruntime; a yield's buddy runs within it of the leftmost";
    /// Mean interval between housekeeping-task runs on each pCPU (0 = no housekeeping).
    housekeeping_interval_us: u64 = 0, (0, MAX_US),
        "mean interval of a housekeeping task on each pCPU, microseconds (0 = none)";
    /// How long each housekeeping run keeps the pCPU.
    housekeeping_run_us: u64 = 0, (0, MAX_US), "how long each housekeeping run takes, microseconds";
    /// VMREAD/VMWRITEs on the path of one VM exit + entry (each pays the error-check fast path).
    vmcs_accesses_per_exit: u64 = 20, (0, 10_000), "VMREAD/VMWRITEs per VM exit + entry (>= 0)";
    /// Pause-loop exiting (`kvm_intel.ple_gap`, TSC ticks between the PAUSEs of one loop; KVM's
    /// default since v2.6.32 is 128): 0 turns PLE off, as on a CPU without it.
    ple_gap: u64 = 128, (0, 1 << 20), "kvm_intel.ple_gap: TSC ticks between PAUSEs of one loop (0 = no pause-loop exiting; KVM's default 128)";
    /// `kvm_intel.ple_window`: the base window, TSC ticks a guest may PAUSE-loop before it exits.
    ple_window: u64 = 4096, (1, 1 << 31), "kvm_intel.ple_window: base PAUSE-loop window, TSC ticks (4096)";
    /// `kvm_intel.ple_window_grow`: a factor if below `ple_window`, else an increment (each exit).
    ple_window_grow: u64 = 2, (0, 1 << 31), "kvm_intel.ple_window_grow: factor (< ple_window) or increment, each PLE exit (2)";
    /// `kvm_intel.ple_window_shrink`: a divisor or decrement at sched-in; 0 resets to the base.
    ple_window_shrink: u64 = 0, (0, 1 << 31), "kvm_intel.ple_window_shrink: divisor (< ple_window) or decrement at sched-in; 0 = reset (0)";
    /// `kvm_intel.ple_window_max` (v4.15: INT_MAX / 2).
    ple_window_max: u64 = 1_073_741_823, (1, u32::MAX as u64), "kvm_intel.ple_window_max, TSC ticks (v4.15: 1073741823)";
    /// `kvm_vcpu_on_spin(vcpu, yield_to_kernel_mode)` from a PLE exit boosts only vCPUs
    /// preempted in guest kernel mode (v4.14+, `kvm_arch_vcpu_in_kernel`).
    yield_to_kernel_mode: bool = true, (0, 1), "true | false: directed yield only to vCPUs preempted in guest kernel mode (v4.14+)";
    /// `kvm.halt_poll_ns`: the most a halted vCPU's thread polls for a wake-up before it
    /// sleeps (`kvm_vcpu_block`), while nothing else waits for its pCPU. KVM's x86 default is
    /// 200000 (`KVM_HALT_POLL_NS_DEFAULT`); 0 here unless an experiment sets it.
    halt_poll_ns: u64 = 0, (0, 1_000_000_000), "kvm.halt_poll_ns: longest halt-poll, ns (0 = none; KVM's x86 default 200000)";
    /// `kvm.halt_poll_ns_grow`: the per-vCPU poll time's factor when it grows (first step 10 us).
    halt_poll_ns_grow: u64 = 2, (0, 1 << 20), "kvm.halt_poll_ns_grow: factor of each grow, from 10 us (2)";
    /// `kvm.halt_poll_ns_shrink`: its divisor when it shrinks (0 = back to 0; v4.15's default).
    halt_poll_ns_shrink: u64 = 0, (0, 1 << 20), "kvm.halt_poll_ns_shrink: divisor of each shrink (0 = reset to 0)";
    /// The TSC rate, MHz: PLE's windows are in TSC ticks.
    tsc_mhz: u64 = 2600, (1, 100_000), "TSC frequency in MHz, for PLE's tick windows (2600)";
    }
    explorer {
        /// Explorer only: vCPUs the host may preempt (`VcpuPut`); empty = none.
        preemptible: Vec<usize> = Vec::new();
        /// Explorer only: a preempted vCPU may also be loaded and put again without entering.
        ioctl_puts: bool = false;
        /// Explorer only: at most this many preemptions per vCPU (0 = unbounded).
        max_preemptions: u32 = 0;
    }
}

impl HostConfig {
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

//! [`probe`]: what the host is, from `/proc`, `/sys`, `uname` and CPUID.

use crate::{cpuid, interrupts, pin, HostError, HostInfo};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

const CPUINFO: &str = "/proc/cpuinfo";
const CMDLINE: &str = "/proc/cmdline";
const CPU_SYS: &str = "/sys/devices/system/cpu";

pub(crate) fn probe() -> Result<HostInfo, HostError> {
    let cpuinfo = read(CPUINFO)?;
    let online_cpus = pin::online_cpus()?;
    let (sockets, cores_per_socket, threads_per_core, topology_source) =
        topology(&cpuinfo, online_cpus.len());
    let kernel_cmdline = read(CMDLINE)?.trim().to_string();
    let flags = cpuinfo_field(&cpuinfo, "flags").unwrap_or_default();
    let has_flag = |name: &str| flags.split_whitespace().any(|f| f == name);
    let (hypervisor, kvm_features) = cpuid::hypervisor();
    let interrupts_rows = std::fs::read_to_string(interrupts::PATH)
        .map(|t| interrupts::parse(&t).tlb.is_some())
        .unwrap_or(false);
    Ok(HostInfo {
        cpu_model: cpuinfo_field(&cpuinfo, "model name").unwrap_or_default(),
        online_cpu_count: online_cpus.len(),
        online_cpus,
        sockets,
        cores_per_socket,
        threads_per_core,
        topology_source: topology_source.to_string(),
        kernel_release: kernel_release()?,
        idle_poll: kernel_cmdline
            .split_whitespace()
            .any(|arg| arg == "idle=poll"),
        kernel_cmdline,
        mitigations: vulnerabilities(),
        pcid: has_flag("pcid"),
        invpcid: has_flag("invpcid"),
        invlpgb: has_flag("invlpgb"),
        hypervisor,
        kvm_features,
        interrupts_rows,
    })
}

fn read(path: &str) -> Result<String, HostError> {
    std::fs::read_to_string(path).map_err(|e| HostError::Unreadable {
        path: path.into(),
        cause: e.to_string(),
    })
}

/// The value of the first `key : value` line of `/proc/cpuinfo` text with that key.
fn cpuinfo_field(cpuinfo: &str, key: &str) -> Option<String> {
    cpuinfo.lines().find_map(|line| {
        let (k, v) = line.split_once(':')?;
        (k.trim() == key).then(|| v.trim().to_string())
    })
}

/// `uname -r`.
fn kernel_release() -> Result<String, HostError> {
    // SAFETY: utsname is plain bytes; uname fills it.
    let mut u: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: `u` is a valid utsname.
    if unsafe { libc::uname(&mut u) } != 0 {
        return Err(crate::sys::syscall_error("uname", "cannot name the kernel"));
    }
    let bytes: Vec<u8> = u
        .release
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// `/sys/devices/system/cpu/vulnerabilities/*`, file name → contents (empty if absent).
fn vulnerabilities() -> BTreeMap<String, String> {
    let dir = Path::new(CPU_SYS).join("vulnerabilities");
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return BTreeMap::new();
    };
    entries
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let text = std::fs::read_to_string(e.path()).ok()?;
            Some((name, text.trim().to_string()))
        })
        .collect()
}

/// Parse a kernel CPU list such as "0-3,8,10-11".
pub(crate) fn parse_cpu_list(text: &str) -> Option<Vec<usize>> {
    let mut cpus = Vec::new();
    for part in text.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (usize, usize) = (a.trim().parse().ok()?, b.trim().parse().ok()?);
                if b < a || b - a > 1 << 16 {
                    return None;
                }
                cpus.extend(a..=b);
            }
            None => cpus.push(part.trim().parse().ok()?),
        }
    }
    Some(cpus)
}

/// (sockets, cores per socket, threads per core, source).
fn topology(cpuinfo: &str, online: usize) -> (usize, usize, usize, &'static str) {
    if let Some((s, c, t)) = sysfs_topology() {
        return (s, c, t, "sysfs");
    }
    if let Some((s, c, t)) = cpuinfo_topology(cpuinfo) {
        return (s, c, t, "cpuinfo");
    }
    (1, online.max(1), 1, "fallback")
}

/// From `cpuN/topology/{physical_package_id, core_cpus_list | thread_siblings_list}` of the
/// online CPUs: sockets = distinct packages, cores = distinct sibling sets.
fn sysfs_topology() -> Option<(usize, usize, usize)> {
    let sys = Path::new(CPU_SYS);
    let online = parse_cpu_list(&std::fs::read_to_string(sys.join("online")).ok()?)?;
    let mut packages = BTreeSet::new();
    let mut cores = BTreeSet::new();
    let mut threads = 1;
    for cpu in online {
        let topo = sys.join(format!("cpu{cpu}/topology"));
        let read = |f: &str| std::fs::read_to_string(topo.join(f)).ok();
        let package: i64 = read("physical_package_id")?.trim().parse().ok()?;
        let siblings = read("core_cpus_list")
            .or_else(|| read("thread_siblings_list"))
            .and_then(|t| parse_cpu_list(&t))?;
        threads = threads.max(siblings.len());
        packages.insert(package);
        cores.insert((package, siblings));
    }
    summarise(packages.len(), cores.len(), threads)
}

/// From "physical id", "cpu cores" and "siblings" of `/proc/cpuinfo`.
fn cpuinfo_topology(cpuinfo: &str) -> Option<(usize, usize, usize)> {
    let packages: BTreeSet<&str> = cpuinfo
        .lines()
        .filter_map(|l| l.split_once(':'))
        .filter(|(k, _)| k.trim() == "physical id")
        .map(|(_, v)| v.trim())
        .collect();
    let cores: usize = cpuinfo_field(cpuinfo, "cpu cores")?.parse().ok()?;
    let siblings: usize = cpuinfo_field(cpuinfo, "siblings")?.parse().ok()?;
    if packages.is_empty() || cores == 0 {
        return None;
    }
    summarise(
        packages.len(),
        packages.len() * cores,
        (siblings / cores).max(1),
    )
}

fn summarise(sockets: usize, cores: usize, threads: usize) -> Option<(usize, usize, usize)> {
    (sockets > 0 && cores > 0).then(|| (sockets, cores.div_ceil(sockets), threads))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists() {
        assert_eq!(
            parse_cpu_list("0-3,8,10-11\n"),
            Some(vec![0, 1, 2, 3, 8, 10, 11])
        );
        assert_eq!(parse_cpu_list("5"), Some(vec![5]));
        assert_eq!(parse_cpu_list("3-1"), None);
        assert_eq!(parse_cpu_list("x"), None);
    }

    #[test]
    fn cpuinfo_fields_and_topology() {
        let text = "processor\t: 0\nmodel name\t: AMD EPYC\nphysical id\t: 0\nsiblings\t: 4\n\
                    cpu cores\t: 2\nflags\t\t: fpu pcid invpcid\n\nprocessor\t: 1\nphysical id\t: 0\n";
        assert_eq!(
            cpuinfo_field(text, "model name").as_deref(),
            Some("AMD EPYC")
        );
        assert_eq!(cpuinfo_topology(text), Some((1, 2, 2)));
        assert_eq!(cpuinfo_topology("processor : 0\n"), None);
    }

    #[test]
    fn this_host_probes() {
        let info = probe().expect("probe");
        assert_eq!(info.online_cpu_count, info.online_cpus.len());
        assert!(info.online_cpu_count >= 1);
        assert!(info.sockets >= 1 && info.cores_per_socket >= 1 && info.threads_per_core >= 1);
        assert!(!info.kernel_release.is_empty());
        if info.hypervisor.as_deref() == Some(cpuid::KVM_SIGNATURE) {
            assert!(info.kvm_features.is_some());
        }
    }
}

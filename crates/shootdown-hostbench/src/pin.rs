//! CPU affinity: which CPUs this process may use, and pinning a thread to one of them.

use crate::sys::{errno_name, last_errno};
use crate::HostError;
use std::mem::{size_of, zeroed};

/// The CPUs in the process's affinity mask (`sched_getaffinity` of the thread-group leader),
/// ascending.
pub(crate) fn online_cpus() -> Result<Vec<usize>, HostError> {
    // SAFETY: cpu_set_t is plain bits; all-zero is the empty set.
    let mut set: libc::cpu_set_t = unsafe { zeroed() };
    // SAFETY: getpid has no preconditions; `set` is a valid cpu_set_t of the size passed.
    let rc =
        unsafe { libc::sched_getaffinity(libc::getpid(), size_of::<libc::cpu_set_t>(), &mut set) };
    if rc != 0 {
        let errno = last_errno();
        return Err(HostError::Syscall {
            call: "sched_getaffinity".into(),
            errno: errno_name(errno),
            hint: if errno == libc::EINVAL {
                "more than 1024 possible CPUs are not supported".into()
            } else {
                "cannot read the process's CPU mask".into()
            },
        });
    }
    let max = 8 * size_of::<libc::cpu_set_t>();
    // SAFETY: CPU_ISSET reads a bit of a valid set, for cpu < CPU_SETSIZE.
    Ok((0..max)
        .filter(|&cpu| unsafe { libc::CPU_ISSET(cpu, &set) })
        .collect())
}

/// Restrict the calling thread to `cpu`. The kernel migrates it there before returning.
pub(crate) fn pin_current_thread(cpu: usize) -> Result<(), HostError> {
    if cpu >= 8 * size_of::<libc::cpu_set_t>() {
        return Err(HostError::Affinity {
            cpu,
            errno: "EINVAL".into(),
            hint: "CPU id beyond the 1024 a cpu_set_t holds".into(),
        });
    }
    // SAFETY: as above; CPU_SET writes a bit of a valid set for cpu < CPU_SETSIZE.
    let rc = unsafe {
        let mut set: libc::cpu_set_t = zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set)
    };
    if rc == 0 {
        return Ok(());
    }
    let errno = last_errno();
    let hint = match errno {
        libc::EPERM => "run outside a restricted cpuset",
        libc::EINVAL => "the CPU is offline or outside this cgroup's cpuset",
        _ => "cannot change this thread's affinity",
    };
    Err(HostError::Affinity {
        cpu,
        errno: errno_name(errno),
        hint: hint.into(),
    })
}

/// The CPU the calling thread runs on now (`sched_getcpu`), or -1 if the kernel can't say.
pub(crate) fn current_cpu() -> i64 {
    // SAFETY: no preconditions.
    i64::from(unsafe { libc::sched_getcpu() })
}

/// Pin the calling thread to `cpu` and check it landed there.
pub(crate) fn pin_and_check(cpu: usize) -> Result<(), HostError> {
    pin_current_thread(cpu)?;
    let got = current_cpu();
    if got != cpu as i64 {
        return Err(HostError::NotMigrated { want: cpu, got });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mask_is_not_empty_and_pinning_works() {
        let cpus = online_cpus().expect("affinity");
        assert!(!cpus.is_empty());
        let cpu = *cpus.last().expect("non-empty");
        std::thread::spawn(move || {
            pin_and_check(cpu).expect("pin");
        })
        .join()
        .expect("join");
    }

    #[test]
    fn pinning_beyond_the_set_is_an_error() {
        assert!(matches!(
            pin_current_thread(100_000),
            Err(HostError::Affinity { .. })
        ));
    }
}

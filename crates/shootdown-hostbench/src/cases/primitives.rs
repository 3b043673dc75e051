//! The primitives a shootdown is built from, timed alone: a system call, a context switch, a
//! cross-CPU wake-up, a migration. They ignore `siblings`.

use super::Workload;
use crate::sys::{pipe, read_byte, write_byte};
use crate::{pin, HostError};
use std::os::fd::OwnedFd;
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

/// `syscall(SYS_getppid)` (see [`crate::Op::NullSyscall`]): entry, a trivial handler and exit,
/// with whatever entry/exit mitigations the host runs (page-table isolation, retbleed
/// untraining, VERW, …). Bypasses libc's wrapper so no cached value can hide the call.
pub(crate) struct NullSyscall;

impl Workload for NullSyscall {
    fn run(&mut self, iters: u64) -> Result<(), HostError> {
        for _ in 0..iters {
            // SAFETY: getppid takes no arguments and cannot fail.
            std::hint::black_box(unsafe { libc::syscall(libc::SYS_getppid) });
        }
        Ok(())
    }
}

/// One byte bounced between the measuring thread and a partner thread over two pipes.
///
/// * `ctx_switch` (see [`crate::Op::CtxSwitch`]): the partner is pinned to the measuring
///   thread's CPU. A round trip is two switches: write wakes the partner (`pipe_write` →
///   `wake_up_interruptible_sync_poll` → `try_to_wake_up`, same runqueue), the read blocks
///   (`pipe_read` → `schedule`) and the partner runs, and back. Reported per switch.
/// * `wake_ipi` (see [`crate::Op::WakeIpi`]): the partner is pinned to the second CPU, idle
///   while it waits. Each direction is a remote wake-up: `try_to_wake_up` on an idle remote CPU
///   queues the task on its wake list and sends a function-call IPI (or a reschedule IPI, or
///   none if the idle CPU polls), then the woken CPU leaves idle and switches in. Reported per
///   round trip, i.e. two wake-ups. Pipes rather than futexes keep the path identical to
///   `ctx_switch` apart from the CPU hop, so the two subtract.
pub(crate) struct PingPong {
    /// Write end towards the partner; closing it ends the partner (it reads EOF).
    to_partner: Option<OwnedFd>,
    from_partner: OwnedFd,
    partner: Option<JoinHandle<()>>,
    ops_per_iter: u64,
}

impl PingPong {
    /// Start the partner pinned to `partner_cpu`; an iteration (a round trip) counts as
    /// `ops_per_iter` ops.
    pub(crate) fn new(partner_cpu: usize, ops_per_iter: u64) -> Result<Self, HostError> {
        let (ping_r, ping_w) = pipe()?;
        let (pong_r, pong_w) = pipe()?;
        let (ready_tx, ready_rx) = mpsc::channel::<Result<(), HostError>>();
        let partner = std::thread::Builder::new()
            .name("hostbench-partner".into())
            .stack_size(64 * 1024)
            .spawn(move || {
                if let Err(e) = pin::pin_and_check(partner_cpu) {
                    let _ = ready_tx.send(Err(e));
                    return;
                }
                let _ = ready_tx.send(Ok(()));
                // Echo until the measuring side closes its write end. The measuring side keeps
                // `pong_r` open until this thread is joined, so the echo never hits EPIPE.
                while let Ok(true) = read_byte(&ping_r) {
                    if write_byte(&pong_w).is_err() {
                        break;
                    }
                }
            })
            .map_err(|e| {
                HostError::Thread(format!(
                    "cannot start the ping-pong partner thread: {e} (raise the thread limit)"
                ))
            })?;
        let pp = PingPong {
            to_partner: Some(ping_w),
            from_partner: pong_r,
            partner: Some(partner),
            ops_per_iter,
        };
        match ready_rx.recv_timeout(Duration::from_secs(10)) {
            Ok(Ok(())) => Ok(pp),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(HostError::Thread(
                "the ping-pong partner did not start within 10 s (host overloaded?)".into(),
            )),
        }
    }
}

impl Workload for PingPong {
    fn ops_per_iter(&self) -> u64 {
        self.ops_per_iter
    }

    fn run(&mut self, iters: u64) -> Result<(), HostError> {
        let to = self
            .to_partner
            .as_ref()
            .ok_or_else(|| HostError::Thread("ping-pong already stopped".into()))?;
        for _ in 0..iters {
            write_byte(to)?;
            if !read_byte(&self.from_partner)? {
                return Err(HostError::Thread(
                    "the ping-pong partner thread exited early".into(),
                ));
            }
        }
        Ok(())
    }
}

impl Drop for PingPong {
    fn drop(&mut self) {
        self.to_partner = None;
        if let Some(h) = self.partner.take() {
            let _ = h.join();
        }
    }
}

/// `sched_setaffinity` of the measuring thread to the first and second CPU in turn (see
/// [`crate::Op::Migrate`]). Each call finds the thread running on a CPU outside its new mask
/// and moves it before returning (`__set_cpus_allowed_ptr` → `affine_move_task` →
/// `stop_one_cpu` → `migration_cpu_stop` on the old CPU, then the thread runs on the new one,
/// which may have to be woken from idle). Each landing is checked with `sched_getcpu`.
pub(crate) struct Migrate {
    cpus: [usize; 2],
    next: usize,
}

impl Migrate {
    /// The thread is on `home` now; the first op moves it to `away`.
    pub(crate) fn new(home: usize, away: usize) -> Self {
        Migrate {
            cpus: [home, away],
            next: 1,
        }
    }
}

impl Workload for Migrate {
    fn run(&mut self, iters: u64) -> Result<(), HostError> {
        for _ in 0..iters {
            pin::pin_and_check(self.cpus[self.next])?;
            self.next ^= 1;
        }
        Ok(())
    }
}

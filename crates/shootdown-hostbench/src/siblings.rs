//! Sibling threads for the shootdown cases: threads of the measuring process, pinned one per
//! CPU, that make the kernel's flush reach other CPUs.
//!
//! Each sibling owns one pre-touched page of its own (never one of the operated pages, so it
//! never faults and never contends on the operated range's page-table lock); it exists only to
//! put the mm on its CPU:
//!
//! * [`SiblingMode::Busy`] siblings spin reading their page with volatile loads. Their CPU runs
//!   the mm, it stays in `mm_cpumask` and is not lazy, so every `flush_tlb_mm_range` of the
//!   measuring thread IPIs it and waits for its acknowledgement. The loop has no `PAUSE`
//!   (`spin_loop`): under a hypervisor, pause-loop exiting could deschedule the vCPU and turn
//!   the IPI into a deferred paravirtual flush.
//! * [`SiblingMode::Sleeping`] siblings touch their page once and block in `read()` on a
//!   shared pipe. Their CPU goes idle and keeps the mm loaded lazily (`enter_lazy_tlb`): plain
//!   flushes skip it, flushes that free page tables (`freed_tables`) still IPI it, until
//!   another process runs there and the CPU leaves `mm_cpumask` (see
//!   [`SiblingMode::Sleeping`]).
//!
//! Dropping [`Siblings`] stops and joins them (busy: a flag; sleeping: closing the pipe's write
//! end wakes every reader with EOF), then unmaps their pages.

use crate::mem::{touch_pages, Mapping, PAGE};
use crate::sys::{pipe, read_byte};
use crate::{pin, HostError, SiblingMode};
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::Duration;

/// How long a sibling may take to start, pin itself and touch its page.
const START_TIMEOUT: Duration = Duration::from_secs(10);

pub(crate) struct Siblings {
    stop: Arc<AtomicBool>,
    /// Write end of the sleepers' pipe; dropping it wakes them.
    wake: Option<OwnedFd>,
    handles: Vec<JoinHandle<()>>,
    /// Each sibling's CPU-time clock (`pthread_getcpuclockid`), valid while it lives.
    clocks: Vec<libc::clockid_t>,
    /// One page per sibling; outlives the threads (fields drop after `Drop::drop` joined them).
    _pages: Option<Mapping>,
}

impl Siblings {
    /// No siblings.
    pub(crate) fn none() -> Self {
        Siblings {
            stop: Arc::new(AtomicBool::new(false)),
            wake: None,
            handles: Vec::new(),
            clocks: Vec::new(),
            _pages: None,
        }
    }

    /// CPU time the siblings have used so far, summed, in ns; `None` without siblings or if
    /// a clock can't be read.
    pub(crate) fn cpu_time_ns(&self) -> Option<u64> {
        if self.clocks.is_empty() {
            return None;
        }
        self.clocks.iter().try_fold(0u64, |sum, &clock| {
            // SAFETY: timespec is plain data; the clock belongs to a live sibling.
            let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
            // SAFETY: as above; clock_gettime writes `ts`.
            if unsafe { libc::clock_gettime(clock, &mut ts) } != 0 {
                return None;
            }
            let ns =
                u64::try_from(ts.tv_sec).ok()? * 1_000_000_000 + u64::try_from(ts.tv_nsec).ok()?;
            Some(sum + ns)
        })
    }

    /// How many siblings started.
    pub(crate) fn len(&self) -> usize {
        self.clocks.len()
    }

    /// Start one sibling per CPU in `cpus`, and return once every one is pinned, has touched
    /// its page and has had time to settle (spinning, or blocked with its CPU idle).
    pub(crate) fn start(cpus: &[usize], mode: SiblingMode) -> Result<Self, HostError> {
        if cpus.is_empty() {
            return Ok(Self::none());
        }
        let pages = Mapping::anon(cpus.len() * PAGE, libc::PROT_READ | libc::PROT_WRITE)?;
        let (wake_r, wake_w) = pipe()?;
        let wake_r = Arc::new(wake_r);
        let mut group = Siblings {
            stop: Arc::new(AtomicBool::new(false)),
            wake: Some(wake_w),
            handles: Vec::with_capacity(cpus.len()),
            clocks: Vec::with_capacity(cpus.len()),
            _pages: None,
        };
        let (ready_tx, ready_rx) = mpsc::channel::<Result<libc::clockid_t, HostError>>();
        for (i, &cpu) in cpus.iter().enumerate() {
            let page = pages.page(i);
            let stop = Arc::clone(&group.stop);
            let wake_r = Arc::clone(&wake_r);
            let ready = ready_tx.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("hostbench-sib{}", i + 1))
                .stack_size(64 * 1024)
                .spawn(move || sibling(cpu, page, mode, &stop, &wake_r, &ready));
            match spawned {
                Ok(h) => group.handles.push(h),
                Err(e) => {
                    return Err(HostError::Thread(format!(
                        "cannot start sibling thread {}: {e} (raise the thread limit)",
                        i + 1
                    )))
                }
            }
        }
        drop(ready_tx);
        group._pages = Some(pages);
        for _ in cpus {
            match ready_rx.recv_timeout(START_TIMEOUT) {
                Ok(Ok(clock)) => group.clocks.push(clock),
                Ok(Err(e)) => return Err(e),
                Err(_) => {
                    return Err(HostError::Thread(
                        "a sibling thread did not start within 10 s (host overloaded?)".into(),
                    ))
                }
            }
        }
        // Let them reach their steady state: spinning, or blocked with the CPU idle and lazy.
        std::thread::sleep(match mode {
            SiblingMode::Busy => Duration::from_millis(2),
            SiblingMode::Sleeping => Duration::from_millis(10),
        });
        Ok(group)
    }
}

fn sibling(
    cpu: usize,
    page: usize,
    mode: SiblingMode,
    stop: &AtomicBool,
    wake: &OwnedFd,
    ready: &mpsc::Sender<Result<libc::clockid_t, HostError>>,
) {
    if let Err(e) = pin::pin_and_check(cpu) {
        let _ = ready.send(Err(e));
        return;
    }
    let mut clock: libc::clockid_t = 0;
    // SAFETY: asks for the calling thread's own CPU-time clock id.
    let rc = unsafe { libc::pthread_getcpuclockid(libc::pthread_self(), &mut clock) };
    if rc != 0 {
        let _ = ready.send(Err(HostError::Syscall {
            call: "pthread_getcpuclockid".into(),
            errno: crate::sys::errno_name(rc),
            hint: "no per-thread CPU clocks on this kernel".into(),
        }));
        return;
    }
    // SAFETY: `page` is this sibling's own page of a live read-write mapping that outlives it.
    unsafe { touch_pages(page, 1) };
    let _ = ready.send(Ok(clock));
    match mode {
        SiblingMode::Busy => {
            while !stop.load(Ordering::Relaxed) {
                // SAFETY: as above; a plain load the compiler must keep.
                unsafe { std::ptr::read_volatile(page as *const u8) };
            }
        }
        SiblingMode::Sleeping => {
            // Nothing is ever written: the read returns at EOF (or on an error) when the
            // group is dropped.
            let _ = read_byte(wake);
        }
    }
}

impl Drop for Siblings {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        self.wake = None;
        for h in self.handles.drain(..) {
            let _ = h.join();
        }
    }
}

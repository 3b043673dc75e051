//! `kvm->mmu_lock` as the rwlock it is with the TDP MMU (x86 defines `KVM_HAVE_MMU_RWLOCK`
//! since v5.12): x86's queued rwlock (kernel/locking/qrwlock.c, include/asm-generic/qrwlock.h).
//!
//! The lock is a count word (`cnts`: readers × `_QR_BIAS` plus the writer byte, `_QW_LOCKED`,
//! and `_QW_WAITING`) and a queued spinlock, `wait_lock`, that orders everyone who could not
//! take the lock at once:
//! * `read_lock`: add a reader; if no writer holds or waits, done. Otherwise take the reader
//!   back, queue on `wait_lock`, add the reader again and wait only for the writer byte to
//!   clear, then release `wait_lock` — so the next queued reader follows at once;
//! * `write_lock`: `cmpxchg(cnts, 0, _QW_LOCKED)`; otherwise queue on `wait_lock`, set
//!   `_QW_WAITING` (which turns new readers into the queue) and wait for `cnts` to be exactly
//!   `_QW_WAITING` (no reader, no writer), take it, release `wait_lock`.
//!
//! So waiters are served in FIFO order and a waiting writer holds back newly arriving readers:
//! the "queued fairness" that makes concurrent `kvm_zap_gfn_range()` callers hand the lock to
//! each other one yield at a time (docs/design/kvm-mmu-seeds.md §2.7). `rwlock_needbreak()` is
//! `queued_rwlock_is_contended()` (= `wait_lock` is held) with `CONFIG_PREEMPTION`, which seed
//! 004's host has. Readers in interrupt context (which skip the queue) do not occur here.
//!
//! Model: `cnts` is the location `Loc::MmuRwlock`; `wait_lock` is a [`QueuedSpinlock`] (its
//! word `Loc::MmuWaitLock`). Each caller keeps where it is in a [`RwlockWait`], so a frame can
//! spin and come back.

use crate::frame::Flow;
use crate::kvm::mmu::lock::QueuedSpinlock;
use crate::machine::Machine;
use crate::mem::{spin_key, Loc};
use crate::spinlock::{LockRef, Queued};
use shootdown_engine::Env;

/// `_QW_LOCKED`: a writer holds the lock.
pub const QW_LOCKED: u64 = 0xff;
/// `_QW_WAITING`: a writer waits (and holds `wait_lock`).
pub const QW_WAITING: u64 = 0x100;
/// `_QR_BIAS`: one reader.
pub const QR_BIAS: u64 = 0x200;
/// `_QW_WMASK`.
const QW_WMASK: u64 = QW_LOCKED | QW_WAITING;

/// `struct qrwlock`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct QueuedRwlock {
    /// `cnts`.
    pub cnts: u64,
    /// `wait_lock`.
    pub wait_lock: QueuedSpinlock,
}

/// Where a caller of `read_lock` / `write_lock` is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum RwlockWait {
    /// Not started: the fast path comes next.
    #[default]
    Fast,
    /// The slow path: queued on `wait_lock`.
    Queued,
    /// Holding `wait_lock`: a reader waiting for the writer byte to clear, or a writer (with
    /// `_QW_WAITING` set) waiting for `cnts == _QW_WAITING`.
    Draining,
}

impl Machine {
    /// `queued_spin_lock(&lock->wait_lock)` by `me`: `true` once held.
    fn wait_lock_acquire<E: Env>(&mut self, me: usize, env: &mut E) -> bool {
        let vm = self.vm_of(me) as u32;
        matches!(
            self.queued_spin_lock(me, LockRef::MmuWaitLock(vm), env),
            Queued::Fast | Queued::Head
        )
    }

    fn wait_lock_release<E: Env>(&mut self, me: usize, env: &mut E) {
        let vm = self.vm_of(me);
        self.store(env, me, Loc::MmuWaitLock(vm as u32), 0);
    }

    /// Into the slow path: count the contention and queue on `wait_lock` next.
    fn rwlock_slowpath(&mut self, w: &mut RwlockWait, text: &'static str) {
        self.perf
            .counters
            .inc(crate::counters::Counter::KvmMmuLockContended);
        self.say(|| text.into());
        *w = RwlockWait::Queued;
    }

    /// One step of `read_lock(&kvm->mmu_lock)` by `me`; `Some(spin)` while it waits (call again
    /// after the wake-up).
    pub(crate) fn mmu_read_lock<E: Env>(
        &mut self,
        me: usize,
        w: &mut RwlockWait,
        env: &mut E,
    ) -> Option<Flow> {
        let vm = self.vm_of(me) as u32;
        let cnts = Loc::MmuRwlock(vm);
        match *w {
            RwlockWait::Fast => {
                let old = self.rmw(env, me, cnts, |c| c + QR_BIAS);
                if old & QW_WMASK == 0 {
                    self.perf
                        .counters
                        .inc(crate::counters::Counter::KvmMmuReadLocks);
                    self.say(|| "read_lock(&kvm->mmu_lock)".into());
                    return None;
                }
                // queued_read_lock_slowpath(): take the reader back and queue.
                self.rmw(env, me, cnts, |c| c - QR_BIAS);
                self.rwlock_slowpath(
                    w,
                    "read_lock(&kvm->mmu_lock): a writer holds or waits: queue",
                );
                self.mmu_read_lock(me, w, env)
            }
            RwlockWait::Queued => {
                if !self.wait_lock_acquire(me, env) {
                    return Some(Flow::Spin(spin_key(Loc::MmuWaitLock(vm))));
                }
                self.rmw(env, me, cnts, |c| c + QR_BIAS);
                *w = RwlockWait::Draining;
                self.mmu_read_lock(me, w, env)
            }
            RwlockWait::Draining => {
                if self.load(env, me, cnts) & QW_LOCKED != 0 {
                    return Some(Flow::Spin(spin_key(cnts)));
                }
                self.wait_lock_release(me, env);
                *w = RwlockWait::Fast;
                self.perf
                    .counters
                    .inc(crate::counters::Counter::KvmMmuReadLocks);
                self.say(|| "read_lock(&kvm->mmu_lock): queue head, writer gone".into());
                None
            }
        }
    }

    /// One step of `write_lock(&kvm->mmu_lock)` by `me`; `Some(spin)` while it waits.
    pub(crate) fn mmu_write_lock<E: Env>(
        &mut self,
        me: usize,
        w: &mut RwlockWait,
        env: &mut E,
    ) -> Option<Flow> {
        let vm = self.vm_of(me) as u32;
        let cnts = Loc::MmuRwlock(vm);
        match *w {
            RwlockWait::Fast => {
                let old = self.rmw(env, me, cnts, |c| if c == 0 { QW_LOCKED } else { c });
                if old == 0 {
                    self.perf
                        .counters
                        .inc(crate::counters::Counter::KvmMmuWriteLocks);
                    self.say(|| "write_lock(&kvm->mmu_lock)".into());
                    return None;
                }
                self.rwlock_slowpath(w, "write_lock(&kvm->mmu_lock): held: queue");
                self.mmu_write_lock(me, w, env)
            }
            RwlockWait::Queued => {
                if !self.wait_lock_acquire(me, env) {
                    return Some(Flow::Spin(spin_key(Loc::MmuWaitLock(vm))));
                }
                self.rmw(env, me, cnts, |c| c | QW_WAITING);
                *w = RwlockWait::Draining;
                self.mmu_write_lock(me, w, env)
            }
            RwlockWait::Draining => {
                let old = self.rmw(
                    env,
                    me,
                    cnts,
                    |c| if c == QW_WAITING { QW_LOCKED } else { c },
                );
                if old != QW_WAITING {
                    return Some(Flow::Spin(spin_key(cnts)));
                }
                self.wait_lock_release(me, env);
                *w = RwlockWait::Fast;
                self.perf
                    .counters
                    .inc(crate::counters::Counter::KvmMmuWriteLocks);
                self.say(|| "write_lock(&kvm->mmu_lock): queue head, readers drained".into());
                None
            }
        }
    }

    /// `read_unlock(&kvm->mmu_lock)`.
    pub(crate) fn mmu_read_unlock<E: Env>(&mut self, me: usize, env: &mut E) {
        let vm = self.vm_of(me) as u32;
        self.rmw(env, me, Loc::MmuRwlock(vm), |c| c - QR_BIAS);
    }

    /// `write_unlock(&kvm->mmu_lock)` (a release store of the writer byte), after the oracle's
    /// check that no flush is owed.
    pub(crate) fn mmu_write_unlock<E: Env>(&mut self, me: usize, env: &mut E) {
        let vm = self.vm_of(me);
        self.check_flush_owed(vm);
        self.rmw(env, me, Loc::MmuRwlock(vm as u32), |c| c & !QW_LOCKED);
    }

    /// `rwlock_needbreak(&kvm->mmu_lock)` with `CONFIG_PREEMPTION`:
    /// `queued_rwlock_is_contended()`, i.e. someone holds `wait_lock`.
    pub(crate) fn mmu_rwlock_contended<E: Env>(&mut self, me: usize, env: &mut E) -> bool {
        let vm = self.vm_of(me) as u32;
        self.load(env, me, Loc::MmuWaitLock(vm)) != 0
    }
}

impl Machine {
    /// Would `me`'s next `mmu_read_lock` / `mmu_write_lock` (at `w`) only wait? Mirrors the
    /// wait conditions above, reading memory as `me` would.
    pub(crate) fn mmu_rwlock_waits(&self, me: usize, w: RwlockWait, write: bool) -> bool {
        let vm = self.vm_of(me);
        let see = |loc: Loc| self.value_seen_by(me, loc);
        match w {
            RwlockWait::Fast => false,
            RwlockWait::Queued => self.queued_spin_lock_waits(me, LockRef::MmuWaitLock(vm as u32)),
            RwlockWait::Draining => {
                let c = see(Loc::MmuRwlock(vm as u32));
                if write {
                    c != QW_WAITING
                } else {
                    c & QW_LOCKED != 0
                }
            }
        }
    }
}

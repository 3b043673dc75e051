//! x86 spinlocks (`kernel/locking/qspinlock.c`, `qspinlock_paravirt.h`,
//! `arch/x86/include/asm/qspinlock.h`): the queued spinlock every lock here is built on, and
//! the three forms a guest kernel's `spin_lock` takes ([`SpinlockKind`]).
//!
//! **The queued spinlock** ([`QueuedSpinlock`]), reduced to what orders its waiters: the lock
//! word (the holder agent + 1, or 0) and the MCS queue of waiters. `queued_spin_lock` takes a
//! free lock with one `cmpxchg` only when nobody queues; otherwise the caller joins the tail (a
//! locked `xchg`), waits to become the head, then waits for the lock word to clear and takes
//! it. So the lock is FIFO among waiters and a newcomer cannot overtake the queue, as in the
//! kernel. Simplified: the pending bit (the first waiter spinning without a queue node) is
//! folded into the queue; it changes who spins on which cache line, not the order. Unlike a
//! ticket model, the state is bounded (a holder and a queue of at most every agent), so retry
//! loops under the explorer have a finite state space. `kvm->mmu_lock` (`kvm/mmu/lock.rs`),
//! the TDP MMU rwlock's `wait_lock` (`kvm/mmu/rwlock.rs`) and the guest kernel locks
//! ([`Machine::kernel_spin_lock`]) all use it.
//!
//! **A guest kernel's `spin_lock`** (v4.15, `kvm_spinlock_init`, docs/design/overcommit.md §6):
//! * `queued` — native qspinlock (bare metal, or a guest without PV spinlocks whose
//!   hypervisor hides itself);
//! * `tas` — `virt_spin_lock()`: a guest on a hypervisor without `KVM_FEATURE_PV_UNHALT` falls
//!   back to an unfair test-and-set lock (spin while the word is set, then `cmpxchg`), so that a
//!   preempted waiter cannot hold up the queue behind it;
//! * `pv` — the paravirtual qspinlock (`__pv_queued_spin_lock_slowpath`), a hybrid: a newcomer
//!   steals a free lock unless the queue head is spinning for it (the `pending` bit), and
//!   otherwise spins unqueued, unfairly, until nobody queues or the head spins
//!   (`pv_hybrid_queued_unfair_trylock`); the queue head sets `pending`, spins `SPIN_THRESHOLD`
//!   (2^15) iterations for the lock, then clears `pending` and halts in `pv_wait`; a waiter
//!   behind it halts after as many iterations, or at one of its every-256-iterations checks that
//!   finds its predecessor halted (`pv_wait_early`). `pv_wait` is `kvm_wait`: HLT, with
//!   interrupts off when the lock is taken with them off, so only a kick wakes it.
//!   `spin_unlock` of a lock whose queue head halted kicks it (`pv_kick` → `KVM_HC_KICK_CPU`);
//!   the kernel defers that kick to the unlock (`pv_kick_node` only marks the lock
//!   `_Q_SLOW_VAL`), as here.
//!
//! Simplified: `pv`'s halting happens in the timed driver only (an iteration count is time);
//! under the explorer its waiters spin. The `pv_hash` table and `_Q_SLOW_VAL` are folded into
//! "the queue head halted" (which is what they record).

use crate::frame::Flow;
use crate::machine::Machine;
use crate::mem::{spin_key, Loc};
use crate::options::SpinlockKind;
use shootdown_engine::{Env, Time};

/// `arch_spinlock_t` as a queued spinlock: the lock word and the MCS queue (head first).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct QueuedSpinlock {
    /// The lock word's locked byte: the holder agent + 1, or 0.
    pub val: u64,
    /// Agents queued for the lock (`mcs_spinlock` nodes), the head first.
    pub queue: Vec<u32>,
    /// The PV lock's pending bit: its queue head is spinning, so no newcomer may steal it
    /// (`set_pending` in `pv_wait_head_or_lock`; only `SpinlockKind::Pv` sets it).
    pub pending: bool,
}

/// Which queued spinlock (for the code all of them share).
#[derive(Clone, Copy, Debug)]
pub(crate) enum LockRef {
    /// `kvm->mmu_lock` of a VM.
    MmuLock(u32),
    /// The TDP MMU rwlock's `wait_lock` of a VM.
    MmuWaitLock(u32),
    /// A guest (or native) kernel lock ([`Machine::kernel_locks`]).
    Kernel(u32),
}

impl LockRef {
    fn loc(self) -> Loc {
        match self {
            LockRef::MmuLock(vm) => Loc::MmuLock(vm),
            LockRef::MmuWaitLock(vm) => Loc::MmuWaitLock(vm),
            LockRef::Kernel(id) => Loc::KernelLock(id),
        }
    }
}

/// What one call of [`Machine::queued_spin_lock`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Queued {
    /// Took the free, unqueued lock (the fast path).
    Fast,
    /// Could not: joined the queue's tail; wait.
    Joined,
    /// Still waiting (queued behind others, or the head with the lock still held).
    Wait,
    /// The queue head found the word clear and took the lock.
    Head,
}

/// `SPIN_THRESHOLD`: iterations a PV waiter spins before `pv_wait`.
const SPIN_THRESHOLD: u64 = 1 << 15;
/// `PV_PREV_CHECK_MASK` + 1: a queued PV waiter checks its predecessor every 256 iterations.
const PV_PREV_CHECK: u64 = 256;

impl Machine {
    fn qlock(&self, r: LockRef) -> &QueuedSpinlock {
        match r {
            LockRef::MmuLock(vm) => &self.kvm(vm as usize).mmu_lock,
            LockRef::MmuWaitLock(vm) => &self.kvm(vm as usize).mmu_rwlock.wait_lock,
            LockRef::Kernel(id) => &self.kernel_locks[id as usize],
        }
    }

    fn qlock_mut(&mut self, r: LockRef) -> &mut QueuedSpinlock {
        match r {
            LockRef::MmuLock(vm) => &mut self.kvm_mut(vm as usize).mmu_lock,
            LockRef::MmuWaitLock(vm) => &mut self.kvm_mut(vm as usize).mmu_rwlock.wait_lock,
            LockRef::Kernel(id) => &mut self.kernel_locks[id as usize],
        }
    }

    /// `queued_spin_lock(lock)` by agent `me`. Call again after each wake-up: the first call
    /// takes a free lock or joins the queue, later ones take the lock once `me` heads the queue
    /// and the holder released it.
    pub(crate) fn queued_spin_lock<E: Env>(
        &mut self,
        me: usize,
        r: LockRef,
        env: &mut E,
    ) -> Queued {
        let loc = r.loc();
        let owner = me as u64 + 1;
        let queue = &self.qlock(r).queue;
        if !queue.contains(&(me as u32)) {
            // Fast path `cmpxchg(lock, 0, LOCKED)`, which fails when the tail is set as well;
            // on failure the slow path's `xchg_tail` (both locked operations, one step here).
            let empty = queue.is_empty();
            let old = self.rmw(env, me, loc, |v| if v == 0 && empty { owner } else { v });
            if old == 0 && empty {
                return Queued::Fast;
            }
            self.qlock_mut(r).queue.push(me as u32);
            return Queued::Joined;
        }
        if queue[0] != me as u32 || self.load(env, me, loc) != 0 {
            return Queued::Wait;
        }
        // The queue head: the lock word cleared, take it (`atomic_try_cmpxchg_relaxed`).
        let old = self.rmw(env, me, loc, |v| if v == 0 { owner } else { v });
        if old != 0 {
            return Queued::Wait;
        }
        self.qlock_mut(r).queue.remove(0);
        Queued::Head
    }

    /// Would `me`'s next [`Machine::queued_spin_lock`] only wait? (Queued, and not the head of
    /// the queue or the lock word still set as `me` sees it.)
    pub(crate) fn queued_spin_lock_waits(&self, me: usize, r: LockRef) -> bool {
        let queue = &self.qlock(r).queue;
        let Some(pos) = queue.iter().position(|&a| a == me as u32) else {
            return false;
        };
        pos != 0 || self.value_seen_by(me, r.loc()) != 0
    }

    /// Would `me`'s next [`Machine::kernel_spin_lock`] of lock `id` only wait? Mirrors its
    /// wait conditions, reading memory as `me` would.
    pub(crate) fn kernel_lock_waits(&self, me: usize, id: u32) -> bool {
        let held = self.value_seen_by(me, Loc::KernelLock(id)) != 0;
        match self.opts.spinlock {
            SpinlockKind::Tas => held,
            SpinlockKind::Queued => self.queued_spin_lock_waits(me, LockRef::Kernel(id)),
            SpinlockKind::Pv => {
                let l = &self.kernel_locks[id as usize];
                match l.queue.iter().position(|&a| a == me as u32) {
                    // Stays in unfair mode only while it can neither steal nor queue.
                    None => !(l.queue.is_empty() || l.pending) && held,
                    Some(0) => l.pending && held,
                    Some(_) => true,
                }
            }
        }
    }

    /// A new guest (or native) kernel spinlock; returns its id ([`Loc::KernelLock`]).
    pub fn add_kernel_lock(&mut self) -> u32 {
        self.kernel_locks.push(QueuedSpinlock::default());
        (self.kernel_locks.len() - 1) as u32
    }

    /// `spin_lock()` of guest kernel lock `id` by CPU `me`, in the form the options select
    /// ([`SpinlockKind`]): `None` once held, else how to wait (`Flow::Spin` on the lock word,
    /// or `Flow::Halt` for a PV waiter in `pv_wait`). Call again after each wake-up.
    pub(crate) fn kernel_spin_lock<E: Env>(
        &mut self,
        me: usize,
        id: u32,
        env: &mut E,
    ) -> Option<Flow> {
        let loc = Loc::KernelLock(id);
        match self.opts.spinlock {
            // virt_spin_lock(): `while (atomic_read(&lock->val)) cpu_relax();` then
            // `cmpxchg(&lock->val, 0, _Q_LOCKED_VAL)`, retried on failure.
            SpinlockKind::Tas => self
                .spin_trylock(env, me, loc)
                .is_none()
                .then_some(Flow::Spin(spin_key(loc))),
            SpinlockKind::Queued => match self.queued_spin_lock(me, LockRef::Kernel(id), env) {
                Queued::Fast | Queued::Head => None,
                Queued::Joined | Queued::Wait => Some(Flow::Spin(spin_key(loc))),
            },
            SpinlockKind::Pv => self.pv_queued_spin_lock(me, id, env),
        }
    }

    /// `__pv_queued_spin_lock_slowpath` (v4.15), one attempt by `me`:
    /// * not queued: the fast path, then `pv_hybrid_queued_unfair_trylock` — steal the lock if
    ///   it is free and no queue head is spinning (`pending` clear); queue if nobody queues or
    ///   the head spins; else stay unqueued, spinning in unfair mode;
    /// * the queue head (`pv_wait_head_or_lock`): set `pending` (no stealing while it spins)
    ///   and take the lock when it is free; after `SPIN_THRESHOLD` iterations clear `pending`
    ///   and halt until the unlocker kicks it;
    /// * behind the head (`pv_wait_node`): spin; halt after `SPIN_THRESHOLD` iterations, or at a
    ///   predecessor check that finds the predecessor not running (`pv_wait_early`).
    ///
    /// The halts and their iteration counts are the timed driver's; under the explorer the
    /// waiters spin.
    fn pv_queued_spin_lock<E: Env>(&mut self, me: usize, id: u32, env: &mut E) -> Option<Flow> {
        let loc = Loc::KernelLock(id);
        let spin = Some(Flow::Spin(spin_key(loc)));
        let pos = self.kernel_locks[id as usize]
            .queue
            .iter()
            .position(|&a| a == me as u32);
        if pos.is_some() && self.perf.cpu[me].pv_waiting {
            // Woken by something other than the kick (an IPI to the blocked vCPU): with
            // interrupts off the vCPU is not runnable, and KVM blocks it again.
            return Some(Flow::Halt);
        }
        match pos {
            None => {
                let l = &self.kernel_locks[id as usize];
                let (empty, pending) = (l.queue.is_empty(), l.pending);
                if !pending && self.spin_trylock(env, me, loc).is_some() {
                    if !empty {
                        self.perf
                            .counters
                            .inc(crate::counters::Counter::PvLockStealing);
                    }
                    self.perf.cpu[me].pv_since = None;
                    return None;
                }
                if empty || pending {
                    // `xchg_tail`: into the MCS queue.
                    self.rmw(env, me, loc, |v| v);
                    self.kernel_locks[id as usize].queue.push(me as u32);
                }
                spin
            }
            Some(0) => {
                if !self.kernel_locks[id as usize].pending {
                    self.set_pending(me, id, true, env);
                }
                // `trylock_clear_pending`.
                if self.spin_trylock(env, me, loc).is_some() {
                    let l = &mut self.kernel_locks[id as usize];
                    l.queue.remove(0);
                    l.pending = false;
                    self.perf.cpu[me].pv_since = None;
                    return None;
                }
                self.pv_wait_or_spin(me, id, None, env)
            }
            Some(p) => {
                let prev = self.kernel_locks[id as usize].queue[p - 1] as usize;
                self.pv_wait_or_spin(me, id, Some(prev), env)
            }
        }
    }

    /// Set or clear the queue head's `pending` bit of kernel lock `id` (a write of the lock
    /// word's line, seen by every spinner on it).
    fn set_pending<E: Env>(&mut self, me: usize, id: u32, on: bool, env: &mut E) {
        let loc = Loc::KernelLock(id);
        self.touch_line(env, me, crate::mem::line_of(self, loc), true);
        self.kernel_locks[id as usize].pending = on;
        env.notify_key(spin_key(loc));
    }

    /// A queued PV waiter (`prev` = its predecessor, `None` for the head) keeps spinning, or
    /// (timed driver, with a host) halts in `pv_wait`. Its count of iterations restarts when it
    /// becomes the head (`pv_wait_head_or_lock` has its own loop).
    fn pv_wait_or_spin<E: Env>(
        &mut self,
        me: usize,
        id: u32,
        prev: Option<usize>,
        env: &mut E,
    ) -> Option<Flow> {
        let spin = Some(Flow::Spin(spin_key(Loc::KernelLock(id))));
        if !env.timed() || self.host.is_none() {
            return spin;
        }
        let head = prev.is_none();
        let now = env.now();
        let since = match self.perf.cpu[me].pv_since {
            Some((t, was_head)) if was_head == head => t,
            _ => {
                self.perf.cpu[me].pv_since = Some((now, head));
                now
            }
        };
        let iter = self.perf.profile.costs.spin_poll.max(Time(1));
        let deadline = since + Time(iter.0 * SPIN_THRESHOLD);
        // pv_wait_early: the predecessor's state is not vcpu_running (halted, or hashed).
        let early = prev.is_some_and(|p| self.perf.cpu[p].pv_waiting);
        if now >= deadline || early {
            if head {
                self.set_pending(me, id, false, env);
            }
            self.perf.cpu[me].pv_waiting = true;
            self.perf.cpu[me].pv_since = None;
            self.perf.counters.inc(crate::counters::Counter::PvWait);
            self.say(|| format!("pv_wait: halt until kicked (kernel lock {id})"));
            return Some(Flow::Halt);
        }
        // Wake at the threshold, or (behind the head) at the next predecessor check.
        let next = if head {
            deadline
        } else {
            let n = (now - since).0 / (iter.0 * PV_PREV_CHECK) + 1;
            (since + Time(iter.0 * PV_PREV_CHECK * n)).min(deadline)
        };
        env.wake_by(me, next);
        spin
    }

    /// `spin_unlock()` of guest kernel lock `id` by `me`: the release store; under `pv`, a kick
    /// (`KVM_HC_KICK_CPU`, an exit of the unlocker) of the queue head if it halted in `pv_wait`.
    pub(crate) fn kernel_spin_unlock<E: Env>(&mut self, me: usize, id: u32, env: &mut E) {
        self.store(env, me, Loc::KernelLock(id), 0);
        let Some(&next) = self.kernel_locks[id as usize].queue.first() else {
            return;
        };
        let next = next as usize;
        if !self.perf.cpu[next].pv_waiting {
            return;
        }
        self.perf.cpu[next].pv_waiting = false;
        self.perf.counters.inc(crate::counters::Counter::PvKick);
        self.vm_exit(env);
        self.say(|| format!("pv_kick(vcpu{next})"));
        let at = env.now() + env.elapsed();
        env.wake(next, at);
    }
}

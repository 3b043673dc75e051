//! What a host thread does between its system calls: the next op of its program (the VMM's
//! memslot ioctls, an MMU-notifier invalidation, userspace work) — the host-thread counterpart
//! of `user.rs`. Each ioctl runs as kernel frames on the thread's own stack.

use crate::frame::Frame;
use crate::host::HostOp;
use crate::kvm::kvm_main::{
    MemslotChange, MmuNotifierInvalidate, MmuNotifierPc, SetMemoryRegion, SetMemoryRegionPc,
};
use crate::kvm::memslot::Memslot;
use crate::machine::Machine;
use crate::state::take_loop;
use shootdown_engine::{Env, Outcome, Park, StepKind, Time};

impl Machine {
    /// One step of host thread agent `a`: its top frame, else its next op.
    pub(crate) fn step_host_thread<E: Env>(&mut self, a: usize, env: &mut E) -> Outcome {
        let t = a - self.cpus.len();
        let park = if !self.host_ref().threads[t].stack.is_empty() {
            self.step_host_stack(a, env)
        } else {
            self.host_thread_op(a, env)
        };
        Outcome {
            park,
            kind: StepKind::Shared,
            violation: self.perf.violation.take(),
        }
    }

    /// Would host thread `a`'s next step only wait, or has it exited?
    pub(crate) fn host_thread_blocked(&self, a: usize) -> bool {
        let t = &self.host_ref().threads[a - self.cpus.len()];
        t.done || self.host_stack_blocked(a)
    }

    fn host_thread_op<E: Env>(&mut self, a: usize, env: &mut E) -> Park {
        let t = a - self.cpus.len();
        let th = &self.host_ref().threads[t];
        let op = th
            .program
            .get(th.pc as usize)
            .copied()
            .unwrap_or(HostOp::Exit);
        let vm = th.vm as usize;
        let advance = |m: &mut Machine| m.host_mut().threads[t].pc += 1;
        match op {
            HostOp::MemslotCreate {
                as_id,
                id,
                base_gfn,
                npages,
                readonly,
                huge,
                pfn,
            } => {
                advance(self);
                self.charge(env, |c| c.vmm_memslot_update);
                self.say(|| {
                    format!(
                        "KVM_SET_USER_MEMORY_REGION: create slot {}{id} (gfns {base_gfn:#x}..{:#x})",
                        as_text(as_id),
                        base_gfn + npages
                    )
                });
                let slot = Memslot {
                    id,
                    base_gfn,
                    npages,
                    readonly,
                    invalid: false,
                    huge,
                    pfn,
                    dirty_log: false,
                };
                self.push_host_frame(
                    a,
                    set_memory_region(MemslotChange::Create, as_id, slot),
                    env,
                );
            }
            HostOp::MemslotDelete { as_id, id } => {
                advance(self);
                self.charge(env, |c| c.vmm_memslot_update);
                let slot = self.active_memslot(vm, as_id, id);
                let space = as_text(as_id);
                match slot {
                    Some(slot) => {
                        self.say(|| format!("KVM_SET_USER_MEMORY_REGION: delete slot {space}{id}"));
                        self.push_host_frame(
                            a,
                            set_memory_region(MemslotChange::Delete, as_id, slot),
                            env,
                        );
                    }
                    None => {
                        self.say(|| format!("slot {space}{id} does not exist: nothing to delete"))
                    }
                }
            }
            HostOp::InvalidateGfns { gfn, npages } => {
                advance(self);
                self.say(|| {
                    format!(
                        "mmu_notifier_invalidate_range(gfns {gfn:#x}..{:#x})",
                        gfn + npages
                    )
                });
                self.push_host_frame(
                    a,
                    Frame::MmuNotifierInvalidate(Box::new(MmuNotifierInvalidate {
                        pc: MmuNotifierPc::StartLock,
                        gfn,
                        npages,
                        begin: 0,
                        flush: false,
                        lock: Default::default(),
                    })),
                    env,
                );
            }
            HostOp::GetDirtyLog { as_id, id } => {
                advance(self);
                self.say(|| format!("ioctl(KVM_GET_DIRTY_LOG, slot {}{id})", as_text(as_id)));
                self.charge(env, |c| c.vmm_memslot_update);
                self.push_host_frame(a, crate::kvm::dirty_log::GetDirtyLog::call(as_id, id), env);
            }
            HostOp::ClearDirtyLog { as_id, id } => {
                advance(self);
                self.say(|| format!("ioctl(KVM_CLEAR_DIRTY_LOG, slot {}{id})", as_text(as_id)));
                self.charge(env, |c| c.vmm_memslot_update);
                self.push_host_frame(a, crate::kvm::dirty_log::GetDirtyLog::clear(as_id, id), env);
            }
            HostOp::EnableDirtyLog { as_id, id } => {
                advance(self);
                self.charge(env, |c| c.vmm_memslot_update);
                let slot = self.active_memslot(vm, as_id, id);
                let space = as_text(as_id);
                match slot {
                    Some(mut slot) => {
                        self.say(|| {
                            format!("KVM_SET_USER_MEMORY_REGION: slot {space}{id} flags |= KVM_MEM_LOG_DIRTY_PAGES")
                        });
                        slot.dirty_log = true;
                        self.push_host_frame(
                            a,
                            set_memory_region(MemslotChange::FlagsOnly, as_id, slot),
                            env,
                        );
                    }
                    None => self.say(|| {
                        format!("slot {space}{id} does not exist: KVM_SET_USER_MEMORY_REGION fails")
                    }),
                }
            }
            HostOp::ClearYoung { gfn, npages } => {
                advance(self);
                self.say(|| {
                    format!(
                        "mmu_notifier_clear_young(gfns {gfn:#x}..{:#x})",
                        gfn + npages
                    )
                });
                self.push_host_frame(
                    a,
                    crate::kvm::mmu::access_track::ClearYoung::call(gfn, npages),
                    env,
                );
            }
            HostOp::NxRecover => {
                advance(self);
                self.say(|| "kvm_nx_huge_page_recovery_worker: recover NX huge pages".into());
                self.push_host_frame(a, crate::kvm::mmu::nx_huge_pages::NxRecover::call(), env);
            }
            HostOp::AssignNoncoherentDma => {
                advance(self);
                self.say(|| "VFIO: assign a device without snoop control".into());
                self.push_host_frame(
                    a,
                    Frame::NoncoherentDmaStart(crate::kvm::mtrr_zap::NoncoherentDmaStart {
                        pc: crate::kvm::mtrr_zap::NoncoherentDmaPc::Start,
                    }),
                    env,
                );
            }
            HostOp::Compute { ns } => {
                advance(self);
                if env.timed() {
                    env.charge(Time::from_ns(ns));
                }
            }
            HostOp::Mark => {
                advance(self);
                let now = env.now();
                self.perf.host_marks.push((t, now));
            }
            HostOp::Loop { to, times } => {
                let th = &mut *self.host_mut().threads[t];
                take_loop(&mut th.pc, &mut th.loop_left, to, times);
            }
            HostOp::Exit => {
                self.host_mut().threads[t].done = true;
                self.perf.host_threads_alive -= 1;
                self.say(|| "exit".into());
                return Park::Done;
            }
        }
        Park::Run
    }
}

fn set_memory_region(change: MemslotChange, as_id: u8, slot: Memslot) -> Frame {
    Frame::SetMemoryRegion(Box::new(SetMemoryRegion {
        pc: SetMemoryRegionPc::Lock,
        change,
        as_id,
        slot,
        lock: Default::default(),
        wrprot: 0,
    }))
}

impl Machine {
    /// Memslot `id` of VM `vm`'s address space `as_id` as the active memslots have it (what the
    /// VMM's ioctl finds), if there is one.
    fn active_memslot(&self, vm: usize, as_id: u8, id: u16) -> Option<Memslot> {
        self.kvm(vm)
            .address_spaces
            .get(as_id as usize)
            .and_then(|s| s.active_set().slots.iter().find(|s| s.id == id).cloned())
    }
}

/// How a counterexample names a slot's address space ("" for the normal one).
fn as_text(as_id: u8) -> &'static str {
    if as_id == 1 {
        "SMM:"
    } else {
        ""
    }
}

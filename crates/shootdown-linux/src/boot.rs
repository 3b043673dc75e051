//! What a booting guest does that seed 004 is about, as user operations of a guest task (the
//! firmware and early kernel code on each vCPU, docs/design/kvm-mmu-seeds.md §2.3–§2.4): writes of MTRR MSRs
//! (a WRMSR exit, or the VMM's `KVM_SET_MSRS` at reset), CR0.CD changes (a CR exit), and the
//! guest-side synchronization that decides how concurrent the resulting zap requests are —
//! spinlocks (SeaBIOS's `SMPLock`, Linux's `cache_disable_lock`) and rendezvous (OVMF's AP
//! broadcasts, Linux's `stop_machine`).
//!
//! The locks and rendezvous are words of guest memory ([`Machine::guest_words`], the location
//! `Loc::GuestWord`): a test-and-set spinlock, and a counting barrier whose waiters spin until
//! everyone of their round has arrived. A vCPU spinning on them stays in the guest (no
//! pause-loop exiting), so a remote TLB flush IPIs it.

use crate::kvm::Exit;
use crate::machine::Machine;
use crate::mem::{spin_key, Loc};
use crate::state::{Access, UserOp};
use shootdown_engine::{Env, Park};
use shootdown_hw::CpuId;

impl Machine {
    /// A new word of guest memory for a lock or a rendezvous, on guest page `gfn`, if it is guest
    /// memory (which every
    /// attempt reads through the vCPU's TLB and EPT, so a spinning vCPU re-faults the page after
    /// a zap, as spinning code does); returns its id.
    pub fn add_guest_word(&mut self, gfn: Option<u64>) -> u32 {
        self.guest_words.push(0);
        self.guest_word_pages.push(gfn);
        (self.guest_words.len() - 1) as u32
    }

    /// Read the page of guest word `w` as the guest does; `false` if that exited to KVM (an EPT
    /// violation: the op is retried after the fault).
    fn touch_guest_word<E: Env>(&mut self, cpu: CpuId, w: u32, env: &mut E) -> bool {
        let Some(gfn) = self.guest_word_pages[w as usize] else {
            return true;
        };
        match self.user_access(cpu, gfn, Access::Read, env) {
            Ok(()) => true,
            Err(crate::user::Fault::Exit(exit)) => {
                self.vm_exit_to_kvm(cpu, exit, env);
                false
            }
            Err(crate::user::Fault::PageFault) => unreachable!("boot scripts map their lock page"),
        }
    }

    /// One step of a boot operation of task `t` on vCPU `cpu`.
    pub(crate) fn boot_op_step<E: Env>(
        &mut self,
        cpu: CpuId,
        t: usize,
        op: UserOp,
        env: &mut E,
    ) -> Park {
        match op {
            UserOp::Wrmsr { msr, value } | UserOp::SetMsr { msr, value } => {
                let host = matches!(op, UserOp::SetMsr { .. });
                self.tasks[t].pc += 1;
                self.vm_exit_to_kvm(cpu, Exit::Wrmsr { msr, value, host }, env);
            }
            UserOp::SetCr0Cd { cd } => {
                self.tasks[t].pc += 1;
                self.vm_exit_to_kvm(cpu, Exit::Cr0Cd { cd }, env);
            }
            UserOp::Smi | UserOp::Rsm => {
                self.tasks[t].pc += 1;
                let exit = if op == UserOp::Smi {
                    Exit::Smi
                } else {
                    Exit::Rsm
                };
                self.vm_exit_to_kvm(cpu, exit, env);
            }
            UserOp::GuestSpinLock { lock } => {
                if !self.touch_guest_word(cpu, lock, env) {
                    return Park::Run;
                }
                let loc = Loc::GuestWord(lock);
                let me = cpu as u64 + 1;
                let old = self.rmw(env, cpu, loc, |v| if v == 0 { me } else { v });
                if old != 0 {
                    self.say(|| format!("spin_lock(guest lock {lock}): held by vcpu{}", old - 1));
                    return Park::SpinOn(spin_key(loc));
                }
                self.say(|| format!("spin_lock(guest lock {lock})"));
                self.tasks[t].pc += 1;
            }
            UserOp::GuestSpinUnlock { lock } => {
                self.store(env, cpu, Loc::GuestWord(lock), 0);
                self.say(|| format!("spin_unlock(guest lock {lock})"));
                self.tasks[t].pc += 1;
            }
            UserOp::Rendezvous { word, parties } => {
                if !self.touch_guest_word(cpu, word, env) {
                    return Park::Run;
                }
                let loc = Loc::GuestWord(word);
                let parties = parties as u64;
                let target = match self.tasks[t].op_base {
                    Some(target) => target,
                    None => {
                        let old = self.rmw(env, cpu, loc, |c| c + 1);
                        let target = (old / parties + 1) * parties;
                        self.tasks[t].op_base = Some(target);
                        target
                    }
                };
                if self.load(env, cpu, loc) < target {
                    return Park::SpinOn(spin_key(loc));
                }
                self.say(|| format!("rendezvous {word}: all {parties} arrived"));
                self.tasks[t].op_base = None;
                self.tasks[t].pc += 1;
            }
            _ => unreachable!("not a boot op: {op:?}"),
        }
        Park::Run
    }
}

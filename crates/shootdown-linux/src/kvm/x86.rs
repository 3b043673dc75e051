//! arch/x86/kvm/x86.c: the vCPU thread's way back into the guest (`vcpu_run` →
//! `vcpu_enter_guest`) and the host side of the paravirtual TLB flush — the steal-time byte
//! that `kvm_arch_vcpu_put` marks (`kvm_steal_time_set_preempted`) and that `record_steal_time`
//! consumes before entry (kernel-model.md §3.3–§3.5; CVE-2019-3016's two halves are mutants K1
//! and K2).

use crate::frame::{Flow, Frame};
use crate::kvm::{ThreadState, KVM_VCPU_FLUSH_TLB, KVM_VCPU_PREEMPTED};
use crate::machine::Machine;
use crate::mem::{line_of, spin_key, Loc};
use shootdown_engine::Env;
use shootdown_hw::CpuId;

/// `vcpu_run()` of a vCPU thread that is outside the guest: the host side of its return into
/// the guest. The frame sits on the vCPU's host stack from the moment the thread leaves the
/// guest until the VM entry, which returns from it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct VcpuRun {
    pub pc: VcpuRunPc,
}

/// The steps of `vcpu_run()` back into the guest.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum VcpuRunPc {
    /// `vcpu_load` (raises `KVM_REQ_STEAL_UPDATE`), then `vcpu_enter_guest`: `record_steal_time`
    /// and VM entry — or, with the K2 mutant, only its read of the steal-time struct.
    Load,
    /// K2 mutant: the rest of `record_steal_time` on the host copy, its write-back, VM entry.
    WriteBack,
}

impl VcpuRun {
    /// A vCPU thread that left the guest and will come back through `vcpu_run`.
    pub fn call() -> Frame {
        Frame::VcpuRun(VcpuRun {
            pc: VcpuRunPc::Load,
        })
    }
}

impl Machine {
    /// A host-side access to a vCPU's steal-time byte: straight to memory (see the module
    /// documentation of [`crate::kvm`]).
    pub(crate) fn host_write_byte<E: Env>(&mut self, v: CpuId, val: u8, env: &mut E) {
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

    /// `kvm_steal_time_set_preempted(vcpu)` (H2), from `kvm_arch_vcpu_put`: mark the vCPU
    /// preempted in its steal-time area. Fixed (8c6de56a42e0): nothing to do if the host copy
    /// says it already did, so a `KVM_VCPU_FLUSH_TLB` the guest set since is kept. K1 mutant:
    /// write the byte anyway (a plain store of `KVM_VCPU_PREEMPTED`).
    pub(crate) fn kvm_steal_time_set_preempted<E: Env>(&mut self, v: CpuId, env: &mut E) {
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

    /// VM entry (H6+H7): the vCPU runs guest code again.
    fn vm_enter(&mut self, v: CpuId) {
        self.host_mut().vcpus[v].thread = ThreadState::Running;
    }

    /// One step of `vcpu_run()` back into the guest, run when the vCPU thread has its pCPU.
    ///
    /// Fixed protocol (b043138246a4), one step: `vcpu_load` raises `KVM_REQ_STEAL_UPDATE`
    /// (H3); `record_steal_time` does `xchg(&st->preempted, 0)` on guest memory and clears the
    /// host copy (H4); if the old value had `KVM_VCPU_FLUSH_TLB`, `kvm_vcpu_flush_tlb` (H5); VM
    /// entry (H6/H7). K2 mutant, two steps: H3 + `kvm_read_guest_cached` of the whole struct into
    /// the host copy (H4a); then `xchg(&copy.preempted, 0)` (H4b), the flush if the *copy* had
    /// the flag, the write-back of the copy (H4c) and entry.
    pub(crate) fn vcpu_run_step<E: Env>(&mut self, v: CpuId, s: &mut VcpuRun, env: &mut E) -> Flow {
        let k2 = self.opts.mutants.pv_record_steal_time_nonatomic;
        match (s.pc, k2) {
            (VcpuRunPc::Load, false) => {
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
                self.vm_enter(v);
                Flow::Return
            }
            (VcpuRunPc::Load, true) => {
                let b = self.host_read_byte(v, env);
                let h = self.host_mut();
                h.vcpus[v].st_preempted = b;
                h.vcpus[v].thread = ThreadState::Running;
                s.pc = VcpuRunPc::WriteBack;
                self.say(|| {
                    format!("vcpu_load(vcpu{v}); record_steal_time: kvm_read_guest_cached: host copy.preempted = {b:#x}")
                });
                Flow::Next
            }
            (VcpuRunPc::WriteBack, _) => {
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
                self.vm_enter(v);
                Flow::Return
            }
        }
    }

    /// Would `VcpuIoctl(v)` change anything? (Like a speculative fill, it is only offered when it
    /// would: in the fixed protocol the host copy already says "preempted", so a second put
    /// writes nothing.)
    pub(crate) fn vcpu_ioctl_would_change(&self, v: CpuId) -> bool {
        let h = self.host_ref();
        let k1 = self.opts.mutants.pv_set_preempted_clobbers_flush;
        (h.vcpus[v].st_preempted == 0 || k1) && h.steal_preempted[v] as u64 != KVM_VCPU_PREEMPTED
    }
}

//! KVM: what a vCPU thread runs on the host side, mirroring the kernel's layout —
//! [`kvm_main`] is virt/kvm/kvm_main.c (the preempt notifiers `kvm_sched_out` / `kvm_sched_in`),
//! [`x86`] is arch/x86/kvm/x86.c (`vcpu_run` / `vcpu_enter_guest`, steal time), [`vmx`] is
//! arch/x86/kvm/vmx (VM exit and entry, INVVPID). The host that schedules vCPU threads is
//! [`crate::host`].
//!
//! **Protocol steps** (shared by both drivers, kernel-model.md §3.3–§3.5): `VcpuPut(v)` is H1+H2
//! (the host preempts the vCPU thread: VM exit, `kvm_sched_out` → `kvm_arch_vcpu_put` →
//! `kvm_steal_time_set_preempted`); the thread then waits in `vcpu_run` ([`VcpuRun`], a frame on
//! the vCPU's host stack) and its next `Step` is H3..H7 (`vcpu_load` raises
//! `KVM_REQ_STEAL_UPDATE`, `record_steal_time` exchanges the byte with 0 and flushes the vCPU's
//! guest TLB if `KVM_VCPU_FLUSH_TLB` was set, then VM entry) — one atomic step, or two with the
//! K2 mutant; `VcpuIoctl(v)` (explorer only) is a `vcpu_load`+`vcpu_put` pair without entering
//! the guest. Host accesses to the steal-time byte go straight to memory: VM exits and the
//! host's locked operations around them (run-queue lock) order them; the guest side goes through
//! the vCPU's store buffer like any guest access.

pub mod kvm_main;
pub mod vmx;
pub mod x86;

use crate::frame::Frame;
pub use x86::{VcpuRun, VcpuRunPc};

/// `KVM_VCPU_PREEMPTED`.
pub const KVM_VCPU_PREEMPTED: u64 = 1 << 0;
/// `KVM_VCPU_FLUSH_TLB`.
pub const KVM_VCPU_FLUSH_TLB: u64 = 1 << 1;

/// Where a vCPU thread is, for the host scheduler.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ThreadState {
    /// Current on its pCPU: running guest code, or host code of `vcpu_run` (its host stack is
    /// not empty).
    Running,
    /// Preempted: runnable, waiting for its pCPU (or picked by the host scheduler, which runs
    /// its `vcpu_run` when the switch is done).
    Runnable,
    /// Blocked in `kvm_vcpu_block` after a HLT exit (timed driver only).
    Blocked,
}

/// One vCPU: `struct kvm_vcpu` as far as the model goes, and its thread.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Vcpu {
    pub vm: u32,
    pub pcpu: u32,
    pub thread: ThreadState,
    /// Host-side kernel frames of the vCPU thread (`vcpu_run` …): the vCPU runs guest code only
    /// while this is empty.
    pub stack: Vec<Frame>,
    /// The host's copy of the steal-time `preempted` byte (`vcpu->arch.st.steal.preempted`,
    /// later `vcpu->arch.st.preempted`): the "already preempted" shadow, and with the K2 mutant
    /// the copy `record_steal_time` works on.
    pub st_preempted: u8,
    /// Preemptions so far (counted only under an explorer bound).
    pub preemptions: u8,
}

impl Vcpu {
    /// Running guest code: current on its pCPU with no host frame.
    pub fn in_guest(&self) -> bool {
        self.thread == ThreadState::Running && self.stack.is_empty()
    }
}

//! arch/x86/kvm/x86.c: the vCPU thread's way back into the guest (`vcpu_run` →
//! `vcpu_enter_guest`) and the host side of the paravirtual TLB flush — the steal-time byte
//! that `kvm_arch_vcpu_put` marks (`kvm_steal_time_set_preempted`) and that `record_steal_time`
//! consumes before entry (docs/design/kernel-model.md §3.3–§3.5; CVE-2019-3016's two halves are mutants K1
//! and K2).
//!
//! With a KVM MMU, `vcpu_run` is the whole loop of docs/design/kernel-model.md §4.2: after an exit,
//! `vcpu->mode = OUTSIDE_GUEST_MODE`, interrupts on (kicks are acknowledged), SRCU read lock,
//! the exit handled (an EPT violation or misconfiguration through the MMU's fault paths, MMIO
//! emulated); then the requests (`KVM_REQ_MMU_RELOAD` before `KVM_REQ_TLB_FLUSH`), a root
//! loaded if there is none, and the entry handshake: interrupts off, `vcpu->mode =
//! IN_GUEST_MODE`, SRCU read unlock with its full barrier, and a last look at the mode and the
//! requests — which pairs with `kvm_make_all_cpus_request()` setting the request before
//! reading the mode.

use crate::counters::Counter;
use crate::frame::{Flow, Frame};
use crate::kvm::kvm_main::mode_name;
use crate::kvm::mmu::fault::{Emulation, MmioPageFault};
use crate::kvm::mmu::page::{MmuLoad, MmuLoadPc, MmuUnload};
use crate::kvm::{mode, Request, ThreadState, KVM_VCPU_FLUSH_TLB, KVM_VCPU_PREEMPTED};
use crate::machine::Machine;
use crate::mem::{line_of, spin_key, Loc};
use crate::options::KvmVersion;
use crate::state::Access;
use shootdown_engine::Env;
use shootdown_hw::ept::Gfn;
use shootdown_hw::tlb::ept_tag;
use shootdown_hw::CpuId;

/// Why a vCPU left the guest.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Exit {
    /// The host preempted the vCPU thread (a host interrupt, then `schedule()`).
    Preempted,
    /// A host IPI: a kick from `kvm_make_all_cpus_request()`.
    Kick,
    /// An EPT violation: no SPTE for `gfn` (or a write to a read-only one, a fetch from a
    /// non-executable one: `present`, the exit qualification's "the translation was present"
    /// bits that `page_fault_can_be_fast()` reads).
    EptViolation {
        gfn: Gfn,
        access: Access,
        present: bool,
    },
    /// An EPT misconfiguration: an MMIO SPTE for `gfn`.
    EptMisconfig { gfn: Gfn },
    /// Shadow paging (EPT off): a #PF for guest-virtual page `vpn` whose guest PTE allows
    /// the access but whose shadow SPTE is missing or read-only (`FNAME(page_fault)`).
    ShadowPageFault { vpn: u64, access: Access },
    /// WRMSR of an MTRR MSR (`host`: not an exit but the VMM's `KVM_SET_MSRS` from the vCPU
    /// thread, e.g. QEMU's reset-state put).
    Wrmsr { msr: u32, value: u64, host: bool },
    /// MOV to CR0 changing CR0.CD to `cd` (KVM intercepts CD through the CR0 guest/host mask).
    Cr0Cd { cd: bool },
    /// A PAUSE loop outlasted its window (`handle_pause`; the yield already ran, see
    /// [`Machine::ple_exit_step`]).
    Pause,
    /// The guest raised an SMI (an OUT to the APM control port that QEMU turns into
    /// `KVM_SMI`): `enter_smm` ([`crate::kvm::smm`]).
    Smi,
    /// RSM in SMM (a #UD intercept, emulated: `em_rsm` → `emulator_leave_smm`).
    Rsm,
}

/// `vcpu_run()` of a vCPU thread that is outside the guest: the host side of its return into
/// the guest. The frame sits on the vCPU's host stack from the moment the thread leaves the
/// guest until the VM entry, which returns from it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct VcpuRun {
    pub pc: VcpuRunPc,
    pub exit: Exit,
}

/// The steps of `vcpu_run()` back into the guest.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum VcpuRunPc {
    /// `vcpu_load` (raises `KVM_REQ_STEAL_UPDATE`), then `vcpu_enter_guest`: `record_steal_time`
    /// and, without a KVM MMU, VM entry — or, with the K2 mutant, only its read of the
    /// steal-time struct.
    Load,
    /// K2 mutant: the rest of `record_steal_time` on the host copy, its write-back, VM entry.
    WriteBack,
    /// Right after a VM exit: `vcpu->mode = OUTSIDE_GUEST_MODE`, `local_irq_enable()`,
    /// `srcu_read_lock()`; then `kvm_x86_ops->handle_exit()` (the fault paths).
    Exited,
    /// Back from the exit handler: emulate the access it gave up on (MMIO, or a write to a
    /// ROM), then the requests.
    Emulate,
    /// `kvm_check_request()` for the pending requests; with none and a root loaded, on to the
    /// entry.
    Requests,
    /// `kvm_mmu_reload()`: no root: load one.
    Reload,
    /// `local_irq_disable()`, `vcpu->mode = IN_GUEST_MODE`, `srcu_read_unlock()` and its full
    /// barrier.
    ModeIn,
    /// The last look at `vcpu->mode` and `vcpu->requests`: back out, or VM entry.
    Recheck,
}

impl VcpuRun {
    /// A vCPU thread that was preempted and will come back through `vcpu_run`.
    pub fn call() -> Frame {
        Frame::VcpuRun(VcpuRun {
            pc: VcpuRunPc::Load,
            exit: Exit::Preempted,
        })
    }

    /// A vCPU that just left the guest for `exit`.
    pub fn exited(exit: Exit) -> Frame {
        Frame::VcpuRun(VcpuRun {
            pc: VcpuRunPc::Exited,
            exit,
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
        let k1 = self.opts.mutants.pv_set_preempted_clobbers_flush();
        if self.host_ref().vcpus[v].st_preempted != 0 && !k1 {
            self.say(|| {
                format!("kvm_steal_time_set_preempted(vcpu{v}): host copy says already preempted, nothing written")
            });
            return;
        }
        if !self.map_steal_time(v, true, env) {
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
        let k2 = self.opts.mutants.pv_record_steal_time_nonatomic();
        match (s.pc, k2) {
            (VcpuRunPc::Load, false) => {
                if !self.map_steal_time(v, false, env) {
                    // record_steal_time() returns: no acknowledgement, no flush.
                    return self.enter_or_continue(v, s, env);
                }
                let loc = Loc::Preempted(v as u32);
                let line = line_of(self, loc);
                self.touch_line(env, v, line, true);
                self.charge(env, |c| c.atomic_rmw);
                let old = self.raw_read(loc);
                self.raw_write(loc, 0);
                env.notify_key(spin_key(loc));
                self.host_mut().vcpus[v].st_preempted = 0;
                let flush = old & KVM_VCPU_FLUSH_TLB != 0;
                // With a modelled MMU the entry comes steps later (the requests, the root).
                let entry = if self.has_kvm_mmu(v) {
                    ""
                } else {
                    "; VM entry"
                };
                self.say(|| {
                    format!(
                        "vcpu_load(vcpu{v}); record_steal_time: xchg(st[{v}].preempted, 0) = {old:#x}{}{entry}",
                        if flush { " ⇒ kvm_vcpu_flush_tlb (INVVPID)" } else { ", no flush" }
                    )
                });
                if flush {
                    self.kvm_vcpu_flush_tlb(v, env);
                }
                self.enter_or_continue(v, s, env)
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
                self.enter_or_continue(v, s, env)
            }
            (VcpuRunPc::Exited, _) if !self.has_kvm_mmu(v) => {
                // A VM without a modelled MMU leaves the guest only for a host IPI here
                // (Shoot4U's, or a kick of a flush request): the exit's interrupt is handled,
                // the requests, then VM entry.
                self.host_mut().vcpus[v].irqs_off = false;
                self.say(|| format!("VM exit (host IPI): handle the interrupt on vcpu{v}'s pCPU"));
                self.ack_kicks(v, env);
                self.kvm_service_flush_requests(v, env);
                self.vm_enter(v);
                Flow::Return
            }
            _ => self.vcpu_enter_guest_step(v, s, env),
        }
    }

    /// After `vcpu_load` and `record_steal_time`: without a KVM MMU, VM entry; with one,
    /// `vcpu_run` retakes SRCU after `cond_resched()` and goes on to the requests.
    fn enter_or_continue<E: Env>(&mut self, v: CpuId, s: &mut VcpuRun, env: &mut E) -> Flow {
        if !self.has_kvm_mmu(v) {
            self.kvm_service_flush_requests(v, env);
            self.vm_enter(v);
            return Flow::Return;
        }
        self.host_mut().vcpus[v].thread = ThreadState::Running;
        self.srcu_read_lock(v, env);
        s.pc = VcpuRunPc::Requests;
        Flow::Next
    }

    /// One step of `vcpu_run()` / `vcpu_enter_guest()` of a vCPU of a VM with a KVM MMU, from a
    /// VM exit to the next VM entry (see the module documentation).
    fn vcpu_enter_guest_step<E: Env>(&mut self, v: CpuId, s: &mut VcpuRun, env: &mut E) -> Flow {
        use VcpuRunPc::*;
        let reqs = Loc::VcpuRequests(v as u32);
        match s.pc {
            Load | WriteBack => unreachable!("handled by vcpu_run_step"),
            Exited => {
                self.store(env, v, Loc::VcpuMode(v as u32), mode::OUTSIDE_GUEST_MODE);
                self.host_mut().vcpus[v].irqs_off = false;
                self.ack_kicks(v, env);
                self.srcu_read_lock(v, env);
                // vmx_handle_exit(): vmx_flush_pml_buffer() first (not for the VMM's
                // KVM_SET_MSRS, which is no exit).
                let drained = if self.opts.pml && !matches!(s.exit, Exit::Wrmsr { host: true, .. })
                {
                    self.vmx_flush_pml_buffer(v, env)
                } else {
                    Vec::new()
                };
                let pml = if drained.is_empty() {
                    String::new()
                } else {
                    let gfns: Vec<String> = drained.iter().map(|g| format!("{g:#x}")).collect();
                    format!(
                        "; vmx_flush_pml_buffer: gfn {} marked dirty",
                        gfns.join(", ")
                    )
                };
                let why = match s.exit {
                    Exit::Preempted => "preemption".to_string(),
                    Exit::Kick => "host IPI".to_string(),
                    Exit::Pause => "PAUSE loop".to_string(),
                    Exit::EptViolation { gfn, access, .. } => {
                        format!("EPT violation ({} gfn {gfn:#x})", access.text())
                    }
                    Exit::EptMisconfig { gfn } => format!("EPT misconfiguration (gfn {gfn:#x})"),
                    Exit::ShadowPageFault { vpn, access } => {
                        format!("#PF ({} page {vpn:#x})", access.text())
                    }
                    Exit::Wrmsr {
                        msr,
                        value,
                        host: false,
                    } => format!("WRMSR {msr:#x} = {value:#x}"),
                    Exit::Wrmsr {
                        msr,
                        value,
                        host: true,
                    } => {
                        format!("none: KVM_SET_MSRS {msr:#x} = {value:#x} from the VMM")
                    }
                    Exit::Cr0Cd { cd } => format!("MOV to CR0, CD={}", cd as u8),
                    Exit::Smi => "OUT to APM_CNT: the VMM raises an SMI (KVM_SMI)".to_string(),
                    Exit::Rsm => "RSM (#UD intercept)".to_string(),
                };
                let handler = match s.exit {
                    Exit::EptViolation { .. } => "; handle_ept_violation",
                    Exit::EptMisconfig { .. } => "; handle_ept_misconfig",
                    Exit::ShadowPageFault { .. } => "; handle_exception_nmi → kvm_mmu_page_fault",
                    Exit::Wrmsr { .. } => "; kvm_set_msr_common",
                    Exit::Cr0Cd { .. } => "; handle_cr → kvm_set_cr0",
                    Exit::Pause => "; handle_pause",
                    Exit::Smi => "; process_smi",
                    Exit::Rsm => "; handle_ud → em_rsm",
                    Exit::Preempted | Exit::Kick => "",
                };
                self.say(|| {
                    format!("VM exit ({why}): mode = OUTSIDE_GUEST_MODE, local_irq_enable, srcu_read_lock{pml}{handler}")
                });
                s.pc = Emulate;
                let handler = match s.exit {
                    // direct_page_fault(): fast_page_fault() first, for a write to a present
                    // SPTE (page_fault_can_be_fast()), then the fault proper.
                    // page_fault_can_be_fast(): any fault while access tracking is on
                    // (no A/D bits: `shadow_acc_track_mask`), else a write to a present SPTE.
                    Exit::EptViolation {
                        gfn,
                        access,
                        present,
                    } if !self.opts.ept_ad || (present && access.is_write()) => {
                        self.fast_page_fault(v, gfn, access, env)
                    }
                    Exit::EptViolation { gfn, access, .. } => {
                        Some(self.slow_page_fault(gfn, access))
                    }
                    Exit::EptMisconfig { gfn } => Some(MmioPageFault::call(gfn)),
                    Exit::ShadowPageFault { vpn, access } => Some(
                        crate::kvm::mmu::paging_tmpl::ShadowPageFault::call(vpn, access),
                    ),
                    Exit::Wrmsr { msr, value, .. } => self.kvm_mtrr_set_msr(v, msr, value, env),
                    Exit::Cr0Cd { cd } => self.kvm_set_cr0_cd(v, cd, env),
                    Exit::Smi => self.kvm_smm_changed(v, true),
                    Exit::Rsm => self.kvm_smm_changed(v, false),
                    Exit::Preempted | Exit::Kick | Exit::Pause => None,
                };
                match handler {
                    Some(f) => Flow::Call(f),
                    None => self.vcpu_enter_guest_step(v, s, env),
                }
            }
            Emulate => {
                s.pc = Requests;
                match self.host_mut().vcpus[v].emulate.take() {
                    Some(Emulation::Mmio { gfn, derived }) => {
                        self.check_mmio_emulation(v, gfn, derived);
                        self.perf.counters.inc(Counter::KvmMmioEmulated);
                        self.charge(env, |c| c.mmio_emulation);
                        self.complete_user_access(v, env);
                        self.say(|| {
                            format!("x86_emulate_instruction: MMIO access to gfn {gfn:#x} (KVM_EXIT_MMIO)")
                        });
                    }
                    Some(Emulation::RomWrite { gfn }) => {
                        self.charge(env, |c| c.mmio_emulation);
                        self.complete_user_access(v, env);
                        self.say(|| format!("emulate the write to ROM gfn {gfn:#x} (dropped)"));
                    }
                    Some(Emulation::RunFailed) => {
                        // The round trip to the VMM and back into KVM_RUN, as an MMIO exit's:
                        // kvm_arch_vcpu_ioctl_run() leaves its SRCU read section on the way
                        // out, and vcpu_run() enters a new one (which sees the memslots
                        // published meanwhile).
                        self.srcu_read_unlock(v, env);
                        self.charge(env, |c| c.mmio_emulation);
                        self.srcu_read_lock(v, env);
                        self.say(|| {
                            "KVM_RUN returns -ENOMEM (srcu_read_unlock); the VMM calls KVM_RUN again (srcu_read_lock)".into()
                        });
                    }
                    // Nothing to emulate: the guest retries its access; on to the requests.
                    None => return self.vcpu_enter_guest_step(v, s, env),
                }
                Flow::Next
            }
            Requests => {
                let r = self.load(env, v, reqs);
                if r & Request::MmuReload.bit() != 0 {
                    self.rmw(env, v, reqs, |x| x & !Request::MmuReload.bit());
                    self.say(|| "kvm_check_request(KVM_REQ_MMU_RELOAD): kvm_mmu_unload".into());
                    return Flow::Call(MmuUnload::call());
                }
                if r & Request::TlbFlushGuest.bit() != 0 {
                    self.rmw(env, v, reqs, |x| x & !Request::TlbFlushGuest.bit());
                    self.say(|| {
                        "kvm_check_request(KVM_REQ_TLB_FLUSH_GUEST): flush the VPID".into()
                    });
                    self.kvm_vcpu_flush_tlb(v, env);
                    return Flow::Next;
                }
                if r & Request::HvTlbFlush.bit() != 0 {
                    self.rmw(env, v, reqs, |x| x & !Request::HvTlbFlush.bit());
                    self.kvm_hv_vcpu_flush_tlb(v, env);
                    return Flow::Next;
                }
                if r & Request::TlbFlush.bit() != 0 {
                    self.rmw(env, v, reqs, |x| x & !Request::TlbFlush.bit());
                    let root = self.host_ref().vcpus[v].root;
                    match (self.opts.kvm, root) {
                        (KvmVersion::Mainline, _) => self.invept_global(v, env),
                        (_, Some(root)) => self.invept_single(v, root, env),
                        // __vmx_flush_tlb(): no root, nothing to flush (the next root load does).
                        (_, None) => {}
                    }
                    let how = match (self.opts.kvm, root) {
                        (KvmVersion::Mainline, _) => "INVEPT all-context".to_string(),
                        (_, Some(r)) => format!("INVEPT single-context (EPT page #{r})"),
                        (_, None) => "no root: nothing to flush".to_string(),
                    };
                    self.say(|| format!("kvm_check_request(KVM_REQ_TLB_FLUSH): {how}"));
                    return Flow::Next;
                }
                if self.host_ref().vcpus[v].root.is_some() {
                    self.summary(|| "no request pending; kvm_mmu_reload: root loaded".into());
                    s.pc = ModeIn;
                } else {
                    self.summary(|| "no request pending".into());
                    s.pc = Reload;
                }
                Flow::Next
            }
            Reload => {
                s.pc = ModeIn;
                self.summary(|| "kvm_mmu_reload: no root: kvm_mmu_load".into());
                Flow::Call(Frame::MmuLoad(MmuLoad {
                    lock: Default::default(),
                    pc: MmuLoadPc::Lock,
                }))
            }
            ModeIn => {
                self.host_mut().vcpus[v].irqs_off = true;
                self.store(env, v, Loc::VcpuMode(v as u32), mode::IN_GUEST_MODE);
                self.srcu_read_unlock(v, env);
                self.say(|| {
                    "local_irq_disable; mode = IN_GUEST_MODE; srcu_read_unlock; smp_mb".into()
                });
                s.pc = Recheck;
                Flow::Next
            }
            Recheck => {
                let m = self.load(env, v, Loc::VcpuMode(v as u32));
                let r = self.load(env, v, reqs);
                if m == mode::EXITING_GUEST_MODE || r != 0 {
                    self.store(env, v, Loc::VcpuMode(v as u32), mode::OUTSIDE_GUEST_MODE);
                    self.host_mut().vcpus[v].irqs_off = false;
                    self.ack_kicks(v, env);
                    self.srcu_read_lock(v, env);
                    self.say(|| {
                        format!("mode {} / requests {r:#x}: cancel the entry (mode = OUTSIDE_GUEST_MODE, local_irq_enable, srcu_read_lock)", mode_name(m))
                    });
                    s.pc = Requests;
                    return Flow::Next;
                }
                let root = self.host_ref().vcpus[v].root.expect("a root before entry");
                let tag = if self.opts.ept {
                    ept_tag(root)
                } else {
                    crate::kvm::mmu::shadow::SHADOW_TLB_TAG
                };
                self.cpus[v].tlb.set_ept_tag(tag);
                self.host_mut().vcpus[v].irqs_off = false;
                if let Some(range) = self.host_mut().vcpus[v].memtype_check.take() {
                    self.check_memtype(Some(v), range);
                }
                let table = if self.opts.ept {
                    "EPTP = EPT page"
                } else {
                    "CR3 = shadow root"
                };
                self.say(|| format!("no request: VM entry ({table} #{root})"));
                self.vm_enter(v);
                Flow::Return
            }
        }
    }

    /// A vCPU leaves the guest for `exit` (a step of guest code ends in a VM exit): the exit
    /// orders its stores, the interruptible work it was doing stops, and the host side runs
    /// `vcpu_run` from `Exited`.
    pub(crate) fn vm_exit_to_kvm<E: Env>(&mut self, v: CpuId, exit: Exit, env: &mut E) {
        self.say(|| match exit {
            Exit::EptViolation { gfn, access, .. } => {
                let why = match access {
                    Access::Fetch => "no executable SPTE",
                    Access::Write => "no writable SPTE",
                    Access::Read => "no SPTE",
                };
                format!("gfn {gfn:#x}: {why}: EPT violation, VM exit")
            }
            Exit::EptMisconfig { gfn } => {
                format!("gfn {gfn:#x}: MMIO SPTE: EPT misconfiguration, VM exit")
            }
            Exit::ShadowPageFault { vpn, access } => {
                format!(
                    "page {vpn:#x}: no shadow translation for the {}: #PF VM exit",
                    access.text()
                )
            }
            Exit::Kick => "VM exit (external interrupt)".into(),
            Exit::Pause => "PAUSE loop: VM exit".into(),
            Exit::Preempted => "VM exit".into(),
            Exit::Wrmsr {
                msr, host: false, ..
            } => format!("WRMSR {msr:#x}: VM exit"),
            Exit::Wrmsr {
                msr, host: true, ..
            } => format!("the VMM sets MSR {msr:#x} (KVM_SET_MSRS)"),
            Exit::Cr0Cd { .. } => "MOV to CR0 (CD): VM exit".into(),
            Exit::Smi => "OUT to APM_CNT (SMI): VM exit".into(),
            Exit::Rsm => "RSM: VM exit (#UD)".into(),
        });
        self.fence(v);
        self.suspend_busy(v, env.now());
        // The VMM's KVM_SET_MSRS runs on the vCPU thread outside KVM_RUN: no VM exit to pay.
        if !matches!(exit, Exit::Wrmsr { host: true, .. }) {
            self.vm_exit(env);
        }
        self.push_host_frame(v, VcpuRun::exited(exit), env);
    }

    /// Would `VcpuIoctl(v)` change anything? (Like a speculative fill, it is only offered when it
    /// would: in the fixed protocol the host copy already says "preempted", so a second put
    /// writes nothing.)
    pub(crate) fn vcpu_ioctl_would_change(&self, v: CpuId) -> bool {
        let h = self.host_ref();
        let k1 = self.opts.mutants.pv_set_preempted_clobbers_flush();
        (h.vcpus[v].st_preempted == 0 || k1) && h.steal_preempted[v] as u64 != KVM_VCPU_PREEMPTED
    }
}

//! The zaps a guest's MTRR write or CR0.CD toggle makes while KVM honours guest memory types
//! (seed 004): the trigger sites — `kvm_mtrr_set_msr()` → `update_mtrr()` (arch/x86/kvm/mtrr.c)
//! and `kvm_set_cr0()` → `kvm_post_set_cr0()` (x86.c) — and the request each makes
//! ([`MtrrZapRequest`]): plain `kvm_zap_gfn_range()` calls, or with patch 9
//! `kvm_mtrr_zap_gfn_range()`, which queues the ranges on the VM's `mtrr_zap_list` and lets one
//! vCPU (the winner of `mtrr_zapping`) drain it while the others spin until it is done.
//!
//! Which changes zap follows [`MtrrZap`] (docs/design/kvm-mmu-seeds.md §2.2): v6.5 zaps on every MTRR write
//! (only `MTRRdefType` while MTRRs are disabled) and, with QEMU's `CD_NW_CLEARED` quirk, never
//! on a CR0.CD toggle; Base2 (patch 6) skips MTRR writes under CR0.CD=1 and zaps on every
//! toggle; patch 10 narrows a toggle's zap to the ranges whose type can change; patch 11 splits
//! each range into its in-memslot pieces. The request is what seed 004 counts ("zap cnt") and
//! times ("zap cycles": from the trigger to the return, waits included).
//!
//! Patch 9 is modelled as posted (v4 09/12, never merged), including the window docs/design/kernel-model.md
//! §5.2 suspects: the drainer finds the list empty and drops the list lock, a loser queues its
//! range, fails the `cmpxchg` on `mtrr_zapping`, then sees the drainer's release of it and
//! returns with its range still queued.
//! Simplifications: the allocation of a list entry never fails; the list lock is a test-and-set
//! spinlock (its waiters are not ordered).

use crate::counters::Counter;
use crate::frame::{Flow, Frame};
use crate::kvm::mmu::tdp_mmu::ZapGfnRange;
use crate::kvm::mtrr::{
    cd_toggle_ranges, kvm_mtrr_valid, split_in_slots, update_mtrr_range, GfnRange, MemType,
    MtrrMsr, GFN_ALL_END,
};
use crate::machine::Machine;
use crate::mem::{spin_key, Loc};
use crate::options::{CdZapRange, MtrrZap};
use shootdown_engine::{Env, Time};
use shootdown_hw::CpuId;

/// A host thread assigns a device without snoop control to the VM
/// (`kvm_arch_register_noncoherent_dma`): the count goes from 0 to 1, so KVM starts honouring
/// the guest's memory types and zaps every leaf made without them
/// (`kvm_noncoherent_dma_assignment_start_or_stop`, patch 5 of seed 004, v6.7; part of Base1).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct NoncoherentDmaStart {
    pub pc: NoncoherentDmaPc,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NoncoherentDmaPc {
    /// `atomic_inc_return(&kvm->arch.noncoherent_dma_count) == 1`, then
    /// `kvm_zap_gfn_range(kvm, 0, ~0)`.
    Start,
    /// Back from the zap: return (the oracle checks every leaf).
    Done,
}

/// A zap request from a trigger site.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct MtrrZapRequest {
    pub pc: MtrrZapPc,
    /// The ranges to zap, in order (one, or patch 10's fine-grained ones, or patch 11's
    /// pieces).
    pub ranges: Vec<GfnRange>,
    /// Patch 9: through `mtrr_zap_list`.
    pub listed: bool,
    /// When the request began (timed driver), for "zap cycles".
    pub began: Time,
    /// The range being zapped by the drain (patch 9).
    pub head: Option<GfnRange>,
}

shootdown_engine::clone_by_fields!(MtrrZapRequest {
    pc,
    ranges,
    listed,
    began,
    head,
});

/// The steps of a zap request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MtrrZapPc {
    /// Without patch 9: `kvm_zap_gfn_range()` of the next range.
    Zap,
    /// Patch 9: `spin_lock(&mtrr_zap_list_lock)`, insert the ranges (an exact duplicate is
    /// dropped), `spin_unlock`.
    Queue,
    /// `kvm_zap_or_wait_mtrr_zap_list()`: `atomic_cmpxchg_acquire(&mtrr_zapping, 0, 1)`.
    Claim,
    /// The drainer: `spin_lock`; pop the head or, with the list empty, `spin_unlock` and
    /// finish.
    Pop,
    /// The drainer: `atomic_set_release(&mtrr_zapping, 0)`.
    Release,
    /// A loser: `while (atomic_read(&mtrr_zapping)) cpu_relax();`.
    Wait,
    /// Account the request and return.
    Done,
}

impl MtrrZapRequest {
    pub fn call(ranges: Vec<GfnRange>, listed: bool, began: Time) -> Frame {
        Frame::MtrrZapRequest(Box::new(MtrrZapRequest {
            pc: if listed {
                MtrrZapPc::Queue
            } else {
                MtrrZapPc::Zap
            },
            ranges,
            listed,
            began,
            head: None,
        }))
    }
}

/// `kvm_mtrr_zap_gfn_range`'s insertion: sorted by length ascending, then start descending;
/// only an exact duplicate (same start and length) is dropped.
fn insert_sorted(list: &mut Vec<GfnRange>, r: GfnRange) {
    let key = |x: &GfnRange| (x.1 - x.0, std::cmp::Reverse(x.0));
    match list.binary_search_by_key(&key(&r), key) {
        Ok(_) => {}
        Err(i) => list.insert(i, r),
    }
}

fn ranges_text(r: &[GfnRange]) -> String {
    let v: Vec<String> = r
        .iter()
        .map(|&(s, e)| {
            if (s, e) == (0, GFN_ALL_END) {
                "[0, ~0)".to_string()
            } else {
                format!("[{s:#x}, {e:#x})")
            }
        })
        .collect();
    v.join(" ")
}

impl Machine {
    /// `kvm_mtrr_set_msr()` by vCPU `v` (a guest WRMSR, or with `host` the VMM's
    /// `KVM_SET_MSRS`), then `update_mtrr()`: the zap request to make, if any. The value was
    /// checked when the workload was built.
    pub(crate) fn kvm_mtrr_set_msr<E: Env>(
        &mut self,
        v: CpuId,
        msr: u32,
        value: u64,
        env: &mut E,
    ) -> Option<Frame> {
        let m = MtrrMsr::decode(msr).expect("the workload checked the MSR");
        debug_assert!(kvm_mtrr_valid(m, value).is_ok());
        self.perf.counters.inc(Counter::KvmMtrrWrites);
        self.charge(env, |c| c.msr_cr_write);
        let vm = self.vm_of(v);
        let vc = &mut self.host_mut().vcpus[v];
        vc.mtrr.set(m, value);
        let (state, cd) = (vc.mtrr, vc.cr0_cd);
        let honors = self.honors_guest_mtrrs(vm);
        // Patch 6 (Base2): the memory type ignores the MTRRs while CR0.CD=1, so do not zap.
        let skip_cd = self.opts.mtrr_zap == MtrrZap::Base2 && cd;
        let range = if honors && !skip_cd {
            update_mtrr_range(&state, m)
        } else {
            None
        };
        self.say(|| {
            let what = match range {
                Some(r) => format!("update_mtrr: zap {}", ranges_text(&[r])),
                None if !honors => "guest MTRRs not honoured: no zap".into(),
                None if skip_cd => "CR0.CD=1: no zap (patch 6)".into(),
                None => "update_mtrr: no zap".into(),
            };
            format!("kvm_mtrr_set_msr({} = {value:#x}): {what}", m.name())
        });
        if let Some(r) = range {
            self.note_memtype_change(v, r);
        }
        range.map(|r| self.zap_request(v, vec![r], env))
    }

    /// Oracle: vCPU `v` changed the memory type of frames `r` and asked for them to be zapped;
    /// INV-MEMTYPE is checked when it next enters the guest.
    fn note_memtype_change(&mut self, v: CpuId, r: GfnRange) {
        let vc = &mut self.host_mut().vcpus[v];
        vc.memtype_check = Some(match vc.memtype_check {
            Some((a, b)) => (a.min(r.0), b.max(r.1)),
            None => r,
        });
    }

    /// `kvm_set_cr0()` by vCPU `v` changing CR0.CD to `cd`, then `kvm_post_set_cr0()`: the
    /// zap request to make, if any.
    pub(crate) fn kvm_set_cr0_cd<E: Env>(
        &mut self,
        v: CpuId,
        cd: bool,
        env: &mut E,
    ) -> Option<Frame> {
        self.charge(env, |c| c.msr_cr_write);
        let vm = self.vm_of(v);
        let vc = &mut self.host_mut().vcpus[v];
        let toggled = vc.cr0_cd != cd;
        vc.cr0_cd = cd;
        let state = vc.mtrr;
        if !toggled {
            self.say(|| format!("kvm_set_cr0(CD={}): unchanged", cd as u8));
            return None;
        }
        self.perf.counters.inc(Counter::KvmCr0CdToggles);
        let zap = self.honors_guest_mtrrs(vm)
            && match self.opts.mtrr_zap {
                MtrrZap::V6_5 => !self.opts.quirk_cd_nw_cleared,
                MtrrZap::Base2 => true,
                MtrrZap::Mainline => false,
            };
        if !zap {
            self.say(|| format!("kvm_post_set_cr0(CD {} -> {}): no zap", !cd as u8, cd as u8));
            return None;
        }
        let ranges = match self.opts.cd_zap_range {
            CdZapRange::All => vec![(0, GFN_ALL_END)],
            CdZapRange::FineGrained => {
                let cd_type = if self.opts.quirk_cd_nw_cleared {
                    MemType::Wb
                } else {
                    MemType::Uc
                };
                cd_toggle_ranges(&state, cd_type)
            }
        };
        self.say(|| {
            format!(
                "kvm_post_set_cr0(CD {} -> {}): zap {}",
                !cd as u8,
                cd as u8,
                ranges_text(&ranges)
            )
        });
        // Patch 10 with nothing to zap still goes through kvm_zap_or_wait_mtrr_zap_list (and
        // is counted at the trigger site like every other request).
        self.note_memtype_change(v, (0, GFN_ALL_END));
        Some(self.zap_request(v, ranges, env))
    }

    /// The request a trigger site makes for `ranges`: counted ("zap cnt"), split into
    /// in-memslot pieces with patch 11, through the list with patch 9.
    fn zap_request<E: Env>(&mut self, v: CpuId, ranges: Vec<GfnRange>, env: &mut E) -> Frame {
        self.perf.counters.inc(Counter::KvmMtrrZapRequests);
        // A zap request is seed 004's workload event (`shootdown profile`: time per request).
        self.count_event(env);
        let vm = self.vm_of(v);
        let ranges = if self.opts.mtrr_zap_split {
            let slots: Vec<(u64, u64)> = self
                .kvm(vm)
                .address_spaces
                .iter()
                .flat_map(|a| a.active_set().slots.iter().map(|s| (s.base_gfn, s.end())))
                .collect();
            ranges
                .into_iter()
                .flat_map(|r| split_in_slots(r, slots.iter().copied()))
                .collect()
        } else {
            ranges
        };
        MtrrZapRequest::call(ranges, self.opts.mtrr_zap_list, env.now())
    }

    /// One step of a zap request by vCPU `v`.
    pub(crate) fn mtrr_zap_request_step<E: Env>(
        &mut self,
        v: CpuId,
        s: &mut MtrrZapRequest,
        env: &mut E,
    ) -> Flow {
        use MtrrZapPc::*;
        let vm = self.vm_of(v) as u32;
        match s.pc {
            Zap => {
                if s.ranges.is_empty() {
                    s.pc = Done;
                    self.say(|| "every range zapped".into());
                    return Flow::Next;
                }
                let (a, b) = s.ranges.remove(0);
                let t = ranges_text(&[(a, b)]);
                self.say(|| format!("kvm_zap_gfn_range {t}"));
                Flow::Call(ZapGfnRange::call(a, b))
            }
            Queue => {
                let lock = Loc::MtrrZapListLock(vm);
                if self.rmw(env, v, lock, |_| 1) != 0 {
                    return Flow::Spin(spin_key(lock));
                }
                let list = &mut self.kvm_mut(vm as usize).mtrr_zap_list;
                for &r in &s.ranges {
                    insert_sorted(list, r);
                }
                let n = list.len();
                self.store(env, v, lock, 0);
                let text = ranges_text(&s.ranges);
                self.say(|| format!("kvm_mtrr_zap_gfn_range: queue {text} ({n} on the list)"));
                s.pc = Claim;
                Flow::Next
            }
            Claim => {
                let old = self.rmw(env, v, Loc::MtrrZapping(vm), |z| if z == 0 { 1 } else { z });
                if old == 0 {
                    self.say(|| "cmpxchg_acquire(mtrr_zapping, 0, 1): won: drain the list".into());
                    s.pc = Pop;
                } else {
                    self.say(|| "cmpxchg_acquire(mtrr_zapping, 0, 1) failed: wait".into());
                    s.pc = Wait;
                }
                Flow::Next
            }
            Pop => {
                let lock = Loc::MtrrZapListLock(vm);
                if self.rmw(env, v, lock, |_| 1) != 0 {
                    return Flow::Spin(spin_key(lock));
                }
                let list = &mut self.kvm_mut(vm as usize).mtrr_zap_list;
                let head = (!list.is_empty()).then(|| list.remove(0));
                self.store(env, v, lock, 0);
                match head {
                    Some((a, b)) => {
                        let t = ranges_text(&[(a, b)]);
                        self.say(|| format!("pop {t}; spin_unlock; kvm_zap_gfn_range"));
                        s.head = Some((a, b));
                        Flow::Call(ZapGfnRange::call(a, b))
                    }
                    None => {
                        self.say(|| "the list is empty: spin_unlock".into());
                        s.head = None;
                        s.pc = Release;
                        Flow::Next
                    }
                }
            }
            Release => {
                self.store(env, v, Loc::MtrrZapping(vm), 0);
                self.say(|| "atomic_set_release(mtrr_zapping, 0)".into());
                s.pc = Done;
                Flow::Next
            }
            Wait => {
                let loc = Loc::MtrrZapping(vm);
                if self.load(env, v, loc) != 0 {
                    return Flow::Spin(spin_key(loc));
                }
                self.say(|| "mtrr_zapping is 0: return".into());
                s.pc = Done;
                Flow::Next
            }
            Done => {
                self.say(|| "the request returns".into());
                if env.timed() {
                    let ns = env.now().saturating_sub(s.began).0 / 1000;
                    self.perf.counters.add(Counter::KvmMtrrZapNs, ns);
                }
                Flow::Return
            }
        }
    }

    /// One step of a non-coherent device's assignment by host thread `a`.
    pub(crate) fn noncoherent_dma_step<E: Env>(
        &mut self,
        a: usize,
        s: &mut NoncoherentDmaStart,
        env: &mut E,
    ) -> Flow {
        let vm = self.vm_of(a) as u32;
        match s.pc {
            NoncoherentDmaPc::Start => {
                self.rmw(env, a, Loc::NoncoherentDma(vm), |_| 1);
                self.say(|| {
                    "kvm_arch_register_noncoherent_dma: count 0 -> 1: kvm_zap_gfn_range(0, ~0)"
                        .into()
                });
                s.pc = NoncoherentDmaPc::Done;
                Flow::Call(ZapGfnRange::call(0, GFN_ALL_END))
            }
            NoncoherentDmaPc::Done => {
                self.check_memtype(None, (0, GFN_ALL_END));
                Flow::Return
            }
        }
    }

    /// Would the request's next step only wait?
    pub(crate) fn mtrr_zap_request_waits(&self, v: CpuId, s: &MtrrZapRequest) -> bool {
        let vm = self.vm_of(v) as u32;
        let see = |loc: Loc| self.value_seen_by(v, loc);
        match s.pc {
            MtrrZapPc::Queue | MtrrZapPc::Pop => see(Loc::MtrrZapListLock(vm)) != 0,
            MtrrZapPc::Wait => see(Loc::MtrrZapping(vm)) != 0,
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_list_keeps_length_then_start_order_and_drops_exact_duplicates() {
        let mut l = Vec::new();
        for r in [
            (0, GFN_ALL_END),
            (0x100, 0x200),
            (0, 0x100),
            (0x100, 0x200),
            (0, 0x80),
        ] {
            insert_sorted(&mut l, r);
        }
        assert_eq!(
            l,
            vec![(0, 0x80), (0x100, 0x200), (0, 0x100), (0, GFN_ALL_END)]
        );
    }
}

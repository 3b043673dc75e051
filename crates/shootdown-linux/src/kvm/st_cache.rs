//! The host's cached mapping of a vCPU's steal-time area (`vcpu->arch.st.cache`), as
//! `record_steal_time()` and `kvm_steal_time_set_preempted()` (arch/x86/kvm/x86.c) use it, in
//! the form `steal_time_map` selects:
//!
//! * `v5_6` (917248144db5, "x86/kvm: Cache gfn to pfn translation", v5.6–v5.15): a
//!   `gfn_to_pfn_cache` through `kvm_map_gfn()` (virt/kvm/kvm_main.c). The cached pfn is
//!   refreshed only when the gfn or the memslot generation changes; in atomic context
//!   (`kvm_steal_time_set_preempted`, from the preempt notifier) a stale cache is not refreshed
//!   (`-EAGAIN`: nothing is written). Nothing invalidates it when an MMU notifier invalidates
//!   the page, so the host may go on writing a page it has freed — fixed by 7e2175ebd695
//!   ("KVM: x86: Fix recording of guest steal time / preempted status", v5.16).
//! * `mainline` (7e2175ebd695): a `gfn_to_hva_cache` (`kvm_gfn_to_hva_cache_init`, re-made when
//!   `slots->generation` moved), accessed as the VMM's user memory (`user_access_begin`,
//!   `unsafe_put_user`): every access translates through the host's page tables, so an
//!   invalidated page is faulted in again, never written behind the host's back; a deleted
//!   slot makes the re-init fail and nothing is written.
//!
//! The oracle (`INV-PFNCACHE`) checks every access through the cache: not through a pfn cached
//! before an MMU-notifier invalidation of the page (that began after the fill) returned, and
//! not through a mapping of a memslot whose deletion has returned (the VMM may have unmapped
//! its memory). Simplified: the area is the vCPU's one page at `st_gfn`, always in address
//! space 0 (`kvm_memslots`, whatever the vCPU's mode); the K2 mutant's two accesses use the
//! cache once each; an invalidation that begins before a fill and returns after it is not
//! judged.

use crate::counters::Counter;
use crate::machine::Machine;
use crate::options::StealTimeMap;
use shootdown_engine::{Env, Violation};
use shootdown_hw::ept::Gfn;
use shootdown_hw::CpuId;

/// A cached translation of the steal-time gfn: to a host pfn (`gfn_to_pfn_cache`) or to the
/// VMM's address for it (`gfn_to_hva_cache`; the model keeps the pfn the address maps now).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GuestCache {
    pub gfn: Gfn,
    pub pfn: u64,
    /// `cache->generation`: the memslot generation at the fill.
    pub generation: u64,
    /// Oracle: the epoch of the fill.
    pub filled: u64,
}

impl Machine {
    /// Map vCPU `v`'s steal-time area for one host access, as the kernel's version does
    /// (`kvm_map_gfn` / the hva cache check); `atomic` from the preempt notifier. Returns
    /// whether the access happens (false: the kernel returns without touching the area).
    pub(crate) fn map_steal_time<E: Env>(&mut self, v: CpuId, atomic: bool, env: &mut E) -> bool {
        if !self.has_kvm_mmu(v) {
            return true;
        }
        let Some(gfn) = self.host_ref().vcpus[v].st_gfn else {
            return true;
        };
        let vm = self.vm_of(v);
        let gen = self.load_memslots_gen(v, 0, env);
        let cached = self.host_ref().vcpus[v].st_cache;
        let fresh = cached.filter(|c| {
            c.gfn == gfn
                && (c.generation == gen || self.opts.mutants.steal_time_cache_ignores_generation())
        });
        let v5_6 = self.opts.steal_time_map == StealTimeMap::V5_6;
        let c = match fresh {
            Some(c) => c,
            None if v5_6 && atomic => {
                self.say(|| {
                    format!("kvm_map_gfn(st of vcpu{v}): cache stale in atomic context: -EAGAIN")
                });
                return false;
            }
            None => {
                let slots = self.kvm(vm).address_spaces[0].active_set();
                let Some(sl) = slots.lookup(gfn) else {
                    self.host_mut().vcpus[v].st_cache = None;
                    self.say(|| format!("steal-time gfn {gfn:#x} of vcpu{v}: no memslot: return"));
                    return false;
                };
                let c = GuestCache {
                    gfn,
                    pfn: sl.pfn_of(gfn),
                    generation: gen,
                    filled: self.oracle.now(),
                };
                self.host_mut().vcpus[v].st_cache = Some(c);
                self.perf.counters.inc(Counter::KvmStealTimeCacheFills);
                let how = if v5_6 {
                    "kvm_cache_gfn_to_pfn"
                } else {
                    "kvm_gfn_to_hva_cache_init"
                };
                self.say(|| format!("{how}(st of vcpu{v}): gfn {gfn:#x} -> pfn {:#x}", c.pfn));
                c
            }
        };
        self.check_steal_time_access(v, &c, v5_6);
        true
    }

    /// Oracle `INV-PFNCACHE`: the host accesses vCPU `v`'s steal-time area through `c`.
    fn check_steal_time_access(&mut self, v: CpuId, c: &GuestCache, through_pfn: bool) {
        let vm = self.vm_of(v);
        let k = self.kvm(vm);
        let freed = k
            .freed_slots
            .iter()
            .find(|(a, sl)| *a == 0 && sl.maps(c.gfn, c.pfn))
            .map(|(_, sl)| sl.id);
        let detail = if let Some(id) = freed {
            format!(
                "the host accessed vcpu{v}'s steal-time area (gfn {:#x}) through its mapping of memslot {id}, whose deletion has returned",
                c.gfn
            )
        } else if through_pfn && self.oracle.gfn_invalidated_after(vm, c.gfn, c.filled) {
            format!(
                "the host accessed vcpu{v}'s steal-time area (gfn {:#x}) through pfn {:#x}, cached before an MMU-notifier invalidation of the page that has returned",
                c.gfn, c.pfn
            )
        } else {
            return;
        };
        self.violate(Violation {
            invariant: "INV-PFNCACHE",
            detail,
        });
    }
}

//! `fast_page_fault()` (arch/x86/kvm/mmu/mmu.c, v3.10+; the TDP MMU's walk from v5.13): a
//! write to a present leaf SPTE whose W bit dirty logging cleared, or any access to an SPTE
//! aging made access-tracked (no A/D bits, `access_track.rs`), is fixed without `mmu_lock`.
//! The walk is lockless (`walk_shadow_page_lockless_begin`: the legacy MMU turns interrupts
//! off and sets `vcpu->mode = READING_SHADOW_PAGE_TABLES`, so that `kvm_flush_remote_tlbs()`
//! waits before shadow pages are freed; the TDP MMU holds `rcu_read_lock()`), and the fix is
//! a `cmpxchg64` on the SPTE (`fast_pf_fix_direct_spte`), which fails if anything — a zap, a
//! write-protect, another vCPU's fix — changed it since the walk read it; the fault then walks
//! again, at most four more times, before it falls back to the slow path. Once the SPTE is
//! writable the page is marked dirty (`mark_page_dirty_in_slot`), after the `cmpxchg`: another
//! vCPU can write through the SPTE before the bit is set, and dirty logging must not lose it
//! (`INV-DIRTYLOG`, `dirty_log.rs`).
//!
//! `page_fault_can_be_fast()`: any fault while access tracking is on (`ept_ad` off), else a
//! write to a present translation (the exit's qualification). An access-tracked SPTE is
//! restored (`restore_acc_track_spte`: R and X back) and, for a write to an MMU-writable one,
//! made writable; the page is marked only when the fix set W.
//!
//! Simplified: a huge SPTE is left to the slow path only in a slot that logs dirty pages (the
//! condition of later kernels; v5.15 left any huge SPTE's W to it, and its slow path then
//! replaced the leaf with `cmpxchg`, which the model's slow path does not do: it retries on a
//! present leaf); the walk and the lockless section's begin are one step with the exit's
//! handling, and a fault whose SPTE cannot be fixed goes straight to the slow path in that
//! step (the kernel's begin/end round trip changes nothing another CPU sees).

use crate::counters::Counter;
use crate::frame::{Flow, Frame};
use crate::kvm::mmu::access_track::restore_acc_track_spte;
use crate::kvm::mmu::fault::TdpPageFault;
use crate::kvm::mmu::tdp_mmu::TdpMmuPageFault;
use crate::kvm::mode;
use crate::machine::Machine;
use crate::mem::Loc;
use crate::state::Access;
use shootdown_engine::{Env, Violation};
use shootdown_hw::ept::{EptWalk, Gfn, SpId, SpteKind, EPT_ROOT_LEVEL};
use shootdown_hw::CpuId;

/// How many times `fast_page_fault()` walks again after a failed `cmpxchg` before it gives up
/// (`if (++retry_count > 4) break;`).
const FAST_PF_RETRIES: u8 = 4;

/// What the lockless walk says when it finds no leaf.
const NO_LEAF: &str = "no present leaf SPTE";

/// `fast_page_fault()` of vCPU `v`, inside its lockless section, with a fixable SPTE.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct FastPageFault {
    pub pc: FastPageFaultPc,
    pub gfn: Gfn,
    pub access: Access,
    /// The leaf the walk found, its value then (what the `cmpxchg` expects) and the value the
    /// fix writes.
    pub sp: SpId,
    pub idx: u16,
    pub old: SpteKind,
    pub new: SpteKind,
    /// Oracle: the epoch at which the walk read it.
    pub walked: u64,
    /// Failed `cmpxchg`es so far.
    pub retries: u8,
}

/// The steps of `fast_page_fault()` after its first walk.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FastPageFaultPc {
    /// `fast_pf_fix_direct_spte()`: `cmpxchg64(sptep, old_spte, old_spte | PT_WRITABLE_MASK)`;
    /// on failure, the walk again.
    Fix,
    /// `mark_page_dirty_in_slot()`; `walk_shadow_page_lockless_end()`; `RET_PF_FIXED`.
    MarkDirty,
    /// `RET_PF_INVALID`: the slow path (`direct_page_fault` goes on).
    Slow,
    /// Back from the slow path: return.
    Done,
}

/// What the lockless walk found (`fast_pf_get_last_sptep` /
/// `kvm_tdp_mmu_fast_pf_get_last_sptep`, then the checks of `fast_page_fault`'s loop).
enum FastWalk {
    /// `is_access_allowed()`: someone fixed it already (`RET_PF_SPURIOUS`).
    Spurious,
    /// A leaf the fast path can fix: access-tracked (restored), or write-protected and
    /// MMU-writable (`spte_can_locklessly_be_made_writable()`: W set); `new` is what the
    /// `cmpxchg` writes.
    Fixable {
        sp: SpId,
        idx: u16,
        old: SpteKind,
        new: SpteKind,
    },
    /// Not present, not a leaf, a huge leaf of a logged slot to make writable, or not
    /// MMU-writable (`RET_PF_INVALID`).
    Invalid(&'static str),
}

/// What the walk found, for the step's text.
fn fixable_text(old: SpteKind) -> &'static str {
    match old {
        SpteKind::Leaf {
            access_tracked: true,
            ..
        } => "an access-tracked SPTE",
        _ => "a write-protected, MMU-writable SPTE",
    }
}

/// Does the fix set W (`is_writable_pte(new) && !is_writable_pte(old)`)?
fn made_writable(old: SpteKind, new: SpteKind) -> bool {
    matches!(
        (old, new),
        (
            SpteKind::Leaf {
                writable: false,
                ..
            },
            SpteKind::Leaf { writable: true, .. }
        )
    )
}

/// What the fix does, for the step's text.
fn fix_verb(old: SpteKind, new: SpteKind) -> &'static str {
    let tracked = matches!(
        old,
        SpteKind::Leaf {
            access_tracked: true,
            ..
        }
    );
    let w = made_writable(old, new);
    match (tracked, w) {
        (true, true) => "restores R/X and sets W",
        (true, false) => "restores R/X",
        _ => "sets W",
    }
}

impl Machine {
    /// The fault path for vCPU `v`'s EPT violation: the TDP MMU's or the legacy MMU's.
    pub(crate) fn slow_page_fault(&self, gfn: Gfn, access: Access) -> Frame {
        if self.opts.tdp_mmu {
            TdpMmuPageFault::call(gfn, access)
        } else {
            TdpPageFault::call(gfn, access)
        }
    }

    /// `fast_page_fault()` on vCPU `v`'s EPT violation of `gfn` (`page_fault_can_be_fast()`:
    /// a write to a present translation, or any with access tracking on), as the exit is
    /// handled: the lockless walk; the frame that fixes the SPTE, or the slow path, or nothing
    /// (`RET_PF_SPURIOUS`: the guest retries its access).
    pub(crate) fn fast_page_fault<E: Env>(
        &mut self,
        v: CpuId,
        gfn: Gfn,
        access: Access,
        env: &mut E,
    ) -> Option<Frame> {
        let walk = self.fast_pf_walk(v, gfn, access);
        if !matches!(walk, FastWalk::Invalid(_)) {
            // The exit's handling (the slow path's first step counts its own).
            self.perf.counters.inc(Counter::KvmEptViolations);
            self.charge(env, |c| c.ept_violation);
        }
        match walk {
            FastWalk::Spurious => {
                self.say(|| {
                    format!("fast_page_fault(gfn {gfn:#x}): access allowed now: RET_PF_SPURIOUS")
                });
                None
            }
            FastWalk::Invalid(why) => {
                // (A walk that found nothing, as most faults' with access tracking on, says
                // nothing: the slow path tells the story.)
                if why != NO_LEAF {
                    self.say(|| format!("fast_page_fault(gfn {gfn:#x}): {why}: RET_PF_INVALID"));
                }
                Some(self.slow_page_fault(gfn, access))
            }
            FastWalk::Fixable { sp, idx, old, new } => {
                self.walk_shadow_page_lockless_begin(v, env);
                let what = fixable_text(old);
                self.say(|| {
                    format!("fast_page_fault(gfn {gfn:#x}): walk_shadow_page_lockless_begin; {what} (EPT page #{sp} entry {idx})")
                });
                Some(Frame::FastPageFault(Box::new(FastPageFault {
                    pc: FastPageFaultPc::Fix,
                    gfn,
                    access,
                    sp,
                    idx,
                    old,
                    new,
                    walked: self.oracle.now(),
                    retries: 0,
                })))
            }
        }
    }

    /// One step of `fast_page_fault()` on vCPU `v`.
    pub(crate) fn fast_page_fault_step<E: Env>(
        &mut self,
        v: CpuId,
        s: &mut FastPageFault,
        env: &mut E,
    ) -> Flow {
        use FastPageFaultPc::*;
        let gfn = s.gfn;
        match s.pc {
            Fix => {
                // cmpxchg64 is a locked instruction: the store buffer drains first.
                self.fence(v);
                let (sp, idx) = (s.sp, s.idx);
                let now = self.fast_pf_current(v, sp, idx);
                let plain = now != Some(s.old) && self.opts.mutants.fast_pf_plain_store();
                if now == Some(s.old) || plain {
                    let new = s.new;
                    if matches!(
                        s.old,
                        SpteKind::Leaf {
                            access_tracked: true,
                            ..
                        }
                    ) {
                        self.perf.counters.inc(Counter::KvmAccessTrackRestored);
                    }
                    if plain {
                        // The stale value may map another frame now (zapped and faulted
                        // again since the walk): a full write, not an attribute change.
                        let vm = self.vm_of(v);
                        self.set_spte(vm, sp, idx, new);
                    } else {
                        self.set_spte_attrs(sp, idx, new);
                    }
                    self.check_fast_pf_install(v, s);
                    self.perf.counters.inc(Counter::KvmFastPfFixed);
                    self.charge(env, |c| c.spte_install);
                    s.pc = MarkDirty;
                    self.say(|| {
                        if plain {
                            format!("fast_pf_fix_direct_spte: store the fixed SPTE to EPT page #{sp} entry {idx} (a plain store over what changed since the walk)")
                        } else {
                            format!("fast_pf_fix_direct_spte: cmpxchg64 {} in EPT page #{sp} entry {idx}", fix_verb(s.old, s.new))
                        }
                    });
                    return Flow::Next;
                }
                s.retries += 1;
                if s.retries > FAST_PF_RETRIES {
                    self.walk_shadow_page_lockless_end(v, env);
                    s.pc = Slow;
                    self.say(|| "fast_pf_fix_direct_spte: cmpxchg64 failed a fifth time: walk_shadow_page_lockless_end; RET_PF_INVALID".into());
                    return Flow::Next;
                }
                match self.fast_pf_walk(v, gfn, s.access) {
                    FastWalk::Fixable { sp, idx, old, new } => {
                        (s.sp, s.idx, s.old, s.new) = (sp, idx, old, new);
                        s.walked = self.oracle.now();
                        self.say(|| {
                            format!("fast_pf_fix_direct_spte: cmpxchg64 failed (the SPTE changed): walk again: EPT page #{sp} entry {idx}")
                        });
                        Flow::Next
                    }
                    FastWalk::Spurious => {
                        self.walk_shadow_page_lockless_end(v, env);
                        self.say(|| "fast_pf_fix_direct_spte: cmpxchg64 failed; the walk again: access allowed: walk_shadow_page_lockless_end; RET_PF_SPURIOUS".into());
                        Flow::Return
                    }
                    FastWalk::Invalid(why) => {
                        self.walk_shadow_page_lockless_end(v, env);
                        s.pc = Slow;
                        self.say(|| {
                            format!("fast_pf_fix_direct_spte: cmpxchg64 failed; the walk again: {why}: walk_shadow_page_lockless_end; RET_PF_INVALID")
                        });
                        Flow::Next
                    }
                }
            }
            MarkDirty => {
                // fast_pf_fix_direct_spte(): the page is marked only if the fix made the SPTE
                // writable (a read's restore of an access-tracked SPTE marks nothing).
                let as_id = self.vcpu_as_id(v);
                let w = made_writable(s.old, s.new);
                let marked = w && self.kvm_vcpu_mark_page_dirty(v, as_id, gfn, env);
                self.walk_shadow_page_lockless_end(v, env);
                self.say(|| {
                    format!(
                        "{}; walk_shadow_page_lockless_end; RET_PF_FIXED",
                        if marked {
                            format!("kvm_vcpu_mark_page_dirty(gfn {gfn:#x})")
                        } else if !w {
                            format!("gfn {gfn:#x}: restored, not made writable: no dirty mark")
                        } else {
                            format!("gfn {gfn:#x}: its memslot logs no dirty pages")
                        }
                    )
                });
                Flow::Return
            }
            Slow => {
                s.pc = Done;
                Flow::Call(self.slow_page_fault(gfn, s.access))
            }
            Done => Flow::Return,
        }
    }

    /// Oracle, as the fix writes the SPTE: a translation made from a walk older than an
    /// MMU-notifier invalidation of the gfn that has returned maps a page the host may have
    /// freed (`INV-STALE`). (The `cmpxchg` fails when the invalidation zapped the SPTE.)
    fn check_fast_pf_install(&mut self, v: CpuId, s: &FastPageFault) {
        let vm = self.vm_of(v);
        if self.oracle.gfn_invalidated_after(vm, s.gfn, s.walked) {
            self.violate(Violation {
                invariant: "INV-STALE",
                detail: format!(
                    "vcpu{v}'s fast_page_fault made gfn {:#x} writable from a walk older than an MMU-notifier invalidation that has returned: the SPTE maps a page the host may have freed",
                    s.gfn
                ),
            });
        }
    }

    /// Is vCPU `v` between its fast fix of `gfn`'s SPTE and the dirty mark it then makes?
    pub(crate) fn fast_pf_marks_pending(&self, v: CpuId, gfn: Gfn) -> bool {
        self.host_ref().vcpus[v].stack.iter().any(|f| {
            matches!(f, Frame::FastPageFault(s) if s.pc == FastPageFaultPc::MarkDirty
                && s.gfn == gfn
                && made_writable(s.old, s.new))
        })
    }

    /// The lockless walk of `gfn` from vCPU `v`'s root and the loop's checks.
    fn fast_pf_walk(&self, v: CpuId, gfn: Gfn, access: Access) -> FastWalk {
        let Some(root) = self.host_ref().vcpus[v].root else {
            return FastWalk::Invalid("no root");
        };
        let EptWalk::Leaf {
            sp,
            idx,
            level,
            spte,
        } = self.ept.walk_from(root, gfn)
        else {
            return FastWalk::Invalid(NO_LEAF);
        };
        let SpteKind::Leaf {
            writable,
            mmu_writable,
            exec,
            access_tracked,
            ..
        } = spte.kind
        else {
            unreachable!("a leaf walk ends at a leaf")
        };
        if !access_tracked && access.allowed_by(writable, exec) {
            return FastWalk::Spurious;
        }
        // restore_acc_track_spte(), then W for a write to an MMU-writable SPTE.
        let mut new = restore_acc_track_spte(spte.kind);
        if access.is_write() && !writable && mmu_writable {
            // A huge SPTE must be split for dirty logging: the slow path does it.
            if level > 1 && self.logs_dirty(v, gfn) {
                return FastWalk::Invalid("a huge SPTE of a logged slot");
            }
            new = new.with_writable(true);
        }
        let SpteKind::Leaf { writable: w, .. } = new else {
            unreachable!()
        };
        if new == spte.kind || !access.allowed_by(w, exec) {
            return FastWalk::Invalid("not a write-protected, MMU-writable SPTE");
        }
        FastWalk::Fixable {
            sp,
            idx,
            old: spte.kind,
            new,
        }
    }

    /// The SPTE the `cmpxchg` compares with: `None` where the kernel's would fail whatever the
    /// value — a TDP MMU table that a zap removed (`handle_removed_pt()` froze each of its
    /// entries; RCU keeps the page until the walk ends). The legacy MMU must not free a page
    /// under a lockless walker (`kvm_flush_remote_tlbs()` waits for it): if one is freed,
    /// that is `INV-PTFREE`.
    fn fast_pf_current(&mut self, v: CpuId, sp: SpId, idx: u16) -> Option<SpteKind> {
        let page = self.ept.page(sp);
        let unlinked = !page.alive || (page.parent.is_none() && page.level < EPT_ROOT_LEVEL);
        if !unlinked {
            return Some(self.ept.spte(sp, idx).kind);
        }
        if !self.opts.tdp_mmu && !page.alive {
            self.violate(Violation {
                invariant: "INV-PTFREE",
                detail: format!(
                    "vcpu{v}'s fast_page_fault cmpxchg64 on freed shadow page #{sp}, inside its lockless walk"
                ),
            });
        }
        None
    }

    /// `walk_shadow_page_lockless_begin()`: the TDP MMU's `rcu_read_lock()`; the legacy MMU's
    /// `local_irq_disable()` and `smp_store_mb(vcpu->mode, READING_SHADOW_PAGE_TABLES)`.
    fn walk_shadow_page_lockless_begin<E: Env>(&mut self, v: CpuId, env: &mut E) {
        if self.opts.tdp_mmu {
            self.tdp_rcu_read_lock(v);
        } else {
            self.host_mut().vcpus[v].irqs_off = true;
            self.rmw(env, v, Loc::VcpuMode(v as u32), |_| {
                mode::READING_SHADOW_PAGE_TABLES
            });
        }
    }

    /// `walk_shadow_page_lockless_end()`: `rcu_read_unlock()`, or
    /// `smp_store_release(&vcpu->mode, OUTSIDE_GUEST_MODE)` and `local_irq_enable()`.
    fn walk_shadow_page_lockless_end<E: Env>(&mut self, v: CpuId, env: &mut E) {
        if self.opts.tdp_mmu {
            self.tdp_rcu_read_unlock(v, env);
        } else {
            self.store(env, v, Loc::VcpuMode(v as u32), mode::OUTSIDE_GUEST_MODE);
            self.host_mut().vcpus[v].irqs_off = false;
        }
    }
}

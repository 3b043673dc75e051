//! Memslots (include/linux/kvm_host.h, virt/kvm/kvm_main.c): which guest frames are RAM backed
//! by host memory, per address space, published to SRCU readers with a generation number.
//!
//! Each address space keeps two memslot sets and publishes one of them (`kvm->memslots[as]`,
//! the location `Loc::Memslots`): an update fills the inactive set while readers may still use
//! the active one, publishes it, waits for the readers (`synchronize_srcu_expedited`), and only
//! then may reuse the old one. Mainline keeps two sets the same way; v5.x copied the array for
//! every update, which readers cannot tell apart.
//!
//! The generation (`slots->generation`, the location `Loc::SlotsGen`) marks an update in
//! progress and is what MMIO SPTEs and the per-vCPU MMIO cache are validated against
//! (docs/design/kernel-model.md §4.3–§4.4): v5.0 makes it odd (+1, then +3 when done), v5.1 and later set
//! bit 63 (then `+ KVM_ADDRESS_SPACE_NUM` when done).

use shootdown_hw::ept::Gfn;

/// `KVM_MEMSLOT_GEN_UPDATE_IN_PROGRESS` (v5.1+).
pub const GEN_UPDATE_IN_PROGRESS: u64 = 1 << 63;
/// `KVM_ADDRESS_SPACE_NUM` on x86 (normal + SMM): generations advance by this much per update
/// whether or not the VM uses SMM.
pub const KVM_ADDRESS_SPACE_NUM: u64 = 2;

/// `struct kvm_memory_slot`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Memslot {
    pub id: u16,
    pub base_gfn: Gfn,
    pub npages: u64,
    /// `KVM_MEM_READONLY` (a ROM: writes exit to the VMM).
    pub readonly: bool,
    /// `KVM_MEMSLOT_INVALID`: being deleted or moved; lookups treat it as absent.
    pub invalid: bool,
    /// The host backs the slot with huge pages (THP or hugetlbfs), so the fault path may map
    /// 2 MiB regions the slot covers whole with one 2 MiB SPTE (`transparent_hugepage_adjust`).
    pub huge: bool,
    /// Host frame of `base_gfn` (the slot's `userspace_addr`, as a host-physical frame).
    pub pfn: u64,
    /// `KVM_MEM_LOG_DIRTY_PAGES`: the slot has a dirty bitmap (`dirty_log.rs`) and is mapped
    /// with 4 KiB SPTEs only.
    pub dirty_log: bool,
}

impl Memslot {
    pub fn contains(&self, gfn: Gfn) -> bool {
        gfn >= self.base_gfn && gfn < self.base_gfn + self.npages
    }
    pub fn end(&self) -> Gfn {
        self.base_gfn + self.npages
    }
    /// The host frame behind `gfn` (in the slot): `__gfn_to_pfn_memslot`'s answer.
    pub fn pfn_of(&self, gfn: Gfn) -> u64 {
        self.pfn + (gfn - self.base_gfn)
    }
    /// Does the slot put host frame `pfn` behind `gfn`?
    pub fn maps(&self, gfn: Gfn, pfn: u64) -> bool {
        self.contains(gfn) && self.pfn_of(gfn) == pfn
    }
}

/// `struct kvm_memslots`: one set of memslots of an address space.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct MemslotSet {
    pub slots: Vec<Memslot>,
    /// `slots->generation` (the location `Loc::SlotsGen`).
    pub generation: u64,
    /// Oracle: which update built this set (0 = the initial one).
    pub version: u64,
}

impl MemslotSet {
    /// `__gfn_to_memslot` as the fault path uses it (`__gfn_to_hva_many`): the slot covering
    /// `gfn`, unless it is being deleted.
    pub fn lookup(&self, gfn: Gfn) -> Option<&Memslot> {
        self.slots.iter().find(|s| s.contains(gfn) && !s.invalid)
    }
}

/// The memslots of one address space.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct AddressSpace {
    /// The two sets; `active` says which one `kvm->memslots[as]` points to (`Loc::Memslots`).
    pub sets: [MemslotSet; 2],
    pub active: u8,
}

impl AddressSpace {
    /// An address space whose initial generation is `as_id` (v5.1+: `slots->generation = i`).
    pub fn new(as_id: u64, slots: Vec<Memslot>) -> AddressSpace {
        let set = MemslotSet {
            slots,
            generation: as_id,
            version: 0,
        };
        AddressSpace {
            sets: [set.clone(), set],
            active: 0,
        }
    }

    pub fn active_set(&self) -> &MemslotSet {
        &self.sets[self.active as usize]
    }

    /// The set of `version`, if it is still one of the two (older ones were reused).
    pub fn set_of_version(&self, version: u64) -> Option<&MemslotSet> {
        self.sets.iter().find(|s| s.version == version)
    }
}

//! MMIO SPTEs and their generation (arch/x86/kvm/mmu.c `mark_mmio_spte`, `check_mmio_spte`,
//! `kvm_mmu_invalidate_mmio_sptes`; docs/design/kernel-model.md §4.4). An MMIO SPTE keeps the low
//! `mmio_gen_bits` of the memslot generation it was created under; a later access accepts it
//! only if the current generation matches — which a wrap of those bits defeats unless every
//! MMIO SPTE is zapped first.

use crate::kvm::memslot::{GEN_UPDATE_IN_PROGRESS, KVM_ADDRESS_SPACE_NUM};
use crate::options::KvmVersion;

/// The generation bits an MMIO SPTE keeps.
fn mask(bits: u8) -> u64 {
    (1u64 << bits) - 1
}

/// `mark_mmio_spte()`: the generation stored in an MMIO SPTE created under `gen`. v5.1+: the
/// low bits, in-progress flag stripped; v5.0: the low bits with bit 0 (odd = in progress)
/// dropped.
pub fn mmio_spte_gen(version: KvmVersion, gen: u64, bits: u8) -> u64 {
    match version {
        KvmVersion::V5_0 => gen & mask(bits) & !1,
        _ => gen & mask(bits),
    }
}

/// `check_mmio_spte()`: may an MMIO SPTE carrying `spte_gen` be used now that the generation
/// is `gen`? v5.1+: never during an update, else the low bits must match; v5.0: the low bits
/// must match, which an odd (in-progress) generation never does.
pub fn check_mmio_spte(version: KvmVersion, gen: u64, spte_gen: u64, bits: u8) -> bool {
    match version {
        KvmVersion::V5_0 => gen & mask(bits) == spte_gen,
        _ => gen & GEN_UPDATE_IN_PROGRESS == 0 && gen & mask(bits) == spte_gen,
    }
}

/// `kvm_mmu_invalidate_mmio_sptes()`'s wrap test on the generation an update is about to
/// publish. v5.1+ strips the address-space bits first, so that a wrap in any address space is
/// seen; v5.0 tests for an exact 0.
pub fn mmio_gen_wrapped(version: KvmVersion, gen: u64, bits: u8) -> bool {
    match version {
        KvmVersion::V5_0 => gen & mask(bits) == 0,
        _ => gen & mask(bits) & !(KVM_ADDRESS_SPACE_NUM - 1) == 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generations_match_wrap_and_respect_updates() {
        let v = KvmVersion::V5_1;
        // 2 bits: generations 0, 2, 4 = 0b100 -> low bits 0 again.
        let g = mmio_spte_gen(v, 0, 2);
        assert!(check_mmio_spte(v, 0, g, 2));
        assert!(!check_mmio_spte(v, 2, g, 2));
        assert!(check_mmio_spte(v, 4, g, 2), "the wrap aliases generation 0");
        assert!(mmio_gen_wrapped(v, 4, 2));
        assert!(!mmio_gen_wrapped(v, 2, 2));
        assert!(!check_mmio_spte(v, 4 | GEN_UPDATE_IN_PROGRESS, g, 2));
        // v5.0: an odd generation never matches.
        let v0 = KvmVersion::V5_0;
        let g0 = mmio_spte_gen(v0, 5, 4);
        assert_eq!(g0, 4);
        assert!(!check_mmio_spte(v0, 5, g0, 4));
        assert!(check_mmio_spte(v0, 4, g0, 4));
    }
}

//! The hypervisor, as CPUID tells it: leaf 1 ECX bit 31 (a hypervisor is present), the
//! signature of leaf 0x40000000, and KVM's paravirtual feature leaf.
//!
//! KVM feature bit numbers are those of Linux's uapi header
//! `arch/x86/include/uapi/asm/kvm_para.h` (`KVM_FEATURE_*`, `KVM_HINTS_REALTIME`).

use serde::{Deserialize, Serialize};

/// KVM's CPUID signature (ebx, ecx, edx of the base leaf; trailing NULs trimmed).
pub const KVM_SIGNATURE: &str = "KVMKVMKVM";

/// KVM's paravirtual features (CPUID `base + 1`, base normally 0x40000000): the raw EAX
/// feature bits and EDX hint bits, and the bits decoded by their `KVM_FEATURE_*` name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct KvmFeatures {
    /// CPUID leaf the features came from (0x40000001 unless KVM sits behind another
    /// hypervisor interface, e.g. at 0x40000101 next to Hyper-V enlightenments).
    pub leaf: u32,
    pub eax: u32,
    pub edx: u32,
    /// bit 0 KVM_FEATURE_CLOCKSOURCE
    pub clocksource: bool,
    /// bit 1 KVM_FEATURE_NOP_IO_DELAY
    pub nop_io_delay: bool,
    /// bit 2 KVM_FEATURE_MMU_OP (obsolete)
    pub mmu_op: bool,
    /// bit 3 KVM_FEATURE_CLOCKSOURCE2
    pub clocksource2: bool,
    /// bit 4 KVM_FEATURE_ASYNC_PF
    pub async_pf: bool,
    /// bit 5 KVM_FEATURE_STEAL_TIME: also what lets the guest see preempted vCPUs.
    pub steal_time: bool,
    /// bit 6 KVM_FEATURE_PV_EOI
    pub pv_eoi: bool,
    /// bit 7 KVM_FEATURE_PV_UNHALT
    pub pv_unhalt: bool,
    /// bit 9 KVM_FEATURE_PV_TLB_FLUSH: the guest skips the IPI to preempted vCPUs and lets the
    /// host flush them on their next entry (Linux uses it with steal_time and without the
    /// realtime hint).
    pub pv_tlb_flush: bool,
    /// bit 10 KVM_FEATURE_ASYNC_PF_VMEXIT
    pub async_pf_vmexit: bool,
    /// bit 11 KVM_FEATURE_PV_SEND_IPI: multicast IPIs by hypercall.
    pub pv_send_ipi: bool,
    /// bit 12 KVM_FEATURE_POLL_CONTROL
    pub poll_control: bool,
    /// bit 13 KVM_FEATURE_PV_SCHED_YIELD
    pub pv_sched_yield: bool,
    /// bit 14 KVM_FEATURE_ASYNC_PF_INT
    pub async_pf_int: bool,
    /// bit 15 KVM_FEATURE_MSI_EXT_DEST_ID
    pub msi_ext_dest_id: bool,
    /// bit 16 KVM_FEATURE_HC_MAP_GPA_RANGE
    pub hc_map_gpa_range: bool,
    /// bit 17 KVM_FEATURE_MIGRATION_CONTROL
    pub migration_control: bool,
    /// bit 24 KVM_FEATURE_CLOCKSOURCE_STABLE_BIT
    pub clocksource_stable: bool,
    /// EDX bit 0 KVM_HINTS_REALTIME: vCPUs are never preempted (dedicated pCPUs).
    pub hints_realtime: bool,
}

impl KvmFeatures {
    /// Decode the EAX/EDX of KVM's feature leaf.
    pub fn from_regs(leaf: u32, eax: u32, edx: u32) -> Self {
        let bit = |n: u32| eax & (1 << n) != 0;
        KvmFeatures {
            leaf,
            eax,
            edx,
            clocksource: bit(0),
            nop_io_delay: bit(1),
            mmu_op: bit(2),
            clocksource2: bit(3),
            async_pf: bit(4),
            steal_time: bit(5),
            pv_eoi: bit(6),
            pv_unhalt: bit(7),
            pv_tlb_flush: bit(9),
            async_pf_vmexit: bit(10),
            pv_send_ipi: bit(11),
            poll_control: bit(12),
            pv_sched_yield: bit(13),
            async_pf_int: bit(14),
            msi_ext_dest_id: bit(15),
            hc_map_gpa_range: bit(16),
            migration_control: bit(17),
            clocksource_stable: bit(24),
            hints_realtime: edx & 1 != 0,
        }
    }
}

/// The 12-byte vendor signature in EBX, ECX, EDX, up to the first NUL, printable ASCII only.
pub(crate) fn signature(ebx: u32, ecx: u32, edx: u32) -> String {
    [ebx, ecx, edx]
        .iter()
        .flat_map(|r| r.to_le_bytes())
        .take_while(|&b| b != 0)
        .filter(|b| b.is_ascii_graphic() || *b == b' ')
        .map(char::from)
        .collect::<String>()
        .trim()
        .to_string()
}

/// (signature at 0x40000000, KVM features) when CPUID says a hypervisor is present.
#[cfg(target_arch = "x86_64")]
pub(crate) fn hypervisor() -> (Option<String>, Option<KvmFeatures>) {
    use core::arch::x86_64::{__cpuid, CpuidResult};
    // `__cpuid` is unsafe on older toolchains and safe on newer ones; CPUID exists on every
    // x86_64 CPU and only reads.
    #[allow(unused_unsafe)]
    let cpuid = |leaf: u32| -> CpuidResult { unsafe { __cpuid(leaf) } };

    if cpuid(1).ecx & (1 << 31) == 0 {
        return (None, None);
    }
    let sig_of = |leaf: u32| {
        let r = cpuid(leaf);
        signature(r.ebx, r.ecx, r.edx)
    };
    let sig = sig_of(0x4000_0000);
    // KVM may also sit at 0x40000100, 0x40000200, … behind another interface; Linux scans the
    // same range (kvm_cpuid_base).
    let kvm = (0x4000_0000u32..0x4001_0000)
        .step_by(0x100)
        .find(|&base| sig_of(base) == KVM_SIGNATURE)
        .map(|base| {
            let r = cpuid(base + 1);
            KvmFeatures::from_regs(base + 1, r.eax, r.edx)
        });
    ((!sig.is_empty()).then_some(sig), kvm)
}

#[cfg(not(target_arch = "x86_64"))]
pub(crate) fn hypervisor() -> (Option<String>, Option<KvmFeatures>) {
    (None, None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kvm_signature_decodes() {
        // "KVMK" "VMKV" "M\0\0\0" in little-endian registers.
        let ebx = u32::from_le_bytes(*b"KVMK");
        let ecx = u32::from_le_bytes(*b"VMKV");
        let edx = u32::from_le_bytes([b'M', 0, 0, 0]);
        assert_eq!(signature(ebx, ecx, edx), KVM_SIGNATURE);
        let hv = u32::from_le_bytes(*b"Micr");
        let hv2 = u32::from_le_bytes(*b"osof");
        let hv3 = u32::from_le_bytes(*b"t Hv");
        assert_eq!(signature(hv, hv2, hv3), "Microsoft Hv");
    }

    #[test]
    fn feature_bits_follow_kvm_para_h() {
        let f = KvmFeatures::from_regs(0x4000_0001, (1 << 5) | (1 << 9) | (1 << 11), 1);
        assert!(f.steal_time && f.pv_tlb_flush && f.pv_send_ipi && f.hints_realtime);
        assert!(!f.pv_eoi && !f.pv_unhalt && !f.poll_control && !f.pv_sched_yield);
        let g = KvmFeatures::from_regs(0x4000_0001, (1 << 6) | (1 << 7) | (1 << 12) | (1 << 13), 0);
        assert!(g.pv_eoi && g.pv_unhalt && g.poll_control && g.pv_sched_yield);
        assert!(!g.steal_time && !g.pv_tlb_flush && !g.hints_realtime);
    }
}

//! arch/x86/kvm/mtrr.c: a vCPU's guest MTRRs, the memory type they give a guest frame, and which
//! guest frames KVM zaps when they or CR0.CD change while KVM honours them (seed 004;
//! docs/design/kernel-model.md §5; docs/design/kvm-mmu-seeds.md §2.2, §2.5, §2.6).
//!
//! While a VM has non-coherent DMA (an assigned device without snoop control) and EPT, KVM bakes
//! the guest's memory type into each leaf SPTE it creates (`vmx_get_mt_mask`): UC+IPAT or WB+IPAT
//! while the faulting vCPU has CR0.CD=1, else the type the vCPU's MTRRs give the frame. So every
//! change of the MTRRs or of CR0.CD must zap the SPTEs whose type may change. Which frames, and
//! when, is what seed 004's variants differ in ([`MtrrZap`], [`CdZapRange`]); mainline (≥ 6.11,
//! 0a7b73559b39) stopped virtualizing guest MTRRs and zaps nothing for them.
//!
//! This file holds the pure parts: the MTRR state and its MSRs (`kvm_mtrr_set_msr`,
//! `kvm_mtrr_valid`), `kvm_mtrr_get_guest_memory_type`, `update_mtrr`'s range rules, patch 10's
//! fine-grained ranges on a CD toggle and patch 11's split at memslot boundaries. The zap itself
//! and the serialized zap list of patch 9 run as steps (`kvm::mmu::tdp_mmu`, `kvm::mtrr_zap`).
//!
//! Simplifications: the guest always has `X86_FEATURE_MTRR` (so MTRRs disabled means UC), 8
//! variable ranges, no `MSR_IA32_CR_PAT` (guest PAT is not modelled: IPAT or not is recorded,
//! PAT's combination is not).

use shootdown_hw::ept::Gfn;

/// A memory type (the SDM's encodings, as in MTRRs and EPT leaf bits 5:3).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum MemType {
    Uc = 0,
    Wc = 1,
    Wt = 4,
    Wp = 5,
    Wb = 6,
}

impl MemType {
    /// The type an MTRR field encodes, if it is a valid one (`valid_mtrr_type`).
    pub fn from_bits(v: u64) -> Option<MemType> {
        Some(match v {
            0 => MemType::Uc,
            1 => MemType::Wc,
            4 => MemType::Wt,
            5 => MemType::Wp,
            6 => MemType::Wb,
            _ => return None,
        })
    }
    /// The names workload files use.
    pub const NAMES: &'static [&'static str] = &["uc", "wc", "wt", "wp", "wb"];
    pub fn parse(s: &str) -> Option<MemType> {
        Some(match s {
            "uc" => MemType::Uc,
            "wc" => MemType::Wc,
            "wt" => MemType::Wt,
            "wp" => MemType::Wp,
            "wb" => MemType::Wb,
            _ => return None,
        })
    }
    pub fn name(self) -> &'static str {
        match self {
            MemType::Uc => "UC",
            MemType::Wc => "WC",
            MemType::Wt => "WT",
            MemType::Wp => "WP",
            MemType::Wb => "WB",
        }
    }
}

/// The memory type a leaf SPTE carries (`vmx_get_mt_mask()`'s result): the EPT memory type and
/// the "ignore guest PAT" bit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct EptMemType {
    pub ty: MemType,
    pub ipat: bool,
}

impl std::fmt::Display for EptMemType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}{}",
            self.ty.name(),
            if self.ipat { "+IPAT" } else { "" }
        )
    }
}

/// `MSR_MTRRdefType`.
pub const MSR_MTRR_DEF_TYPE: u32 = 0x2ff;
/// `MSR_MTRRphysBase0`; base `n` is `0x200 + 2n`, its mask `0x201 + 2n`.
pub const MSR_MTRR_PHYS_BASE0: u32 = 0x200;
/// Variable ranges the guest's `MTRRcap` reports (`KVM_NR_VAR_MTRR`).
pub const KVM_NR_VAR_MTRR: usize = 8;
/// The fixed-range MSRs in the order of `mtrr_state.fixed_ranges` (`fixed_range_msr_to_range`):
/// `MTRRfix64K_00000`, `MTRRfix16K_80000`, `MTRRfix16K_A0000`, `MTRRfix4K_C0000` …
/// `MTRRfix4K_F8000`, with the physical range each covers (8 byte-sized types each).
pub const FIXED_MTRRS: [(u32, u64, u64); 11] = [
    (0x250, 0x0_0000, 0x8_0000),
    (0x258, 0x8_0000, 0xa_0000),
    (0x259, 0xa_0000, 0xc_0000),
    (0x268, 0xc_0000, 0xc_8000),
    (0x269, 0xc_8000, 0xd_0000),
    (0x26a, 0xd_0000, 0xd_8000),
    (0x26b, 0xd_8000, 0xe_0000),
    (0x26c, 0xe_0000, 0xe_8000),
    (0x26d, 0xe_8000, 0xf_0000),
    (0x26e, 0xf_0000, 0xf_8000),
    (0x26f, 0xf_8000, 0x10_0000),
];
/// `MTRRdefType.E`: MTRRs enabled.
pub const MTRR_DEF_TYPE_E: u64 = 1 << 11;
/// `MTRRdefType.FE`: fixed ranges enabled.
pub const MTRR_DEF_TYPE_FE: u64 = 1 << 10;
/// `MTRRphysMask.V`: the variable range is valid.
pub const MTRR_PHYS_MASK_VALID: u64 = 1 << 11;
/// The guest's physical-address width (`cpuid_maxphyaddr`; QEMU's default `phys-bits` on a
/// host with 46).
pub const MAXPHYADDR: u32 = 46;
/// One past the last guest frame (`gpa_to_gfn(~0ULL)`, what a "zap all" asks for).
pub const GFN_ALL_END: Gfn = (!0u64) >> 12;

/// A half-open range of guest frames `[start, end)`.
pub type GfnRange = (Gfn, Gfn);

/// Which MTRR MSR a number is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MtrrMsr {
    DefType,
    /// Fixed-range MSR `i` of [`FIXED_MTRRS`].
    Fixed(usize),
    /// Variable range `n`: its base (`false`) or mask (`true`).
    Var(usize, bool),
}

impl MtrrMsr {
    /// `msr_mtrr_valid()`: is `msr` an MTRR MSR KVM handles here?
    pub fn decode(msr: u32) -> Option<MtrrMsr> {
        if msr == MSR_MTRR_DEF_TYPE {
            return Some(MtrrMsr::DefType);
        }
        if let Some(i) = FIXED_MTRRS.iter().position(|f| f.0 == msr) {
            return Some(MtrrMsr::Fixed(i));
        }
        let var_end = MSR_MTRR_PHYS_BASE0 + 2 * KVM_NR_VAR_MTRR as u32;
        if (MSR_MTRR_PHYS_BASE0..var_end).contains(&msr) {
            let off = msr - MSR_MTRR_PHYS_BASE0;
            return Some(MtrrMsr::Var(off as usize / 2, off % 2 == 1));
        }
        None
    }

    /// The MSR's number.
    pub fn msr(self) -> u32 {
        match self {
            MtrrMsr::DefType => MSR_MTRR_DEF_TYPE,
            MtrrMsr::Fixed(i) => FIXED_MTRRS[i].0,
            MtrrMsr::Var(n, mask) => MSR_MTRR_PHYS_BASE0 + 2 * n as u32 + mask as u32,
        }
    }

    /// The name the SDM gives it (for traces and counterexamples).
    pub fn name(self) -> String {
        match self {
            MtrrMsr::DefType => "MTRRdefType".into(),
            MtrrMsr::Fixed(i) => {
                let (_, s, e) = FIXED_MTRRS[i];
                let k = (e - s) / 8 / 1024;
                format!("MTRRfix{k}K_{s:05X}")
            }
            MtrrMsr::Var(n, false) => format!("MTRRphysBase{n}"),
            MtrrMsr::Var(n, true) => format!("MTRRphysMask{n}"),
        }
    }
}

/// Bits of a physical address above the guest's width (reserved in bases and masks).
fn phys_reserved() -> u64 {
    !0u64 << MAXPHYADDR
}

/// `kvm_mtrr_valid(vcpu, msr, data)`: may the guest write `data` to `msr`? The error is the
/// reason (a `#GP` in the guest; a one-line error in a workload file).
pub fn kvm_mtrr_valid(msr: MtrrMsr, data: u64) -> Result<(), String> {
    match msr {
        MtrrMsr::DefType => {
            if data & !0xcff != 0 {
                return Err(format!("MTRRdefType {data:#x} sets reserved bits"));
            }
            if MemType::from_bits(data & 0xff).is_none() {
                return Err(format!(
                    "MTRRdefType {data:#x}: unknown memory type {}",
                    data & 0xff
                ));
            }
        }
        MtrrMsr::Fixed(_) => {
            for b in 0..8 {
                let t = (data >> (8 * b)) & 0xff;
                if MemType::from_bits(t).is_none() {
                    return Err(format!("byte {b} of {data:#x}: unknown memory type {t}"));
                }
            }
        }
        MtrrMsr::Var(_, false) => {
            if MemType::from_bits(data & 0xff).is_none() {
                return Err(format!(
                    "base {data:#x}: unknown memory type {}",
                    data & 0xff
                ));
            }
            if data & (phys_reserved() | 0xf00) != 0 {
                return Err(format!("base {data:#x} sets reserved bits"));
            }
        }
        MtrrMsr::Var(_, true) => {
            if data & (phys_reserved() | 0x7ff) != 0 {
                return Err(format!("mask {data:#x} sets reserved bits"));
            }
        }
    }
    Ok(())
}

/// The `MTRRphysMask` address bits (V clear) of a variable range of `size` bytes, which must be
/// a power of two of at least 4 KiB.
pub fn size_mask(size: u64) -> Result<u64, String> {
    if !size.is_power_of_two() || size < 4096 {
        return Err(format!("{size:#x} is not a power of two of at least 4 KiB"));
    }
    Ok(((1u64 << MAXPHYADDR) - 1) & !(size - 1))
}

/// One variable range (`struct kvm_mtrr_range`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct VarRange {
    pub base: u64,
    pub mask: u64,
}

impl VarRange {
    pub fn valid(&self) -> bool {
        self.mask & MTRR_PHYS_MASK_VALID != 0
    }
    /// `var_mtrr_range()`: the physical range `[start, end)` the base and mask describe
    /// (for a mask whose ones are contiguous from the top; [`MtrrState::check`] refuses others).
    pub fn range(&self) -> (u64, u64) {
        let start = self.base & !0xfff;
        let mask = (self.mask & !0xfff) | phys_reserved();
        (start, (start | !mask).wrapping_add(1))
    }
    pub fn ty(&self) -> MemType {
        MemType::from_bits(self.base & 0xff).unwrap_or(MemType::Uc)
    }
}

/// A vCPU's MTRRs (`vcpu->arch.mtrr_state`), reset state all zero (MTRRs disabled).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MtrrState {
    pub deftype: u64,
    pub fixed: [u64; 11],
    pub var: [VarRange; KVM_NR_VAR_MTRR],
}

/// Hashed as one run of words (every vCPU's MTRRs are in every fingerprint: one write
/// instead of twenty).
impl std::hash::Hash for MtrrState {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        let MtrrState {
            deftype,
            fixed,
            var,
        } = self;
        let mut w = [0u64; 1 + 11 + 2 * KVM_NR_VAR_MTRR];
        w[0] = *deftype;
        w[1..12].copy_from_slice(fixed);
        for (i, r) in var.iter().enumerate() {
            w[12 + 2 * i] = r.base;
            w[13 + 2 * i] = r.mask;
        }
        u64::hash_slice(&w, h);
    }
}

impl MtrrState {
    /// `mtrr_is_enabled()`.
    pub fn enabled(&self) -> bool {
        self.deftype & MTRR_DEF_TYPE_E != 0
    }
    /// `fixed_mtrr_is_enabled()`.
    pub fn fixed_enabled(&self) -> bool {
        self.deftype & MTRR_DEF_TYPE_FE != 0
    }
    /// `mtrr_default_type()`.
    pub fn default_type(&self) -> MemType {
        MemType::from_bits(self.deftype & 0xff).unwrap_or(MemType::Uc)
    }

    /// `kvm_mtrr_set_msr()`'s store (after [`kvm_mtrr_valid`]).
    pub fn set(&mut self, msr: MtrrMsr, data: u64) {
        match msr {
            MtrrMsr::DefType => self.deftype = data,
            MtrrMsr::Fixed(i) => self.fixed[i] = data,
            MtrrMsr::Var(n, false) => self.var[n].base = data,
            // KVM keeps the reserved physical-address bits set in the stored mask.
            MtrrMsr::Var(n, true) => self.var[n].mask = data | phys_reserved(),
        }
    }

    /// The type of the fixed range covering physical address `pa` (< 1 MiB).
    fn fixed_type(&self, pa: u64) -> MemType {
        let i = FIXED_MTRRS
            .iter()
            .position(|&(_, s, e)| (s..e).contains(&pa))
            .expect("below 1 MiB");
        let (_, s, e) = FIXED_MTRRS[i];
        let unit = (e - s) / 8;
        let byte = (pa - s) / unit;
        MemType::from_bits((self.fixed[i] >> (8 * byte)) & 0xff).unwrap_or(MemType::Uc)
    }

    /// `kvm_mtrr_get_guest_memory_type(vcpu, gfn)`: MTRRs disabled → UC (the guest has MTRRs);
    /// a fixed range when FE is set and the frame is below 1 MiB; else, over the valid variable
    /// ranges containing the frame in KVM's list order (descending base), the first type, kept
    /// while the next equals it, UC if a later one is UC, WT for WT with WB, and WB for any
    /// other mix (KVM's answer to an undefined overlap — so UC "wins" only when it comes
    /// later in the list, as in the kernel); no range → the default type.
    pub fn memtype(&self, gfn: Gfn) -> MemType {
        if !self.enabled() {
            return MemType::Uc;
        }
        let pa = gfn << 12;
        if self.fixed_enabled() && pa < 0x10_0000 {
            return self.fixed_type(pa);
        }
        let mut ty: Option<MemType> = None;
        for r in self.var_list() {
            let (s, e) = r.range();
            if pa < s || pa >= e {
                continue;
            }
            let cur = r.ty();
            ty = Some(match ty {
                None => cur,
                Some(t) if t == cur => t,
                Some(_) if cur == MemType::Uc => return MemType::Uc,
                Some(t) if is_wt_wb(t) && is_wt_wb(cur) => MemType::Wt,
                Some(_) => return MemType::Wb,
            });
        }
        ty.unwrap_or_else(|| self.default_type())
    }

    /// `mtrr_state->head`: the valid variable ranges in descending order of their base MSR
    /// value (`set_var_mtrr_msr` inserts before the first entry whose base is not above it;
    /// among equal bases the higher index is taken as the newer).
    fn var_list(&self) -> Vec<VarRange> {
        let mut v: Vec<(usize, VarRange)> = self
            .var
            .iter()
            .copied()
            .enumerate()
            .filter(|(_, r)| r.valid())
            .collect();
        v.sort_by(|a, b| b.1.base.cmp(&a.1.base).then(b.0.cmp(&a.0)));
        v.into_iter().map(|(_, r)| r).collect()
    }

    /// `kvm_mtrr_check_gfn_range_consistency(vcpu, base, n)`: do the MTRRs give every frame of
    /// `[base, base + n)` one type (so one huge SPTE can map them)? Disabled MTRRs: yes.
    pub fn uniform(&self, base: Gfn, n: u64) -> bool {
        if !self.enabled() {
            return true;
        }
        let first = self.memtype(base);
        // Types change only at fixed-range units below 1 MiB and at variable-range bounds.
        let mut edges: Vec<Gfn> = Vec::new();
        if self.fixed_enabled() && base < 0x100 {
            edges.extend((base..(base + n).min(0x100)).skip(1));
            edges.push(0x100);
        }
        for r in self.var_list() {
            let (s, e) = gfns(r.range());
            edges.push(s);
            edges.push(e);
        }
        edges
            .into_iter()
            .filter(|&g| g > base && g < base + n)
            .all(|g| self.memtype(g) == first)
    }

    /// Is the state something the model can take (on top of [`kvm_mtrr_valid`] per MSR)? Masks
    /// of valid variable ranges must be contiguous from the top (the SDM leaves others
    /// undefined) and the range aligned to its size.
    pub fn check(&self) -> Result<(), String> {
        for (n, r) in self.var.iter().enumerate().filter(|(_, r)| r.valid()) {
            let m = (r.mask & !0xfff) | phys_reserved();
            if (!m).wrapping_add(1) & !m != 0 || m == phys_reserved() {
                return Err(format!(
                    "variable range {n}: mask {:#x} is not contiguous from the top",
                    r.mask
                ));
            }
            if r.base & !0xfff & !m != 0 {
                return Err(format!(
                    "variable range {n}: base {:#x} is not aligned to the size its mask {:#x} gives",
                    r.base, r.mask
                ));
            }
        }
        Ok(())
    }
}

fn is_wt_wb(t: MemType) -> bool {
    matches!(t, MemType::Wt | MemType::Wb)
}

/// `[start, end)` in frames of a physical byte range (`gpa_to_gfn` of each end).
fn gfns((s, e): (u64, u64)) -> GfnRange {
    (s >> 12, e >> 12)
}

/// `update_mtrr(vcpu, msr)` after a write of `msr` (the new value already stored): the frames
/// whose SPTEs must be zapped, or `None` for no zap. KVM's checks that MTRRs are honoured at
/// all (TDP, non-coherent DMA) and patch 6's CR0.CD=1 skip are the caller's.
/// * MTRRs disabled: only an `MTRRdefType` write zaps;
/// * a fixed-range MSR: its range, if fixed ranges are enabled;
/// * `MTRRdefType`: everything (`[0, ~0)`);
/// * a variable range's base or mask: the range they now describe (valid or not).
///
/// The written value is not compared with the old one: rewriting the same value zaps again.
pub fn update_mtrr_range(state: &MtrrState, msr: MtrrMsr) -> Option<GfnRange> {
    if !state.enabled() && msr != MtrrMsr::DefType {
        return None;
    }
    match msr {
        MtrrMsr::Fixed(i) => {
            let (_, s, e) = FIXED_MTRRS[i];
            state.fixed_enabled().then_some(gfns((s, e)))
        }
        MtrrMsr::DefType => Some((0, GFN_ALL_END)),
        // A mask never written is 0: `end` wraps to 0 and kvm_zap_gfn_range() refuses the
        // empty range (WARN_ON_ONCE).
        MtrrMsr::Var(n, _) if state.var[n].mask == 0 => None,
        MtrrMsr::Var(n, _) => Some(gfns(state.var[n].range())),
    }
}

/// Patch 10's `kvm_honors_guest_mtrrs_zap_on_cd_toggle()`: the ranges a CR0.CD toggle zaps
/// (before patch 10, and in Base2, always everything). `cd_type` is the memory type of CR0.CD=1
/// (WB with `KVM_X86_QUIRK_CD_NW_CLEARED`, else UC).
/// * the default type (UC if MTRRs are disabled) differs from `cd_type`: everything;
/// * else, MTRRs enabled: `[0, 1 MiB)` if fixed ranges are enabled and one of their types
///   differs from the default, then each valid variable range whose type does;
/// * else (disabled, and `cd_type` UC): nothing differs, nothing to zap.
pub fn cd_toggle_ranges(state: &MtrrState, cd_type: MemType) -> Vec<GfnRange> {
    let default = if state.enabled() {
        state.default_type()
    } else {
        MemType::Uc
    };
    if default != cd_type {
        return vec![(0, GFN_ALL_END)];
    }
    if !state.enabled() {
        return Vec::new();
    }
    let mut out = Vec::new();
    if state.fixed_enabled() {
        let any = FIXED_MTRRS.iter().enumerate().any(|(i, _)| {
            (0..8).any(|b| MemType::from_bits((state.fixed[i] >> (8 * b)) & 0xff) != Some(default))
        });
        if any {
            out.push(gfns((0, 0x10_0000)));
        }
    }
    for r in state.var.iter().filter(|r| r.valid() && r.ty() != default) {
        out.push(gfns(r.range()));
    }
    out
}

/// Patch 11's split (`kvm_mtrr_zap_gfn_range` with in-slot pieces): `range` clipped to each
/// memslot of each address space that overlaps it, in address-space then slot order.
pub fn split_in_slots<'a>(
    range: GfnRange,
    slots: impl IntoIterator<Item = (Gfn, Gfn)> + 'a,
) -> Vec<GfnRange> {
    slots
        .into_iter()
        .filter_map(|(s, e)| {
            let (a, b) = (range.0.max(s), range.1.min(e));
            (a < b).then_some((a, b))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// OVMF's MTRRs after PlatformInitLib's MemDetect (docs/design/kvm-mmu-seeds.md §2.5): default WB,
    /// fixed WB except 640 KiB–1 MiB UC, variable UC from 2 GiB to 4 GiB.
    fn ovmf() -> MtrrState {
        let mut s = MtrrState {
            deftype: MTRR_DEF_TYPE_E | MTRR_DEF_TYPE_FE | 6,
            ..Default::default()
        };
        for i in 0..11 {
            s.fixed[i] = 0x0606_0606_0606_0606;
        }
        s.fixed[2] = 0; // A0000-BFFFF UC
        for i in 3..11 {
            s.fixed[i] = 0;
        }
        s.var[0] = var(0x8000_0000, 0x8000_0000, MemType::Uc);
        s
    }

    /// A valid variable range of `size` bytes (a power of two) at `base`.
    fn var(base: u64, size: u64, ty: MemType) -> VarRange {
        VarRange {
            base: base | ty as u64,
            mask: size_mask(size).unwrap() | MTRR_PHYS_MASK_VALID,
        }
    }

    #[test]
    fn msr_numbers_round_trip() {
        for msr in [
            0x2ff, 0x250, 0x258, 0x259, 0x268, 0x26f, 0x200, 0x201, 0x20e, 0x20f,
        ] {
            assert_eq!(MtrrMsr::decode(msr).unwrap().msr(), msr);
        }
        assert_eq!(MtrrMsr::decode(0x210), None);
        assert_eq!(MtrrMsr::decode(0x277), None, "PAT is not an MTRR here");
        assert_eq!(MtrrMsr::Fixed(3).name(), "MTRRfix4K_C0000");
        assert_eq!(MtrrMsr::Fixed(0).name(), "MTRRfix64K_00000");
    }

    #[test]
    fn memory_types_follow_the_sdm() {
        let s = ovmf();
        assert_eq!(s.memtype(0), MemType::Wb);
        assert_eq!(s.memtype(0xa0), MemType::Uc);
        assert_eq!(s.memtype(0x100), MemType::Wb);
        assert_eq!(s.memtype(0x8_0000), MemType::Uc, "2 GiB");
        assert_eq!(s.memtype(0xf_ffff), MemType::Uc);
        assert_eq!(s.memtype(0x10_0000), MemType::Wb, "4 GiB");
        let mut d = s;
        d.deftype &= !MTRR_DEF_TYPE_E;
        assert_eq!(d.memtype(0x100), MemType::Uc, "MTRRs disabled");
        // Overlaps: WT + WB = WT; UC wins.
        let mut o = s;
        o.var[1] = var(0x1_0000_0000, 0x1_0000_0000, MemType::Wt);
        o.var[2] = var(0x1_0000_0000, 0x1_0000_0000, MemType::Wb);
        assert_eq!(o.memtype(0x10_0000), MemType::Wt);
        o.var[2] = var(0x1_0000_0000, 0x1_0000_0000, MemType::Uc);
        assert_eq!(o.memtype(0x10_0000), MemType::Uc);
    }

    #[test]
    fn update_mtrr_ranges() {
        let s = ovmf();
        assert_eq!(
            update_mtrr_range(&s, MtrrMsr::DefType),
            Some((0, GFN_ALL_END))
        );
        assert_eq!(update_mtrr_range(&s, MtrrMsr::Fixed(1)), Some((0x80, 0xa0)));
        assert_eq!(
            update_mtrr_range(&s, MtrrMsr::Var(0, true)),
            Some((0x8_0000, 0x10_0000))
        );
        let mut d = s;
        d.deftype = 0;
        assert_eq!(update_mtrr_range(&d, MtrrMsr::Var(0, true)), None);
        assert_eq!(
            update_mtrr_range(&d, MtrrMsr::DefType),
            Some((0, GFN_ALL_END))
        );
        let mut nf = s;
        nf.deftype &= !MTRR_DEF_TYPE_FE;
        assert_eq!(update_mtrr_range(&nf, MtrrMsr::Fixed(1)), None);
    }

    #[test]
    fn patch10_fine_grained_ranges() {
        let s = ovmf();
        // With the quirk, CD=1 is WB: equal to the default, so only the non-WB ranges.
        assert_eq!(
            cd_toggle_ranges(&s, MemType::Wb),
            vec![(0, 0x100), (0x8_0000, 0x10_0000)]
        );
        // MTRRs disabled: the default is UC, not WB: everything.
        assert_eq!(
            cd_toggle_ranges(&MtrrState::default(), MemType::Wb),
            vec![(0, GFN_ALL_END)]
        );
        // Without the quirk CD=1 is UC and the default WB: everything.
        assert_eq!(cd_toggle_ranges(&s, MemType::Uc), vec![(0, GFN_ALL_END)]);
    }

    #[test]
    fn patch11_split() {
        let slots = [
            (0, 0xa0),
            (0xc0, 0xc8),
            (0x100, 0x8_0000),
            (0x10_0000, 0x48_0000),
        ];
        assert_eq!(split_in_slots((0, GFN_ALL_END), slots), slots.to_vec());
        assert_eq!(split_in_slots((0x8_0000, 0x10_0000), slots), vec![]);
        assert_eq!(
            split_in_slots((0, 0x100), slots),
            vec![(0, 0xa0), (0xc0, 0xc8)]
        );
    }

    #[test]
    fn bad_settings_are_refused() {
        assert!(kvm_mtrr_valid(MtrrMsr::DefType, 0xc02)
            .unwrap_err()
            .contains("unknown memory type 2"));
        assert!(kvm_mtrr_valid(MtrrMsr::Var(0, true), 0x801).is_err());
        let mut s = ovmf();
        s.var[0].mask = 0x3fff_7fff_f800; // bit 31 is a hole in the mask
        assert!(s.check().unwrap_err().contains("not contiguous"));
        let mut s = ovmf();
        s.var[0].base = 0x4000_0000; // 1 GiB base for a 2 GiB range
        assert!(s.check().unwrap_err().contains("not aligned"));
        assert!(ovmf().check().is_ok());
    }
}

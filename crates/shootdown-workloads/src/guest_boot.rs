//! A guest booting while KVM honours its memory types (seed 004, docs/design/kvm-mmu-seeds.md §2.3–§2.5,
//! §7.2): every vCPU runs a script of the MTRR writes, CR0.CD changes, guest locks and EPT
//! population its firmware and kernel make, and KVM zaps SPTEs for them. The scripts are data:
//! an experiment's `[workload]` table describes the firmware and kernel (`docs/experiment-format.md`,
//! "guest_boot"), so another firmware or kernel is another file, not code.
//!
//! * `mtrrs.NAME` — a named MTRR state: `default` type, `fixed` sub-ranges
//!   (`{ from, to, type }`, byte addresses below 1 MiB; `fixed = []` leaves FE clear) and
//!   `variable` ranges (`{ base, size, type }` or `{ base, mask, type }`);
//! * `memslots` — guest RAM and ROM (`{ gpa, size, huge, readonly }`), which the EPT maps;
//! * `sequences.NAME` — a list of steps a phase can `run`;
//! * `locks.NAME` — the guest physical address of each guest lock the steps take, and
//!   `rendezvous_gpa` the one of the word the phases end on; with `spin_refault = true` a vCPU
//!   spinning on them reads that page through its TLB and EPT on every attempt, so it re-faults
//!   the page after a zap (and retries while one is in progress) as spinning code does. Off by
//!   default: the scripts model the boot's MTRR events, and re-access of the other working sets
//!   after a zap is not modelled either (docs/reproduction.md, seed 004, shows both). `"none"`
//!   marks a lock outside guest memory, such as the VMM's;
//! * `phases` — in order; each has the steps of the BSP (`bsp`), of every AP (`ap`), and of
//!   single vCPUs (`vcpu = { INDEX = [...] }`, which replace the role's steps); a phase ends when
//!   every vCPU finished its steps (a rendezvous), which is how firmware broadcasts and waits.
//!
//! A step is one of `{ cd = 0|1 }` (MOV to CR0), `{ wrmsr = MSR, value = N }`,
//! `{ wrmsr = "MTRRdefType", state = NAME }` (that state's `MTRRdefType`), `{ mtrrs = NAME }` (the
//! state's fixed and variable MSRs, as guest WRMSRs), `{ set_msrs = NAME }` (every MTRR MSR of
//! the state, `MTRRdefType` first, as the VMM's `KVM_SET_MSRS`: QEMU's puts; `"reset"` is the
//! all-zero state), `{ lock = NAME }`, `{ unlock = NAME }`, `{ touch = [GPA, BYTES] }` (access
//! the range for writing, faulting its EPT entries in: one access per 2 MiB region; `read` for
//! reading, e.g. from a ROM), `{ compute_us = N }`
//! and `{ run = SEQUENCE }`. MSRs are named (`MTRRdefType`, `MTRRfix64K_00000`,
//! `MTRRphysBase0`, …) or numbered.
//!
//! Metric: the zap cycles, the time vCPUs spent in zap requests (KVM's `kvm.mtrr_zap_ns`), in
//! millions of cycles at `cpu_ghz`; the requests themselves are `kvm.mtrr_zap_requests`
//! ("zap cnt").

use crate::{Built, Measure, ParamError, Params};
use shootdown_engine::Time;
use shootdown_linux::kvm::memslot::Memslot;
use shootdown_linux::kvm::mtrr::{
    kvm_mtrr_valid, size_mask, MemType, MtrrMsr, MtrrState, VarRange, FIXED_MTRRS, KVM_NR_VAR_MTRR,
    MAXPHYADDR, MTRR_DEF_TYPE_E, MTRR_DEF_TYPE_FE, MTRR_PHYS_MASK_VALID,
};
use shootdown_linux::{Counter, Machine, UserOp};
use std::collections::BTreeMap;

/// Host frames backing the guest's memslots start here.
const PFN_BASE: u64 = 0x100_0000;
/// 4 KiB pages per 2 MiB region.
const REGION_PAGES: u64 = 512;

/// What a step turns into for one vCPU.
struct Ctx<'a> {
    states: &'a BTreeMap<String, MtrrState>,
    /// Waiters re-read their lock's page through the EPT (`spin_refault`).
    spin_refault: bool,
    /// `locks.NAME`: the guest page of each lock.
    lock_pages: &'a toml::Table,
    sequences: &'a toml::Table,
    locks: &'a mut BTreeMap<String, u32>,
    /// Guest frames a step touches (to map in the guest page tables).
    touched: &'a mut Vec<(u64, u64)>,
    machine: &'a mut Machine,
    depth: u32,
}

fn err<T>(key: impl Into<String>, reason: impl Into<String>) -> Result<T, ParamError> {
    Err((key.into(), reason.into()))
}

/// An integer that may be written as a number or as a hex string (`"0xfeb00000"`).
fn int(v: &toml::Value, key: &str) -> Result<u64, ParamError> {
    match v {
        toml::Value::Integer(i) if *i >= 0 => Ok(*i as u64),
        toml::Value::String(s) => {
            let t = s.trim();
            let r = match t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
                Some(h) => u64::from_str_radix(&h.replace('_', ""), 16),
                None => t.replace('_', "").parse(),
            };
            r.or_else(|_| err(key, format!("expected a non-negative integer, got '{s}'")))
        }
        other => err(
            key,
            format!("expected a non-negative integer, got {}", other.type_str()),
        ),
    }
}

fn table<'a>(v: &'a toml::Value, key: &str) -> Result<&'a toml::Table, ParamError> {
    v.as_table().ok_or_else(|| {
        (
            key.to_string(),
            format!("expected a table, got {}", v.type_str()),
        )
    })
}

fn array<'a>(v: &'a toml::Value, key: &str) -> Result<&'a Vec<toml::Value>, ParamError> {
    v.as_array().ok_or_else(|| {
        (
            key.to_string(),
            format!("expected an array, got {}", v.type_str()),
        )
    })
}

/// `t[name]`, or the error that the key `k.name` is missing.
fn field<'a>(t: &'a toml::Table, k: &str, name: &str) -> Result<&'a toml::Value, ParamError> {
    t.get(name)
        .ok_or_else(|| (format!("{k}.{name}"), "missing".to_string()))
}

fn only_keys(t: &toml::Table, key: &str, allowed: &[&str]) -> Result<(), ParamError> {
    match t.keys().find(|k| !allowed.contains(&k.as_str())) {
        Some(k) => err(
            format!("{key}.{k}"),
            format!("unknown key (expected {})", allowed.join(", ")),
        ),
        None => Ok(()),
    }
}

fn memtype(v: &toml::Value, key: &str) -> Result<MemType, ParamError> {
    let s = v
        .as_str()
        .ok_or_else(|| (key.to_string(), "expected a memory type name".to_string()))?;
    MemType::parse(s).ok_or_else(|| {
        (
            key.to_string(),
            format!(
                "unknown memory type '{s}' (expected {})",
                MemType::NAMES.join(" | ")
            ),
        )
    })
}

/// An MSR by name (`MTRRdefType`, `MTRRfix4K_C0000`, `MTRRphysMask3`) or number.
fn msr(v: &toml::Value, key: &str) -> Result<MtrrMsr, ParamError> {
    let n = match v.as_str() {
        Some(s) if !s.starts_with("0x") && s.parse::<u64>().is_err() => {
            let mut all: Vec<MtrrMsr> = vec![MtrrMsr::DefType];
            all.extend((0..11).map(MtrrMsr::Fixed));
            all.extend(
                (0..KVM_NR_VAR_MTRR).flat_map(|n| [MtrrMsr::Var(n, false), MtrrMsr::Var(n, true)]),
            );
            return all
                .into_iter()
                .find(|m| m.name() == s)
                .ok_or_else(|| (key.to_string(), format!("unknown MTRR MSR '{s}'")));
        }
        _ => int(v, key)?,
    };
    MtrrMsr::decode(n as u32)
        .ok_or_else(|| (key.to_string(), format!("MSR {n:#x} is not an MTRR MSR")))
}

/// `mtrrs.NAME`: an MTRR state (MTRRs enabled).
fn mtrr_state(t: &toml::Table, key: &str) -> Result<MtrrState, ParamError> {
    only_keys(t, key, &["default", "fixed", "variable"])?;
    let default = match t.get("default") {
        Some(v) => memtype(v, &format!("{key}.default"))?,
        None => {
            return err(
                format!("{key}.default"),
                "missing (the default memory type)",
            )
        }
    };
    let mut s = MtrrState {
        deftype: MTRR_DEF_TYPE_E | default as u64,
        ..Default::default()
    };
    if let Some(f) = t.get("fixed") {
        let f = array(f, &format!("{key}.fixed"))?;
        if !f.is_empty() {
            s.deftype |= MTRR_DEF_TYPE_FE;
        }
        // Unnamed sub-ranges take the default type.
        let mut bytes = [default as u8; 88];
        for (i, r) in f.iter().enumerate() {
            let k = format!("{key}.fixed[{i}]");
            let r = table(r, &k)?;
            only_keys(r, &k, &["from", "to", "type"])?;
            let (from, to) = (
                int(field(r, &k, "from")?, &format!("{k}.from"))?,
                int(field(r, &k, "to")?, &format!("{k}.to"))?,
            );
            let ty = memtype(field(r, &k, "type")?, &format!("{k}.type"))?;
            if from >= to || to > 0x10_0000 {
                return err(
                    k,
                    format!("[{from:#x}, {to:#x}) is not a range below 1 MiB"),
                );
            }
            for (m, &(_, ms, me)) in FIXED_MTRRS.iter().enumerate() {
                let unit = (me - ms) / 8;
                for b in 0..8 {
                    let (us, ue) = (ms + b * unit, ms + (b + 1) * unit);
                    if us < to && ue > from {
                        if us < from || ue > to {
                            return err(
                                k,
                                format!("[{from:#x}, {to:#x}) splits the fixed sub-range [{us:#x}, {ue:#x})"),
                            );
                        }
                        bytes[m * 8 + b as usize] = ty as u8;
                    }
                }
            }
        }
        for m in 0..11 {
            s.fixed[m] = u64::from_le_bytes(bytes[m * 8..m * 8 + 8].try_into().unwrap());
        }
    }
    if let Some(v) = t.get("variable") {
        let v = array(v, &format!("{key}.variable"))?;
        if v.len() > KVM_NR_VAR_MTRR {
            return err(
                format!("{key}.variable"),
                format!("at most {KVM_NR_VAR_MTRR} variable ranges"),
            );
        }
        for (i, r) in v.iter().enumerate() {
            let k = format!("{key}.variable[{i}]");
            let r = table(r, &k)?;
            only_keys(r, &k, &["base", "size", "mask", "type"])?;
            let base = int(field(r, &k, "base")?, &format!("{k}.base"))?;
            let ty = memtype(field(r, &k, "type")?, &format!("{k}.type"))?;
            let mask = match (r.get("size"), r.get("mask")) {
                (Some(sz), None) => size_mask(int(sz, &format!("{k}.size"))?)
                    .or_else(|r| err(format!("{k}.size"), r))?,
                (None, Some(m)) => int(m, &format!("{k}.mask"))? & !MTRR_PHYS_MASK_VALID,
                _ => return err(k, "give exactly one of size and mask"),
            };
            let vr = VarRange {
                base: base | ty as u64,
                mask: mask | MTRR_PHYS_MASK_VALID,
            };
            kvm_mtrr_valid(MtrrMsr::Var(i, false), vr.base)
                .or_else(|r| err(format!("{k}.base"), r))?;
            kvm_mtrr_valid(MtrrMsr::Var(i, true), vr.mask)
                .or_else(|r| err(format!("{k}.mask"), r))?;
            s.var[i] = vr;
        }
    }
    s.check().or_else(|r| err(format!("{key}.variable"), r))?;
    Ok(s)
}

/// The MSR writes that program `s`'s fixed and variable ranges (MtrrLib / `set_mtrr_state`
/// order: fixed, then each variable base and mask).
fn range_msrs(s: &MtrrState) -> Vec<(u32, u64)> {
    let mut v: Vec<(u32, u64)> = (0..11)
        .map(|i| (MtrrMsr::Fixed(i).msr(), s.fixed[i]))
        .collect();
    for n in 0..KVM_NR_VAR_MTRR {
        v.push((MtrrMsr::Var(n, false).msr(), s.var[n].base));
        v.push((
            MtrrMsr::Var(n, true).msr(),
            s.var[n].mask & ((1u64 << MAXPHYADDR) - 1),
        ));
    }
    v
}

impl Ctx<'_> {
    fn state(&self, v: &toml::Value, key: &str) -> Result<MtrrState, ParamError> {
        let name = v
            .as_str()
            .ok_or_else(|| (key.to_string(), "expected an MTRR state name".to_string()))?;
        if name == "reset" {
            return Ok(MtrrState::default());
        }
        self.states.get(name).copied().ok_or_else(|| {
            let known: Vec<&str> = self.states.keys().map(|s| s.as_str()).collect();
            (
                key.to_string(),
                format!(
                    "no MTRR state '{name}' (known: reset, {})",
                    known.join(", ")
                ),
            )
        })
    }

    fn lock(&mut self, v: &toml::Value, key: &str) -> Result<u32, ParamError> {
        let name = v
            .as_str()
            .ok_or_else(|| (key.to_string(), "expected a lock name".to_string()))?;
        if let Some(&w) = self.locks.get(name) {
            return Ok(w);
        }
        let Some(gpa) = self.lock_pages.get(name) else {
            return err(
                key,
                format!("lock '{name}' has no page: add workload.locks.{name} = GPA"),
            );
        };
        // "none": a lock that is not guest memory (the VMM's), taken without a guest access.
        let gfn = if gpa.as_str() == Some("none") || !self.spin_refault {
            None
        } else {
            let g = int(gpa, &format!("locks.{name}"))? >> 12;
            self.touched.push((g, 1));
            Some(g)
        };
        let w = self.machine.add_guest_word(gfn);
        self.locks.insert(name.to_string(), w);
        Ok(w)
    }

    /// The ops of one step.
    fn step(
        &mut self,
        v: &toml::Value,
        key: &str,
        out: &mut Vec<UserOp>,
    ) -> Result<(), ParamError> {
        let t = table(v, key)?;
        let k = |n: &str| format!("{key}.{n}");
        if let Some(cd) = t.get("cd") {
            only_keys(t, key, &["cd"])?;
            let cd = int(cd, &k("cd"))?;
            if cd > 1 {
                return err(k("cd"), "expected 0 or 1");
            }
            out.push(UserOp::SetCr0Cd { cd: cd == 1 });
        } else if let Some(m) = t.get("wrmsr") {
            only_keys(t, key, &["wrmsr", "value", "state"])?;
            let m = msr(m, &k("wrmsr"))?;
            let value = match (t.get("value"), t.get("state")) {
                (Some(v), None) => int(v, &k("value"))?,
                (None, Some(s)) if m == MtrrMsr::DefType => self.state(s, &k("state"))?.deftype,
                (None, Some(_)) => {
                    return err(k("state"), "only MTRRdefType takes its value from a state")
                }
                _ => return err(key.to_string(), "give exactly one of value and state"),
            };
            kvm_mtrr_valid(m, value).or_else(|r| err(k("value"), r))?;
            out.push(UserOp::Wrmsr {
                msr: m.msr(),
                value,
            });
        } else if let Some(s) = t.get("mtrrs") {
            only_keys(t, key, &["mtrrs"])?;
            let s = self.state(s, &k("mtrrs"))?;
            out.extend(
                range_msrs(&s)
                    .into_iter()
                    .map(|(msr, value)| UserOp::Wrmsr { msr, value }),
            );
        } else if let Some(s) = t.get("set_msrs") {
            only_keys(t, key, &["set_msrs"])?;
            let s = self.state(s, &k("set_msrs"))?;
            out.push(UserOp::SetMsr {
                msr: MtrrMsr::DefType.msr(),
                value: s.deftype,
            });
            out.extend(
                range_msrs(&s)
                    .into_iter()
                    .map(|(msr, value)| UserOp::SetMsr { msr, value }),
            );
        } else if let Some(l) = t.get("lock") {
            only_keys(t, key, &["lock"])?;
            let lock = self.lock(l, &k("lock"))?;
            out.push(UserOp::GuestSpinLock { lock });
        } else if let Some(l) = t.get("unlock") {
            only_keys(t, key, &["unlock"])?;
            let lock = self.lock(l, &k("unlock"))?;
            out.push(UserOp::GuestSpinUnlock { lock });
        } else if let Some((what, r)) = t
            .get("touch")
            .map(|r| ("touch", r))
            .or(t.get("read").map(|r| ("read", r)))
        {
            only_keys(t, key, &[what])?;
            let write = what == "touch";
            let r = array(r, &k(what))?;
            if r.len() != 2 {
                return err(k(what), "expected [GPA, BYTES]");
            }
            let (gpa, bytes) = (int(&r[0], &k(what))?, int(&r[1], &k(what))?);
            if bytes == 0 || gpa % 4096 != 0 {
                return err(k(what), "expected a page-aligned GPA and a non-zero size");
            }
            let (first, last) = (gpa >> 12, (gpa + bytes - 1) >> 12);
            let mut g = first;
            while g <= last {
                let next = ((g / REGION_PAGES) + 1) * REGION_PAGES;
                out.push(UserOp::Touch { vpn: g, write });
                self.touched.push((g, 1));
                g = next;
            }
        } else if let Some(us) = t.get("compute_us") {
            only_keys(t, key, &["compute_us"])?;
            out.push(UserOp::Compute {
                ns: int(us, &k("compute_us"))?.saturating_mul(1000),
            });
        } else if let Some(name) = t.get("run") {
            only_keys(t, key, &["run"])?;
            let n = name
                .as_str()
                .ok_or_else(|| (k("run"), "expected a sequence name".to_string()))?;
            let seq = self.sequences.get(n).ok_or_else(|| {
                let known: Vec<&str> = self.sequences.keys().map(|s| s.as_str()).collect();
                (
                    k("run"),
                    format!("no sequence '{n}' (known: {})", known.join(", ")),
                )
            })?;
            if self.depth > 8 {
                return err(k("run"), "sequences nest more than 8 deep (a cycle?)");
            }
            self.depth += 1;
            let key = format!("sequences.{n}");
            for (i, s) in array(seq, &key)?.iter().enumerate() {
                self.step(s, &format!("{key}[{i}]"), out)?;
            }
            self.depth -= 1;
        } else {
            return err(
                key.to_string(),
                "a step needs one of cd, wrmsr, mtrrs, set_msrs, lock, unlock, touch, read, compute_us, run",
            );
        }
        Ok(())
    }
}

pub fn build(p: &Params, mut m: Machine) -> Result<Built, ParamError> {
    let Some(h) = &m.host else {
        return err("kind", "guest_boot needs a [host] (the VM that boots)");
    };
    let vcpus = h.cfg.vcpus_per_vm;
    if h.cfg.vms != 1 {
        return err("host.vms", "guest_boot boots one VM");
    }
    if !m.opts.tdp_mmu {
        return err(
            "kind",
            "guest_boot needs the TDP MMU (option tdp_mmu = true)",
        );
    }
    let noncoherent = p.boolean("noncoherent_dma", true)?;
    let ghz = p.num("cpu_ghz", 3.1, 100.0)?;
    let rendezvous_gpa = p.int("rendezvous_gpa", 0x7000, 0..=i64::MAX)? as u64;
    let spin_refault = p.boolean("spin_refault", false)?;
    for k in ["mtrrs", "memslots", "sequences", "phases", "locks"] {
        p.mark_used(k);
    }
    let empty = toml::Table::new();
    let t = p.table_ref();
    let mut states = BTreeMap::new();
    if let Some(v) = t.get("mtrrs") {
        for (name, s) in table(v, "mtrrs")? {
            if name == "reset" {
                return err(
                    format!("mtrrs.{name}"),
                    "'reset' is the built-in all-zero state",
                );
            }
            let key = format!("mtrrs.{name}");
            states.insert(name.clone(), mtrr_state(table(s, &key)?, &key)?);
        }
    }
    let mut slots = Vec::new();
    let mut pfn = PFN_BASE;
    let Some(ms) = t.get("memslots") else {
        return err("memslots", "missing (the guest's memory)");
    };
    for (i, s) in array(ms, "memslots")?.iter().enumerate() {
        let k = format!("memslots[{i}]");
        let s = table(s, &k)?;
        only_keys(s, &k, &["gpa", "size", "huge", "readonly"])?;
        let gpa = int(field(s, &k, "gpa")?, &format!("{k}.gpa"))?;
        let size = int(field(s, &k, "size")?, &format!("{k}.size"))?;
        if gpa % 4096 != 0 || size == 0 || size % 4096 != 0 {
            return err(k, "gpa and size must be page-aligned and the size non-zero");
        }
        let flag = |n: &str| match s.get(n) {
            None => Ok(false),
            Some(toml::Value::Boolean(b)) => Ok(*b),
            Some(_) => err(format!("{k}.{n}"), "expected true or false"),
        };
        let slot = Memslot {
            id: i as u16,
            base_gfn: gpa >> 12,
            npages: size >> 12,
            readonly: flag("readonly")?,
            invalid: false,
            huge: flag("huge")?,
            pfn,
            dirty_log: false,
        };
        if let Some(o) = slots
            .iter()
            .find(|o: &&Memslot| o.base_gfn < slot.end() && slot.base_gfn < o.end())
        {
            return err(k, format!("overlaps memslot {}", o.id));
        }
        pfn += size >> 12;
        slots.push(slot);
    }
    m.enable_kvm_mmu(0, slots);
    m.set_noncoherent_dma(0, noncoherent);
    let sequences = match t.get("sequences") {
        Some(v) => table(v, "sequences")?,
        None => &empty,
    };
    let Some(phases) = t.get("phases") else {
        return err("phases", "missing (the boot's phases)");
    };
    let phases = array(phases, "phases")?;
    let mut progs: Vec<Vec<UserOp>> = vec![Vec::new(); vcpus];
    let mut locks = BTreeMap::new();
    let mut touched = Vec::new();
    let locks_table = match t.get("locks") {
        Some(v) => table(v, "locks")?,
        None => &empty,
    };
    let rendezvous = m.add_guest_word(spin_refault.then_some(rendezvous_gpa >> 12));
    if spin_refault {
        touched.push((rendezvous_gpa >> 12, 1));
    }
    for (i, ph) in phases.iter().enumerate() {
        let key = format!("phases[{i}]");
        let ph = table(ph, &key)?;
        only_keys(ph, &key, &["name", "bsp", "ap", "vcpu"])?;
        let mut ctx = Ctx {
            states: &states,
            spin_refault,
            lock_pages: locks_table,
            sequences,
            locks: &mut locks,
            touched: &mut touched,
            machine: &mut m,
            depth: 0,
        };
        let mut ops_of = |role: &str| -> Result<Vec<UserOp>, ParamError> {
            let mut out = Vec::new();
            if let Some(steps) = ph.get(role) {
                let k = format!("{key}.{role}");
                for (j, s) in array(steps, &k)?.iter().enumerate() {
                    ctx.step(s, &format!("{k}[{j}]"), &mut out)?;
                }
            }
            Ok(out)
        };
        let bsp = ops_of("bsp")?;
        let ap = ops_of("ap")?;
        let mut own: BTreeMap<usize, Vec<UserOp>> = BTreeMap::new();
        if let Some(v) = ph.get("vcpu") {
            for (idx, steps) in table(v, &format!("{key}.vcpu"))? {
                let k = format!("{key}.vcpu.{idx}");
                let n: usize = idx
                    .parse()
                    .or_else(|_| err(k.clone(), "expected a vCPU index"))?;
                if n >= vcpus {
                    return err(
                        k,
                        format!("vCPU index {n} out of range (the VM has {vcpus} vCPUs)"),
                    );
                }
                let mut out = Vec::new();
                for (j, s) in array(steps, &k)?.iter().enumerate() {
                    ctx.step(s, &format!("{k}[{j}]"), &mut out)?;
                }
                own.insert(n, out);
            }
        }
        for (v, prog) in progs.iter_mut().enumerate() {
            let ops = match own.remove(&v) {
                Some(o) => o,
                None if v == 0 => bsp.clone(),
                None => ap.clone(),
            };
            prog.extend(ops);
            prog.push(UserOp::Rendezvous {
                word: rendezvous,
                parties: vcpus as u32,
            });
        }
    }
    let mm = m.add_mm("guest");
    touched.sort_unstable();
    touched.dedup();
    for &(g, n) in &touched {
        m.map_pages(mm, g, n, true);
    }
    for (v, mut prog) in progs.into_iter().enumerate() {
        prog.push(UserOp::Exit);
        m.add_task(&format!("vcpu{v}"), mm, v, prog);
    }
    Ok(Built {
        machine: m,
        measure: Measure::CounterScaled {
            counter: Counter::KvmMtrrZapNs,
            scale: ghz / 1e6,
        },
        max_time: Time::from_ms(60_000),
    })
}

//! mmtest with `rom.sh` (seed 003: `mmtest -c 8 -m 2000 -e ./rom.sh`, docs/design/kvm-mmu-seeds.md §1).
//! Eight guest threads each re-access their already populated 2000 MB while, in the same guest,
//! `rom.sh` reads a PCI option ROM through sysfs. Each 4 KiB chunk of that read enables the ROM
//! BAR and disables it again (`pci_map_rom` / `pci_unmap_rom`), and QEMU answers each toggle by
//! creating, then deleting, a read-only memslot over the ROM. The deletion is what seed 003
//! changed: v5.0 invalidates every shadow page (`kvm_mmu_invalidate_zap_all_pages`: every vCPU
//! reloads its root and re-faults its whole working set), v5.1 zaps only the ROM slot's SPTEs.
//! Metric: mmtest's time, taken as the mean over threads of one timed pass, in milliseconds.
//!
//! What mmtest times, the EPT leaf size and how often `rom.sh` reads the ROM inside the timed
//! window are not known (docs/design/kvm-mmu-seeds.md §1.5, §6); each is a parameter, and
//! docs/reproduction.md shows what each choice predicts:
//! * `ept_leaf = "2m"` (default): the host backs guest RAM with THP, so KVM maps it with 2 MiB
//!   EPT leaves; `"4k"`: 4 KiB leaves (no THP), 512 times the re-faults.
//! * `cats = 1` (default): reads of the whole ROM in the timed pass, `cat_interval_us` apart,
//!   the first at the start of the pass (so its re-faults cover the whole working set, as each
//!   read's would over a run of many passes). One read of a `rom_kb` ROM is `rom_kb / 4 + 1`
//!   BAR toggles (the last, empty read maps and unmaps too), `toggle_us` apart.
//! * One pass is timed, over memory the threads populated before (an earlier pass): the EPT and
//!   the guest page tables are filled at set-up.
//!
//! Model: a thread's working set is 2 MiB regions accessed through one representative page each
//! ([`UserOp::TouchRegions`]); its other 511 pages cost a TLB-missing access each, or, when 4 KiB
//! EPT leaves were zapped, what the representative's re-fault cost. The ROM toggles are made by
//! a QEMU thread on a pCPU of its own (the config-space exits and the 4 KiB ROM copy of one chunk
//! between a toggle's create and delete are `toggle_us`, assumed); the vCPU that
//! runs `rom.sh` is not modelled (it spends the window in QEMU and the ROM copy). Guest frames
//! equal guest virtual pages (identity), so regions are 2 MiB-aligned in both.

use crate::{params::limits, Built, Measure, ParamError, Params};
use shootdown_engine::Time;
use shootdown_linux::host::HostOp;
use shootdown_linux::kvm::memslot::Memslot;
use shootdown_linux::{Machine, UserOp};

/// First guest frame of the threads' memory (4 GiB: above the PCI hole, as QEMU lays out RAM
/// beyond 3 GiB).
const RAM_BASE_GFN: u64 = 0x10_0000;
/// The ROM BAR's guest frame (below 4 GiB, in the PCI hole).
const ROM_GFN: u64 = 0xfeb80;
/// Host frames backing RAM and the ROM.
const RAM_PFN: u64 = 0x100_0000;
const ROM_PFN: u64 = 0x80_0000;
/// Pages per 2 MiB region.
const REGION_PAGES: u64 = 512;

pub fn build(p: &Params, mut m: Machine) -> Result<Built, ParamError> {
    let Some(h) = &m.host else {
        return Err((
            "kind".into(),
            "mmtest_rom needs a [host] (the VM whose memslots change)".into(),
        ));
    };
    let vcpus = h.cfg.vcpus_per_vm;
    if h.cfg.vms != 1 {
        return Err(("host.vms".into(), "mmtest_rom runs in one VM".into()));
    }
    let threads = p.int("threads", 8, 1..=limits::THREADS)? as usize;
    let mem_mb = p.int("mem_mb", 2000, 2..=limits::MEMORY_MB)? as u64;
    let leaf = p.string("ept_leaf", "2m", &["2m", "4k"])?;
    let cats = p.int("cats", 1, 0..=10_000)? as u64;
    let rom_kb = p.int("rom_kb", 64, 4..=16 * 1024)? as u64;
    let cat_interval_us = p.num("cat_interval_us", 20_000.0, limits::MS * 1000.0)?;
    let toggle_us = p.num("toggle_us", 50.0, limits::MS * 1000.0)?;
    if threads > vcpus {
        return Err((
            "threads".into(),
            format!("{threads} threads but the VM has {vcpus} vCPUs (one thread per vCPU)"),
        ));
    }
    if mem_mb % 2 != 0 {
        return Err((
            "mem_mb".into(),
            format!("must be a multiple of 2 (2 MiB regions; got {mem_mb})"),
        ));
    }
    if rom_kb % 4 != 0 {
        return Err((
            "rom_kb".into(),
            format!("must be a multiple of 4 (got {rom_kb})"),
        ));
    }
    let pcpus = m.topo.nr_cpus();
    if vcpus >= pcpus {
        return Err((
            "host.vcpus_per_vm".into(),
            format!(
                "QEMU's thread needs a pCPU of its own: at most {} vCPUs on {pcpus} pCPUs",
                pcpus - 1
            ),
        ));
    }
    let regions = mem_mb / 2;
    let per_thread = regions * REGION_PAGES;
    let huge = leaf == "2m";
    let ram_pages = per_thread * threads as u64;
    let rom_pages = rom_kb / 4;
    let ram = Memslot {
        id: 0,
        base_gfn: RAM_BASE_GFN,
        npages: ram_pages,
        readonly: false,
        invalid: false,
        huge,
        pfn: RAM_PFN,
        dirty_log: false,
    };
    m.enable_kvm_mmu(0, vec![ram]);
    let mm = m.add_mm("mmtest");
    for i in 0..threads {
        let start = RAM_BASE_GFN + i as u64 * per_thread;
        // Populated by an earlier pass: the representatives' guest PTEs and EPT entries.
        for r in 0..regions {
            let vpn = start + r * REGION_PAGES;
            m.map_pages(mm, vpn, 1, true);
            m.prefault_ept(0, vpn, 1);
        }
        let prog = vec![
            UserOp::Mark,
            UserOp::TouchRegions {
                start,
                regions,
                pages: REGION_PAGES,
                write: false,
            },
            UserOp::Mark,
            UserOp::Exit,
        ];
        m.add_task(&format!("mmtest/{i}"), mm, i, prog);
    }
    // QEMU: each 4 KiB chunk of a ROM read maps the ROM BAR (a read-only memslot) and unmaps
    // it again; reads start `cat_interval_us` apart.
    let toggles = rom_pages + 1;
    let mut prog = Vec::new();
    for c in 0..cats {
        if c > 0 {
            prog.push(HostOp::Compute {
                ns: (cat_interval_us * 1000.0) as u64,
            });
        }
        for _ in 0..toggles {
            prog.push(HostOp::MemslotCreate {
                as_id: 0,
                id: 1,
                base_gfn: ROM_GFN,
                npages: rom_pages,
                readonly: true,
                huge: false,
                pfn: ROM_PFN,
            });
            prog.push(HostOp::Compute {
                ns: (toggle_us * 1000.0) as u64,
            });
            prog.push(HostOp::MemslotDelete { as_id: 0, id: 1 });
        }
    }
    prog.push(HostOp::Exit);
    m.add_host_thread("qemu", 0, pcpus - 1, prog);
    Ok(Built {
        machine: m,
        measure: Measure::MeanMarkedMillis,
        max_time: Time::from_ms(60_000),
    })
}

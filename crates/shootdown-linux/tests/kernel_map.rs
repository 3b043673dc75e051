//! Global kernel mappings and `flush_tlb_kernel_range()` in the timed driver (`kernel_map.rs`).

mod common;
use common::{machine, run_to_end};
use shootdown_linux::kernel_map::VMALLOC_START_VPN;
use shootdown_linux::*;

#[test]
fn a_kernel_range_flush_reaches_every_cpu_idle_ones_included() {
    let mut m = machine(4);
    let page = VMALLOC_START_VPN + 7;
    m.map_pages(INIT_MM, page, 1, true);
    let mm = m.add_mm("mm1");
    // cpu1 reads the kernel page 50 times; cpu0 unmaps it meanwhile; cpu2 and cpu3 idle.
    m.add_task(
        "reader",
        mm,
        1,
        vec![
            UserOp::KernelTouch { vpn: page },
            UserOp::Compute { ns: 1_000 },
            UserOp::Loop {
                to: 0,
                times: Some(50),
            },
            UserOp::Exit,
        ],
    );
    m.add_task(
        "driver",
        mm,
        0,
        vec![
            UserOp::Compute { ns: 20_000 },
            UserOp::VunmapRange {
                start: page,
                npages: 1,
            },
            UserOp::Exit,
        ],
    );
    run_to_end(&mut m, 10, 1_000_000);
    let c = m.counters();
    // on_each_cpu: the three other CPUs take the IPI, halted or not.
    assert_eq!(c.get(Counter::TlbShootdowns), 3);
    assert!(!m.mms[INIT_MM as usize].space.leaf(page, false).present);
}

#[test]
fn text_poke_flushes_its_alias_without_an_ipi() {
    let mut m = machine(2);
    let text = VMALLOC_START_VPN;
    m.map_pages(INIT_MM, text, 2, true);
    let mm = m.add_mm("mm1");
    let poking_mm = m.add_poking_mm();
    m.add_task(
        "patcher",
        mm,
        0,
        vec![
            UserOp::TextPoke {
                poking_mm,
                page: text,
            },
            UserOp::TextPoke {
                poking_mm,
                page: text + 1,
            },
            UserOp::Loop {
                to: 0,
                times: Some(10),
            },
            UserOp::Exit,
        ],
    );
    run_to_end(&mut m, 10, 1_000_000);
    let c = m.counters();
    // 22 pokes: each switches to poking_mm and back, and its flush IPIs no one; every poke
    // after the first finds poking_mm's ASID slot a generation behind and flushes it.
    assert_eq!(c.get(Counter::NrTlbRemoteFlush), 0);
    assert_eq!(m.mms[poking_mm as usize].tlb_gen, 1 + 22);
    assert!(c.get(Counter::FlushOnTaskSwitch) >= 22);
}

#[test]
fn efi_calls_switch_to_efi_mm_and_catch_up_on_missed_flushes() {
    let mut m = machine(2);
    let mm = m.add_mm("mm1");
    m.map_pages(mm, 0x10, 1, true);
    let efi_mm = m.add_efi_mm();
    m.add_task(
        "efivarfs",
        mm,
        0,
        vec![
            UserOp::Touch {
                vpn: 0x10,
                write: true,
            },
            UserOp::EfiCall { efi_mm },
            UserOp::Loop {
                to: 0,
                times: Some(20),
            },
            UserOp::Exit,
        ],
    );
    m.add_task(
        "zapper",
        mm,
        1,
        vec![
            UserOp::MadviseDontneed {
                start: 0x10,
                npages: 1,
            },
            UserOp::Compute { ns: 300 },
            UserOp::Loop {
                to: 0,
                times: Some(40),
            },
            UserOp::Exit,
        ],
    );
    run_to_end(&mut m, 10, 1_000_000);
    let c = m.counters();
    assert_eq!(c.get(Counter::EfiCalls), 21);
    // efi_mm is loaded only inside the calls: each one switches to it and back.
    assert_ne!(m.cpus[0].tlbstate.loaded_mm, efi_mm as u64);
    assert!(c.get(Counter::Cr3Writes) >= 2 * 21);
}

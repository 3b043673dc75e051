//! The KVM MMU in the timed driver (kvm/, kvm/mmu/): guest accesses walk the EPT, faults fill
//! it, memslot updates zap it in each strategy, and the oracle checks every use.
use shootdown_engine::timed::{Limits, Stop, TimedDriver};
use shootdown_engine::Time;
use shootdown_hw::{CostProfile, Features, Topology};
use shootdown_linux::host::HostOp;
use shootdown_linux::kvm::memslot::Memslot;
use shootdown_linux::*;
use std::sync::Arc;

fn vm(vcpus: usize, opts: Options, slots: Vec<Memslot>) -> Machine {
    let topo = Topology::new(1, vcpus + 2, 1).unwrap();
    let prof = Arc::new(CostProfile::uniform("t", 10.0, Features::modern()));
    let cfg = HostConfig {
        vms: 1,
        vcpus_per_vm: vcpus,
        ..HostConfig::default()
    };
    cfg.validate(vcpus + 2).unwrap();
    let mut m = Machine::with_host(topo, prof, opts, MemoryModel::Sc, cfg);
    m.enable_kvm_mmu(0, slots);
    m
}

fn ram(id: u16, base_gfn: u64, npages: u64, huge: bool) -> Memslot {
    Memslot {
        id,
        base_gfn,
        npages,
        readonly: false,
        invalid: false,
        huge,
        pfn: 0x100000 + base_gfn,
        dirty_log: false,
    }
}

fn run(m: &mut Machine, ms: u64) -> (Stop, u64) {
    let n = m.cpus.len() + m.host.as_ref().unwrap().threads.len();
    let mut d = TimedDriver::new(n, 1, 0);
    let s = d.run(
        m,
        Limits {
            max_time: Time::from_ms(ms),
            max_steps: 5_000_000,
        },
    );
    (s.stop, s.steps)
}

/// A memslot over the frames the guest's page allocator hands out (`page_alloc.rs` starts at
/// 2^24), so that pages the guest faults in are RAM, not MMIO.
fn allocator_ram() -> Memslot {
    ram(1, 1 << 24, 1 << 20, false)
}

/// Two vCPUs each writing their 32 of 64 guest pages (0x200…) `loops` times over, in a VM whose
/// slot 0 has 0x400 pages (`logged`: `KVM_MEM_LOG_DIRTY_PAGES` from the start), and the VMM
/// thread `qemu` running `host`.
fn two_writers(o: Options, logged: bool, loops: u32, host: Vec<HostOp>) -> Machine {
    let mut slot = ram(0, 0, 0x400, false);
    slot.dirty_log = logged;
    let mut m = vm(2, o, vec![slot]);
    let mm = m.add_mm("g");
    m.map_pages(mm, 0x200, 64, true);
    for cpu in 0..2 {
        let prog = vec![
            UserOp::TouchRange {
                start: 0x200 + cpu as u64 * 32,
                npages: 32,
                write: true,
            },
            UserOp::Loop {
                to: 0,
                times: Some(loops),
            },
            UserOp::Exit,
        ];
        m.add_task("t", mm, cpu, prog);
    }
    m.add_host_thread("qemu", 0, 3, host);
    m
}

/// A guest touch of a page whose frame no SPTE maps exits to KVM, which maps it; the access
/// then hits: one EPT violation per page (4 KiB slot) or per 2 MiB region (huge slot).
#[test]
fn faults_fill_the_ept_at_4k_or_2m() {
    for (huge, faults) in [(false, 64), (true, 1)] {
        let mut m = vm(1, Options::default(), vec![ram(0, 0, 0x400, huge)]);
        let mm = m.add_mm("g");
        m.map_pages(mm, 0x200, 64, true);
        m.add_task(
            "t",
            mm,
            0,
            vec![
                UserOp::TouchRange {
                    start: 0x200,
                    npages: 64,
                    write: false,
                },
                UserOp::TouchRange {
                    start: 0x200,
                    npages: 64,
                    write: false,
                },
                UserOp::Exit,
            ],
        );
        let (stop, _) = run(&mut m, 10);
        assert_eq!(stop, Stop::Finished, "huge={huge}");
        let c = m.counters();
        assert_eq!(c.get(Counter::KvmEptViolations), faults, "huge={huge}");
        assert_eq!(c.get(Counter::KvmMmuPfFixed), faults, "huge={huge}");
        assert!(m.perf.uses_checked >= 128);
    }
}

/// A frame no memslot covers is MMIO: the fault installs an MMIO SPTE and emulates the access;
/// the next access to it is an EPT misconfiguration answered from the MMIO cache.
#[test]
fn a_frame_without_a_slot_is_emulated_as_mmio() {
    let mut m = vm(1, Options::default(), vec![ram(0, 0, 0x100, false)]);
    let mm = m.add_mm("g");
    m.map_pages(mm, 0x300, 1, true);
    m.add_task(
        "t",
        mm,
        0,
        vec![
            UserOp::Touch {
                vpn: 0x300,
                write: false,
            },
            UserOp::Touch {
                vpn: 0x300,
                write: false,
            },
            UserOp::Exit,
        ],
    );
    let (stop, _) = run(&mut m, 10);
    assert_eq!(stop, Stop::Finished);
    let c = m.counters();
    assert_eq!(c.get(Counter::KvmEptViolations), 1);
    assert_eq!(c.get(Counter::KvmMmioExits), 1);
    assert_eq!(c.get(Counter::KvmMmioEmulated), 2);
}

/// Deleting a memslot while vCPUs keep touching RAM of another slot, with the strategies whose
/// lock breaks are safe (fast invalidate; mainline's slot-only zap, which flushes before each
/// break; v5.0's zap-all, which has none): the deletion returns with nothing of the slot left
/// (INV-SLOT), no stale translation is used (INV-STALE), no flush is owed at a lock release
/// (INV-FLUSH-OWED).
#[test]
fn memslot_deletion_in_every_strategy_keeps_the_invariants() {
    for (zap, kvm) in [
        ("fast_invalidate", "v5_0"),
        ("fast_invalidate", "mainline"),
        ("slot_only", "mainline"),
        ("zap_all", "v5_0"),
    ] {
        {
            let mut o = Options::default();
            o.set("memslot_zap", &OptValue::Str(zap.into())).unwrap();
            o.set("kvm", &OptValue::Str(kvm.into())).unwrap();
            let mut m = vm(
                2,
                o,
                vec![ram(0, 0, 0x400, false), ram(1, 0x400, 0x10, false)],
            );
            let mm = m.add_mm("g");
            m.map_pages(mm, 0x100, 32, true);
            m.map_pages(mm, 0x400, 16, true);
            for cpu in 0..2 {
                m.add_task(
                    &format!("t{cpu}"),
                    mm,
                    cpu,
                    vec![
                        UserOp::TouchRange {
                            start: 0x400,
                            npages: 16,
                            write: false,
                        },
                        UserOp::TouchRange {
                            start: 0x100,
                            npages: 32,
                            write: true,
                        },
                        UserOp::Loop {
                            to: 1,
                            times: Some(50),
                        },
                        UserOp::Exit,
                    ],
                );
            }
            m.add_host_thread(
                "qemu",
                0,
                3,
                vec![
                    HostOp::Compute { ns: 20_000 },
                    HostOp::MemslotDelete { as_id: 0, id: 1 },
                    HostOp::MemslotCreate {
                        as_id: 0,
                        id: 1,
                        base_gfn: 0x400,
                        npages: 0x10,
                        readonly: true,
                        huge: false,
                        pfn: 0x900000,
                    },
                    HostOp::MemslotDelete { as_id: 0, id: 1 },
                    HostOp::Exit,
                ],
            );
            let (stop, _) = run(&mut m, 50);
            assert_eq!(stop, Stop::Finished, "{zap} {kvm}");
            let c = m.counters();
            assert_eq!(c.get(Counter::KvmMemslotUpdates), 5, "{zap} {kvm}");
            assert!(c.get(Counter::KvmRemoteTlbFlush) >= 1, "{zap} {kvm}");
            assert!(c.get(Counter::KvmMmuShadowZapped) >= 1, "{zap} {kvm}");
        }
    }
}

#[test]
fn mmu_notifier_invalidations_zap_and_flush_in_both_mmus() {
    // The TDP MMU's notifier takes the rwlock for write and walks its roots
    // (`kvm_tdp_mmu_unmap_gfn_range`), yielding to the faults of the two vCPUs; the legacy
    // MMU's takes the spinlock and walks the rmaps, and its flush kicks vCPUs queued on that
    // lock, which must take the kick there for the flush to finish.
    for tdp_mmu in [true, false] {
        notifier_invalidations(tdp_mmu);
    }
}

fn notifier_invalidations(tdp_mmu: bool) {
    let o = Options {
        tdp_mmu,
        ..Options::default()
    };
    let mut m = vm(2, o, vec![ram(0, 0, 0x400, false)]);
    let mm = m.add_mm("g");
    m.map_pages(mm, 0x100, 32, true);
    for cpu in 0..2 {
        m.add_task(
            &format!("t{cpu}"),
            mm,
            cpu,
            vec![
                UserOp::TouchRange {
                    start: 0x100,
                    npages: 32,
                    write: true,
                },
                UserOp::Loop {
                    to: 0,
                    times: Some(40),
                },
                UserOp::Exit,
            ],
        );
    }
    m.add_host_thread(
        "reclaim",
        0,
        3,
        vec![
            HostOp::Compute { ns: 5_000 },
            HostOp::InvalidateGfns {
                gfn: 0x100,
                npages: 16,
            },
            HostOp::Loop {
                to: 0,
                times: Some(9),
            },
            HostOp::Exit,
        ],
    );
    let (stop, _) = run(&mut m, 50);
    assert_eq!(stop, Stop::Finished, "tdp_mmu = {tdp_mmu}: {}", m.dump());
    let c = m.counters();
    assert_eq!(c.get(Counter::KvmMmuNotifierInvalidations), 10);
    assert!(c.get(Counter::KvmRemoteTlbFlush) >= 1);
    assert_eq!(c.get(Counter::KvmZapGfnRange), 0);
}

/// NX huge pages (`nx_huge_pages`), in both MMUs: a vCPU that executes from a page of a huge
/// slot and reads the page beside it splits the 2 MiB SPTE (a 4 KiB table, tracked), while the
/// other reads through it; the recovery worker zaps the tracked table every 20 us and flushes,
/// and the next fetch splits again.
#[test]
fn nx_huge_pages_split_on_fetch_and_recover_in_both_mmus() {
    for tdp_mmu in [true, false] {
        nx_recovery(tdp_mmu);
    }
}

fn nx_recovery(tdp_mmu: bool) {
    let o = Options {
        tdp_mmu,
        nx_huge_pages: true,
        nx_huge_pages_recovery_ratio: Count(1),
        ..Options::default()
    };
    let mut m = vm(2, o, vec![ram(0, 0, 0x400, true)]);
    let mm = m.add_mm("g");
    m.map_pages(mm, 0x200, 4, true);
    let fetcher = vec![
        UserOp::Exec { vpn: 0x200 },
        UserOp::Touch {
            vpn: 0x201,
            write: false,
        },
        UserOp::Compute { ns: 2_000 },
        UserOp::Loop {
            to: 0,
            times: Some(60),
        },
        UserOp::Exit,
    ];
    let reader = vec![
        UserOp::TouchRange {
            start: 0x200,
            npages: 4,
            write: false,
        },
        UserOp::Compute { ns: 2_000 },
        UserOp::Loop {
            to: 0,
            times: Some(60),
        },
        UserOp::Exit,
    ];
    m.add_task("fetcher", mm, 0, fetcher);
    m.add_task("reader", mm, 1, reader);
    m.add_host_thread(
        "nx_recovery",
        0,
        3,
        vec![
            HostOp::Compute { ns: 20_000 },
            HostOp::NxRecover,
            HostOp::Loop {
                to: 0,
                times: Some(5),
            },
            HostOp::Exit,
        ],
    );
    let (stop, _) = run(&mut m, 50);
    assert_eq!(stop, Stop::Finished, "tdp_mmu = {tdp_mmu}: {}", m.dump());
    let c = m.counters();
    // Each recovery finds the table split since the last one and zaps it, with a flush; the
    // next fetch splits again.
    assert_eq!(c.get(Counter::KvmNxRecovered), 6, "tdp_mmu = {tdp_mmu}");
    assert_eq!(c.get(Counter::KvmNxLpageSplits), 7, "tdp_mmu = {tdp_mmu}");
    assert!(
        c.get(Counter::KvmRemoteTlbFlush) >= 6,
        "tdp_mmu = {tdp_mmu}"
    );
}

/// SMM (`kvm/smm.rs`), in both MMUs: vCPU 0 enters SMM, writes SMRAM — a slot of address space
/// 1 with host memory of its own, over gfns where the normal address space has other RAM — and
/// leaves, 21 times, while vCPU 1 writes the same gfns in normal mode and the host invalidates
/// them in both address spaces. Each transition resets the MMU (SMM's root is its own); the
/// oracle checks that every access reaches its own address space's frame (`INV-ADDR-SPACE`).
#[test]
fn smm_transitions_switch_address_spaces_in_both_mmus() {
    for tdp_mmu in [true, false] {
        smm_transitions(tdp_mmu);
    }
}

fn smm_transitions(tdp_mmu: bool) {
    let o = Options {
        tdp_mmu,
        ..Options::default()
    };
    let mut m = vm(
        2,
        o,
        vec![ram(0, 0, 0x200, false), ram(1, 0x200, 0x200, false)],
    );
    let smram = Memslot {
        pfn: 0x200200,
        dirty_log: false,
        ..ram(1, 0x200, 0x10, false)
    };
    m.enable_smm(0, vec![ram(0, 0, 0x200, false), smram]);
    let mm = m.add_mm("g");
    m.map_pages(mm, 0x200, 0x10, true);
    let touch = UserOp::TouchRange {
        start: 0x200,
        npages: 0x10,
        write: true,
    };
    let smm_user = vec![
        UserOp::Smi,
        touch,
        UserOp::Rsm,
        touch,
        UserOp::Compute { ns: 1_000 },
        UserOp::Loop {
            to: 0,
            times: Some(20),
        },
        UserOp::Exit,
    ];
    let normal = vec![
        touch,
        UserOp::Compute { ns: 1_000 },
        UserOp::Loop {
            to: 0,
            times: Some(40),
        },
        UserOp::Exit,
    ];
    m.add_task("smm", mm, 0, smm_user);
    m.add_task("normal", mm, 1, normal);
    m.add_host_thread(
        "reclaim",
        0,
        3,
        vec![
            HostOp::Compute { ns: 7_000 },
            HostOp::InvalidateGfns {
                gfn: 0x200,
                npages: 0x10,
            },
            HostOp::Loop {
                to: 0,
                times: Some(4),
            },
            HostOp::Exit,
        ],
    );
    let (stop, _) = run(&mut m, 50);
    assert_eq!(stop, Stop::Finished, "tdp_mmu = {tdp_mmu}: {}", m.dump());
    let c = m.counters();
    assert_eq!(c.get(Counter::KvmSmmTransitions), 42, "tdp_mmu = {tdp_mmu}");
    assert_eq!(
        c.get(Counter::KvmMmuNotifierInvalidations),
        5,
        "tdp_mmu = {tdp_mmu}"
    );
    // Each gfn faults at least once per address space (SMM's root has its own SPTEs).
    assert!(
        c.get(Counter::KvmEptViolations) >= 0x20,
        "tdp_mmu = {tdp_mmu}"
    );
}

/// The steal-time cache (`kvm/st_cache.rs`): housekeeping on vCPU 0's pCPU makes the host
/// preempt and resume the vCPU (each put writes the steal-time area, each load refreshes and
/// acknowledges it), while a host thread reclaims the area's page every 300 us. Mainline's hva cache
/// is refilled only for a new memslot generation and never writes a page the host invalidated;
/// v5.6–v5.15's pfn cache writes through the pfn it cached before the reclaim (`INV-PFNCACHE`:
/// 7e2175ebd695's use-after-free).
#[test]
fn the_steal_time_cache_survives_reclaims_only_as_an_hva_cache() {
    for map in [StealTimeMap::Mainline, StealTimeMap::V5_6] {
        let o = Options {
            steal_time_map: map,
            ..Options::default()
        };
        // Housekeeping tasks on the vCPU's pCPU preempt it every 100 us or so.
        let topo = Topology::new(1, 3, 1).unwrap();
        let prof = Arc::new(CostProfile::uniform("t", 10.0, Features::modern()));
        let cfg = HostConfig {
            vms: 1,
            vcpus_per_vm: 1,
            housekeeping_interval_us: 100,
            housekeeping_run_us: 10,
            ..HostConfig::default()
        };
        cfg.validate(3).unwrap();
        let mut m = Machine::with_host(topo, prof, o, MemoryModel::Sc, cfg);
        m.enable_kvm_mmu(0, vec![ram(0, 0, 0x200, false), ram(1, 0x300, 1, false)]);
        m.set_steal_time_gfns(0, 0x300);
        let mm = m.add_mm("g");
        m.map_pages(mm, 0x10, 4, true);
        m.add_task(
            "t",
            mm,
            0,
            vec![
                UserOp::TouchRange {
                    start: 0x10,
                    npages: 4,
                    write: true,
                },
                UserOp::Compute { ns: 20_000 },
                UserOp::Loop {
                    to: 0,
                    times: Some(400),
                },
                UserOp::Exit,
            ],
        );
        m.add_host_thread(
            "reclaim",
            0,
            2,
            vec![
                HostOp::Compute { ns: 300_000 },
                HostOp::InvalidateGfns {
                    gfn: 0x300,
                    npages: 1,
                },
                HostOp::Loop {
                    to: 0,
                    times: Some(20),
                },
                HostOp::Exit,
            ],
        );
        let (stop, _) = run(&mut m, 100);
        match map {
            StealTimeMap::Mainline => {
                assert_eq!(stop, Stop::Finished, "{}", m.dump());
                assert!(m.counters().get(Counter::KvmStealTimeCacheFills) >= 1);
            }
            StealTimeMap::V5_6 => match stop {
                Stop::Violation(v) => assert_eq!(v.invariant, "INV-PFNCACHE", "{v:?}"),
                s => panic!("v5.6's pfn cache should be caught: {s:?}"),
            },
        }
    }
}

/// The TDP MMU's GFN-range zap in each form (`tdp_zap`): vCPU 1 rewrites `MTRRdefType` (WB)
/// over and over while guest MTRRs are honoured, so each write zaps everything, while vCPU 0
/// keeps touching two pages of a 2 MiB-mapped region. Before v5.18 the zap removes the whole
/// subtree at the top level (its PDPT and PD) with its flush, and the toucher's next fault
/// builds it again; the leaf-only walk frees nothing and visits every entry below. A violation
/// would stop the run.
#[test]
fn tdp_zap_forms_free_whole_tables_before_v5_18() {
    use shootdown_linux::options::{MtrrZap, TdpZap};
    let mut steps = Vec::new();
    for form in [
        TdpZap::V5_10,
        TdpZap::V5_12,
        TdpZap::V5_15,
        TdpZap::Mainline,
    ] {
        let o = Options {
            tdp_mmu: true,
            mtrr_zap: MtrrZap::V6_5,
            tdp_zap: form,
            ..Options::default()
        };
        let mut m = vm(2, o, vec![ram(0, 0, 0x400, true)]);
        let mtrrs = shootdown_linux::kvm::mtrr::MtrrState {
            deftype: 0x806,
            ..Default::default()
        };
        m.set_guest_memtypes(0, true, mtrrs, false);
        m.set_tdp_max_gfn(0, 1 << (23 - 12));
        let mm = m.add_mm("g");
        m.map_pages(mm, 0x200, 2, true);
        let toucher = vec![
            UserOp::TouchRange {
                start: 0x200,
                npages: 2,
                write: false,
            },
            UserOp::Compute { ns: 1_000 },
            UserOp::Loop {
                to: 0,
                times: Some(40),
            },
            UserOp::Exit,
        ];
        let writer = vec![
            UserOp::Wrmsr {
                msr: 0x2ff,
                value: 0x806,
            },
            UserOp::Compute { ns: 3_000 },
            UserOp::Loop {
                to: 0,
                times: Some(9),
            },
            UserOp::Exit,
        ];
        m.add_task("toucher", mm, 0, toucher);
        m.add_task("writer", mm, 1, writer);
        let (stop, _) = run(&mut m, 50);
        assert_eq!(stop, Stop::Finished, "{form:?}: {}", m.dump());
        let c = m.counters();
        assert_eq!(c.get(Counter::KvmZapGfnRange), 10, "{form:?}");
        let freed = c.get(Counter::KvmTdpTablesFreed);
        if form == TdpZap::Mainline {
            assert_eq!(freed, 0);
        } else {
            // Each zap finds the subtree the toucher's last fault rebuilt (or none yet).
            assert!((2..=20).contains(&freed), "{form:?}: {freed}");
        }
        steps.push(c.get(Counter::KvmTdpIterSteps));
    }
    // The whole-table walks visit the root's entries; the leaf-only walk descends.
    assert!(steps[3] > steps[0], "{steps:?}");
    assert_eq!(steps[1], steps[2], "{steps:?}");
}

/// `alloc_fail`: vCPU 0's first `mmu_topup_memory_caches()` fails, in both MMUs: the fault
/// returns -ENOMEM, `KVM_RUN` is entered again, the access exits once more and maps.
#[test]
fn an_injected_topup_failure_costs_one_more_exit_in_both_mmus() {
    for tdp_mmu in [true, false] {
        let mut o = Options {
            tdp_mmu,
            ..Options::default()
        };
        o.set(
            "alloc_fail",
            &OptValue::Str("mmu_topup_memory_caches:0".into()),
        )
        .unwrap();
        let mut m = vm(1, o, vec![ram(0, 0, 0x400, false)]);
        let mm = m.add_mm("g");
        m.map_pages(mm, 0x200, 4, true);
        let prog = vec![
            UserOp::TouchRange {
                start: 0x200,
                npages: 4,
                write: false,
            },
            UserOp::Exit,
        ];
        m.add_task("t", mm, 0, prog);
        let (stop, _) = run(&mut m, 10);
        assert_eq!(stop, Stop::Finished, "tdp_mmu = {tdp_mmu}: {}", m.dump());
        let c = m.counters();
        assert_eq!(c.get(Counter::KvmAllocFailures), 1, "tdp_mmu = {tdp_mmu}");
        assert_eq!(c.get(Counter::KvmEptViolations), 5, "tdp_mmu = {tdp_mmu}");
        assert_eq!(c.get(Counter::KvmMmuPfFixed), 4, "tdp_mmu = {tdp_mmu}");
    }
}

/// Dirty logging in both MMUs: two vCPUs write 64 pages of a logged slot over and over while
/// the VMM harvests the bitmap every 20 us (`KVM_GET_DIRTY_LOG`, or with manual protect
/// `KVM_GET_DIRTY_LOG` then `KVM_CLEAR_DIRTY_LOG`). Only the first write of each page takes the
/// slow path; every write after a harvest write-protected the page is fixed by
/// `fast_page_fault` without `mmu_lock`, and marks the page again.
#[test]
fn after_each_harvest_the_fast_path_makes_pages_writable_again() {
    for (tdp_mmu, manual) in [(true, false), (false, false), (true, true), (false, true)] {
        let o = Options {
            tdp_mmu,
            manual_dirty_log_protect: manual,
            ..Options::default()
        };
        let mut m = two_writers(
            o,
            true,
            200,
            [
                vec![
                    HostOp::Compute { ns: 20_000 },
                    HostOp::GetDirtyLog { as_id: 0, id: 0 },
                ],
                if manual {
                    vec![HostOp::ClearDirtyLog { as_id: 0, id: 0 }]
                } else {
                    vec![]
                },
                vec![
                    HostOp::Loop {
                        to: 0,
                        times: Some(9),
                    },
                    HostOp::Exit,
                ],
            ]
            .concat(),
        );
        let (stop, _) = run(&mut m, 100);
        assert_eq!(
            stop,
            Stop::Finished,
            "tdp_mmu = {tdp_mmu}, manual = {manual}: {}",
            m.dump()
        );
        let c = m.counters();
        let fast = c.get(Counter::KvmFastPfFixed);
        assert_eq!(
            c.get(Counter::KvmDirtyLogHarvests),
            10,
            "tdp_mmu = {tdp_mmu}"
        );
        assert_eq!(c.get(Counter::KvmMmuPfFixed), 64, "tdp_mmu = {tdp_mmu}");
        assert!(fast >= 64, "tdp_mmu = {tdp_mmu}: {fast} fast fixes");
        assert_eq!(
            c.get(Counter::KvmEptViolations),
            64 + fast,
            "tdp_mmu = {tdp_mmu}"
        );
        assert_eq!(
            c.get(Counter::KvmDirtyPagesMarked),
            64 + fast,
            "tdp_mmu = {tdp_mmu}"
        );
        assert!(c.get(Counter::KvmDirtyPagesHarvested) <= 64 + fast);
    }
}

/// Dirty logging with EPT A/D bits and PML, in both MMUs, on the workload above: harvests
/// clear D bits instead of W, so only each page's first write exits (the slow path); every
/// write after a harvest's flush sets D again through the A/D assist and logs its gfn, which
/// the vCPU's next exit (the harvest's kick, a flush request) drains into the bitmap.
#[test]
fn with_pml_writes_after_a_harvest_are_logged_without_exits() {
    for (tdp_mmu, manual) in [(true, false), (false, false), (true, true), (false, true)] {
        let o = Options {
            tdp_mmu,
            manual_dirty_log_protect: manual,
            ept_ad: true,
            pml: true,
            ..Options::default()
        };
        let mut m = two_writers(
            o,
            true,
            200,
            [
                vec![
                    HostOp::Compute { ns: 20_000 },
                    HostOp::GetDirtyLog { as_id: 0, id: 0 },
                ],
                if manual {
                    vec![HostOp::ClearDirtyLog { as_id: 0, id: 0 }]
                } else {
                    vec![]
                },
                vec![
                    HostOp::Loop {
                        to: 0,
                        times: Some(9),
                    },
                    HostOp::Exit,
                ],
            ]
            .concat(),
        );
        let (stop, _) = run(&mut m, 100);
        let what = format!("tdp_mmu = {tdp_mmu}, manual = {manual}");
        assert_eq!(stop, Stop::Finished, "{what}: {}", m.dump());
        let c = m.counters();
        let (logged, drained) = (c.get(Counter::KvmPmlLogged), c.get(Counter::KvmPmlFlushed));
        assert_eq!(c.get(Counter::KvmDirtyLogHarvests), 10, "{what}");
        assert_eq!(c.get(Counter::KvmMmuPfFixed), 64, "{what}");
        assert_eq!(c.get(Counter::KvmEptViolations), 64, "{what}");
        assert_eq!(c.get(Counter::KvmFastPfFixed), 0, "{what}");
        // Every A/D assist is a write to the logged slot, so every one is logged; what the
        // runs' last exits did not drain is at most the two logs' contents.
        assert_eq!(c.get(Counter::KvmEptDirtyAssists), logged, "{what}");
        assert!(logged >= 64, "{what}: {logged} logged");
        assert!(
            drained <= logged && logged - drained <= 64,
            "{what}: {drained} of {logged}"
        );
        assert_eq!(c.get(Counter::KvmDirtyPagesMarked), 64 + drained, "{what}");
        // Each D bit a harvest clears hands the page its dirty state.
        assert!(c.get(Counter::KvmSetPfnDirty) >= 64, "{what}");
    }
}

/// Aging and turning dirty logging on for a live slot, in both MMUs: two vCPUs write 64 pages
/// over and over; the host ages them all (`clear_young`), then sets `KVM_MEM_LOG_DIRTY_PAGES`
/// on the slot and harvests it five times. Without A/D bits every aged SPTE is made
/// access-tracked and restored by `fast_page_fault` at its next access; with them aging
/// changes no SPTE (the accessed bits are not modelled).
#[test]
fn aged_sptes_come_back_through_the_fast_path_and_logging_starts_on_a_live_slot() {
    for (tdp_mmu, ept_ad) in [(true, false), (false, false), (true, true)] {
        let o = Options {
            tdp_mmu,
            ept_ad,
            ..Options::default()
        };
        let mut m = two_writers(
            o,
            false,
            3000,
            vec![
                HostOp::Compute { ns: 50_000 },
                HostOp::ClearYoung {
                    gfn: 0x200,
                    npages: 64,
                },
                HostOp::Compute { ns: 20_000 },
                HostOp::EnableDirtyLog { as_id: 0, id: 0 },
                HostOp::Compute { ns: 20_000 },
                HostOp::GetDirtyLog { as_id: 0, id: 0 },
                HostOp::Loop {
                    to: 4,
                    times: Some(4),
                },
                HostOp::Exit,
            ],
        );
        let (stop, _) = run(&mut m, 100);
        let what = format!("tdp_mmu = {tdp_mmu}, ept_ad = {ept_ad}");
        assert_eq!(stop, Stop::Finished, "{what}: {}", m.dump());
        let c = m.counters();
        let (aged, restored) = (
            c.get(Counter::KvmSptesAged),
            c.get(Counter::KvmAccessTrackRestored),
        );
        assert_eq!(c.get(Counter::KvmDirtyLogHarvests), 5, "{what}");
        assert_eq!(c.get(Counter::KvmMmuPfFixed), 64, "{what}");
        if ept_ad {
            assert_eq!((aged, restored), (0, 0), "{what}");
        } else {
            // Every page was mapped before the aging, and every one is touched after it.
            assert_eq!(aged, 64, "{what}");
            assert_eq!(restored, 64, "{what}");
        }
        // Logging on write-protects what aging left writable; every page is written after
        // it, so the first harvest holds them all.
        assert!(c.get(Counter::KvmDirtyPagesHarvested) >= 64, "{what}");
    }
}

/// `KVM_DIRTY_LOG_INITIALLY_SET` in both MMUs: turning logging on for the live slot sets every
/// bit and write-protects nothing; the first `KVM_CLEAR_DIRTY_LOG` clears (and write-protects)
/// all 1,024 pages, after which only the pages the vCPUs write come back.
#[test]
fn initially_set_reports_every_page_once_then_only_the_written_ones() {
    for tdp_mmu in [true, false] {
        let o = Options {
            tdp_mmu,
            manual_dirty_log_protect: true,
            dirty_log_initially_set: true,
            ..Options::default()
        };
        let mut m = two_writers(
            o,
            false,
            3000,
            vec![
                HostOp::Compute { ns: 50_000 },
                HostOp::EnableDirtyLog { as_id: 0, id: 0 },
                HostOp::Compute { ns: 20_000 },
                HostOp::GetDirtyLog { as_id: 0, id: 0 },
                HostOp::ClearDirtyLog { as_id: 0, id: 0 },
                HostOp::Loop {
                    to: 2,
                    times: Some(2),
                },
                HostOp::Exit,
            ],
        );
        let (stop, _) = run(&mut m, 100);
        let what = format!("tdp_mmu = {tdp_mmu}");
        assert_eq!(stop, Stop::Finished, "{what}: {}", m.dump());
        let c = m.counters();
        assert_eq!(c.get(Counter::KvmDirtyLogHarvests), 3, "{what}");
        let harvested = c.get(Counter::KvmDirtyPagesHarvested);
        // 1,024 at the first clear; then at most the 64 written pages each time.
        assert!(
            (1024 + 64..=1024 + 2 * 64).contains(&harvested),
            "{what}: {harvested}"
        );
    }
}

/// Shadow paging (EPT off): the guest's page tables are shadowed; vcpu0 zaps 16 of the pages
/// vcpu1 reads (the page table goes unsync; the INVLPGs of the flush sync its SPTEs), then
/// unmaps a whole page table of its own (an emulated PMD write). Every use is checked: a stale
/// SPTE after a flush would stop the run.
#[test]
fn shadow_paging_faults_unsyncs_and_syncs_on_guest_flushes() {
    let o = Options {
        ept: false,
        ..Options::default()
    };
    let mut m = vm(2, o, vec![ram(0, 0, 0x800, false), allocator_ram()]);
    let mm = m.add_mm("g");
    m.map_pages(mm, 0x200, 64, true);
    m.map_pages(mm, 0x400, 8, true);
    m.add_task(
        "zapper",
        mm,
        0,
        vec![
            UserOp::TouchRange {
                start: 0x200,
                npages: 64,
                write: true,
            },
            UserOp::MadviseDontneed {
                start: 0x200,
                npages: 16,
            },
            UserOp::Loop {
                to: 0,
                times: Some(20),
            },
            UserOp::TouchRange {
                start: 0x400,
                npages: 8,
                write: true,
            },
            UserOp::Munmap {
                start: 0x400,
                npages: 512,
            },
            UserOp::Exit,
        ],
    );
    m.add_task(
        "reader",
        mm,
        1,
        vec![
            UserOp::TouchRange {
                start: 0x200,
                npages: 32,
                write: false,
            },
            UserOp::Loop {
                to: 0,
                times: Some(40),
            },
            UserOp::Exit,
        ],
    );
    let (stop, _) = run(&mut m, 50);
    assert_eq!(stop, Stop::Finished);
    let c = m.counters();
    // Each zap of a page both vCPUs read is faulted in again, or prefetched beside a fault
    // (FNAME(pte_prefetch): the aligned group of 8 around it).
    let (faults, prefetched) = (
        c.get(Counter::KvmShadowFaults),
        c.get(Counter::KvmPtePrefetch),
    );
    assert!(
        faults + prefetched >= 64 + 8 + 20 * 16,
        "{faults} + {prefetched}"
    );
    assert!(
        prefetched > 0 && faults < 64 + 8 + 20 * 16,
        "{faults} + {prefetched}"
    );
    // One shadow page per guest page table (0x200 and 0x400 groups).
    assert_eq!(c.get(Counter::KvmShadowPages), 2);
    // The madvise flushes 16 pages with INVLPGs on both vCPUs (the reader's when it runs the
    // mm), every one an exit.
    assert!(c.get(Counter::KvmInvlpg) >= 20 * 16, "{c:?}");
    // free_pgtables() clears the PMD entry of 0x400's table: one emulated write.
    assert_eq!(c.get(Counter::KvmMmuPteWrite), 1);
    assert_eq!(c.get(Counter::KvmEptViolations), 0);
    assert_eq!(m.shadow_rmap_mismatch(), None);
    assert!(m.perf.uses_checked > 0);
}

/// Shadow paging's sync in both eras (`shadow_sync_flush`): with a flush ceiling of one page a
/// `madvise` is a full flush, whose CR3 reload syncs the unsync page. The dropped SPTEs count
/// in `kvm->tlbs_dirty` (before f81602958c11) or not at all (v5.15, which flushes at once);
/// the kept ones were accessed, so either era flushes remotely. A page the sync empties is
/// zapped (`munmap` of the whole 8-page group).
#[test]
fn shadow_paging_sync_counts_tlbs_dirty_in_its_era() {
    for era in [
        options::ShadowSyncFlush::TlbsDirty,
        options::ShadowSyncFlush::Remote,
    ] {
        let o = Options {
            ept: false,
            shadow_sync_flush: era,
            tlb_single_page_flush_ceiling: options::AtLeastOne(1),
            ..Options::default()
        };
        let mut m = vm(2, o, vec![ram(0, 0, 0x800, false), allocator_ram()]);
        let mm = m.add_mm("g");
        m.map_pages(mm, 0x200, 64, true);
        m.map_pages(mm, 0x400, 8, true);
        let ops = vec![
            UserOp::TouchRange {
                start: 0x200,
                npages: 64,
                write: true,
            },
            UserOp::MadviseDontneed {
                start: 0x200,
                npages: 16,
            },
            UserOp::TouchRange {
                start: 0x400,
                npages: 8,
                write: true,
            },
            UserOp::Munmap {
                start: 0x400,
                npages: 8,
            },
            UserOp::Exit,
        ];
        m.add_task("zapper", mm, 0, ops);
        let (stop, _) = run(&mut m, 50);
        assert_eq!(stop, Stop::Finished);
        let c = m.counters();
        let dirty = c.get(Counter::KvmTlbsDirty);
        match era {
            options::ShadowSyncFlush::TlbsDirty => assert!(dirty >= 16, "{dirty}"),
            options::ShadowSyncFlush::Remote => assert_eq!(dirty, 0),
        }
        assert!(c.get(Counter::KvmSyncPage) >= 2, "{c:?}");
        assert!(c.get(Counter::KvmSyncZap) >= 1, "{c:?}");
        assert!(c.get(Counter::KvmRemoteTlbFlush) >= 2, "{c:?}");
        assert_eq!(m.shadow_rmap_mismatch(), None);
        assert!(m.perf.uses_checked > 0);
    }
}

/// Shadow paging under MMU notifiers in the timed driver: a host thread invalidates the frames
/// two vCPUs keep touching, in both eras of the sync. Its rmap walks zap their SPTEs, a vCPU
/// that needs `mmu_lock` meanwhile spins, every use is checked, and the rmaps stay in step.
#[test]
fn shadow_paging_runs_under_mmu_notifier_invalidations() {
    let mut waits = 0;
    for era in [
        options::ShadowSyncFlush::TlbsDirty,
        options::ShadowSyncFlush::Remote,
    ] {
        let o = Options {
            ept: false,
            shadow_sync_flush: era,
            tlb_single_page_flush_ceiling: options::AtLeastOne(1),
            ..Options::default()
        };
        let mut m = vm(2, o, vec![ram(0, 0, 0x800, false), allocator_ram()]);
        let mm = m.add_mm("g");
        m.map_pages(mm, 0x200, 32, true);
        let touch = |write| UserOp::TouchRange {
            start: 0x200,
            npages: 32,
            write,
        };
        let zapper = vec![
            touch(true),
            UserOp::MadviseDontneed {
                start: 0x200,
                npages: 4,
            },
            UserOp::Loop {
                to: 0,
                times: Some(20),
            },
            UserOp::Exit,
        ];
        let reader = vec![
            touch(false),
            UserOp::Loop {
                to: 0,
                times: Some(40),
            },
            UserOp::Exit,
        ];
        m.add_task("zapper", mm, 0, zapper);
        m.add_task("reader", mm, 1, reader);
        m.add_host_thread(
            "reclaim",
            0,
            2,
            vec![
                HostOp::Compute { ns: 20_000 },
                HostOp::InvalidateGfns {
                    gfn: 0,
                    npages: 0x800,
                },
                HostOp::Loop {
                    to: 0,
                    times: Some(20),
                },
                HostOp::Exit,
            ],
        );
        let (stop, _) = run(&mut m, 100);
        assert_eq!(stop, Stop::Finished, "{era:?}: {}", m.dump());
        let c = m.counters();
        assert!(c.get(Counter::KvmMmuNotifierInvalidations) >= 20, "{c:?}");
        assert!(c.get(Counter::KvmShadowFaults) > 0, "{c:?}");
        assert_eq!(m.shadow_rmap_mismatch(), None, "{era:?}");
        assert!(m.perf.uses_checked > 0);
        waits += c.get(Counter::KvmShadowLockWaits);
    }
    // Some vCPU step found the lock taken by the invalidation and spun.
    assert!(waits > 0);
}

/// Shadow paging with guest THP: a guest 2 MiB page is shadowed by 4 KiB SPTEs in a direct
/// page, and its zap and refault (emulated PMD writes) give it a new one, beside a second
/// process on vcpu0, with PCIDs and without. Every use is checked.
#[test]
fn shadow_paging_maps_guest_huge_pages() {
    for pcid in [true, false] {
        let o = Options {
            ept: false,
            pcid,
            transparent_hugepage: options::Thp::Always,
            ..Options::default()
        };
        let mut m = vm(2, o, vec![ram(0, 0, 0x800, false), allocator_ram()]);
        let a = m.add_mm("a");
        let b = m.add_mm("b");
        m.map_pages(b, 0x200, 16, true);
        let huge = vec![
            UserOp::TouchRange {
                start: 0x400,
                npages: 64,
                write: true,
            },
            UserOp::MadviseDontneed {
                start: 0x400,
                npages: 512,
            },
            UserOp::Loop {
                to: 0,
                times: Some(100),
            },
            UserOp::Exit,
        ];
        let small = vec![
            UserOp::TouchRange {
                start: 0x200,
                npages: 16,
                write: true,
            },
            UserOp::Compute { ns: 100_000 },
            UserOp::Loop {
                to: 0,
                times: Some(100),
            },
            UserOp::Exit,
        ];
        m.add_task("huge", a, 0, huge.clone());
        m.add_task("small", b, 0, small);
        m.add_task("huge2", a, 1, huge);
        let (stop, _) = run(&mut m, 500);
        assert_eq!(stop, Stop::Finished, "pcid={pcid}");
        let c = m.counters();
        assert!(c.get(Counter::ThpFaultAlloc) >= 200, "pcid={pcid}: {c:?}");
        // Each zap and each refault of the huge page is a guest PMD write KVM emulates.
        assert!(c.get(Counter::KvmMmuPteWrite) >= 400, "pcid={pcid}: {c:?}");
        // One shadow fault per huge fault at least: the 2 MiB TLB entry it fills covers the
        // rest of the group (shadow.rs: the model's TLB caches the guest leaf's size).
        assert!(c.get(Counter::KvmShadowFaults) >= 200, "pcid={pcid}: {c:?}");
        assert_eq!(c.get(Counter::KvmMmioExits), 0, "pcid={pcid}");
        assert_eq!(c.get(Counter::KvmMmioEmulated), 0, "pcid={pcid}");
        assert_eq!(m.shadow_rmap_mismatch(), None, "pcid={pcid}");
    }
}

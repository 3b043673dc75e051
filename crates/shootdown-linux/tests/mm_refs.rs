//! `mm_users` / `mm_count` and kernel threads borrowing an mm (`mm_refs.rs`) in the timed driver.

mod common;
use common::{machine, run_to_end};
use shootdown_linux::*;

#[test]
fn a_worker_borrows_an_mm_while_its_owner_zaps_it_and_the_counts_balance() {
    let mut m = machine(2);
    let mm = m.add_mm("mm1");
    m.map_pages(mm, 0x10, 1, true);
    // A vhost-like worker: borrow, write the page, give it back, 20 times.
    m.add_kthread(
        "worker",
        0,
        vec![
            UserOp::UseMm { mm },
            UserOp::Touch {
                vpn: 0x10,
                write: true,
            },
            UserOp::UnuseMm,
            UserOp::Compute { ns: 5_000 },
            UserOp::Loop {
                to: 0,
                times: Some(20),
            },
            UserOp::Exit,
        ],
    );
    m.add_task(
        "owner",
        mm,
        1,
        vec![
            UserOp::MadviseDontneed {
                start: 0x10,
                npages: 1,
            },
            UserOp::Compute { ns: 5_000 },
            UserOp::Loop {
                to: 0,
                times: Some(20),
            },
            UserOp::Exit,
        ],
    );
    assert_eq!(m.mms[mm as usize].mm_users, 1);
    run_to_end(&mut m, 100, 10_000_000);
    // Every borrow was given back and the owner is gone (the run ends at its exit, before its
    // last context switch); each task that runs on mm1 without owning it (an idle task, the
    // exited owner) holds one reference, so its page tables were never freed.
    let m1 = &m.mms[mm as usize];
    assert_eq!(m1.mm_users, 0);
    let lazy = m
        .tasks
        .iter()
        .filter(|t| t.mm.is_none() && t.active_mm == Some(mm))
        .count() as u32;
    assert!(lazy >= 1);
    assert_eq!(m1.mm_count, lazy);
    assert!(m.counters().get(Counter::NrTlbRemoteFlush) > 0);
}

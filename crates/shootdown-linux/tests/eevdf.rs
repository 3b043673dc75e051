//! The kernel's task scheduler in its two forms (`sched = "fifo" | "eevdf"`, `fair.rs`), seen
//! through pipes (`pipe.rs`): whether a woken reader preempts a CPU hog.

mod common;
use common::{machine_with, run_to_end};
use shootdown_engine::Time;
use shootdown_linux::*;

/// A reader and a hog share CPU 0; a writer on CPU 1 computes 1 ms, then writes one message to
/// the reader's pipe. Returns how long after the write the reader got its message (its `Mark`),
/// and the run's wake-up preemptions.
fn reader_latency(sched: &str) -> (Time, u64) {
    let mut opts = Options::default();
    opts.set("sched", &OptValue::Str(sched.into())).unwrap();
    let mut m = machine_with(2, opts);
    let pipe = m.add_pipe(16);
    let hog_mm = m.add_mm("hog");
    m.add_task(
        "hog",
        hog_mm,
        0,
        vec![
            UserOp::Compute { ns: 50_000 },
            UserOp::Loop {
                to: 0,
                times: Some(99),
            },
            UserOp::Exit,
        ],
    );
    let reader_mm = m.add_mm("reader");
    let reader = m.add_task(
        "reader",
        reader_mm,
        0,
        vec![UserOp::PipeRead { pipe }, UserOp::Mark, UserOp::Exit],
    );
    let writer_mm = m.add_mm("writer");
    let writer = m.add_task(
        "writer",
        writer_mm,
        1,
        vec![
            UserOp::Compute { ns: 1_000_000 },
            UserOp::Mark,
            UserOp::PipeWrite { pipe },
            UserOp::Exit,
        ],
    );
    run_to_end(&mut m, 100, 10_000_000);
    let wrote = m.perf.marks[writer as usize][0];
    let read = m.perf.marks[reader as usize][0];
    assert_eq!(m.pipes[pipe as usize].msgs, 0, "the message was read");
    (
        read.saturating_sub(wrote),
        m.perf.counters.get(Counter::WakeupPreemptions),
    )
}

#[test]
fn a_woken_reader_with_lag_preempts_the_hog_under_eevdf_and_waits_out_the_slice_under_fifo() {
    // EEVDF: the reader slept with positive lag (it ran less than the hog), so it wakes left of
    // V with the hog made ineligible: pick_eevdf picks it, and the hog is preempted at its
    // next return to user (within one 50 us compute).
    let (eevdf, preemptions) = reader_latency("eevdf");
    assert_eq!(preemptions, 1);
    assert!(eevdf < Time::from_us(60), "{eevdf:?}");
    // FIFO: the reader waits for the hog's 3 ms time slice to end.
    let (fifo, none) = reader_latency("fifo");
    assert_eq!(none, 0);
    assert!(fifo > Time::from_us(1_000), "{fifo:?}");
}

#[test]
fn a_full_pipe_blocks_its_writer_until_the_reader_makes_room() {
    let mut m = machine_with(2, Options::default());
    let pipe = m.add_pipe(2);
    let a = m.add_mm("writer");
    let b = m.add_mm("reader");
    m.add_task(
        "writer",
        a,
        0,
        vec![
            UserOp::PipeWrite { pipe },
            UserOp::Loop {
                to: 0,
                times: Some(9),
            },
            UserOp::Exit,
        ],
    );
    m.add_task(
        "reader",
        b,
        1,
        vec![
            UserOp::Compute { ns: 20_000 },
            UserOp::PipeRead { pipe },
            UserOp::Loop {
                to: 0,
                times: Some(9),
            },
            UserOp::Exit,
        ],
    );
    run_to_end(&mut m, 100, 10_000_000);
    // Ten messages through a pipe of two: the writer slept on wr_wait and was woken.
    assert_eq!(m.pipes[pipe as usize].msgs, 0);
    assert!(m.perf.counters.get(Counter::ContextSwitches) >= 8);
}

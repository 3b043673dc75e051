//! Amit et al.'s flush designs in the timed driver: early acknowledgement (`smp.rs`,
//! option `early_ack`) and in-context PTI user flushes (`tlb.rs`, option `pti_user_flush`). A
//! thread madvises pages of its own while another thread of the process reads the same pages
//! on the other CPU, so every madvise is a shootdown.

mod common;
use shootdown_engine::timed::{Limits, Stop, TimedDriver};
use shootdown_engine::trace::TraceEvent;
use shootdown_engine::{Model, Time};
use shootdown_hw::{CostProfile, Features, Topology};
use shootdown_linux::options::{EarlyAck, PtiUserFlush};
use shootdown_linux::*;
use std::sync::Arc;

/// 2 CPUs of uniform 10 ns costs but a 2 µs IPI delivery, PTI as asked; 208 rounds of: write page 0x10 + i (mod 16),
/// madvise it away, while the other thread reads all 16 pages in a loop. Returns the stop,
/// the trace's instant marks (Perfetto) and the counters.
fn run(opts: Options, pti: bool) -> (Stop, Vec<&'static str>, Counters) {
    let topo = Topology::new(1, 2, 1).unwrap();
    let features = Features {
        pti,
        ..Features::modern()
    };
    let mut prof = CostProfile::uniform("t", 10.0, features);
    prof.costs.ipi_latency_same_socket = Time::from_ns(2_000);
    let prof = Arc::new(prof);
    let mut m = Machine::new(topo, prof, opts, MemoryModel::Sc);
    let mm = m.add_mm("mm1");
    common::madvise_against_reader(&mut m, mm, 2_000, 500, 2_000);
    let mut d = TimedDriver::new(m.agents(), 1, 0);
    d.enable_trace();
    let st = d.run(
        &mut m,
        Limits {
            max_time: Time::from_ms(100),
            max_steps: 10_000_000,
        },
    );
    let marks = d
        .take_trace()
        .into_iter()
        .filter_map(|e| match e.ev {
            TraceEvent::Instant { name, .. } => Some(name),
            _ => None,
        })
        .collect();
    (st.stop, marks, m.counters().clone())
}

/// How many of the trace's instant marks are named `name`.
fn count(marks: &[&str], name: &str) -> u64 {
    marks.iter().filter(|&&m| m == name).count() as u64
}

fn with_early_ack(early_ack: EarlyAck) -> Options {
    Options {
        early_ack,
        ..Options::default()
    }
}

#[test]
fn early_acked_flushes_are_acknowledged_before_they_run() {
    let (stop, _, off) = run(with_early_ack(EarlyAck::Off), false);
    assert_eq!(stop, Stop::Finished);
    assert_eq!(off.get(Counter::EarlyAcks), 0);
    let (stop, marks, on) = run(with_early_ack(EarlyAck::Acked), false);
    assert_eq!(stop, Stop::Finished, "the oracle found nothing");
    let shootdowns = on.get(Counter::TlbShootdowns);
    assert!(shootdowns >= 150, "{shootdowns}");
    // Every flush the reader's CPU ran from an IPI was acknowledged first (none frees tables),
    // each with its Perfetto mark.
    assert_eq!(on.get(Counter::EarlyAcks), shootdowns);
    assert_eq!(count(&marks, "early ack"), shootdowns);
}

#[test]
fn the_rfc_as_posted_returns_before_the_target_flushed() {
    // wait = 0: madvise returns and frees the page while the reader may still use it.
    let (stop, _, _) = run(with_early_ack(EarlyAck::RfcV2), false);
    assert!(matches!(stop, Stop::Violation(_)), "{stop:?}");
}

#[test]
fn deferred_user_flushes_leave_the_user_pcid_to_the_return_to_user() {
    let deferred = Options {
        pti_user_flush: PtiUserFlush::Deferred,
        ..Options::default()
    };
    let (stop, _, imm) = run(Options::default(), true);
    assert_eq!(stop, Stop::Finished);
    assert_eq!(imm.get(Counter::UserFlushDeferred), 0);
    let (stop, marks, def) = run(deferred.clone(), true);
    assert_eq!(stop, Stop::Finished, "the oracle found nothing");
    // Each shootdown's one page is deferred by the reader's handler; the zapper's own local
    // flushes are not. Each deferred range is flushed at a return to user (a Perfetto mark),
    // several merged into one when they arrive before it.
    let shootdowns = def.get(Counter::TlbShootdowns);
    assert!(shootdowns >= 150, "{shootdowns}");
    assert_eq!(def.get(Counter::UserFlushDeferred), shootdowns);
    let returns = count(&marks, "deferred user flush");
    assert!(
        returns > 0 && returns <= shootdowns,
        "{returns} {shootdowns}"
    );
    // Without PTI there is no user PCID to defer.
    let (stop, _, nopti) = run(deferred, false);
    assert_eq!(stop, Stop::Finished);
    assert_eq!(nopti.get(Counter::UserFlushDeferred), 0);
}

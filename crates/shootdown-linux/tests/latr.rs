//! LATR in the timed driver (`latr.rs`): a thread madvises pages of its own while another thread
//! of the process computes on the other CPU. Its flushes are saved for the other CPU's ticks
//! instead of IPIs; with `lazy_free` the oracle finds nothing, and the artifact's default
//! configuration (`latr`) frees a page the other CPU still maps.

mod common;
use common::machine_with;
use shootdown_engine::timed::{Limits, Stop, TimedDriver};
use shootdown_engine::{Model, Time};
use shootdown_linux::options::Latr;
use shootdown_linux::*;

/// 200 rounds of: write page 0x10 + i (mod 16), madvise it away; the other thread reads all 16
/// pages in a loop for 20 ms. Returns the run's stop and counters.
fn run(latr: Latr) -> (Stop, Counters) {
    let opts = Options {
        latr,
        ..Options::default()
    };
    let mut m = machine_with(2, opts);
    let mm = m.add_mm("mm1");
    common::madvise_against_reader(&mut m, mm, 20_000, 5_000, 4_000);
    let st = TimedDriver::new(m.agents(), 1, 0).run(
        &mut m,
        Limits {
            max_time: Time::from_ms(100),
            max_steps: 10_000_000,
        },
    );
    (st.stop, m.counters().clone())
}

#[test]
fn lazy_free_saves_the_flushes_for_the_ticks_and_holds_the_pages() {
    let (stop, c) = run(Latr::LazyFree);
    assert_eq!(stop, Stop::Finished, "the oracle found nothing");
    // 208 madvises, each flush saved. The IPIs left are copy-on-write flushes (LATR keeps
    // them): the zapper's write to a zero page the reader had faulted in (`wp_page_copy`).
    assert_eq!(c.get(Counter::LatrSaved), 208);
    assert!(
        c.get(Counter::TlbShootdowns) < 20,
        "{}",
        c.get(Counter::TlbShootdowns)
    );
    // The zapper is done within two ticks of cpu1, which drain every saved flush.
    assert_eq!(c.get(Counter::LatrTicks), 2);
    assert_eq!(c.get(Counter::LatrFlushes), 208);
}

#[test]
fn without_lazy_free_a_page_is_freed_while_the_other_cpu_maps_it() {
    let (stop, _) = run(Latr::Latr);
    assert!(matches!(stop, Stop::Violation(_)), "{stop:?}");
}

#[test]
fn without_latr_every_flush_is_an_ipi() {
    let (stop, c) = run(Latr::Off);
    assert_eq!(stop, Stop::Finished);
    assert_eq!(c.get(Counter::LatrSaved), 0);
    assert!(
        c.get(Counter::TlbShootdowns) >= 150,
        "{}",
        c.get(Counter::TlbShootdowns)
    );
}

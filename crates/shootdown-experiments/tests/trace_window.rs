//! Traces of the interesting window: the automatic window holds the workload's shootdowns, each
//! IPI is one arrow with its own id that lands no earlier than its send completed, and every
//! slice opened in the window is closed in it — natively and in a guest.

use shootdown_experiments::{load, trace_point};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Trace point 0's first variant of `file` and return its events.
fn trace(file: &str, sets: &[&str], variant: &str, from_ms: Option<f64>) -> Vec<serde_json::Value> {
    let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
    let e = load(&root().join("experiments/seeds").join(file), &sets).unwrap();
    let dir = root().join("target").join("trace-window-test");
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join(format!("{file}-{variant}-{from_ms:?}.json"));
    trace_point(&e, true, 0, variant, from_ms, 1.0, &out).unwrap();
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    v["traceEvents"].as_array().unwrap().clone()
}

/// Flow arrows by id: (send ts, arrival ts).
fn flows(events: &[serde_json::Value]) -> BTreeMap<u64, (Option<f64>, Option<f64>)> {
    let mut m: BTreeMap<u64, (Option<f64>, Option<f64>)> = BTreeMap::new();
    for ev in events {
        let ts = ev["ts"].as_f64();
        match ev["ph"].as_str() {
            Some("s") => {
                let e = m.entry(ev["id"].as_u64().unwrap()).or_default();
                assert!(e.0.is_none(), "flow id {} sent twice", ev["id"]);
                e.0 = ts;
            }
            Some("f") => {
                let e = m.entry(ev["id"].as_u64().unwrap()).or_default();
                assert!(e.1.is_none(), "flow id {} arrives twice", ev["id"]);
                e.1 = ts;
            }
            _ => {}
        }
    }
    m
}

/// Every `B` has its `E` on the same track, in order, and nothing stays open.
fn assert_balanced(events: &[serde_json::Value]) {
    let mut open: BTreeMap<u64, Vec<(String, f64)>> = BTreeMap::new();
    for ev in events {
        let tid = ev["tid"].as_u64().unwrap_or(u64::MAX);
        match ev["ph"].as_str() {
            Some("B") => open.entry(tid).or_default().push((
                ev["name"].as_str().unwrap().into(),
                ev["ts"].as_f64().unwrap(),
            )),
            Some("E") => {
                let (_, began) = open
                    .entry(tid)
                    .or_default()
                    .pop()
                    .unwrap_or_else(|| panic!("an end without a begin on track {tid}"));
                assert!(ev["ts"].as_f64().unwrap() >= began);
            }
            _ => {}
        }
    }
    assert!(open.values().all(|s| s.is_empty()), "left open: {open:?}");
}

fn check(file: &str, sets: &[&str], variant: &str) {
    let events = trace(file, sets, variant, None);
    assert_balanced(&events);
    let f = flows(&events);
    assert!(!f.is_empty(), "{file}: the automatic window holds no IPI");
    let mut arrived = 0;
    for (id, (sent, landed)) in &f {
        let sent = sent.unwrap_or_else(|| panic!("{file}: flow {id} arrives but was never sent"));
        if let Some(landed) = landed {
            arrived += 1;
            assert!(
                *landed >= sent,
                "{file}: IPI {id} delivered at {landed} µs, before its send completed at {sent} µs"
            );
        }
    }
    assert!(arrived > 0, "{file}: no IPI lands in the window");
}

#[test]
fn native_ipis_land_after_their_send_and_each_has_its_own_arrow() {
    check("seed002-pthread-mmap.toml", &[], "before");
    check(
        "seed000-sysbench-no-mitigations.toml",
        &["experiment.quick_rows=[8]"],
        "before",
    );
}

#[test]
fn guest_ipis_land_after_their_send_and_each_has_its_own_arrow() {
    check("seed002-madv-dontneed.toml", &[], "before");
    check(
        "seed001-ebizzy-pv.toml",
        &["experiment.quick_rows=[2]"],
        "vanilla",
    );
}

/// An explicit start keeps exactly `[from, from + duration)`, re-opening at `from` what was
/// running then.
#[test]
fn an_explicit_window_starts_where_asked_and_reopens_running_slices() {
    let events = trace("seed002-madv-dontneed.toml", &[], "before", Some(0.5));
    assert_balanced(&events);
    let ts: Vec<f64> = events.iter().filter_map(|e| e["ts"].as_f64()).collect();
    assert!(!ts.is_empty());
    assert!(ts.iter().all(|&t| (500.0..=1500.0).contains(&t)), "{ts:?}");
    assert!(
        events
            .iter()
            .any(|e| e["ph"] == "B" && e["ts"].as_f64() == Some(500.0)),
        "nothing re-opened at the window's start"
    );
}

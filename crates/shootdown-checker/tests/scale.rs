//! `check --set`: scenario keys overridden before validation, and `cpus=N` growing a scenario
//! by copies of its last role (`scale.rs`). State counts are pinned: depth-first search's do not
//! depend on the number of threads.

use shootdown_checker::check;
use std::path::PathBuf;

fn scenario(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../scenarios")
        .join(format!("{name}.toml"))
}

fn sets(s: &[&str]) -> Vec<String> {
    s.iter().map(|x| x.to_string()).collect()
}

#[test]
fn a_grown_scenario_verifies_and_says_what_it_added() {
    let sc = scenario("pv_tlb_flush");
    let r = check(
        &sc,
        None,
        "sc",
        None,
        None,
        0,
        "dfs",
        true,
        &sets(&["cpus=3"]),
    )
    .unwrap();
    assert_eq!(r.verdict, "verified");
    assert_eq!((r.states, r.transitions), (36_948, 96_181));
    assert_eq!(
        r.notes[0],
        "--set cpus=3: cpu2 runs a copy of cpu1's tasks (reader)"
    );
    // The plain scenario is smaller: the copy really runs.
    let plain = check(&sc, None, "sc", None, None, 0, "dfs", true, &[]).unwrap();
    assert!(plain.states < r.states / 10, "{}", plain.states);
    assert!(plain.notes.is_empty(), "{:?}", plain.notes);
}

#[test]
fn a_mutant_is_still_found_in_the_grown_scenario() {
    let sc = scenario("pv_tlb_flush");
    let r = check(
        &sc,
        Some("pv_set_preempted_clobbers_flush"),
        "sc",
        None,
        None,
        0,
        "auto",
        true,
        &sets(&["cpus=3"]),
    )
    .unwrap();
    assert_eq!(r.verdict, "violation");
    assert_eq!(r.invariant.as_deref(), Some("INV-STALE"));
}

#[test]
fn options_and_array_elements_can_be_set() {
    let sc = scenario("smp_call_concurrent");
    let r = check(
        &sc,
        Some("inc_tlb_gen_after_ipis"),
        "sc",
        None,
        None,
        0,
        "auto",
        true,
        &sets(&["options.smp_call=remote_then_local"]),
    )
    .unwrap();
    // The mutant lives in the concurrent flush: the older form never runs it.
    assert_eq!(r.verdict, "verified");
    let more = check(
        &sc,
        None,
        "sc",
        None,
        None,
        0,
        "dfs",
        true,
        &sets(&["mms.0.map.0.npages=2"]),
    )
    .unwrap();
    assert_eq!(more.verdict, "verified");
}

#[test]
fn bad_sets_are_one_line_errors_naming_the_key() {
    let sc = scenario("smp_call_concurrent");
    for (set, key, why) in [
        (
            "cpus=2",
            "cpus",
            "--set can only grow a scenario (3 CPUs, asked for 2)",
        ),
        (
            "tasks.9.cpu=1",
            "tasks.9.cpu",
            "'tasks' is an array of 3: index it with 0 to 2",
        ),
        (
            "options.smp_call=bogus",
            "options.smp_call",
            "unknown value 'bogus'",
        ),
        ("cpus", "cpus", "--set expects KEY=VALUE"),
        ("nosuch=1", "nosuch", "unknown field"),
    ] {
        let e = check(&sc, None, "sc", None, None, 0, "dfs", true, &sets(&[set])).unwrap_err();
        let msg = e.to_string();
        assert_eq!(e.key, key, "{set}: {msg}");
        assert!(msg.contains(why), "{set}: {msg}");
        assert_eq!(msg.lines().count(), 1, "{msg}");
    }
}

//! What the explorer assumes of a state's copy and of its fingerprint, checked along walks of
//! every scenario under both memory models:
//!
//! * successors are built in a reused state with `clone_from` (`clone_by_fields!`): a copy made
//!   that way must be the source, whatever the destination held before — equal, with the same
//!   fingerprint, and stepping alike (each state is copied into one buffer that last held
//!   another state, of another scenario, size or memory model);
//! * fingerprints leave out the fields `hash_by_fields!` declares fixed for a run (options,
//!   topology, programs, names, host configuration): no step may change them;
//! * components remember their digests (`HashCached`): after every step, of the walked state
//!   and of its copy, the fingerprint from remembered digests is the one computed afresh;
//! * interning (`Interner`, as the breadth-first searches do to every state they store)
//!   changes no value or fingerprint, and an interned state steps like any other: the walked
//!   state and its copy are interned after every step, into one interner for the run, so
//!   that they share components with each other and with earlier states; a walk never
//!   interned takes the same steps to the same states (stowing the performance arrays of a
//!   stored state changes no step).
mod common;
use common::*;
use shootdown_checker::explore::{fingerprint, ExploreEnv};
use shootdown_checker::{scenario::parse_memory_model, Scenario};
use shootdown_engine::{Interner, Model};
use shootdown_linux::Machine;

#[test]
fn clone_from_copies_every_scenario_state_exactly() {
    let mut paths: Vec<_> = std::fs::read_dir(scenarios())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        .collect();
    paths.sort();
    assert!(paths.len() > 20, "scenarios found: {}", paths.len());
    let mut scratch: Option<Machine> = None;
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    for path in &paths {
        let sc = Scenario::load(path).unwrap();
        for mm in ["sc", "tso"] {
            let mut m = sc.build(None, parse_memory_model(mm).unwrap()).unwrap();
            // One per run, as in the searches: a component's digest leaves out its fields
            // fixed for the run (a task's program).
            let interner = Interner::default();
            let init = m.clone();
            // The same walk, never interned: stowing a stored state's performance arrays
            // (`Perf::stow`) must change no step.
            let mut plain = m.clone();
            let mut enabled = Vec::new();
            for _ in 0..300 {
                let copy = match &mut scratch {
                    Some(t) => {
                        t.clone_from(&m);
                        t
                    }
                    None => scratch.insert(m.clone()),
                };
                assert!(*copy == m, "{}: clone_from differs", path.display());
                assert_eq!(fingerprint(copy), fingerprint(&m));
                enabled.clear();
                m.enabled(&mut enabled);
                let mut again = Vec::new();
                copy.enabled(&mut again);
                assert_eq!(enabled, again);
                if enabled.is_empty() {
                    break;
                }
                rng = rng
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let a = enabled[(rng >> 33) as usize % enabled.len()];
                let o1 = m.apply(a, &mut ExploreEnv::default());
                let o2 = copy.apply(a, &mut ExploreEnv::default());
                assert_eq!(o1.violation, o2.violation, "{}: {a:?}", path.display());
                let o3 = plain.apply(a, &mut ExploreEnv::default());
                assert_eq!(o1.violation, o3.violation, "{}: {a:?}", path.display());
                assert!(
                    plain == m,
                    "{}: an interned state stepped differently",
                    path.display()
                );
                m.intern(&interner);
                copy.intern(&interner);
                assert!(
                    *copy == m,
                    "{}: the copy stepped differently",
                    path.display()
                );
                assert_eq!(copy.finished(), m.finished());
                assert_fixed_alike(&init, &m, path);
                assert_digests_fresh(&m, path);
                assert_digests_fresh(copy, path);
                if o1.violation.is_some() {
                    break;
                }
            }
        }
    }
}

/// The fingerprint from the components' remembered digests is the fingerprint afresh.
fn assert_digests_fresh(m: &Machine, path: &std::path::Path) {
    let remembered = fingerprint(m);
    let mut fresh = m.clone();
    fresh.forget_digests();
    assert_eq!(
        remembered,
        fingerprint(&fresh),
        "{}: a remembered digest is stale",
        path.display()
    );
}

/// The fields fingerprints leave out are those of the initial state.
fn assert_fixed_alike(init: &Machine, m: &Machine, path: &std::path::Path) {
    let p = path.display();
    assert!(
        m.opts == init.opts && m.topo == init.topo,
        "{p}: options or topology changed"
    );
    assert_eq!(
        (m.pcid_hw, m.pti, m.invpcid, m.memory_model),
        (init.pcid_hw, init.pti, init.invpcid, init.memory_model),
        "{p}"
    );
    for (a, b) in init.tasks.iter().zip(&m.tasks) {
        assert!(
            a.name == b.name && a.program == b.program,
            "{p}: task {}",
            a.name
        );
    }
    for (a, b) in init.mms.iter().zip(&m.mms) {
        assert_eq!(a.name, b.name, "{p}");
    }
    if let (Some(a), Some(b)) = (&init.host, &m.host) {
        assert!(a.cfg == b.cfg, "{p}: host configuration changed");
        for (x, y) in a.threads.iter().zip(&b.threads) {
            assert!(
                x.name == y.name && x.program == y.program,
                "{p}: {}",
                x.name
            );
        }
    }
}

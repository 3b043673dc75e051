//! The explorer builds successors in a reused state with `clone_from` (`clone_by_fields!`):
//! a copy made that way must be the source, whatever the destination held before — equal,
//! with the same fingerprint, and stepping alike. Checked along walks of every scenario under
//! both memory models, copying each state into one buffer that last held another state (of
//! another scenario, size or memory model).
mod common;
use common::*;
use shootdown_checker::explore::{fingerprint, ExploreEnv};
use shootdown_checker::{scenario::parse_memory_model, Scenario};
use shootdown_engine::Model;
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
                assert!(
                    *copy == m,
                    "{}: the copy stepped differently",
                    path.display()
                );
                assert_eq!(copy.finished(), m.finished());
                if o1.violation.is_some() {
                    break;
                }
            }
        }
    }
}

//! The plan names every file a run reads, with a digest of its bytes: the experiment, then its
//! profile and each profile it inherits. A sweep's cache key is built from these, so an edit of
//! any of them must change them.

use shootdown_experiments::load;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn copy_tree(dir: &Path) -> PathBuf {
    let exp = dir.join("exp.toml");
    std::fs::create_dir_all(dir.join("profiles")).unwrap();
    std::fs::copy(
        root().join("experiments/seeds/seed000-sysbench-mitigations.toml"),
        &exp,
    )
    .unwrap();
    for p in ["haswell-x-2s48t-mitigations", "haswell-x-2s48t"] {
        std::fs::copy(
            root().join(format!("profiles/{p}.toml")),
            dir.join(format!("profiles/{p}.toml")),
        )
        .unwrap();
    }
    exp
}

fn names_and_digests(exp: &Path, sets: &[String]) -> Vec<(String, String)> {
    load(exp, sets)
        .unwrap()
        .inputs
        .iter()
        .map(|i| {
            let name = Path::new(&i.path)
                .file_name()
                .unwrap()
                .to_string_lossy()
                .into_owned();
            (name, i.sha256.clone())
        })
        .collect()
}

#[test]
fn inputs_are_the_experiment_and_its_profile_chain_and_follow_edits() {
    let dir = root().join("target").join("inputs-test");
    let _ = std::fs::remove_dir_all(&dir);
    let exp = copy_tree(&dir);
    let before = names_and_digests(&exp, &[]);
    let names: Vec<&str> = before.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "exp.toml",
            "haswell-x-2s48t-mitigations.toml",
            "haswell-x-2s48t.toml"
        ]
    );
    assert!(before.iter().all(|(_, d)| d.len() == 64));
    // A profile override changes no file read.
    let set = vec!["profile_override.cost.ipi_latency_same_socket=900".to_string()];
    assert_eq!(names_and_digests(&exp, &set), before);
    // Editing the inherited profile changes its digest and only its digest.
    let inherited = dir.join("profiles/haswell-x-2s48t.toml");
    let mut text = std::fs::read_to_string(&inherited).unwrap();
    text.push_str("\n# edited\n");
    std::fs::write(&inherited, text).unwrap();
    let after = names_and_digests(&exp, &[]);
    assert_eq!(after[..2], before[..2]);
    assert_ne!(after[2], before[2]);
}

#[test]
fn the_plan_carries_inputs_and_sets() {
    let e = load(
        &root().join("experiments/seeds/seed002-madv-dontneed.toml"),
        &["workload.iterations=50".to_string()],
    )
    .unwrap();
    let plan = e.plan_json(true);
    assert_eq!(plan["inputs"].as_array().unwrap().len(), 2);
    assert_eq!(plan["sets"][0], "workload.iterations=50");
}

/// Outside any tree with a `profiles/`, the installed package's profiles
/// (`$SHOOTDOWN_SHIPPED_PROFILES`, set by the Python layer) are the last place searched.
#[test]
fn a_copied_experiment_finds_the_shipped_profiles() {
    let dir = std::env::temp_dir().join(format!("shootdown-shipped-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let exp = dir.join("copy.toml");
    std::fs::copy(
        root().join("experiments/seeds/seed002-madv-dontneed.toml"),
        &exp,
    )
    .unwrap();
    let err = load(&exp, &[]).unwrap_err().to_string();
    assert!(err.contains("installed package's profiles"), "{err}");
    // Only this test sets the variable; for the other tests of this binary it only adds a
    // fallback after the tree's own profiles/.
    std::env::set_var("SHOOTDOWN_SHIPPED_PROFILES", root().join("profiles"));
    let e = load(&exp, &[]).unwrap();
    assert!(e.inputs[1].path.contains("skylake-laptop-kvm-guest.toml"));
    std::fs::remove_dir_all(&dir).unwrap();
}

//! Bad input gives one clear line naming the file, the key and the reason — never a panic.

use shootdown_experiments::load;
use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

/// Write `text` as an experiment under target/ (the repository's profiles/ is found by the
/// ancestor search) and load it.
fn load_text(name: &str, text: &str, sets: &[&str]) -> Result<(), String> {
    let dir = repo().join("target").join("bad-input-tests");
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
    load(&p, &sets).map(|_| ()).map_err(|e| e.to_string())
}

const GOOD: &str = r#"
[experiment]
name = "t"
profile = "skylake-laptop-kvm-guest"
metric = "time"
unit = "us"
[topology]
sockets = 1
cores_per_socket = 2
threads_per_core = 1
[workload]
kind = "madv_dontneed_pingpong"
iterations = 10
[variants.before]
options = { lazy_tlb = "legacy" }
"#;

#[test]
fn good_file_loads() {
    load_text("good.toml", GOOD, &[]).unwrap();
}

fn expect(name: &str, text: &str, sets: &[&str], key: &str, reason: &str) {
    let e = load_text(name, text, sets).unwrap_err();
    assert!(e.contains(name), "names the file: {e}");
    assert!(e.contains(key), "names the key {key}: {e}");
    assert!(e.contains(reason), "gives the reason '{reason}': {e}");
    assert_eq!(e.lines().count(), 1, "one line: {e}");
}

#[test]
fn unknown_keys_are_rejected() {
    expect(
        "unk1.toml",
        &GOOD.replace("metric", "metrc"),
        &[],
        "experiment.metrc",
        "unknown key",
    );
    expect(
        "unk2.toml",
        GOOD,
        &["workload.iterashuns=3"],
        "workload.iterashuns",
        "unknown workload parameter",
    );
    expect(
        "unk3.toml",
        GOOD,
        &["variants.before.options.smp_cal=concurrent"],
        "variants.before.options.smp_cal",
        "unknown option",
    );
    expect(
        "unk4.toml",
        GOOD,
        &["variants.before.options.lazy_tlb=sloppy"],
        "variants.before.options.lazy_tlb",
        "unknown value 'sloppy'",
    );
    expect(
        "unk5.toml",
        GOOD,
        &["variants.before.options.mutant=nope"],
        "variants.before.options.mutant",
        "unknown mutant",
    );
}

#[test]
fn impossible_topologies_are_rejected() {
    expect(
        "topo1.toml",
        GOOD,
        &["topology.sockets=0"],
        "topology.sockets",
        "at least 1",
    );
    expect(
        "topo2.toml",
        GOOD,
        &["topology.threads_per_core=-2"],
        "topology.threads_per_core",
        "at least 0",
    );
    expect(
        "topo3.toml",
        GOOD,
        &["workload.cpu_b=7"],
        "workload.cpu_b",
        "does not exist",
    );
    let sys = GOOD
        .replace("madv_dontneed_pingpong", "sysbench_fileio")
        .replace("iterations = 10", "threads = 9");
    expect(
        "topo4.toml",
        &sys,
        &["workload.file_total_size_mb=8"],
        "workload.threads",
        "only 2 CPUs",
    );
}

#[test]
fn malformed_files_and_values_are_rejected() {
    expect(
        "mal1.toml",
        "[experiment\nname=",
        &[],
        "mal1.toml",
        "malformed TOML",
    );
    expect(
        "mal2.toml",
        GOOD,
        &["workload.iterations=\"many\""],
        "workload.iterations",
        "expected an integer",
    );
    expect(
        "mal3.toml",
        GOOD,
        &["experiment.profile=nosuchmachine"],
        "experiment.profile",
        "no profile 'nosuchmachine'",
    );
    expect("mal4.toml", GOOD, &["oops"], "oops", "KEY=VALUE");
    let e = load(Path::new("/nonexistent/exp.toml"), &[])
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("/nonexistent/exp.toml") && e.contains("cannot read"),
        "{e}"
    );
}

#[test]
fn negative_costs_in_profiles_are_rejected() {
    // Its own directory: a profiles/ beside the other tests' files would shadow the
    // repository's while it is being filled.
    let dir = repo()
        .join("target")
        .join("bad-input-tests-neg")
        .join("profiles");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("broken.toml"),
        "[profile]\nname = \"broken\"\ninherits = \"skylake-laptop-kvm-guest\"\n[cost]\ninvlpg = { value = -5, source = \"typo\" }\n",
    )
    .unwrap();
    std::fs::copy(
        repo().join("profiles/skylake-laptop-kvm-guest.toml"),
        dir.join("skylake-laptop-kvm-guest.toml"),
    )
    .unwrap();
    let p = repo()
        .join("target")
        .join("bad-input-tests-neg")
        .join("neg.toml");
    std::fs::write(&p, GOOD.replace("skylake-laptop-kvm-guest", "broken")).unwrap();
    let e = load(&p, &[]).unwrap_err().to_string();
    assert!(
        e.contains("broken.toml") && e.contains("cost.invlpg") && e.contains("non-negative"),
        "{e}"
    );
}

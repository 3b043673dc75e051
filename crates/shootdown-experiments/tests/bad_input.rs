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
        "must be between 0 and 16384 (got -2)",
    );
    expect(
        "topo3.toml",
        GOOD,
        &["workload.cpu_b=7"],
        "workload.cpu_b",
        "does not exist",
    );
    expect(
        "topo5.toml",
        GOOD,
        &["topology.cores_per_socket=9000", "topology.sockets=9000"],
        "topology.cores_per_socket",
        "9000 x 9000 x 1 logical CPUs is more than the 16384 supported",
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

/// A value the rows would replace is refused instead of silently ignored.
#[test]
fn the_row_key_is_chosen_by_rows_only() {
    let rowed = GOOD.replace(
        "unit = \"us\"",
        "unit = \"us\"\nrow_key = \"iterations\"\nrows = [10, 20]",
    );
    expect(
        "row1.toml",
        &rowed,
        &[],
        "workload.iterations",
        "set per row (experiment.row_key = \"iterations\"); choose it with experiment.rows",
    );
    let rowed = rowed.replace("iterations = 10\n", "");
    load_text("row2.toml", &rowed, &[]).unwrap();
    expect(
        "row3.toml",
        &rowed,
        &["workload.iterations=5"],
        "workload.iterations",
        "choose it with experiment.rows",
    );
    let hosted = rowed.replace(
        "row_key = \"iterations\"\nrows = [10, 20]",
        "row_key = \"vms\"\nrows = [1, 2]",
    ) + "[host]\nvms = 1\nvcpus_per_vm = 2\n";
    load_text("row4.toml", &hosted, &[]).unwrap();
    expect(
        "row5.toml",
        &hosted,
        &["host.vms=2"],
        "host.vms",
        "--set: set per row (experiment.row_key = \"vms\")",
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
    // Counts are bounded above too: a typo'd size fails at load, not by overflow or an
    // endless run.
    expect(
        "mal5.toml",
        GOOD,
        &["workload.iterations=20000000000"],
        "workload.iterations",
        "must be between 1 and 1000000000 (got 20000000000)",
    );
    expect(
        "mal6.toml",
        GOOD,
        &["host.timeslice_us=9223372036854775807"],
        "host.timeslice_us",
        "must be between 1 and 3600000000 (got 9223372036854775807)",
    );
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
        e.contains("broken.toml")
            && e.contains("cost.invlpg")
            && e.contains("between 0 and 1000000000 (got -5)"),
        "{e}"
    );
}

/// `[profile_override]` (here through `--set`) layers costs and features over the named
/// profile for sensitivity studies; the profile's name then says which keys were overridden.
#[test]
fn profile_override_layers_over_the_profile_and_names_itself() {
    let dir = repo().join("target").join("bad-input-tests");
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join("override.toml");
    std::fs::write(&p, GOOD).unwrap();
    let base = load(&p, &[]).unwrap();
    let sets = [
        "profile_override.cost.ipi_latency_same_socket=600".to_string(),
        "profile_override.features.mlp=4".to_string(),
    ];
    let e = load(&p, &sets).unwrap();
    assert_eq!(e.profile.costs.ipi_latency_same_socket.0, 600_000); // ps
    assert_eq!(e.profile.features.mlp, 4);
    assert_eq!(e.profile.costs.invlpg, base.profile.costs.invlpg);
    assert_eq!(
        e.profile.name,
        "skylake-laptop-kvm-guest + override(cost.ipi_latency_same_socket, features.mlp)"
    );
    assert_eq!(base.profile.name, "skylake-laptop-kvm-guest");
}

#[test]
fn bad_profile_overrides_are_rejected() {
    expect(
        "ovr1.toml",
        GOOD,
        &["profile_override.cost.ipi_latncy=600"],
        "profile_override.cost.ipi_latncy",
        "unknown cost key",
    );
    expect(
        "ovr2.toml",
        GOOD,
        &["profile_override.cost.invlpg=-3"],
        "profile_override.cost.invlpg",
        "between 0 and 1000000000 (got -3)",
    );
    expect(
        "ovr5.toml",
        GOOD,
        &["profile_override.cost.invlpg=1e300"],
        "profile_override.cost.invlpg",
        "between 0 and 1000000000 (got 1e300)",
    );
    expect(
        "ovr3.toml",
        GOOD,
        &["profile_override.costs.invlpg=3"],
        "profile_override.costs",
        "unknown section",
    );
    expect(
        "ovr4.toml",
        GOOD,
        &["profile_override.features.pti=maybe"],
        "profile_override.features.pti",
        "expected true or false",
    );
    expect(
        "ovr6.toml",
        GOOD,
        &["profile_override.features.smt_slowdown=0.5"],
        "profile_override.features.smt_slowdown",
        "expected a factor between 1.0 and 4.0 (got 0.5)",
    );
    expect(
        "ovr7.toml",
        GOOD,
        &["profile_override.features.smt_slowdown=\"fast\""],
        "profile_override.features.smt_slowdown",
        "expected a factor between 1.0 and 4.0 (got \"fast\")",
    );
    let e = load(
        &repo().join("target/bad-input-tests/ovr6.toml"),
        &["profile_override.features.smt_slowdown=1.25".to_string()],
    )
    .unwrap();
    assert_eq!(e.profile.features.smt_slowdown_permille, 1250);
}

/// The seed experiments run their machines' profiles as they are: an override there would be a
/// per-table fudge factor.
#[test]
fn seed_experiments_do_not_override_their_profiles() {
    let dir = repo().join("experiments").join("seeds");
    let mut n = 0;
    for f in std::fs::read_dir(&dir).unwrap() {
        let p = f.unwrap().path();
        if p.extension().and_then(|e| e.to_str()) != Some("toml") {
            continue;
        }
        let doc: toml::Table = toml::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
        assert!(!doc.contains_key("profile_override"), "{}", p.display());
        let e = load(&p, &[]).unwrap();
        assert!(!e.profile.name.contains("override"), "{}", p.display());
        n += 1;
    }
    assert!(n >= 5, "found the seed experiments");
}

/// Seed 003's experiment with bad host and memslot settings: one line naming the key.
#[test]
fn bad_kvm_host_and_mmtest_settings_are_rejected() {
    let seed003 = repo().join("experiments/seeds/seed003-mmtest-rom.toml");
    let text = std::fs::read_to_string(&seed003).unwrap();
    let cases: &[(&str, &[&str], &str, &str)] = &[
        (
            "kvm1.toml",
            &["host.vcpus_per_vm=0"],
            "host.vcpus_per_vm",
            "must be between 1 and",
        ),
        (
            "kvm2.toml",
            &["variants.after.options.memslot_zap=\"zap_some\""],
            "variants.after.options.memslot_zap",
            "unknown value 'zap_some' (expected zap_all | fast_invalidate | slot_only)",
        ),
        (
            "kvm3.toml",
            &["workload.ept_leaf=\"1g\""],
            "workload.ept_leaf",
            "unknown value '1g' (expected 2m | 4k)",
        ),
        (
            "kvm4.toml",
            &["workload.threads=9"],
            "workload.threads",
            "9 threads but the VM has 8 vCPUs",
        ),
        (
            "kvm5.toml",
            &["host.vcpus_per_vm=16"],
            "host.vcpus_per_vm",
            "QEMU's thread needs a pCPU of its own",
        ),
        (
            "kvm6.toml",
            &["workload.rom_kb=6"],
            "workload.rom_kb",
            "must be a multiple of 4",
        ),
        (
            "kvm7.toml",
            &["workload.mem_mb=3000000"],
            "workload.mem_mb",
            "between",
        ),
    ];
    for (name, sets, key, reason) in cases {
        expect(name, &text, sets, key, reason);
    }
}

/// A profile's `fitted` list marks the published cells it was fitted on, and only those.
#[test]
fn fitted_costs_mark_their_cells() {
    let e = load(
        &repo().join("experiments/seeds/seed003-mmtest-rom.toml"),
        &[],
    )
    .unwrap();
    assert_eq!(
        e.profile
            .fitted
            .get("user_touch_page")
            .map(|v| v.as_slice()),
        Some(&["seed003-mmtest-rom/after/1".to_string()][..])
    );
    for c in &e.published {
        let want: &[&str] = if c.variant == "after" {
            &["user_touch_page"]
        } else {
            &[]
        };
        assert_eq!(c.fitted, want, "{c:?}");
    }
    // A value set again is no longer the fitted one.
    let e = load(
        &repo().join("experiments/seeds/seed003-mmtest-rom.toml"),
        &["profile_override.cost.user_touch_page=100".to_string()],
    )
    .unwrap();
    assert!(e.published.iter().all(|c| c.fitted.is_empty()));
    // A malformed list names the profile key.
    let dir = repo()
        .join("target")
        .join("bad-input-tests")
        .join("profiles");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("fit-bad.toml"),
        "[profile]\nname = \"fit-bad\"\ninherits = \"skylake-laptop-kvm-guest\"\n[cost]\ninvlpg = { value = 100, fitted = \"t\" }\n",
    )
    .unwrap();
    let e = load_text(
        "fit1.toml",
        &GOOD.replace("skylake-laptop-kvm-guest", "fit-bad"),
        &[],
    )
    .unwrap_err();
    assert!(
        e.starts_with(&dir.join("fit-bad.toml").display().to_string()),
        "{e}"
    );
    assert!(
        e.contains("cost.invlpg.fitted: expected a list of \"EXPERIMENT/VARIANT\""),
        "{e}"
    );
    assert_eq!(e.lines().count(), 1, "{e}");
}

/// Seed 004's boot scripts and MTRR states: a malformed one names the key and the reason.
#[test]
fn boot_scripts_and_mtrr_settings_are_checked() {
    let ovmf = std::fs::read_to_string(repo().join("experiments/seeds/seed004-ovmf.toml"))
        .unwrap()
        .replace("name = \"seed004-ovmf\"", "name = \"t4\"");
    load_text("boot-good.toml", &ovmf, &[]).unwrap();
    // An unknown memory type.
    expect(
        "boot-memtype.toml",
        &ovmf.replacen(
            "{ base = 0x80000000, size = 0x80000000, type = \"uc\" }",
            "{ base = 0x80000000, size = 0x80000000, type = \"uncached\" }",
            1,
        ),
        &[],
        "workload.mtrrs.ovmf.variable[0].type",
        "unknown memory type 'uncached' (expected uc | wc | wt | wp | wb)",
    );
    // Overlapping variable ranges, one of them with a mask that is not contiguous.
    expect(
        "boot-mask.toml",
        &ovmf.replacen(
            "variable = [{ base = 0x80000000, size = 0x80000000, type = \"uc\" }]",
            "variable = [{ base = 0x80000000, size = 0x80000000, type = \"uc\" }, { base = 0x80000000, mask = 0x3fff7fff0000, type = \"wb\" }]",
            1,
        ),
        &[],
        "workload.mtrrs.ovmf.variable",
        "variable range 1: mask 0x3fff7fff0800 is not contiguous from the top",
    );
    // A base not aligned to its size.
    expect(
        "boot-align.toml",
        &ovmf.replacen(
            "{ base = 0x80000000, size = 0x80000000, type = \"uc\" }",
            "{ base = 0x40000000, size = 0x80000000, type = \"uc\" }",
            1,
        ),
        &[],
        "workload.mtrrs.ovmf.variable",
        "is not aligned to the size",
    );
    // A vCPU index past the VM's vCPUs (rows are 8 and 16 vCPUs).
    expect(
        "boot-vcpu.toml",
        &ovmf.replacen(
            "ap = [{ cd = 0 }]",
            "ap = [{ cd = 0 }]\nvcpu = { 17 = [{ cd = 0 }] }",
            1,
        ),
        &[],
        "workload.phases[3].vcpu.17",
        "vCPU index 17 out of range (the VM has 8 vCPUs)",
    );
    // A step that is none of the known ones, an unknown MSR, a sequence that does not exist.
    expect(
        "boot-step.toml",
        &ovmf.replacen("ap = [{ cd = 0 }]", "ap = [{ cdd = 0 }]", 1),
        &[],
        "workload.phases[3].ap[0]",
        "a step needs one of cd, wrmsr",
    );
    expect(
        "boot-msr.toml",
        &ovmf.replacen(
            "{ wrmsr = \"MTRRdefType\", value = 0 }",
            "{ wrmsr = \"MTRRdeftype\", value = 0 }",
            1,
        ),
        &[],
        "workload.sequences.ovmf_set_all_wb[1].wrmsr",
        "unknown MTRR MSR 'MTRRdeftype'",
    );
    expect(
        "boot-value.toml",
        &ovmf.replacen(
            "{ wrmsr = \"MTRRdefType\", value = 0 }",
            "{ wrmsr = \"MTRRdefType\", value = 0xc02 }",
            1,
        ),
        &[],
        "workload.sequences.ovmf_set_all_wb[1].value",
        "MTRRdefType 0xc02: unknown memory type 2",
    );
    expect(
        "boot-run.toml",
        &ovmf.replacen("{ run = \"ovmf_set\" }", "{ run = \"ovmf_sett\" }", 1),
        &[],
        "run",
        "no sequence 'ovmf_sett'",
    );
    expect(
        "boot-fixed.toml",
        &ovmf.replacen(
            "{ from = 0xa0000, to = 0x100000, type = \"uc\" }",
            "{ from = 0xa1000, to = 0x100000, type = \"uc\" }",
            1,
        ),
        &[],
        "workload.mtrrs.ovmf_legacy_uc.fixed[1]",
        "splits the fixed sub-range",
    );
    expect(
        "boot-lock.toml",
        &ovmf.replacen("cache_disable_lock = 0x2a00000", "", 1),
        &[],
        "lock",
        "lock 'cache_disable_lock' has no page",
    );
    // An experiment that reports a counter the model does not have.
    expect(
        "boot-counter.toml",
        &ovmf.replacen(
            "kvm.mtrr_zap_requests\", label",
            "kvm.mtrr_zaps\", label",
            1,
        ),
        &[],
        "experiment.counters[0].counter",
        "unknown counter 'kvm.mtrr_zaps'",
    );
}

//! Bad scenario files and bad arguments are errors naming the file and the key, never panics.
mod common;
use common::*;
use shootdown_checker::{check, list, Scenario};
use std::path::PathBuf;

const GOOD: &str = r#"
description = "ok"
cpus = 2
[options]
lazy_tlb = "mainline"
[[mms]]
name = "mm1"
map = [{ start = 0x10 }]
[[tasks]]
name = "t"
cpu = 1
mm = "mm1"
program = [{ touch = { vpn = 0x10 } }, "exit"]
"#;

fn write(name: &str, text: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("shootdown-checker-errors-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(format!("{name}.toml"));
    std::fs::write(&p, text).unwrap();
    p
}

fn key_of(name: &str, text: &str) -> String {
    let p = write(name, text);
    let e = Scenario::load(&p).expect_err(name);
    let shown = e.to_string();
    assert!(
        shown.starts_with(&format!("{}: {}: ", p.display(), e.key)),
        "{shown}"
    );
    e.key
}

#[test]
fn the_good_file_loads() {
    let p = write("good", GOOD);
    let s = Scenario::load(&p).unwrap();
    assert_eq!(s.name, "good");
    let r = check(&p, None, "sc", Some(100_000), None, 0, "bfs", true, &[]).unwrap();
    assert_eq!(r.verdict, "verified");
}

#[test]
fn errors_name_the_key() {
    let cases: &[(&str, String, &str)] = &[
        ("top", GOOD.replace("cpus = 2", "cpus = 2\ncpu_count = 3"), "cpu_count"),
        ("task_key", GOOD.replace("program =", "progam ="), "progam"),
        ("op", GOOD.replace("touch = {", "tuch = {"), "tuch"),
        ("op_field", GOOD.replace("vpn = 0x10 }", "vpn = 0x10, wirte = true }"), "wirte"),
        ("mm_key", GOOD.replace("map = [", "mapped = ["), "mapped"),
        ("opt_value", GOOD.replace("\"mainline\"", "\"bogus\""), "options.lazy_tlb"),
        ("opt_key", GOOD.replace("lazy_tlb", "lazy_tbl"), "options.lazy_tbl"),
        ("opt_mutant", GOOD.replace("lazy_tlb = \"mainline\"", "mutant = \"x\""), "options.mutant"),
        ("cpu_range", GOOD.replace("cpu = 1", "cpu = 5"), "tasks[0].cpu"),
        ("mm_name", GOOD.replace("mm = \"mm1\"", "mm = \"mm9\""), "tasks[0].mm"),
        ("cpus_type", GOOD.replace("cpus = 2", "cpus = \"two\""), "cpus"),
        ("cpus_zero", GOOD.replace("cpus = 2", "cpus = 0"), "cpus"),
        ("missing", GOOD.replace("description = \"ok\"", ""), "description"),
        (
            "mutant_name",
            format!("{GOOD}\n[[mutants]]\nname = \"nope\"\ndescription = \"x\"\n"),
            "mutants[0].name",
        ),
        (
            "mutant_bug",
            format!("{GOOD}\n[[mutants]]\nname = \"batch_flush_gen_zero\"\nbug = \"N3\"\ndescription = \"x\"\n"),
            "mutants[0].bug",
        ),
        (
            "mutant_key",
            format!("{GOOD}\n[[mutants]]\nname = \"batch_flush_gen_zero\"\nbug = \"N8\"\ndescription = \"x\"\nexpects = \"INV-STALE\"\n"),
            "expects",
        ),
        ("setup", format!("{GOOD}\n[[setup]]\ncpu = 1\nuntil = \"sleeping\"\n"), "setup[0].until"),
        ("setup_both", format!("{GOOD}\n[[setup]]\ncpu = 1\n"), "setup[0]"),
        ("symmetric", GOOD.replace("cpus = 2", "cpus = 2\nsymmetric = [[0, 1]]"), "symmetric[0]"),
        ("loop", GOOD.replace("\"exit\"]", "{ loop = { to = 9 } }]"), "tasks[0].program[1]"),
        ("fdatasync_file", GOOD.replace("\"exit\"]", "{ fdatasync = { file = 1 } }]"), "tasks[0].program[1]"),
        // mremap onto the pre-mapped page, truncate of a file that is not there, a VMA of one.
        (
            "mremap_dest",
            GOOD.replace("\"exit\"]", "{ mremap = { start = 0x30, npages = 1, new_start = 0x10 } }]"),
            "tasks[0].program[1]",
        ),
        (
            "truncate_file",
            GOOD.replace("\"exit\"]", "{ truncate = { file = \"data\" } }]"),
            "tasks[0].program[1]",
        ),
        (
            "vma_file",
            GOOD.replace("map = [", "vmas = [{ start = 0x40, npages = 1, file = \"data\" }]\nmap = ["),
            "mms[0].vmas[0].file",
        ),
        (
            "device_truncate",
            format!(
                "{}\n[[files]]\nname = \"bar\"\nnpages = 1\ndevice = true\n",
                GOOD.replace("\"exit\"]", "{ truncate = { file = \"bar\" } }]")
            ),
            "tasks[0].program[1]",
        ),
    ];
    for (name, text, key) in cases {
        assert_eq!(key_of(name, text), *key, "case {name}");
    }
}

/// Bad memslot and host settings of a `[kvm]` scenario: one line naming the file, the key and
/// the reason.
#[test]
fn bad_kvm_settings_name_the_key_and_the_reason() {
    let kvm = std::fs::read_to_string(scenarios().join("kvm_slot_zap.toml")).unwrap();
    let cases: &[(&str, String, &str, &str)] = &[
        (
            "kvm_overlap",
            kvm.replace("{ id = 2, base = 0x201,", "{ id = 2, base = 0x1ff,"),
            "kvm.memslots[2]",
            "overlap another memslot's 0x0..0x200",
        ),
        (
            "kvm_past_memory",
            kvm.replace("{ id = 2, base = 0x201,", "{ id = 2, base = 0xfffffffff,"),
            "kvm.memslots[2].base",
            "end past guest memory",
        ),
        (
            "kvm_zero_pages",
            kvm.replace("{ id = 1, base = 0x200, npages = 1 }", "{ id = 1, base = 0x200, npages = 0 }"),
            "kvm.memslots[1].npages",
            "1..=1048576 pages (got 0)",
        ),
        (
            "kvm_zap",
            kvm.replace("memslot_zap = \"slot_only\"", "memslot_zap = \"zap_some\""),
            "options.memslot_zap",
            "unknown value 'zap_some' (expected zap_all | fast_invalidate | slot_only)",
        ),
        (
            "kvm_zero_vcpus",
            kvm.replace("cpus = 2", "cpus = 0"),
            "cpus",
            "must be between 1 and 64 (got 0)",
        ),
        (
            "kvm_create_past_memory",
            kvm.replace(
                "program = [{ memslot_delete = { id = 1 } }, \"exit\"]",
                "program = [{ memslot_create = { id = 3, base = 0x1000000000, npages = 1 } }, \"exit\"]",
            ),
            "kvm.threads[0].program[0].memslot_create.base",
            "end past guest memory",
        ),
    ];
    for (name, text, key, reason) in cases {
        assert_ne!(text, &kvm, "case {name} changed the file");
        let path = write(&format!("{name}.toml"), text);
        let e = shootdown_checker::Scenario::load(&path)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(&format!("{name}.toml")),
            "{name}: names the file: {e}"
        );
        assert!(e.contains(key), "{name}: names {key}: {e}");
        assert!(e.contains(reason), "{name}: says '{reason}': {e}");
        assert_eq!(e.lines().count(), 1, "{name}: one line: {e}");
    }
}

#[test]
fn bad_arguments_name_the_key() {
    let p = write("args", GOOD);
    let e = check(
        &p,
        Some("no_such_mutant"),
        "sc",
        Some(100),
        None,
        0,
        "bfs",
        true,
        &[],
    )
    .unwrap_err();
    assert_eq!(e.key, "mutant");
    let e = check(&p, None, "pso", Some(100), None, 0, "bfs", true, &[]).unwrap_err();
    assert_eq!(e.key, "memory_model");
    let e = check(&p, None, "sc", Some(100), Some(10), 0, "dfs", true, &[]).unwrap_err();
    assert_eq!(e.key, "strategy");
    let e = check(&p, None, "sc", Some(0), None, 0, "bfs", true, &[]).unwrap_err();
    assert_eq!(e.key, "max_states");
    let missing = p.with_file_name("does-not-exist.toml");
    let e = check(&missing, None, "sc", Some(100), None, 0, "bfs", true, &[]).unwrap_err();
    assert!(e
        .to_string()
        .starts_with(&format!("{}: ", missing.display())));
}

#[test]
fn list_reports_a_bad_file_by_name() {
    let dir = std::env::temp_dir().join(format!("shootdown-checker-list-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("a.toml"), GOOD).unwrap();
    std::fs::write(dir.join("b.toml"), GOOD.replace("cpus", "cpuz")).unwrap();
    let e = list(&dir).unwrap_err();
    assert!(e.file.ends_with("b.toml"), "{e}");
    assert_eq!(e.key, "cpuz");
}

#[test]
fn list_of_the_shipped_scenarios() {
    let l = list(&scenarios()).unwrap();
    let names: Vec<&str> = l.iter().map(|s| s.scenario.as_str()).collect();
    for n in [
        "batch_unmap",
        "flush_catchup",
        "lazy_munmap",
        "smp_call_concurrent",
        "smp_call_remote_then_local",
        "switch_mm_flush",
        "switch_mm_flush_v5",
    ] {
        assert!(names.contains(&n), "{n}");
    }
    let json: serde_json::Value =
        serde_json::from_str(&shootdown_checker::list_json(&scenarios()).unwrap()).unwrap();
    let first = &json.as_array().unwrap()[0];
    assert!(first["scenario"].is_string() && first["description"].is_string());
    let m = &first["mutants"].as_array().unwrap()[0];
    assert!(m["name"].is_string() && m["description"].is_string());
    assert!(m["bug"].is_string() || m["bug"].is_null());
    // `bug` is the catalog id or null.
    let all: Vec<_> = l.iter().flat_map(|s| s.mutants.iter()).collect();
    assert!(all
        .iter()
        .any(|m| m.name == "lazy_ignores_freed_tables" && m.bug.as_deref() == Some("N3")));
    assert!(all
        .iter()
        .any(|m| m.name == "partial_flush_when_full_owed" && m.bug.is_none()));
}

/// Verdicts say what they do not prove: an undeclared mutant is an error (not "verified"), a
/// TSO mutant under SC and a reached bound come with a note, and the listing shows each
/// mutant's expected invariant and memory model.
#[test]
fn verdicts_are_honest_about_what_they_checked() {
    let sc = scenario("switch_mm_flush");
    let e = check(
        &sc,
        Some("pv_set_preempted_clobbers_flush"),
        "sc",
        Some(1000),
        None,
        0,
        "bfs",
        true,
        &[],
    )
    .unwrap_err();
    assert_eq!(e.key, "mutant");
    assert!(
        e.to_string().contains(
            "'pv_set_preempted_clobbers_flush' is not declared by this scenario (declared: "
        ),
        "{e}"
    );
    let r = check(
        &sc,
        Some("switch_mm_no_barrier"),
        "sc",
        Some(1_000_000),
        None,
        0,
        "bfs",
        true,
        &[],
    )
    .unwrap();
    assert_eq!(r.verdict, "verified");
    assert!(
        r.notes[0]
            .contains("declared for TSO: its bug needs store buffering and cannot show under SC"),
        "{:?}",
        r.notes
    );
    assert!(r
        .to_text()
        .contains("\nnote: mutant switch_mm_no_barrier is declared for TSO"));
    let r = check(
        &sc,
        Some("switch_mm_no_barrier"),
        "tso",
        Some(1_000_000),
        None,
        0,
        "bfs",
        true,
        &[],
    )
    .unwrap();
    assert!(r.notes.is_empty(), "{:?}", r.notes);
    let r = check(&sc, None, "sc", Some(10), None, 0, "bfs", true, &[]).unwrap();
    assert_eq!(r.verdict, "bound-reached");
    // How far it got, and a bound to try.
    assert!(
        r.notes[0].contains("state bound (10 states; 10 stored, depth ")
            && r.notes[0]
                .ends_with("too few levels to estimate how many remain: try --max-states 100"),
        "{:?}",
        r.notes
    );
    let r = check(
        &sc,
        None,
        "sc",
        Some(1_000_000),
        Some(5),
        1,
        "random",
        true,
        &[],
    )
    .unwrap();
    assert!(
        r.notes[0].starts_with("sampling never proves anything"),
        "{:?}",
        r.notes
    );
    let text = shootdown_checker::report::list_text(&list(&scenarios()).unwrap());
    assert!(
        text.contains("(expect INV-STALE under tso)")
            && text.contains("(expect INV-MMIO under sc)"),
        "{text}"
    );
}
